"""Write a dump of IDs for timing ``snowfence verify``, with a few problems planted in it.

The dump looks like a loader's: ``--worker-ids`` worker IDs (region 0..7, worker 0..)
each mint blocks of 4,096 IDs (one millisecond's worth in the default layout), and the
blocks arrive round-robin, each worker ID's clock a few milliseconds behind the one
before it, so that the dump is in order within each worker ID but not overall. The
IDs end an hour before now. Planted, at positions spread over the dump:

- ``--duplicates`` duplicates: an ID written again in place of the next ID of its
  worker ID (one extra copy each, and no order broken);
- ``--disorder`` out-of-order IDs: two neighbouring IDs of one worker ID swapped (one
  ID lower than the one before it, each).

So ``snowfence verify`` on the dump reports exactly those counts. The dump is written
in chunks (memory stays small), as ``--format binary`` (little-endian int64, what
``snowfence reserve --format binary`` writes) or ``text`` (one decimal ID per line).

    python benchmarks/verify_dump.py OUT --count 100000000 [--format binary|text]
        [--worker-ids 8] [--duplicates 3] [--disorder 3]
    time snowfence verify OUT

Default layout only (41 bits of ms since 2026-01-01, 3 region, 7 worker, 12 sequence bits).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from snowfence.ids import DEFAULT_LAYOUT as L

BLOCK = 4096
CHUNK = BLOCK * 4096  # IDs generated at a time: a whole number of blocks


def plant_positions(count: int, how_many: int, salt: int) -> np.ndarray:
    """Positions spread over the dump, each with a later ID of the same block after it."""
    if not how_many:
        return np.empty(0, dtype=np.int64)
    spaced = np.linspace(0, count - 1, how_many + 2, dtype=np.int64)[1:-1]
    spaced = spaced - spaced % BLOCK + (salt * 97) % (BLOCK - 2)  # inside a block, not at its last two IDs
    return spaced[spaced + 1 < count]


def generate(count: int, worker_ids: int, start_ms: int, dups: np.ndarray, swaps: np.ndarray, write) -> None:
    for first in range(0, count, CHUNK):
        i = np.arange(first, min(count, first + CHUNK), dtype=np.int64)
        block = i // BLOCK
        slot = block % worker_ids  # which worker ID
        ms = start_ms + block // worker_ids + (worker_ids - slot) * 3
        region, worker = slot % (L.max_region + 1), slot // (L.max_region + 1)
        ids = (ms << L.time_shift) | (region << L.region_shift) | (worker << L.worker_shift) | (i % BLOCK)
        for p in dups[(dups >= first) & (dups < first + len(i))] - first:
            ids[p + 1] = ids[p]
        for p in swaps[(swaps >= first) & (swaps < first + len(i))] - first:
            ids[p], ids[p + 1] = ids[p + 1], ids[p]
        write(ids)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", metavar="OUT")
    parser.add_argument("--count", type=int, default=100_000_000)
    parser.add_argument("--format", choices=["binary", "text"], default="binary")
    parser.add_argument("--worker-ids", type=int, default=8)
    parser.add_argument("--duplicates", type=int, default=3)
    parser.add_argument("--disorder", type=int, default=3)
    args = parser.parse_args()
    if not 1 <= args.worker_ids <= (L.max_region + 1) * (L.max_worker + 1):
        parser.error("--worker-ids must be 1..1024")
    span_ms = args.count // BLOCK // args.worker_ids + 3 * args.worker_ids + 1
    start_ms = int(time.time() * 1000) - L.epoch_ms - 3_600_000 - span_ms
    dups = plant_positions(args.count, args.duplicates, 1)
    swaps = plant_positions(args.count, args.disorder, 2)  # other IDs of the same blocks as the duplicates
    started = time.monotonic()
    with open(args.out, "wb") as out:
        if args.format == "binary":
            generate(args.count, args.worker_ids, start_ms, dups, swaps, lambda ids: ids.astype("<i8").tofile(out))
        else:
            generate(
                args.count,
                args.worker_ids,
                start_ms,
                dups,
                swaps,
                lambda ids: out.write(("\n".join(map(str, ids.tolist())) + "\n").encode()),
            )
    print(
        f"wrote {args.count:,} IDs ({args.format}) of {args.worker_ids} worker IDs to {args.out} in "
        f"{time.monotonic() - started:.1f} s; planted {len(dups)} duplicates and {len(swaps)} out of order",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
