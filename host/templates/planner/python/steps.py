"""The strategy of {{name}}, in plain Python, so it can be tested without the host.

Delays round up to the next of the configured `steps`. Each step is a fanout
exchange and a queue whose messages expire after the step; the message is
published with the destination as its routing key and, on expiry,
dead-letters through the default exchange, which routes on that key straight
to the destination queue.
"""

UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
KEYS = ("prefix", "steps")


class ConfigError(ValueError):
    """A mistake in the strategy's table; its text reaches the user."""


def duration_ms(value, key):
    """`"10s"`, `"1500ms"`, `"1h 30m"` or whole milliseconds, as delay.toml writes durations."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a duration such as \"10s\", got {value!r}")
    total, digits, rest = 0, "", value.replace(" ", "")
    while rest:
        if rest[0].isdigit():
            digits, rest = digits + rest[0], rest[1:]
            continue
        unit = "ms" if rest.startswith("ms") else rest[0]
        if unit not in UNITS_MS or not digits:
            raise ConfigError(f"{key}: {value!r} is not a duration (units: ms, s, m, h, d)")
        total, digits, rest = total + int(digits) * UNITS_MS[unit], "", rest[len(unit):]
    if digits:
        raise ConfigError(f"{key}: {value!r} needs a unit (ms, s, m, h, d)")
    return total


class Steps:
    def __init__(self, config):
        unknown = sorted(set(config) - set(KEYS))
        if unknown:
            raise ConfigError(f"unknown key {unknown[0]!r}; known: {', '.join(KEYS)}")
        self.prefix = config.get("prefix", "{{name}}")
        steps = config.get("steps", ["1s", "10s", "1m"])
        self.steps = sorted({duration_ms(s, "steps") for s in steps})
        if not self.steps or self.steps[0] == 0:
            raise ConfigError("steps: give at least one delay, each above zero")

    def step_name(self, ms):
        return f"{self.prefix}.{ms}ms"

    def step_for(self, delay_ms):
        """The step a delay rounds up to (0 for none), or None beyond the longest."""
        if delay_ms == 0:
            return 0
        return next((ms for ms in self.steps if ms >= delay_ms), None)
