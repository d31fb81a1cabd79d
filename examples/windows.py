"""Close time windows on the watermark: count events per second of ID time, and emit a
second only when no event of it can still come.

    python examples/windows.py --connect tcp://127.0.0.1:5555 --seconds 10
    python examples/windows.py --pause-every-s 3 --pause-s 2.5   # producers that go quiet

Producers stamp events with IDs (`AsyncClient.ids()`); the closer asks for the
cluster's watermark W: no ID carrying a millisecond before W is minted after the reply.
IDs minted earlier may still be in a producer's hand, in a prefetched block at most
`max_age_s` old, so the closer waits for that too: a window closes when its end is at or
below both W and the wall clock less `max_age_s` (and the skew bound): `ids()` hands out
no ID older than `max_age_s`, also after a producer paused with a block in hand. An event
that arrives for a closed window would be late: this example counts them, and there are
none, however long the producers pause (``--pause-s``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter

from snowfence import AsyncClient, SnowfenceError, WatermarkUnavailable, decode
from snowfence.clients.aio import run

WINDOW_MS = 1000
MAX_AGE_S = 0.5
SKEW_MS = 100


async def produce(
    client: AsyncClient, log: list[int], stop: asyncio.Event, pause_every_s: float = 0.0, pause_s: float = 0.0
) -> None:
    """Stands in for a service that stamps what it writes; appends to the closer's input.
    With ``pause_every_s``, it goes quiet for ``pause_s`` that often (a stall, a GC pause)."""
    ids = client.ids(max_age_s=MAX_AGE_S, batch=64)
    next_pause = time.monotonic() + pause_every_s
    while not stop.is_set():
        log.append(await anext(ids))
        await asyncio.sleep(0.0005)
        if pause_every_s and time.monotonic() >= next_pause:
            await asyncio.sleep(pause_s)
            next_pause = time.monotonic() + pause_every_s
    await ids.aclose()


async def close_windows(client: AsyncClient, log: list[int], stop: asyncio.Event) -> tuple[int, int]:
    """Count events per window; print each window once it is closed. Returns (closed, late)."""
    counts: Counter = Counter()
    closed_below = 0  # every window ending at or before this Unix ms is closed
    closed = late = 0
    while not stop.is_set():
        await asyncio.sleep(0.2)
        try:
            mark = await client.watermark()
        except WatermarkUnavailable:
            continue  # the node has promised nothing yet
        horizon = min(mark.unix_ms, int(time.time() * 1000 - MAX_AGE_S * 1000) - SKEW_MS)
        pending, log[:] = log[:], []  # everything stamped before the reply is in here
        for id_ in pending:
            at = decode(id_).unix_ms
            if at < closed_below:
                late += 1
            else:
                counts[at // WINDOW_MS] += 1
        for window in sorted(w for w in counts if (w + 1) * WINDOW_MS <= horizon):
            print(f"window {window * WINDOW_MS}: {counts.pop(window)} events", flush=True)
            closed += 1
            closed_below = max(closed_below, (window + 1) * WINDOW_MS)
    return closed, late


async def main_async(
    connect: list[str], seconds: float, producers: int, pause_every_s: float = 0.0, pause_s: float = 0.0
) -> tuple[int, int]:
    stop = asyncio.Event()
    log: list[int] = []
    async with AsyncClient(connect, timeout_s=2.0) as client:
        tasks = [
            asyncio.create_task(produce(client, log, stop, pause_every_s * (1 + i / producers), pause_s))
            for i in range(producers)
        ]
        closer = asyncio.create_task(close_windows(client, log, stop))
        try:
            # Until the time is up, or a task fails (no node answering, say).
            await asyncio.wait([*tasks, closer], timeout=seconds, return_when=asyncio.FIRST_EXCEPTION)
            stop.set()
            await asyncio.gather(*tasks)
            return await closer
        finally:  # the first error is the one raised; the others' are collected, not left unretrieved
            stop.set()
            for task in (*tasks, closer):
                task.cancel()
            await asyncio.gather(*tasks, closer, return_exceptions=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connect", default=os.environ.get("SNOWFENCE_CONNECT", "tcp://127.0.0.1:5555"))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--pause-every-s", type=float, default=0.0, help="producers go quiet this often (0: never)")
    parser.add_argument("--pause-s", type=float, default=0.0, help="for this long each time")
    args = parser.parse_args()
    try:
        closed, late = run(
            main_async(args.connect.split(","), args.seconds, args.producers, args.pause_every_s, args.pause_s)
        )
    except SnowfenceError as exc:  # one line, not a traceback: the node is not there, say
        print(f"windows: {exc.code}: {exc}", file=sys.stderr)
        return 1
    print(f"closed {closed} windows; late events: {late}", file=sys.stderr)
    return 0 if late == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
