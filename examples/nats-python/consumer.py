#!/usr/bin/env python3
"""Consumes a destination subject and prints how late each message came.

A destination of hourglass on NATS is a subject some stream captures. This
creates that stream (`--stream`, by default the subject with '.' as '-') when
it is missing, and a durable pull consumer on it, then prints "ready": start
it before the producer. Each message is acknowledged and printed with its
lateness: the time it arrived here minus its due time, the Unix milliseconds
hourglass wrote in its `hourglass-due-at` header. It exits 0 once `--count`
messages arrived and none was early, 1 otherwise or after `--timeout` seconds.
Needs nats-py (python3 -m pip install nats-py).
"""

import argparse
import asyncio
import time

import nats
from nats.errors import TimeoutError as NoMessageYet
from nats.js.errors import NotFoundError


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="nats://127.0.0.1:4222")
    parser.add_argument("--subject", default="orders.created", help="the destination subject")
    parser.add_argument("--stream", help="the stream that captures it (default: the subject with '.' as '-')")
    parser.add_argument("--durable", default="orders-example", help="the durable consumer's name")
    parser.add_argument("--count", type=int, default=5, help="messages to wait for")
    parser.add_argument("--timeout", type=float, default=30, help="seconds to wait for them")
    args = parser.parse_args()
    stream = args.stream or args.subject.replace(".", "-")

    connection = await nats.connect(args.url)
    jetstream = connection.jetstream()
    try:
        await jetstream.stream_info(stream)
    except NotFoundError:
        await jetstream.add_stream(name=stream, subjects=[args.subject])
    subscription = await jetstream.pull_subscribe(args.subject, durable=args.durable, stream=stream)
    print("ready", flush=True)

    received, early = 0, 0
    deadline = time.monotonic() + args.timeout
    while received < args.count and time.monotonic() < deadline:
        try:
            # One at a time: each message is timed the moment it arrives.
            messages = await subscription.fetch(1, timeout=min(1.0, max(0.01, deadline - time.monotonic())))
        except NoMessageYet:
            continue
        for message in messages:
            arrived_ms = int(time.time() * 1000)
            await message.ack()
            headers = message.headers or {}
            late_ms = arrived_ms - int(headers["hourglass-due-at"])
            early += late_ms < 0
            received += 1
            print(f"{message.subject} got {message.data.decode()} tenant={headers.get('tenant')} late_ms={late_ms}", flush=True)
    await connection.close()
    print(f"received {received} of {args.count}, {early} early", flush=True)
    return 0 if received == args.count and early == 0 else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
