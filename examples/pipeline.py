"""Streaming pipeline: stamp every event of an asyncio stream with an ID.

    python examples/pipeline.py --connect tcp://127.0.0.1:5555 --events 100000

`AsyncClient.ids()` keeps blocks in hand and refills them in the background,
so stamping an event costs about what reading the next integer of a range
costs; blocks older than `max_age_s` are dropped, so the IDs stay close to the
time the events were stamped. Runs on uvloop when it is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from snowfence import AsyncClient, SnowfenceError, decode
from snowfence.clients.aio import run


async def events(count: int):
    """Stands in for a Kafka consumer, a websocket, a change feed..."""
    for i in range(count):
        yield {"seq": i, "body": f"event {i}"}
        if i % 1000 == 0:
            await asyncio.sleep(0)  # let the refill task and the socket run


async def pipeline(connect: list[str], count: int) -> int:
    stamped = 0
    last = None
    async with AsyncClient(connect, timeout_s=2.0) as client:
        ids = client.ids(max_age_s=1.0)
        async for event in events(count):
            event["id"] = await anext(ids)
            stamped += 1
            last = event
        await ids.aclose()
    print(f"stamped {stamped} events; the last one: {last['id']} = {decode(last['id'])}", file=sys.stderr)
    return stamped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connect", default=os.environ.get("SNOWFENCE_CONNECT", "tcp://127.0.0.1:5555"))
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    try:
        stamped = run(pipeline(args.connect.split(","), args.events))
    except SnowfenceError as exc:  # one line, not a traceback: the node is not there, say
        print(f"pipeline: {exc.code}: {exc}", file=sys.stderr)
        return 1
    return 0 if stamped == args.events else 1


if __name__ == "__main__":
    sys.exit(main())
