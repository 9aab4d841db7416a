// Run with `node --test` in this folder: no host or broker needed.
import assert from "node:assert/strict";
import { test } from "node:test";

import { planner } from "./planner.js";

test("a delay rounds up to the next step and beyond the last is refused", () => {
  planner.configure(JSON.stringify({ steps: ["1s", "10s"] }));
  const plan = planner.plan({ destination: "orders", delayMs: 2_500n, messageId: "m" });
  assert.equal(plan.deliversAfterMs, 10_000n);
  const exchange = plan.commands[0].val.exchange;
  assert.equal(exchange.tag, "registered");
  assert.equal(planner.names()[exchange.val], "{{name}}.10000ms");
  assert.throws(() => planner.plan({ destination: "orders", delayMs: 10_001n, messageId: "m" }));
  assert.throws(() => planner.configure(JSON.stringify({ stepz: ["1s"] })));
});
