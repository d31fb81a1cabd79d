"""A client process that keeps reserving until told to stop, and counts what a client
suffers when nodes go away: timeouts, and the requests that were never answered.

    python steadyload.py ENDPOINT[,ENDPOINT...] OUT_FILE STOP_FILE SEED [TIMEOUT_S] [DEADLINE_S]

It reserves mixed counts (1 to 60,000: several requests in flight for the larger ones)
with one :class:`snowfence.Client` on the endpoints in the order given, until STOP_FILE
exists (or DEADLINE_S passes), and writes every block it got to OUT_FILE as int64 pairs
(first, count). On exit it prints one JSON line: ``ids``, ``calls``, ``errors`` (calls
that raised), ``timeouts`` (waits of TIMEOUT_S that ended with a request unanswered),
``unanswered`` (requests the client gave up waiting for), ``max_call_s`` and ``resets``.

The counting reads the client's own round (``ReserveRound.settle``: its requests past
their deadline, the ones it gives up on), and changes nothing it does.
"""

import array
import json
import os
import random
import sys
import time

from snowfence import Client
from snowfence.clients.core.rounds import ReserveRound
from snowfence.errors import SnowfenceError

COUNTS = {"timeouts": 0, "unanswered": 0}
_settle = ReserveRound.settle


def _counting_settle(self, now_ns):
    expired = sum(1 for p in self.waiting.values() if p.deadline_ns <= now_ns)
    if expired:
        COUNTS["timeouts"] += 1
        COUNTS["unanswered"] += expired
    return _settle(self, now_ns)


ReserveRound.settle = _counting_settle


def main() -> int:
    endpoints, out, stop_file, seed = sys.argv[1].split(","), sys.argv[2], sys.argv[3], int(sys.argv[4])
    timeout_s = float(sys.argv[5]) if len(sys.argv) > 5 else 2.0
    deadline = time.monotonic() + (float(sys.argv[6]) if len(sys.argv) > 6 else 60.0)
    rng = random.Random(seed)
    pairs = array.array("q")
    ids = calls = errors = 0
    max_call_s = 0.0
    with Client(endpoints, timeout_s=timeout_s, retries=20, discover=False) as client:
        while not os.path.exists(stop_file) and time.monotonic() < deadline:
            n = rng.choice([1, 7, 100, 4096, 30_000, rng.randint(1, 60_000)])
            began = time.monotonic()
            calls += 1
            try:
                blocks = client.reserve(n)
            except SnowfenceError as exc:
                errors += 1
                print(f"error: {exc}", file=sys.stderr, flush=True)
                continue
            finally:
                max_call_s = max(max_call_s, time.monotonic() - began)
            for b in blocks:
                pairs.extend((b.first, b.count))
                ids += b.count
        resets = client.resets
    with open(out, "wb") as f:
        pairs.tofile(f)
    figures = {"ids": ids, "calls": calls, "errors": errors, "max_call_s": round(max_call_s, 3), "resets": resets}
    print(json.dumps({**figures, **COUNTS}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
