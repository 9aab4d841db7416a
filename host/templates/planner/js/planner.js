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

// What `configure` read.
let settings = { prefix: "{{name}}", steps: [] };

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
    settings = { prefix: config.prefix ?? "{{name}}", steps };
    return { granularity: { tag: "listed", val: [0n, ...steps] }, maxDelayMs: longest() };
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
    const publish = (exchange) => ({
      tag: "publish",
      val: { exchange, routingKey: request.destination, bcc: [], headers: [], expirationMs: undefined, mandatory: true },
    });
    if (request.delayMs === 0n) return { commands: [publish("")], deliversAfterMs: 0n };
    const ms = settings.steps.find((step) => step >= request.delayMs);
    if (ms === undefined) throw `delay ${request.delayMs}ms is above the longest step ${longest()}ms`;
    return { commands: [publish(stepName(ms))], deliversAfterMs: ms };
  },

  handleDue(_message) {
    throw "{{name}} is not pump-driven";
  },

  decideRedelivery(_request) {
    throw "{{name}} does not decide redeliveries";
  },
};
