// {{name}}: an hourglass delay planner in JavaScript.
//
// Delays round up to the next of the configured `steps`. Each step is a
// fanout exchange and a queue whose messages expire after the step; the
// message is published with the destination as its routing key and, on
// expiry, dead-letters through the default exchange, which routes on that key
// straight to the destination queue.
//
// componentize-js turns this module into a component of the `planner-world`
// in wit/; `./build` does it. WIT's u64 is BigInt here, records are objects
// with camelCase fields, variants are { tag, val }, and a thrown string is a
// result's error. The module imports nothing, so `node --test` runs it as is.

const KEYS = ["prefix", "steps"];
const UNITS_MS = { ms: 1n, s: 1_000n, m: 60_000n, h: 3_600_000n, d: 86_400_000n };

// What `configure` read. `names` are the exchanges plans publish to, registered
// once (the host asks for them right after `configure`): the default exchange
// at index 0, then each step's; a plan names one by index, not by string.
let settings = { prefix: "{{name}}", steps: [], names: [] };

/** `"10s"`, `"1500ms"`, `"1h 30m"` or whole milliseconds, as delay.toml writes durations. */
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
  if (digits !== "") throw `${key}: ${JSON.stringify(value)} needs a unit (ms, s, m, h, d)`;
  return total;
}

const stepName = (ms) => `${settings.prefix}.${ms}ms`;
const longest = () => settings.steps[settings.steps.length - 1];

export const planner = {
  describe() {
    const key = (name, description, defaultValue) => ({ name, description, defaultValue });
    return {
      name: "{{name}}",
      version: "0.1.0",
      family: "amqp",
      configKeys: [
        key("prefix", "names of the step exchanges and queues: <prefix>.<ms>ms", "{{name}}"),
        key("steps", "the delays it delivers; others round up to the next", '["1s", "10s", "1m"]'),
      ],
    };
  },

  configure(configJson) {
    const config = JSON.parse(configJson);
    const unknown = Object.keys(config).filter((k) => !KEYS.includes(k));
    if (unknown.length > 0) throw `unknown key ${JSON.stringify(unknown[0])}; known: ${KEYS.join(", ")}`;
    const given = (config.steps ?? ["1s", "10s", "1m"]).map((s) => durationMs(s, "steps"));
    const steps = [...new Set(given)].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    if (steps.length === 0 || steps[0] === 0n) throw "steps: give at least one delay, each above zero";
    const prefix = config.prefix ?? "{{name}}";
    settings = { prefix, steps, names: ["", ...steps.map((ms) => `${prefix}.${ms}ms`)] };
    return { granularity: { tag: "listed", val: [0n, ...steps] }, maxDelayMs: longest() };
  },

  names() {
    return settings.names;
  },

  topology() {
    return settings.steps.flatMap((ms) => {
      const name = stepName(ms);
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
    // A name is { tag: "registered", val: index into names } or { tag: "text", val: string }:
    // the exchange was registered, the destination is this request's own.
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
    const n = settings.steps.findIndex((step) => step >= request.delayMs);
    if (n === -1) throw `delay ${request.delayMs}ms is above the longest step ${longest()}ms`;
    return { commands: [publish(n + 1)], deliversAfterMs: settings.steps[n] };
  },

  handleDue(_message) {
    throw "{{name}} is not pump-driven";
  },

  handleHeld(_message) {
    throw "{{name}} holds no messages in a stream";
  },

  decideRedelivery(_request) {
    throw "{{name}} does not decide redeliveries";
  },
};
