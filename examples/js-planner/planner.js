// Exponential back-off buckets: a planner written in JavaScript.
//
// Delays round up to base * 2^k (1 s, 2 s, 4 s, ... up to `cap`). Each bucket
// is a fanout exchange and a TTL queue; the message is published with the
// destination as its routing key and, when its TTL ends, dead-letters through
// the default exchange straight to the destination queue. Redeliveries wait
// base * 2^(attempt - 1), capped, shortened by up to `jitter` of themselves,
// the jitter drawn from the request's seed, so an answer is reproducible.
//
// componentize-js turns this module into a component of the `planner-world`
// in ../../wit; `./build` does it. WIT's u64 and s64 are BigInt here, records
// are objects with camelCase fields, variants are { tag, val }, and a thrown
// string is a result's error.

const KEYS = ["prefix", "base", "cap", "max_attempts", "jitter"];
const UNITS_MS = { ms: 1n, s: 1_000n, m: 60_000n, h: 3_600_000n, d: 86_400_000n };

// What `configure` read. `names` are the exchanges plans publish to, registered
// once (the host asks for them right after `configure`): the default exchange
// at index 0, then each bucket's, so a plan names one by index, not by string.
let settings = { prefix: "jsbackoff", buckets: [], names: [], maxAttempts: 8, jitter: 0.2 };

/** `"1s"`, `"1500ms"`, `"2h 5m"` or whole milliseconds, as delay.toml writes durations. */
function durationMs(value, key) {
  if (Number.isInteger(value) && value >= 0) return BigInt(value);
  if (typeof value !== "string") throw `${key}: expected a duration such as "10s", got ${JSON.stringify(value)}`;
  let total = 0n;
  let digits = "";
  let rest = value.replaceAll(" ", "");
  while (rest.length > 0) {
    if (rest[0] >= "0" && rest[0] <= "9") {
      digits += rest[0];
      rest = rest.slice(1);
      continue;
    }
    const unit = rest.startsWith("ms") ? "ms" : rest[0];
    if (!(unit in UNITS_MS) || digits === "") throw `${key}: ${JSON.stringify(value)} is not a duration (units: ms, s, m, h, d)`;
    total += BigInt(digits) * UNITS_MS[unit];
    digits = "";
    rest = rest.slice(unit.length);
  }
  return total + (digits === "" ? 0n : BigInt(digits));
}

/** The same mixing as the Rust and Python back-off examples, so all three jitter alike. */
function splitmix64(seed) {
  const mask = (1n << 64n) - 1n;
  let z = (seed + 0x9e3779b97f4a7c15n) & mask;
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & mask;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & mask;
  return z ^ (z >> 31n);
}

const bucket = (ms) => `${settings.prefix}.${ms}ms`;
const longest = () => settings.buckets[settings.buckets.length - 1];

export const planner = {
  describe() {
    const key = (name, description, defaultValue) => ({ name, description, defaultValue });
    return {
      name: "js-backoff",
      version: "0.1.0",
      family: "amqp",
      configKeys: [
        key("prefix", "names of the bucket exchanges and queues: <prefix>.<ms>ms", "jsbackoff"),
        key("base", "the shortest bucket", "1s"),
        key("cap", "the longest bucket", "5m"),
        key("max_attempts", "redeliveries before giving up", "8"),
        key("jitter", "fraction of a redelivery delay jitter may remove", "0.2"),
      ],
    };
  },

  configure(configJson) {
    const config = JSON.parse(configJson);
    const unknown = Object.keys(config).filter((k) => !KEYS.includes(k));
    if (unknown.length > 0) throw `unknown key ${JSON.stringify(unknown[0])}; known: ${KEYS.join(", ")}`;
    const base = durationMs(config.base ?? "1s", "base");
    const cap = durationMs(config.cap ?? "5m", "cap");
    if (base === 0n || cap < base) throw `base (${base}ms) must be above zero and at most cap (${cap}ms)`;
    const jitter = config.jitter ?? 0.2;
    if (!(jitter >= 0 && jitter <= 1)) throw `jitter: ${jitter} must be between 0.0 and 1.0`;
    const buckets = [base];
    while (buckets[buckets.length - 1] * 2n <= cap) buckets.push(buckets[buckets.length - 1] * 2n);
    const prefix = config.prefix ?? "jsbackoff";
    const names = ["", ...buckets.map((ms) => `${prefix}.${ms}ms`)];
    settings = { prefix, buckets, names, maxAttempts: config.max_attempts ?? 8, jitter };
    return { granularity: { tag: "listed", val: [0n, ...buckets] }, maxDelayMs: longest() };
  },

  names() {
    return settings.names;
  },

  topology() {
    return settings.buckets.flatMap((ms) => {
      const name = bucket(ms);
      const ttl = [
        { key: "x-message-ttl", value: { tag: "int", val: ms } },
        { key: "x-dead-letter-exchange", value: { tag: "text", val: "" } },
      ];
      return [
        { tag: "declare-exchange", val: { name, kind: "fanout", durable: true, arguments: [] } },
        { tag: "declare-queue", val: { name, durable: true, arguments: ttl } },
        { tag: "bind-queue", val: { queue: name, exchange: name, routingKey: "", arguments: [] } },
      ];
    });
  },

  destinationSetup(_destination) {
    return [];
  },

  plan(request) {
    // `exchange` is an index into `names`; the destination is this call's own, so text.
    const publish = (exchange) => ({
      tag: "publish",
      val: {
        exchange: { tag: "registered", val: exchange },
        routingKey: { tag: "text", val: request.destination },
        bcc: [],
        headers: [],
        expirationMs: undefined,
        mandatory: true,
      },
    });
    if (request.delayMs === 0n) return { commands: [publish(0)], deliversAfterMs: 0n };
    const n = settings.buckets.findIndex((b) => b >= request.delayMs);
    if (n === -1) throw `delay ${request.delayMs}ms is above the longest bucket ${longest()}ms`;
    return { commands: [publish(n + 1)], deliversAfterMs: settings.buckets[n] };
  },

  handleDue(_message) {
    throw "js-backoff is not pump-driven";
  },

  handleHeld(_message) {
    throw "js-backoff holds no messages in a stream";
  },

  decideRedelivery(request) {
    if (request.attempt === 0 || request.attempt > settings.maxAttempts) {
      return { tag: "give-up", val: `${Math.max(request.attempt - 1, 0)} attempts made` };
    }
    const full = settings.buckets[Math.min(request.attempt - 1, settings.buckets.length - 1)];
    const unit = Number(splitmix64(request.seed ^ BigInt(request.attempt)) >> 11n) / 2 ** 53;
    return { tag: "retry-after-ms", val: full - BigInt(Math.floor(Number(full) * settings.jitter * unit)) };
  },
};
