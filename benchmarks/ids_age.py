"""What an exact `max_age_s` costs `Client.ids()`: a consumer loop over its IDs against
the same loop over a local range, for each way of handing IDs out, side by side.

    python benchmarks/ids_age.py [--n 3000000] [--runs 5] [--before SRC]

Each measurement is a process of its own (one client, one `ids()`, the loop timed over N
IDs after the first blocks arrived, then the same loop over a range in that process), so
that `--before` can run the previous release's client (`SRC`: its `src` directory, e.g.
of a `git worktree` of the commit before) beside this one's. The variants are
interleaved round by round and reported as medians of the ratio ids() / range:

- this release, `max_age_s=None`: nothing checked, chain over ranges (the fastest);
- this release, `max_age_s=1.0` (the default): the age checked at each ID handed out;
- with `--before`, the previous release, `max_age_s=1.0`: checked per block only, so a
  pause in the middle of a block handed out stale IDs.

The node: 2 workers x 8 worker IDs, so supply is not the limit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from common import median, servers

HERE = Path(__file__).resolve().parent
THIS_SRC = HERE.parent / "src"

CONSUMER = r"""
import json, sys, time
from itertools import islice
from snowfence import Client

endpoint, n, max_age, body = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
max_age = None if max_age == "none" else float(max_age)


def loop(it):
    t = time.perf_counter()
    if body == "empty":
        for _ in islice(it, n):
            pass
    else:
        acc = 0
        for x in islice(it, n):
            acc ^= x
    return n / (time.perf_counter() - t)


with Client(endpoint) as client:
    stream = client.ids(max_age_s=max_age)
    next(stream)  # the first blocks arrive; the loop then measures steady state
    ids_per_s = loop(stream)
range_per_s = loop(iter(range(1 << 60, (1 << 60) + n)))
print(json.dumps({"ids": ids_per_s, "range": range_per_s}))
"""


def measure(src: Path, endpoint: str, n: int, max_age: str, body: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", CONSUMER, endpoint, str(n), max_age, body],
        capture_output=True, text=True, env=env, timeout=300, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--before", type=Path, help="the previous release's src directory, to run beside")
    args = parser.parse_args()
    variants = [("this release, max_age_s=None", THIS_SRC, "none"), ("this release, max_age_s=1.0", THIS_SRC, "1.0")]
    if args.before:
        variants.append(("previous release, max_age_s=1.0", args.before.resolve(), "1.0"))
    spec = {"kind": "snowfence", "workers": 2, "ready": 16, "args": ["--ids-per-worker", "8"]}
    rows = []
    with servers({"node": spec}) as s:
        endpoint = s["node"].endpoint
        for body, shown in (("empty", "empty loop"), ("xor", "acc ^= id")):
            results: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
            for _ in range(args.runs):
                for name, src, max_age in variants:  # interleaved, round by round
                    results[name].append(measure(src, endpoint, args.n, max_age, body))
            for name, _, _ in variants:
                got = results[name]
                ids_s, range_s = median(r["ids"] for r in got), median(r["range"] for r in got)
                ratio = median(r["ids"] / r["range"] for r in got)
                rows.append((shown, name, range_s, ids_s, ratio))
                print(f"{shown:10s} {name:34s} range {range_s:13,.0f}  ids() {ids_s:13,.0f}  {ratio:.2f}", flush=True)
    print("\n| loop body | ids() | range, IDs/s | ids(), IDs/s | ids() / range |")
    print("|---|---|---|---|---|")
    for shown, name, range_s, ids_s, ratio in rows:
        print(f"| `{shown}` | {name} | {range_s:,.0f} | {ids_s:,.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
