"""A client process for fault runs: call `reserve` over and over and record
every outcome, acknowledged blocks and errors alike.

    python recorder.py OUT_FILE SEED PAUSE_S ENDPOINT [ENDPOINT ...]

Runs until SIGTERM (or OUT_FILE + ".stop" appears). Each call goes to the next
endpoint in turn, with no retries, so what the file shows is what the service
did. OUT_FILE receives int64 rows of
``(send_mono_ns, recv_mono_ns, endpoint_index, outcome, first, count)``: one
row per block of an acknowledged call, one row with count 0 per failed call.
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


def main() -> int:
    out, seed, pause_s, endpoints = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    rng = random.Random(seed)
    rows = array.array("q")
    # Each client asks its own node: the checker holds a node to the worker IDs it held.
    clients = [Client(ep, timeout_s=0.5, retries=0, discover=False) for ep in endpoints]
    code = {name: i for i, name in enumerate(OUTCOMES)}
    turn = seed
    while not stop[0] and not os.path.exists(out + ".stop"):
        index = turn % len(clients)
        turn += 1
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
    return 0


def read(path: str) -> list[tuple[int, ...]]:
    data = array.array("q")
    with open(path, "rb") as f:
        data.frombytes(f.read())
    return [tuple(data[i : i + FIELDS]) for i in range(0, len(data), FIELDS)]


if __name__ == "__main__":
    sys.exit(main())
