"""Blocks of 4,096: the layout's ceiling, beyond it with several worker IDs per
process, and latency at half of the maximum load.

    python benchmarks/ceiling.py [--runs 3] [--duration 5]
"""

from __future__ import annotations

import argparse

from common import bench, median, servers


def summarize(name: str, rs: list[dict]) -> str:
    ids = median(r["ids_per_s"] for r in rs)
    ceiling = rs[0]["ceiling_ids_per_s"]
    lat = {k: median(r["latency_us"][k] for r in rs) for k in ("p50", "p99", "p999")}
    cpu = median(r["cpu"]["server_cores"] for r in rs)
    ok = all(r["check"]["unique"] and r["check"]["outside_request_window"] == 0 for r in rs)
    return (
        f"| {name} | {ids:,.0f} | {ids / ceiling:.1%} | {lat['p50']:,.0f} | {lat['p99']:,.0f} | {lat['p999']:,.0f} "
        f"| {cpu:.2f} | {ok} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5)
    args = parser.parse_args()
    d = ["--duration", str(args.duration)]
    rows = []
    specs = {
        "one": {"kind": "snowfence", "workers": 2},
        "wide": {"kind": "snowfence", "workers": 2, "ready": 16, "args": ["--ids-per-worker", "8"]},
    }
    with servers(specs) as s:
        for name, label in (("one", "2 workers x 1 worker ID"), ("wide", "2 workers x 8 worker IDs")):
            full = [bench(s[name], *d, "--clients", "4", "--depth", "4") for _ in range(args.runs)]
            rows.append(summarize(f"{label}, full load (4 clients x 4 in flight)", full))
            half_rate = median(r["requests_per_s"] for r in full) / 2
            half = [
                bench(s[name], *d, "--clients", "4", "--depth", "8", "--rate", str(half_rate)) for _ in range(args.runs)
            ]
            rows.append(summarize(f"{label}, half load ({half_rate:,.0f} requests/s offered)", half))
            print(rows[-2], rows[-1], sep="\n", flush=True)
    print("\n| configuration | IDs/s | of ceiling | p50 us | p99 us | p99.9 us | server cores | unique, in window |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
