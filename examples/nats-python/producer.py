#!/usr/bin/env python3
"""Publishes messages to hourglass's ingress subject, each to be delivered later.

Each message names where it goes (`hourglass-destination`, a subject some
stream captures) and how long it waits (`hourglass-delay`: "90s", "1h 30m" or
milliseconds) in headers; every other header travels on with it. The publish
is a JetStream publish: it returns once the ingress stream stored the message,
and hourglass takes it from there. Message n (from 0) waits `--delay` plus n
times `--step`. Needs nats-py (python3 -m pip install nats-py) and a running
`hourglass serve` on NATS, which creates the ingress stream.
"""

import argparse
import asyncio
import json
import time

import nats
from nats.js.errors import NoStreamResponseError


def milliseconds(text: str) -> int:
    """ "1500", "1500ms", "2s" or "1m" as milliseconds."""
    for suffix, factor in (("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000)):
        if text.endswith(suffix) and text[: -len(suffix)].isdigit():
            return int(text[: -len(suffix)]) * factor
    return int(text)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="nats://127.0.0.1:4222")
    parser.add_argument("--ingress", default="hourglass.ingress", help="hourglass's ingress subject ([service.ingress] queue)")
    parser.add_argument("--subject", default="orders.created", help="the destination: a subject some stream captures")
    parser.add_argument("--count", type=int, default=5)
    parser.add_argument("--delay", default="2s", help="the first message's delay: 1500ms, 2s, 1m or milliseconds")
    parser.add_argument("--step", default="500ms", help="how much longer each next message waits")
    args = parser.parse_args()
    delay_ms, step_ms = milliseconds(args.delay), milliseconds(args.step)

    connection = await nats.connect(args.url)
    jetstream = connection.jetstream()
    try:
        for n in range(args.count):
            wait_ms = delay_ms + n * step_ms
            body = json.dumps({"order": n, "sent_at_ms": int(time.time() * 1000), "delay_ms": wait_ms})
            headers = {
                "hourglass-destination": args.subject,
                "hourglass-delay": str(wait_ms),
                "Content-Type": "application/json",
                "tenant": "acme",
            }
            ack = await jetstream.publish(args.ingress, body.encode(), headers=headers)
            print(f"published order {n} to {args.subject} in {wait_ms} ms (ingress stream {ack.stream}, seq {ack.seq})", flush=True)
    except NoStreamResponseError:
        print(f"no stream captures {args.ingress}: is hourglass serve running on this server with [service.ingress] on?", flush=True)
        return 1
    finally:
        await connection.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
