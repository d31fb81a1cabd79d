"""A client process for integration tests: reserve IDs until a count is reached,
record every acknowledged block in arrival order.

    python loadgen.py ENDPOINT[,ENDPOINT] TOTAL OUT_FILE SEED [DEADLINE_S]

OUT_FILE receives int64 pairs (first, count), one per block, in the order the
reserve calls returned them. Errors are counted, never fatal, until DEADLINE_S.
"""

import array
import random
import sys
import time

from snowfence import Client
from snowfence.errors import SnowfenceError


def main() -> int:
    endpoints, total, out, seed = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    deadline = time.monotonic() + (float(sys.argv[5]) if len(sys.argv) > 5 else 60.0)
    rng = random.Random(seed)
    pairs = array.array("q")
    got = errors = 0
    with Client(endpoints, timeout_s=1.0, retries=20, discover=False) as client:
        while got < total and time.monotonic() < deadline:
            n = min(total - got, rng.choice([1, 7, 100, 4096, 5000, rng.randint(1, 9000)]))
            try:
                blocks = client.reserve(n)
            except SnowfenceError:
                errors += 1
                continue
            for b in blocks:
                pairs.extend((b.first, b.count))
                got += b.count
    with open(out, "wb") as f:
        pairs.tofile(f)
    print(f"{got} {errors}", flush=True)
    return 0 if got >= total else 1


if __name__ == "__main__":
    sys.exit(main())
