"""How fast a Python loop consumes `Client.ids()`, against the same loop over a range.

Starts a node (by default 2 workers x 8 worker IDs, so supply is not the limit),
then times loops over N IDs, alternating the two sources, several times.

    python benchmarks/client_ids.py [--n 5000000] [--runs 5] [--ids-per-worker 8]
"""

from __future__ import annotations

import argparse
import time
from itertools import islice

from common import median, servers

from snowfence import Client


def consume_empty(it, n: int) -> float:
    t = time.perf_counter()
    for _ in islice(it, n):
        pass
    return time.perf_counter() - t


def consume_xor(it, n: int) -> float:
    acc = 0
    t = time.perf_counter()
    for x in islice(it, n):
        acc ^= x
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ids-per-worker", type=int, default=8)
    args = parser.parse_args()
    spec = {
        "kind": "snowfence",
        "workers": args.workers,
        "ready": args.workers * args.ids_per_worker,
        "args": ["--ids-per-worker", str(args.ids_per_worker)],
    }
    rows = []
    with servers({"node": spec}) as s, Client(s["node"].endpoint) as client:
        for body, consume in (("empty loop", consume_empty), ("acc ^= id", consume_xor)):
            ranges, streams = [], []
            for _ in range(args.runs):
                ranges.append(consume(iter(range(1 << 60, (1 << 60) + args.n)), args.n))
                stream = client.ids()
                next(stream)  # the first blocks arrive; the loop then measures steady state
                streams.append(consume(stream, args.n))
            r, c = median(ranges), median(streams)
            rows.append((body, args.n / r, args.n / c, r / c))
            print(
                f"{body:12s} range {args.n / r:14,.0f} IDs/s   ids() {args.n / c:14,.0f} IDs/s   ratio {r / c:.2f}",
                flush=True,
            )
    print("\n| loop body | range, IDs/s | Client.ids(), IDs/s | ids() / range |")
    print("|---|---|---|---|")
    for body, r, c, ratio in rows:
        print(f"| `{body}` | {r:,.0f} | {c:,.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
