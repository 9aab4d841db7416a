#!/usr/bin/env python3
"""A consumer that fails twice and succeeds on the third attempt.

It does no retrying of its own: it rejects the message (without requeue) and
hourglass brings it back later, with the header `hourglass-attempt` telling
which delivery this is. Start hourglass first:

    cargo run --release -- --config examples/redelivery.toml serve

then, with pika installed (python3 -m pip install pika):

    python3 examples/redelivery_consumer.py

It publishes one message to the queue `work` and prints each delivery:
attempt 1 at 0 s, attempt 2 about 2 s later, attempt 3 about 5 s after that.
"""

import argparse
import sys
import time

import pika


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/%2f")
    parser.add_argument("--queue", default="work")
    parser.add_argument("--input", default="hourglass.redelivery", help="hourglass's redelivery input (service.redelivery_input)")
    parser.add_argument("--fail", type=int, default=2, help="reject the first N deliveries of each message")
    parser.add_argument("--publish", type=int, default=1, help="messages to publish before consuming")
    parser.add_argument("--timeout", type=float, default=60, help="give up (exit 1) after this many seconds")
    args = parser.parse_args()

    connection = pika.BlockingConnection(pika.URLParameters(args.url))
    channel = connection.channel()
    # The same declaration hourglass makes, so either side may come first.
    channel.queue_declare(args.queue, durable=True, arguments={"x-dead-letter-exchange": args.input})
    channel.confirm_delivery()

    started = time.monotonic()
    for i in range(1, args.publish + 1):
        properties = pika.BasicProperties(
            content_type="application/json",
            message_id=f"job-{i}",
            delivery_mode=2,
            headers={"tenant": "acme"},
        )
        channel.basic_publish("", args.queue, f'{{"job": {i}}}'.encode(), properties)
    print(f"published {args.publish} message(s) to {args.queue}", flush=True)

    done = 0
    for method, properties, body in channel.consume(args.queue, inactivity_timeout=0.5):
        if time.monotonic() - started > args.timeout:
            print(f"timed out after {args.timeout:.0f} s with {done} of {args.publish} done", file=sys.stderr)
            return 1
        if method is None:
            continue
        attempt = int((properties.headers or {}).get("hourglass-attempt", 1))
        elapsed = time.monotonic() - started
        if attempt <= args.fail:
            print(f"{properties.message_id} attempt {attempt} at {elapsed:.1f} s: failing (reject)", flush=True)
            channel.basic_reject(method.delivery_tag, requeue=False)
        else:
            print(f"{properties.message_id} attempt {attempt} at {elapsed:.1f} s: succeeded", flush=True)
            channel.basic_ack(method.delivery_tag)
            done += 1
            if done == args.publish:
                break
    channel.cancel()
    connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
