"""IDs/s and latency against workers, block size and requests in flight.

python benchmarks/scaling.py [--duration 3]
"""

from __future__ import annotations

import argparse

from common import bench, servers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    print(f"{args.clients} client processes; depth = requests in flight per client\n")
    print("| workers | batch | depth | IDs/s | requests/s | p50 us | p99 us |")
    print("|---|---|---|---|---|---|---|")
    for workers in (1, 2):
        with servers({"node": {"kind": "snowfence", "workers": workers}}) as s:
            for batch in (1, 16, 256, 4096):
                for depth in (1, 4, 16, 64):
                    r = bench(
                        s["node"],
                        "--duration",
                        str(args.duration),
                        "--clients",
                        str(args.clients),
                        "--depth",
                        str(depth),
                        "--batch",
                        str(batch),
                    )
                    lat = r["latency_us"]
                    print(
                        f"| {workers} | {batch} | {depth} | {r['ids_per_s']:,.0f} | {r['requests_per_s']:,.0f} "
                        f"| {lat['p50']:,.0f} | {lat['p99']:,.0f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
