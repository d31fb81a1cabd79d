"""Isolation on a shared node: a noisy neighbour, two greedy clients, a mix.

Real processes throughout: one `snowfence serve` node, and each client in a
process of its own.

* noisy: a client keeps ``--depth`` requests of 4,096 in flight (``pipeline``),
  or sends 20,000 at once and never reads a reply (``silent``); beside it,
  another client calls ``reserve(1)`` in a loop. Its latency is measured alone
  first, then beside each neighbour, in the same run.
* greedy: two clients keep 256 requests of 4,096 in flight each; their shares of
  the node's IDs, counted over the same window, and their sum against the
  layout's ceiling.
* mix: a bulk loader (``reserve(1_000_000)`` in a loop), a streaming pipeline
  (``ids()``), a load test (``snowfence bench``, blocks of 4,096) and a
  ``reserve(1)`` probe, all at once.

    python benchmarks/isolation.py [--scenario noisy|greedy|mix|all] [--duration 5] [--runs 3]
        [-- extra `snowfence serve` arguments, e.g. --worker-queue-ms 1]

The test suite runs the same scenarios, shorter (tests/integration/test_isolation.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUCKET_NS = 100_000_000


# -- client processes (run as `python isolation.py ROLE ...`) ------------------------


def role_greedy(endpoint: str, depth: int, duration_s: float, batch: int) -> dict:
    """Keep ``depth`` requests in flight; IDs received per 100 ms (monotonic buckets)."""
    import zmq

    from snowfence import protocol

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    rid = 0
    buckets: dict[int, int] = {}
    overloaded = errors = 0
    for _ in range(depth):
        rid += 1
        sock.send(protocol.encode_reserve(rid, batch))
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        if not sock.poll(100):
            continue
        while True:
            try:
                body = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            reply = protocol.decode_reply(body)
            if reply.type == protocol.BLOCK:
                b = time.monotonic_ns() // BUCKET_NS
                buckets[b] = buckets.get(b, 0) + reply.count
            elif reply.error is not None and reply.error.code == "overloaded":
                overloaded += 1
            else:
                errors += 1
            rid += 1
            sock.send(protocol.encode_reserve(rid, batch))
    sock.close()
    ctx.term()
    return {"buckets": buckets, "overloaded": overloaded, "errors": errors}


def role_silent(endpoint: str, count: int, duration_s: float, batch: int) -> dict:
    """Send ``count`` requests at once and never read a reply."""
    import zmq

    from snowfence import protocol

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.connect(endpoint)
    for rid in range(1, count + 1):
        sock.send(protocol.encode_reserve(rid, batch))
    time.sleep(duration_s)
    sock.close()
    ctx.term()
    return {}


def role_probe(endpoint: str, duration_s: float) -> dict:
    """``reserve(1)`` in a loop: per-call latency in microseconds."""
    from snowfence import Client

    latencies = []
    with Client(endpoint, timeout_s=5.0) as client:
        client.reserve(1)  # connected
        end = time.monotonic() + duration_s
        while time.monotonic() < end:
            t0 = time.perf_counter_ns()
            client.reserve(1)
            latencies.append((time.perf_counter_ns() - t0) / 1000)
    return summary(latencies)


def role_loader(endpoint: str, duration_s: float) -> dict:
    """A bulk loader: ``reserve(1_000_000)`` again and again."""
    from snowfence import Client

    ids, calls = 0, []
    with Client(endpoint, timeout_s=10.0) as client:
        end = time.monotonic() + duration_s
        while time.monotonic() < end:
            t0 = time.perf_counter()
            ids += sum(b.count for b in client.reserve(1_000_000))
            calls.append(time.perf_counter() - t0)
    return {"ids": ids, "seconds_per_million": statistics.median(calls) if calls else None}


def role_stream(endpoint: str, duration_s: float) -> dict:
    """A streaming pipeline: IDs from ``ids()``, one at a time."""
    from snowfence import Client

    n = 0
    with Client(endpoint, timeout_s=5.0) as client:
        it = client.ids()
        end = time.monotonic() + duration_s
        while time.monotonic() < end:
            for _ in range(1000):
                next(it)
            n += 1000
    return {"ids": n}


ROLES = {
    "greedy": role_greedy,
    "silent": role_silent,
    "probe": role_probe,
    "loader": role_loader,
    "stream": role_stream,
}


def summary(latencies_us: list[float]) -> dict:
    if not latencies_us:
        return {"calls": 0}
    s = sorted(latencies_us)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))]

    return {"calls": len(s), "p50_us": q(0.50), "p90_us": q(0.90), "p99_us": q(0.99), "max_us": s[-1]}


def spawn(role: str, **kw) -> subprocess.Popen:
    args = [sys.executable, str(Path(__file__).resolve()), role, json.dumps(kw)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)


def collect(proc: subprocess.Popen, timeout_s: float) -> dict:
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"client process exited with {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


# -- scenarios ----------------------------------------------------------------------


def noisy(endpoint: str, duration_s: float, neighbour: str, depth: int = 1000) -> dict:
    """A ``reserve(1)`` probe alone, then beside a pipelining or a silent neighbour."""
    alone = collect(spawn("probe", endpoint=endpoint, duration_s=duration_s), duration_s + 30)
    if neighbour == "pipeline":
        noisy_proc = spawn("greedy", endpoint=endpoint, depth=depth, duration_s=duration_s + 2.0, batch=4096)
    else:
        noisy_proc = spawn("silent", endpoint=endpoint, count=20_000, duration_s=duration_s + 2.0, batch=4096)
    time.sleep(1.0)  # the neighbour's pipeline is full
    beside = collect(spawn("probe", endpoint=endpoint, duration_s=duration_s), duration_s + 30)
    collect(noisy_proc, duration_s + 30)
    return {"alone": alone, "beside": beside, "neighbour": neighbour}


def greedy(endpoint: str, duration_s: float, ceiling_ids_per_s: float, depth: int = 256) -> dict:
    """Two greedy clients: shares of the IDs both received in the same window."""
    procs = [spawn("greedy", endpoint=endpoint, depth=depth, duration_s=duration_s + 2.0, batch=4096) for _ in "ab"]
    results = [collect(p, duration_s + 30) for p in procs]
    # The window both were running at full pipeline: skip the first and last second.
    firsts = [min(map(int, r["buckets"]), default=0) for r in results]
    lasts = [max(map(int, r["buckets"]), default=0) for r in results]
    lo, hi = max(firsts) + 10, min(lasts) - 10
    counts = [sum(v for k, v in r["buckets"].items() if lo <= int(k) < hi) for r in results]
    window_s = max(hi - lo, 1) * BUCKET_NS / 1e9
    total = sum(counts)
    return {
        "window_s": window_s,
        "ids_per_s": [c / window_s for c in counts],
        "shares": [c / total if total else 0.0 for c in counts],
        "of_ceiling": total / window_s / ceiling_ids_per_s,
        "overloaded": [r["overloaded"] for r in results],
        "errors": [r["errors"] for r in results],
    }


def mix(endpoint: str, duration_s: float) -> dict:
    """A bulk loader, a streaming pipeline, a load test and a latency probe together."""
    loader = spawn("loader", endpoint=endpoint, duration_s=duration_s)
    stream = spawn("stream", endpoint=endpoint, duration_s=duration_s)
    bench = subprocess.Popen(
        [sys.executable, "-m", "snowfence", "bench", "--connect", endpoint, "--json", "--duration", str(duration_s),
         "--batch", "4096", "--clients", "2", "--depth", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    time.sleep(1.0)
    probe = collect(spawn("probe", endpoint=endpoint, duration_s=max(1.0, duration_s - 2.0)), duration_s + 30)
    out, _ = bench.communicate(timeout=duration_s + 60)
    load = json.loads(out)
    return {
        "probe": probe,
        "loader": collect(loader, duration_s + 60),
        "stream": collect(stream, duration_s + 30),
        "load_test": {"ids_per_s": load["ids_per_s"], "latency_us": load["latency_us"], "errors": load["errors"]},
    }


def ms(us: float) -> str:
    return f"{us / 1000:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="all", choices=["noisy", "greedy", "mix", "all"])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("serve_args", nargs="*", help="extra `snowfence serve` arguments (after --)")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from common import servers

    ceiling = args.workers * 4096 * 1000
    with servers({"node": {"kind": "snowfence", "workers": args.workers, "args": args.serve_args}}) as s:
        ep = s["node"].endpoint
        if args.scenario in ("noisy", "all"):
            for neighbour in ("pipeline", "silent"):
                rows = [noisy(ep, args.duration, neighbour) for _ in range(args.runs)]
                a50 = statistics.median(r["alone"]["p50_us"] for r in rows)
                a99 = statistics.median(r["alone"]["p99_us"] for r in rows)
                b50 = statistics.median(r["beside"]["p50_us"] for r in rows)
                b99 = statistics.median(r["beside"]["p99_us"] for r in rows)
                print(
                    f"noisy neighbour ({neighbour}): reserve(1) alone p50 {ms(a50)} ms p99 {ms(a99)} ms; "
                    f"beside it p50 {ms(b50)} ms p99 {ms(b99)} ms (medians of {args.runs})",
                    flush=True,
                )
        if args.scenario in ("greedy", "all"):
            rows = [greedy(ep, args.duration, ceiling) for _ in range(args.runs)]
            for r in rows:
                print(
                    f"two greedy clients: shares {r['shares'][0]:.3f} / {r['shares'][1]:.3f}, together "
                    f"{r['of_ceiling']:.3f} of the ceiling ({sum(r['ids_per_s']) / 1e6:.2f}M IDs/s)",
                    flush=True,
                )
        if args.scenario in ("mix", "all"):
            for _ in range(args.runs):
                r = mix(ep, args.duration)
                print(
                    f"mix: probe reserve(1) p50 {ms(r['probe']['p50_us'])} ms p99 {ms(r['probe']['p99_us'])} ms; "
                    f"loader {r['loader']['ids'] / args.duration / 1e6:.2f}M IDs/s "
                    f"({r['loader']['seconds_per_million']:.3f} s per million); "
                    f"stream {r['stream']['ids'] / args.duration / 1e6:.2f}M IDs/s; "
                    f"load test {r['load_test']['ids_per_s'] / 1e6:.2f}M IDs/s "
                    f"p99 {ms(r['load_test']['latency_us']['p99'])} ms",
                    flush=True,
                )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ROLES:
        print(json.dumps(ROLES[sys.argv[1]](**json.loads(sys.argv[2]))))
    else:
        main()
