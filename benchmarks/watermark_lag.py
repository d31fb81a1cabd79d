"""How far the watermark lags the wall clock, on the embedded store and on etcd.

For each store, one node with its defaults (2 workers, ``--watermark-interval-s 1``,
renewals every 2 s) is started by this script, with a client loading it (blocks of 64
as fast as it can) or idle; another client asks WATERMARK every 100 ms for
``--duration`` s and records, at each reply, the local wall clock less the promise.
The table shows the median, p99 and maximum per store and load. etcd is a single
member on loopback (found as the tests find it: tests/harness/etcdharness.py), started and
stopped here.

    python benchmarks/watermark_lag.py [--duration 30] [--stores embedded,etcd]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "harness"))

from common import servers  # noqa: E402

from snowfence import Client, WatermarkUnavailable  # noqa: E402


def percentile(sorted_values: list[int], q: float) -> int:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def measure(endpoint: str, duration_s: float, loaded: bool) -> list[int]:
    stop = threading.Event()

    def load() -> None:
        with Client(endpoint, discover=False) as client:
            while not stop.is_set():
                client.reserve(64)

    loader = threading.Thread(target=load, daemon=True) if loaded else None
    if loader is not None:
        loader.start()
    lags = []
    with Client(endpoint, discover=False) as client:
        deadline = time.monotonic() + 60
        while True:  # the first promise: the new store's window first
            try:
                client.watermark()
                break
            except WatermarkUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        end = time.monotonic() + duration_s
        while time.monotonic() < end:
            mark = client.watermark()
            lags.append(time.time_ns() // 1_000_000 - mark.unix_ms)
            time.sleep(0.1)
    stop.set()
    if loader is not None:
        loader.join()
    return sorted(lags)


def etcd_server(root: Path) -> tuple[subprocess.Popen, str]:
    from etcdharness import EtcdCluster

    cluster = EtcdCluster(root / "etcd", size=1).start()
    return cluster, ",".join(cluster.endpoints)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--stores", default="embedded,etcd")
    args = parser.parse_args()
    rows = []
    for store in args.stores.split(","):
        root = Path(tempfile.mkdtemp(prefix="sfwm-"))
        cluster = None
        try:
            extra = []
            if store == "etcd":
                cluster, urls = etcd_server(root)
                extra = ["--etcd", urls, "--cluster", "bench"]
            with servers({"node": {"kind": "snowfence", "workers": 2, "args": extra}}) as started:
                endpoint = started["node"].endpoint
                for loaded in (False, True):
                    lags = measure(endpoint, args.duration, loaded)
                    rows.append((store, "loaded" if loaded else "idle", len(lags), lags))
        finally:
            if cluster is not None:
                cluster.stop()
            shutil.rmtree(root, ignore_errors=True)
    print(
        f"watermark lag behind the wall clock, {args.duration:g} s per row, asked every 100 ms ({os.cpu_count()} cores)"
    )
    print("| store | load | replies | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|")
    for store, load, n, lags in rows:
        print(f"| {store} | {load} | {n} | {percentile(lags, 0.5)} | {percentile(lags, 0.99)} | {lags[-1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
