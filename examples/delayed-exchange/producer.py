#!/usr/bin/env python3
"""Publishes three orders with the delayed-message plugin's `x-delay` header.

Written the plugin's way; the only change for hourglass is the exchange
declaration this file no longer makes (hourglass declares `orders.delayed`).
The publish calls are exactly those a plugin program makes.
"""

import argparse
import json
import time

import pika

ORDERS = [("order.created", 2000), ("order.shipped", 2500), ("invoice.paid", 1500)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/%2f")
    parser.add_argument("--exchange", default="orders.delayed")
    args = parser.parse_args()

    connection = pika.BlockingConnection(pika.URLParameters(args.url))
    channel = connection.channel()
    # With the plugin, the producer declared the exchange itself:
    #   channel.exchange_declare(args.exchange, "x-delayed-message", durable=True,
    #                            arguments={"x-delayed-type": "topic"})
    # hourglass declares it; this line is the whole code change.
    channel.confirm_delivery()
    for routing_key, delay_ms in ORDERS:
        body = json.dumps({"order": routing_key, "sent_at_ms": int(time.time() * 1000), "delay_ms": delay_ms})
        properties = pika.BasicProperties(content_type="application/json", delivery_mode=2, headers={"x-delay": delay_ms})
        channel.basic_publish(args.exchange, routing_key, body.encode(), properties)
        print(f"published {routing_key} with x-delay {delay_ms}", flush=True)
    connection.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
