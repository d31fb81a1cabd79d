"""Single-ID requests: the snowfence broker against a bare zmq.proxy relay.

Both servers run at once with the same number of worker processes minting with
the same minter; `snowfence bench` drives them with the same clients, in
alternating order, several times. Reports medians and the ratio, then the
latency of both at half the broker's throughput, offered on a fixed schedule.

    python benchmarks/broker_vs_proxy.py [--runs 5] [--duration 5] [--clients 4] [--depth 16] [--serve-args "..."]

The relay hands every request to a worker (two hops); a snowfence node with its
defaults answers single IDs from its broker's own worker ID (one hop), and with
``--serve-args "--broker-mint-max-ids 0"`` hands them to a worker as the relay does.
"""

from __future__ import annotations

import argparse
import shlex

from common import bench, median, servers


def line(run: int, name: str, r: dict) -> str:
    lat = r["latency_us"]
    return (
        f"run {run} {name:9s} {r['requests_per_s']:9,.0f} req/s  p50 {lat['p50']:7,.0f}  p99 {lat['p99']:7,.0f} us"
        f"  server {r['cpu']['server_us_per_request']:5.1f} us/req  errors {sum(r['errors'].values())}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--half-load-runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument(
        "--serve-args", default="", help='more arguments for snowfence serve ("--broker-mint-max-ids 0": two hops)'
    )
    args = parser.parse_args()
    common = ["--duration", str(args.duration), "--batch", str(args.batch)]
    full: dict[str, list[dict]] = {"relay": [], "snowfence": []}
    half: dict[str, list[dict]] = {"relay": [], "snowfence": []}
    with servers(
        {
            "relay": {"kind": "relay", "workers": args.workers},
            "snowfence": {"kind": "snowfence", "workers": args.workers, "args": shlex.split(args.serve_args)},
        }
    ) as s:
        for run in range(args.runs):
            for name in ["relay", "snowfence"] if run % 2 == 0 else ["snowfence", "relay"]:
                r = bench(s[name], *common, "--clients", str(args.clients), "--depth", str(args.depth))
                full[name].append(r)
                print(line(run + 1, name, r), flush=True)
        half_rate = median(r["requests_per_s"] for r in full["snowfence"]) / 2
        for run in range(args.half_load_runs):
            for name in ["relay", "snowfence"] if run % 2 == 0 else ["snowfence", "relay"]:
                r = bench(s[name], *common, "--clients", "2", "--depth", "64", "--rate", str(half_rate))
                half[name].append(r)
                print("half " + line(run + 1, name, r), flush=True)

    print("\n| server | requests/s | p50 us | p99 us | server CPU us/request | unique |")
    print("|---|---|---|---|---|---|")
    for name, rs in full.items():
        rate = median(r["requests_per_s"] for r in rs)
        p50, p99 = median(r["latency_us"]["p50"] for r in rs), median(r["latency_us"]["p99"] for r in rs)
        cpu = median(r["cpu"]["server_us_per_request"] for r in rs)
        unique = all(r["check"]["unique"] for r in rs)
        print(f"| {name} | {rate:,.0f} | {p50:,.0f} | {p99:,.0f} | {cpu:.1f} | {unique} |")
    rates = {name: median(r["requests_per_s"] for r in rs) for name, rs in full.items()}
    print(
        f"\nsnowfence broker / bare zmq.proxy relay, requests/s (medians of {args.runs}): "
        f"{rates['snowfence'] / rates['relay']:.2f}"
    )
    if not args.half_load_runs:  # none measured: no table of zeros
        return
    print(
        f"\nHalf load: {half_rate:,.0f} requests/s offered by 2 clients on a fixed schedule "
        f"(medians of {args.half_load_runs})\n"
    )
    print("| server | requests/s | p50 us | p99 us | p99.9 us |")
    print("|---|---|---|---|---|")
    for name, rs in half.items():
        lat = {k: median(r["latency_us"][k] for r in rs) for k in ("p50", "p99", "p999")}
        print(
            f"| {name} | {median(r['requests_per_s'] for r in rs):,.0f} | {lat['p50']:,.0f} | {lat['p99']:,.0f} "
            f"| {lat['p999']:,.0f} |"
        )


if __name__ == "__main__":
    main()
