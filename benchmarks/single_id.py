"""One ID per round trip, from one Python process: snowfence beside Redis, side by side.

What a user who takes one ID per event (a web request creating one row) compares.
Each round measures, one after the other in this process, for ``--duration`` s each:

- ``Client.reserve(1)`` of snowfence's blocking client against a node on TCP loopback
  with its defaults: the client learns the node's fast port (plain TCP) and its broker
  answers the request itself, from its own worker ID;
- the same request from a bare TCP socket on that fast port (what the client library costs);
- ``Client.reserve(1)`` against a node with the fast port but without the broker's
  minting (``--broker-mint-max-ids 0``: the broker hands the request to a worker);
- ``Client.reserve(1)`` over ZeroMQ alone (``--fast-bind off``), with the broker's minting
  (one ZeroMQ hop) and without (two hops: client to broker, broker to worker, the
  path of the releases before the fast port);
- Redis ``INCR`` through redis-py, one per round trip, on TCP loopback;
- a bare pyzmq ROUTER echo in another Python process (one ZeroMQ hop, no work);
- ``AsyncClient.reserve(1)`` (fast port and broker minting; ZeroMQ and two hops) and
  redis-py's asyncio client, likewise (uvloop if installed).

Rounds interleave the variants; the table shows the median over rounds of each
round's p50 and p99. Then, head to head, each snowfence client and its redis-py
counterpart alternate one call each for ``--duration`` s per round, so that both meet
the same moment's noise (from one variant's turn to the next, a p99 on a virtual
machine moves by tens of microseconds). The nodes are started by this script (``snowfence serve`` on
free ports, their defaults otherwise), as are Redis (Debian's ``redis-server``) and
the echo; all are stopped at the end. Needs ``pip install -e '.[bench]'`` (redis-py
uses hiredis, its faster parser, when that is installed: the table says which).

On a machine with few cores, where the scheduler puts a server decides much of a
round trip: a server woken on the client's own core answers in a fraction of the
time of one woken on another (a wake-up across cores costs tens of microseconds on a
virtual machine), and it may pick differently for Redis and for snowfence. ``--pin``
takes that out: every server process on the last core, this client on the first, so
each round trip crosses cores both ways, as it does between two hosts.

    python benchmarks/single_id.py [--runs 3] [--duration 3] [--pin] [--serve-args "..."]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import median, own_region, wait_ready

from snowfence import AsyncClient, Client, protocol

ECHO = """
import sys, zmq
ctx = zmq.Context()
s = ctx.socket(zmq.ROUTER)
s.bind(sys.argv[1])
reply = bytes.fromhex(sys.argv[2])
print("ready", flush=True)
while True:
    ident, body = s.recv_multipart()
    s.send_multipart([ident, reply])
"""


def wait_own_worker_id(endpoint: str, timeout_s: float = 20.0) -> None:
    """Until the node's broker mints small requests itself (its own worker ID is ready)."""
    deadline = time.monotonic() + timeout_s
    with Client(endpoint, timeout_s=2.0) as client:
        while time.monotonic() < deadline:
            own = client.status()["broker"].get("own_worker_id") or {}
            if own.get("ready"):
                return
            time.sleep(0.1)
    raise RuntimeError(f"{endpoint}: the broker's own worker ID is not ready")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quantiles(samples_ns: list[int]) -> dict:
    s = sorted(samples_ns)
    return {"p50": s[len(s) // 2] / 1000, "p99": s[min(len(s) - 1, int(len(s) * 0.99))] / 1000, "n": len(s)}


def alternating(calls: dict, duration_s: float) -> dict:
    """Each call in turn, one at a time, for ``duration_s``: every call meets the same
    moment's noise as the others (a round of one variant after another does not)."""
    for _ in range(200):
        for call in calls.values():
            call()
    out: dict[str, list[int]] = {name: [] for name in calls}
    pairs = [(out[name], call) for name, call in calls.items()]
    end = time.monotonic() + duration_s
    clock = time.perf_counter_ns
    while time.monotonic() < end:
        for samples, call in pairs:
            t0 = clock()
            call()
            samples.append(clock() - t0)
    return {name: quantiles(samples) for name, samples in out.items()}


async def aalternating(calls: dict, duration_s: float) -> dict:
    for _ in range(200):
        for call in calls.values():
            await call()
    out: dict[str, list[int]] = {name: [] for name in calls}
    pairs = [(out[name], call) for name, call in calls.items()]
    end = time.monotonic() + duration_s
    clock = time.perf_counter_ns
    while time.monotonic() < end:
        for samples, call in pairs:
            t0 = clock()
            await call()
            samples.append(clock() - t0)
    return {name: quantiles(samples) for name, samples in out.items()}


def timed(call, duration_s: float) -> dict:
    return alternating({"": call}, duration_s)[""]


async def atimed(call, duration_s: float) -> dict:
    return (await aalternating({"": call}, duration_s))[""]


def head_to_head(endpoint: str, redis_port: int, duration_s: float) -> dict:
    import redis

    r = redis.Redis(host="127.0.0.1", port=redis_port)
    with Client(endpoint, timeout_s=5.0) as client:
        try:
            return alternating({"snowfence": lambda: client.reserve(1), "redis": lambda: r.incr("id")}, duration_s)
        finally:
            r.close()


async def ahead_to_head(endpoint: str, redis_port: int, duration_s: float) -> dict:
    import redis.asyncio as aredis

    r = aredis.Redis(host="127.0.0.1", port=redis_port)
    async with AsyncClient(endpoint, timeout_s=5.0) as client:
        try:
            return await aalternating(
                {"snowfence": lambda: client.reserve(1), "redis": lambda: r.incr("id")}, duration_s
            )
        finally:
            await r.aclose()


def snowfence_client(endpoint: str, duration_s: float) -> dict:
    with Client(endpoint, timeout_s=5.0) as client:
        return timed(lambda: client.reserve(1), duration_s)


def raw_fast(endpoint: str, duration_s: float) -> dict:
    """A bare blocking TCP socket on the node's fast port (learned from NODES)."""
    with Client(endpoint, timeout_s=5.0) as client:
        port = client.nodes()["fast_port"]
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ids = iter(range(1, 1 << 62))

    def call():
        sock.sendall(protocol.encode_stream(protocol.encode_reserve(next(ids), 1)))
        protocol.decode_reply(sock.recv(64)[4:])

    try:
        return timed(call, duration_s)
    finally:
        sock.close()


def redis_incr(port: int, duration_s: float) -> dict:
    import redis

    r = redis.Redis(host="127.0.0.1", port=port)
    try:
        return timed(lambda: r.incr("id"), duration_s)
    finally:
        r.close()


def zmq_echo(endpoint: str, duration_s: float) -> dict:
    import zmq

    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    request = protocol.encode_reserve(1, 1)

    def call():
        sock.send(request)
        sock.recv()

    try:
        return timed(call, duration_s)
    finally:
        sock.close(0)


async def async_snowfence(endpoint: str, duration_s: float) -> dict:
    async with AsyncClient(endpoint, timeout_s=5.0) as client:
        return await atimed(lambda: client.reserve(1), duration_s)


async def async_redis(port: int, duration_s: float) -> dict:
    import redis.asyncio as aredis

    r = aredis.Redis(host="127.0.0.1", port=port)
    try:
        return await atimed(lambda: r.incr("id"), duration_s)
    finally:
        await r.aclose()


def run_async(coro):
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per variant per round")
    parser.add_argument("--serve-args", default="", help="more arguments for snowfence serve")
    parser.add_argument("--pin", action="store_true", help="servers on the last core, this client on the first")
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        sys.exit("redis-server is not installed (Debian: apt-get install redis-server)")
    root = Path(tempfile.mkdtemp(prefix="sf-single-"))
    redis_port, echo_port = free_port(), free_port()
    echo_ep = f"tcp://127.0.0.1:{echo_port}"
    #: name: (endpoint, serve arguments beyond the defaults)
    nodes = {
        "fast": (f"tcp://127.0.0.1:{free_port()}", []),
        "fast-worker": (f"tcp://127.0.0.1:{free_port()}", ["--broker-mint-max-ids", "0"]),
        "zmq-one": (f"tcp://127.0.0.1:{free_port()}", ["--fast-bind", "off"]),
        "zmq-two": (f"tcp://127.0.0.1:{free_port()}", ["--fast-bind", "off", "--broker-mint-max-ids", "0"]),
    }
    cores = sorted(os.sched_getaffinity(0))
    if args.pin and len(cores) < 2:
        sys.exit("--pin needs two cores")
    pin = ["taskset", "-c", str(cores[-1])] if args.pin else []
    fast_ep, worker_ep, one_ep, two_ep = (nodes[n][0] for n in ("fast", "fast-worker", "zmq-one", "zmq-two"))
    procs = []
    try:
        for index, (name, (endpoint, extra)) in enumerate(nodes.items()):
            serve = [
                *pin,
                sys.executable,
                "-m",
                "snowfence",
                "serve",
                "--bind",
                endpoint,
                "--state-dir",
                str(root / name),
            ]
            serve += extra + shlex.split(args.serve_args)
            serve += own_region(index, serve)
            log = open(root / f"serve-{name}.log", "ab")
            procs.append(subprocess.Popen(serve, stdout=log, stderr=log, start_new_session=True))
        procs.append(
            subprocess.Popen(
                [
                    *pin,
                    "redis-server",
                    "--port",
                    str(redis_port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        reply = protocol.encode_block(1, 1 << 40, 1).hex()
        echo = subprocess.Popen(
            [*pin, sys.executable, "-c", ECHO, echo_ep, reply],
            stdout=subprocess.PIPE,
            start_new_session=True,
            text=True,
        )
        procs.append(echo)
        echo.stdout.readline()
        for endpoint, _ in nodes.values():
            wait_ready(endpoint, 1)
        wait_own_worker_id(fast_ep)
        wait_own_worker_id(one_ep)
        import redis

        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(host="127.0.0.1", port=redis_port).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        variants = {
            "snowfence Client.reserve(1), default node": lambda: snowfence_client(fast_ep, args.duration),
            "a bare TCP socket, fast port": lambda: raw_fast(fast_ep, args.duration),
            "snowfence Client.reserve(1), fast port, worker mints": lambda: snowfence_client(worker_ep, args.duration),
            "snowfence Client.reserve(1), ZeroMQ, one hop": lambda: snowfence_client(one_ep, args.duration),
            "snowfence Client.reserve(1), ZeroMQ, two hops": lambda: snowfence_client(two_ep, args.duration),
            "Redis INCR, redis-py": lambda: redis_incr(redis_port, args.duration),
            "pyzmq ROUTER echo (one hop)": lambda: zmq_echo(echo_ep, args.duration),
            "snowfence AsyncClient.reserve(1), default node": lambda: run_async(
                async_snowfence(fast_ep, args.duration)
            ),
            "snowfence AsyncClient.reserve(1), ZeroMQ, two hops": lambda: run_async(
                async_snowfence(two_ep, args.duration)
            ),
            "Redis INCR, redis-py asyncio": lambda: run_async(async_redis(redis_port, args.duration)),
        }
        if args.pin:
            os.sched_setaffinity(0, {cores[0]})
        import redis.utils

        parser_name = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "its Python parser"
        print(f"redis-py {redis.__version__} with {parser_name}; {'pinned' if args.pin else 'not pinned'}", flush=True)
        results: dict[str, list[dict]] = {name: [] for name in variants}
        for run in range(1, args.runs + 1):
            for name, fn in variants.items():
                r = fn()
                results[name].append(r)
                line = f"run {run} {name:52s} p50 {r['p50']:7.0f}  p99 {r['p99']:7.0f} us  ({r['n']:,} calls)"
                print(line, flush=True)
        # Head to head: snowfence's client and redis-py's, one call each in turn.
        pairs = {
            "blocking: Client.reserve(1) / redis-py INCR": lambda: head_to_head(fast_ep, redis_port, args.duration),
            "asyncio: AsyncClient.reserve(1) / redis-py asyncio INCR": lambda: run_async(
                ahead_to_head(fast_ep, redis_port, args.duration)
            ),
        }
        duels: dict[str, list[dict]] = {name: [] for name in pairs}
        for run in range(1, args.runs + 1):
            for name, fn in pairs.items():
                r = fn()
                duels[name].append(r)
                s_, r_ = r["snowfence"], r["redis"]
                quant = f"p50 {s_['p50']:5.0f} / {r_['p50']:5.0f}  p99 {s_['p99']:5.0f} / {r_['p99']:5.0f} us"
                print(f"run {run} {name:56s} {quant}", flush=True)
        print(f"\n{args.runs} rounds of {args.duration:g} s each, interleaved; medians of each round's quantiles\n")
        print("| one ID per round trip | p50 us | p99 us | p50 per round | p99 per round |")
        print("|---|---|---|---|---|")
        for name, rs in results.items():
            p50s, p99s = [r["p50"] for r in rs], [r["p99"] for r in rs]
            print(
                f"| {name} | {median(p50s):,.0f} | {median(p99s):,.0f} | "
                f"{', '.join(f'{v:,.0f}' for v in p50s)} | {', '.join(f'{v:,.0f}' for v in p99s)} |"
            )
        print("\nHead to head: one call of each in turn, the default node's fast port against Redis; us\n")
        print("| clients | p50 snowfence / Redis | p99 snowfence / Redis | p99 per round, snowfence / Redis |")
        print("|---|---|---|---|")
        for name, rs in duels.items():
            med = {k: {q: median([r[k][q] for r in rs]) for q in ("p50", "p99")} for k in ("snowfence", "redis")}
            rounds = ", ".join(f"{r['snowfence']['p99']:,.0f} / {r['redis']['p99']:,.0f}" for r in rs)
            print(
                f"| {name} | {med['snowfence']['p50']:,.0f} / {med['redis']['p50']:,.0f} "
                f"| {med['snowfence']['p99']:,.0f} / {med['redis']['p99']:,.0f} | {rounds} |"
            )
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
