"""snowfence side by side with what people use instead, measured in one run.

- snowfence: blocks of 4,096 and single IDs, from one Python client process
- Redis INCRBY 4096 (a block allocator) and INCR (one ID), pipelined, redis-py
- a PostgreSQL sequence: nextval() per ID (sequence CACHE 1000) and
  nextval() over generate_series(1, 4096) as a block allocator, psycopg 3
- uuid7 generated in-process (RFC 9562 layout, hand-rolled: Python 3.11 has none)

Redis (Debian's redis-server) and PostgreSQL (Debian's postgresql) are started
by this script on unix sockets in a temp dir and stopped at the end; as root,
PostgreSQL runs as the `postgres` user. Needs `pip install -e '.[bench]'`.

    python benchmarks/alternatives.py [--seconds 3] [--runs 3]
"""

from __future__ import annotations

import argparse
import glob
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from common import median, servers

from snowfence import Client


def uuid7() -> bytes:
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(secrets.token_bytes(10), "big")
    value = (ms << 80) | (0x7 << 76) | ((rand >> 68) & 0xFFF) << 64 | (0b10 << 62) | (rand & ((1 << 62) - 1))
    return value.to_bytes(16, "big")


def timed(fn, seconds: float) -> float:
    """IDs per second from calling ``fn`` (which returns how many IDs it got) for ``seconds``."""
    ids = 0
    end = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < end:
        ids += fn()
    return ids / (time.perf_counter() - start)


class Redis:
    def __init__(self, root: Path) -> None:
        self.sock = str(root / "redis.sock")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", self.sock, "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        deadline = time.monotonic() + 10
        while not os.path.exists(self.sock) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.client = redis.Redis(unix_socket_path=self.sock)

    def block(self) -> int:
        self.client.incrby("ids", 4096)
        return 4096

    def single_pipelined(self, depth: int = 16) -> int:
        pipe = self.client.pipeline(transaction=False)
        for _ in range(depth):
            pipe.incr("ids")
        pipe.execute()
        return depth

    def single(self) -> int:
        self.client.incr("ids")
        return 1

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Postgres:
    def __init__(self, root: Path) -> None:
        bindir = sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1]
        self.data = root / "pg"
        self.run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        os.chmod(root, 0o777)
        subprocess.run(
            [*self.run_as, f"{bindir}/initdb", "-D", str(self.data), "-A", "trust", "-U", "bench"],
            check=True,
            capture_output=True,
        )
        self.proc = subprocess.Popen(
            [
                *self.run_as,
                f"{bindir}/postgres",
                "-D",
                str(self.data),
                "-k",
                str(root),
                "-c",
                "listen_addresses=",
                "-c",
                "fsync=off",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import psycopg

        deadline = time.monotonic() + 20
        while True:
            try:
                self.conn = psycopg.connect(host=str(root), user="bench", dbname="postgres", autocommit=True)
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.conn.execute("CREATE SEQUENCE ids CACHE 1000")
        self.cur = self.conn.cursor()

    def single(self) -> int:
        self.cur.execute("SELECT nextval('ids')")
        self.cur.fetchone()
        return 1

    def block(self) -> int:
        self.cur.execute("SELECT nextval('ids') FROM generate_series(1, 4096)")
        return len(self.cur.fetchall())

    def stop(self) -> None:
        self.conn.close()
        self.proc.terminate()
        self.proc.wait(20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for tool in ("redis-server", "runuser"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not found: apt-get install redis-server postgresql")
    root = Path(tempfile.mkdtemp(prefix="sfalt-"))
    redis_srv = pg = None
    results: dict[str, list[float]] = {}
    try:
        redis_srv, pg = Redis(root), Postgres(root)
        wide = {"kind": "snowfence", "workers": 2, "ready": 16, "args": ["--ids-per-worker", "8"]}
        with (
            servers({"node": {"kind": "snowfence", "workers": 2}, "wide": wide}) as s,
            Client(s["node"].endpoint) as client,
            Client(s["wide"].endpoint) as wide_client,
        ):
            cases = {
                "snowfence, 2 workers x 8 worker IDs, reserve(262,144)": lambda: sum(
                    b.count for b in wide_client.reserve(262_144)
                ),
                "snowfence, blocks of 4,096 (reserve(65,536), pipelined)": lambda: sum(
                    b.count for b in client.reserve(65_536)
                ),
                "snowfence, one ID per request": lambda: sum(b.count for b in client.reserve(1)),
                "snowfence, Client.ids() (prefetching)": lambda: sum(
                    1 for _ in zip(range(65_536), ids_stream, strict=False)
                ),
                "Redis INCRBY 4096 (block allocator)": redis_srv.block,
                "Redis INCR, 16 pipelined": redis_srv.single_pipelined,
                "Redis INCR, one per round trip": redis_srv.single,
                "PostgreSQL nextval() over generate_series(1, 4096)": pg.block,
                "PostgreSQL nextval() per ID (CACHE 1000)": pg.single,
                "uuid7, in-process (128 bits)": lambda: sum(1 for _ in range(1000) if uuid7()),
            }
            ids_stream = client.ids()
            for run in range(args.runs):
                for name, fn in cases.items():
                    results.setdefault(name, []).append(timed(fn, args.seconds))
                print(f"run {run + 1} done", flush=True)
    finally:
        if pg is not None:
            pg.stop()
        if redis_srv is not None:
            redis_srv.stop()
        shutil.rmtree(root, ignore_errors=True)
    base = median(results["snowfence, blocks of 4,096 (reserve(65,536), pipelined)"])
    print(f"\n| allocator | IDs/s (median of {args.runs}) | vs snowfence blocks |")
    print("|---|---|---|")
    for name, values in results.items():
        print(f"| {name} | {median(values):,.0f} | {median(values) / base:.2f} |")


if __name__ == "__main__":
    main()
