#!/usr/bin/env python3
"""Three consumers of delayed orders, each with a queue bound to `orders`.

With the plugin the queues were bound to the `x-delayed-message` exchange;
with hourglass they are bound to its `deliver_to` exchange, `orders`. The
queues and bindings are declared first ("ready" is printed then), so start
this before the producer. Each delivery is printed with how late it came
after its `x-delay`; it exits 0 once `--expect` deliveries arrived and none
was early, 1 otherwise (or after `--timeout` seconds).
"""

import argparse
import json
import time

import pika

BINDINGS = ["order.*", "order.created", "#"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/%2f")
    parser.add_argument("--exchange", default="orders", help="where the queues are bound: the delayed exchange's deliver_to")
    parser.add_argument("--expect", type=int, default=6, help="deliveries to wait for (3 orders: 2 + 1 + 3 by the bindings)")
    parser.add_argument("--timeout", type=float, default=30)
    args = parser.parse_args()

    connection = pika.BlockingConnection(pika.URLParameters(args.url))
    channel = connection.channel()
    # Before: channel.queue_bind(queue, "orders.delayed", binding) — the plugin's exchange.
    channel.exchange_declare(args.exchange, "topic", durable=True)
    queues = {}
    for binding in BINDINGS:
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(queue, args.exchange, binding)
        queues[queue] = binding
    print("ready", flush=True)

    received, early = 0, 0
    deadline = time.monotonic() + args.timeout
    while received < args.expect and time.monotonic() < deadline:
        for queue, binding in queues.items():
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                continue
            order = json.loads(body)
            late_ms = int(time.time() * 1000) - order["sent_at_ms"] - order["delay_ms"]
            early += late_ms < 0
            received += 1
            print(f"{binding} got {method.routing_key} late_ms={late_ms}", flush=True)
        connection.sleep(0.01)
    connection.close()
    print(f"received {received} of {args.expect}, {early} early", flush=True)
    return 0 if received == args.expect and early == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
