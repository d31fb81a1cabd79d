"""Single-ID requests: the snowfence broker against a bare zmq.proxy relay.

Both servers run at once with the same number of worker processes minting with
the same minter; `snowfence bench` drives them with the same clients, in
alternating order, several times. Reports medians and the ratio.

    python benchmarks/broker_vs_proxy.py [--runs 5] [--duration 5] [--clients 4] [--depth 16]
"""

from __future__ import annotations

import argparse

from common import bench, median, servers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    load = [
        "--duration",
        str(args.duration),
        "--clients",
        str(args.clients),
        "--depth",
        str(args.depth),
        "--batch",
        str(args.batch),
    ]
    results: dict[str, list[dict]] = {"relay": [], "snowfence": []}
    with servers(
        {
            "relay": {"kind": "relay", "workers": args.workers},
            "snowfence": {"kind": "snowfence", "workers": args.workers},
        }
    ) as s:
        for run in range(args.runs):
            order = ["relay", "snowfence"] if run % 2 == 0 else ["snowfence", "relay"]
            for name in order:
                r = bench(s[name], *load)
                results[name].append(r)
                print(
                    f"run {run + 1} {name:9s} {r['requests_per_s']:9,.0f} req/s  p50 {r['latency_us']['p50']:7,.0f}"
                    f"  p99 {r['latency_us']['p99']:7,.0f} us  server {r['cpu']['server_us_per_request']:5.1f} us/req"
                    f"  errors {sum(r['errors'].values())}",
                    flush=True,
                )
    print()
    print("| server | requests/s | p50 us | p99 us | server CPU us/request | unique |")
    print("|---|---|---|---|---|---|")
    for name, rs in results.items():
        print(
            f"| {name} | {median(r['requests_per_s'] for r in rs):,.0f} | "
            f"{median(r['latency_us']['p50'] for r in rs):,.0f} | {median(r['latency_us']['p99'] for r in rs):,.0f} | "
            f"{median(r['cpu']['server_us_per_request'] for r in rs):.1f} | "
            f"{all(r['check']['unique'] for r in rs)} |"
        )
    ratio = median(r["requests_per_s"] for r in results["snowfence"]) / median(
        r["requests_per_s"] for r in results["relay"]
    )
    print(f"\nsnowfence broker / bare zmq.proxy relay, requests/s (medians of {args.runs}): {ratio:.2f}")


if __name__ == "__main__":
    main()
