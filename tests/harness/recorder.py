"""A client process for fault runs: call `reserve` over and over and record
every outcome, acknowledged blocks and errors alike.

    python recorder.py OUT_FILE SEED PAUSE_S ENDPOINT [ENDPOINT ...]

Runs until SIGTERM (or OUT_FILE + ".stop" appears). Each call goes to the next
endpoint in turn, with no retries, so what the file shows is what the service
did. OUT_FILE receives int64 rows of
``(send_mono_ns, recv_mono_ns, endpoint_index, outcome, first, count)``: one
row per block of an acknowledged call, one row with count 0 per failed call.

Every ``WATERMARK_EVERY`` calls (env, default 16; 0: never) it also asks the
node for its watermark; OUT_FILE + ".wm" receives int64 rows of
``(send_mono_ns, recv_mono_ns, endpoint_index, watermark_unix_ms, recv_wall_ms)``,
one per watermark answered (a node that has none yet is skipped).
"""

from __future__ import annotations

import array
import os
import random
import signal
import sys
import time

from snowfence import Client
from snowfence.errors import SnowfenceError

OUTCOMES = ["ok", "timeout", "unavailable", "fenced", "clock_unsafe", "reservation_expired", "other"]
FIELDS = 6
WATERMARK_FIELDS = 5


def main() -> int:
    out, seed, pause_s, endpoints = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    rng = random.Random(seed)
    rows = array.array("q")
    marks = array.array("q")
    every = int(os.environ.get("WATERMARK_EVERY", "16"))
    # Each client asks its own node: the checker holds a node to the worker IDs it held.
    clients = [Client(ep, timeout_s=0.5, retries=0, discover=False) for ep in endpoints]
    code = {name: i for i, name in enumerate(OUTCOMES)}
    turn = seed
    while not stop[0] and not os.path.exists(out + ".stop"):
        index = turn % len(clients)
        turn += 1
        if every and turn % every == 0:
            sent = time.monotonic_ns()
            try:
                mark = clients[index].watermark()
            except SnowfenceError:
                pass
            else:
                marks.extend((sent, time.monotonic_ns(), index, mark.unix_ms, time.time_ns() // 1_000_000))
        n = rng.choice([1, 7, 100, 4096, 5000])
        sent = time.monotonic_ns()
        try:
            blocks = clients[index].reserve(n)
        except SnowfenceError as exc:
            rows.extend((sent, time.monotonic_ns(), index, code.get(exc.code, code["other"]), 0, 0))
        else:
            got = time.monotonic_ns()
            for b in blocks:
                rows.extend((sent, got, index, 0, b.first, b.count))
        if pause_s:
            time.sleep(pause_s)
    for c in clients:
        c.close()
    with open(out, "wb") as f:
        rows.tofile(f)
    with open(out + ".wm", "wb") as f:
        marks.tofile(f)
    return 0


def read(path: str, fields: int = FIELDS) -> list[tuple[int, ...]]:
    data = array.array("q")
    with open(path, "rb") as f:
        data.frombytes(f.read())
    return [tuple(data[i : i + fields]) for i in range(0, len(data), fields)]


def read_watermarks(path: str) -> list[tuple[int, ...]]:
    """The watermarks a recorder was answered (none if it wrote no such file)."""
    try:
        return read(path + ".wm", WATERMARK_FIELDS)
    except FileNotFoundError:
        return []


if __name__ == "__main__":
    sys.exit(main())
