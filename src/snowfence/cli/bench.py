"""``snowfence bench``: its flags; the load is :mod:`snowfence.bench`'s."""

from __future__ import annotations

import argparse

from ..protocol import MAX_BLOCK
from . import node
from .args import connect_flags, number


def add(sub) -> None:
    bench = sub.add_parser("bench", help="Load a running deployment and report IDs/s, requests/s and latency.")
    connect_flags(bench, retries=False)
    seconds = number(float, 0, 1_000_000, low_open=True, what="a number of seconds")
    bench.add_argument("--duration", type=seconds, default=10.0, metavar="S", help="Seconds measured (default 10).")
    bench.add_argument(
        "--warmup",
        type=number(float, 0, 1_000_000, what="a number of seconds"),
        default=1.0,
        metavar="S",
        help="Seconds before measuring (default 1).",
    )
    bench.add_argument(
        "--batch",
        type=number(int, 1, MAX_BLOCK, what="a count"),
        default=4096,
        metavar="N",
        help="IDs per request (default 4096).",
    )
    bench.add_argument(
        "--clients",
        type=number(int, 1, 256, what="a count"),
        default=4,
        metavar="C",
        help="Client processes (default 4).",
    )
    bench.add_argument(
        "--depth",
        type=number(int, 1, 65536, what="a count"),
        default=16,
        metavar="D",
        help="Requests in flight per client (default 16).",
    )
    bench.add_argument(
        "--rate",
        type=number(float, 0, 1e9, low_open=True, what="a rate"),
        default=0.0,
        metavar="R",
        help="Offered requests/s in total, on a fixed schedule, above 0; without it, as fast as answered.",
    )
    bench.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="Skip the uniqueness and time-window check of every ID received.",
    )
    bench.add_argument("--json", action="store_true", help="Print the results as JSON.")
    bench.add_argument(
        "--plot", metavar="FILE.png", help="Plot latency distribution and throughput (needs matplotlib)."
    )
    bench.set_defaults(run=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from .. import bench

    endpoints = node.endpoints_of(args)
    node.curve_keys(args)
    if args.plot:
        bench.need_matplotlib()  # before the run, not after it
    spec = bench.BenchSpec(
        endpoints=endpoints,
        duration_s=args.duration,
        warmup_s=args.warmup,
        batch=args.batch,
        clients=args.clients,
        depth=args.depth,
        rate=args.rate,
        check=args.check,
        timeout_s=args.timeout,
        server_key=args.server_key,
        client_key=args.client_key,
        discover=args.discover,
    )
    return bench.main(spec, args.json, args.plot)
