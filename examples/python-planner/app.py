"""Exponential back-off buckets: a planner written in Python.

Delays round up to base * 2^k (1 s, 2 s, 4 s, ... up to `cap`). Each bucket is
a fanout exchange and a TTL queue; the message is published with the
destination as its routing key and, when its TTL ends, dead-letters through
the default exchange straight to the destination queue. Redeliveries wait
base * 2^(attempt - 1), capped, shortened by up to `jitter` of themselves,
the jitter drawn from the request's seed, so an answer is reproducible.

componentize-py turns this file into a component of the `planner-world` in
../../wit; `./build` does it. The host answers the WASI calls Python makes as
it starts without giving it anything (no clock, no randomness, no files), so
the planner is as pure as one written in Rust.
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import types as t

UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(value, key):
    """`"1s"`, `"1500ms"`, `"2h 5m"` or whole milliseconds, as delay.toml writes durations."""
    if isinstance(value, int) and value >= 0:
        return value
    if not isinstance(value, str):
        raise Err(f"{key}: expected a duration such as \"10s\", got {value!r}")
    total, digits, rest = 0, "", value.replace(" ", "")
    while rest:
        if rest[0].isdigit():
            digits, rest = digits + rest[0], rest[1:]
            continue
        unit = "ms" if rest.startswith("ms") else rest[0]
        if unit not in UNITS_MS or not digits:
            raise Err(f"{key}: {value!r} is not a duration (units: ms, s, m, h, d)")
        total, digits, rest = total + int(digits) * UNITS_MS[unit], "", rest[len(unit):]
    return total + int(digits or 0)


def splitmix64(seed):
    """The same mixing the Rust back-off example uses, so both jitter alike."""
    mask = (1 << 64) - 1
    z = (seed + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


class Settings:
    """What `configure` read. Module state, not the Planner's: componentize-py
    makes a new Planner object for each call into the component. `names` are
    the exchanges plans publish to, registered once (the host asks for them
    right after `configure`): the default exchange at index 0, then each
    bucket's, so a plan names one by index instead of sending the string."""

    prefix, buckets, names, max_attempts, jitter = "pybackoff", [], [], 8, 0.2


class Planner(exports.Planner):

    def describe(self):
        keys = [
            t.ConfigKey("prefix", "names of the bucket exchanges and queues: <prefix>.<ms>ms", "pybackoff"),
            t.ConfigKey("base", "the shortest bucket", "1s"),
            t.ConfigKey("cap", "the longest bucket", "5m"),
            t.ConfigKey("max_attempts", "redeliveries before giving up", "8"),
            t.ConfigKey("jitter", "fraction of a redelivery delay jitter may remove", "0.2"),
        ]
        return t.PlannerInfo("python-backoff", "0.1.0", t.BrokerFamily.AMQP, keys)

    def configure(self, config_json):
        config = json.loads(config_json)
        unknown = sorted(set(config) - {"prefix", "base", "cap", "max_attempts", "jitter"})
        if unknown:
            raise Err(f"unknown key {unknown[0]!r}; known: prefix, base, cap, max_attempts, jitter")
        Settings.prefix = config.get("prefix", "pybackoff")
        base, cap = duration_ms(config.get("base", "1s"), "base"), duration_ms(config.get("cap", "5m"), "cap")
        if base == 0 or cap < base:
            raise Err(f"base ({base}ms) must be above zero and at most cap ({cap}ms)")
        Settings.jitter = config.get("jitter", 0.2)
        if not 0.0 <= Settings.jitter <= 1.0:
            raise Err(f"jitter: {Settings.jitter} must be between 0.0 and 1.0")
        Settings.max_attempts = config.get("max_attempts", 8)
        Settings.buckets = [base]
        while Settings.buckets[-1] * 2 <= cap:
            Settings.buckets.append(Settings.buckets[-1] * 2)
        Settings.names = [""] + [self.bucket(ms) for ms in Settings.buckets]
        return t.DelayRange(t.Granularity_Listed([0] + Settings.buckets), Settings.buckets[-1])

    def bucket(self, ms):
        return f"{Settings.prefix}.{ms}ms"

    def names(self):
        return Settings.names

    def topology(self):
        commands = []
        for ms in Settings.buckets:
            name = self.bucket(ms)
            ttl = [t.Field("x-message-ttl", t.Value_Int(ms)), t.Field("x-dead-letter-exchange", t.Value_Text(""))]
            commands.append(t.Command_DeclareExchange(t.DeclareExchange(name, t.ExchangeKind.FANOUT, True, [])))
            commands.append(t.Command_DeclareQueue(t.DeclareQueue(name, True, ttl)))
            commands.append(t.Command_BindQueue(t.BindQueue(name, name, "", [])))
        return commands

    def destination_setup(self, destination):
        return []

    def plan(self, request):
        # The exchange by its index in `names`; the destination is this call's own, so text.
        def publish(exchange):
            return t.Command_Publish(t.Publish(t.Name_Registered(exchange), t.Name_Text(request.destination), [], [], None, True))

        if request.delay_ms == 0:
            return t.DelayPlan([publish(0)], 0)
        for n, ms in enumerate(Settings.buckets):
            if ms >= request.delay_ms:
                return t.DelayPlan([publish(n + 1)], ms)
        raise Err(f"delay {request.delay_ms}ms is above the longest bucket {Settings.buckets[-1]}ms")

    def handle_due(self, message):
        raise Err("python-backoff is not pump-driven")

    def handle_held(self, message):
        raise Err("python-backoff holds no messages in a stream")

    def decide_redelivery(self, request):
        if request.attempt == 0 or request.attempt > Settings.max_attempts:
            return t.RedeliveryDecision_GiveUp(f"{max(request.attempt - 1, 0)} attempts made")
        full = Settings.buckets[min(request.attempt - 1, len(Settings.buckets) - 1)]
        unit = (splitmix64(request.seed ^ request.attempt) >> 11) / float(1 << 53)
        return t.RedeliveryDecision_RetryAfterMs(full - int(full * Settings.jitter * unit))
