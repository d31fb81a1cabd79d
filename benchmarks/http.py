"""The HTTP door beside the other doors: parsers, single-ID round trips, shares under load.

* ``--scenario parsers``: what parsing one ``curl`` request costs with ``httptools``
  (llhttp, which the door uses) and with ``h11`` (pure Python, sans-I/O), in this
  process; for h11 also with the response it builds, since the door would use its
  writer too.
* ``--scenario latency``: one ID per round trip from one Python process, each variant
  in turn one call at a time (as benchmarks/single_id.py does), against nodes this
  script starts on TCP loopback with their defaults: an HTTP keep-alive client
  (``http.client``), a bare keep-alive socket writing the request and reading the
  response (what the HTTP client library costs), ``Client.reserve(1)`` (the fast port),
  and ``Client.reserve(1)`` against a node with ``--fast-bind off`` (ZeroMQ). Then
  ``curl`` run once per ID, as a shell script would: the whole run (process start,
  connection, request) and curl's own ``time_total``.
* ``--scenario fair``: three client processes, each flooding one door (ZeroMQ: 256
  RESERVEs of 4,096 in flight; the fast port: the same; HTTP: 16 pipelined
  ``GET /v1/ids?count=20000&blocks=1``), their shares of the node's IDs over the same
  window, and every block checked against every other (no ID twice).

    python benchmarks/http.py [--scenario parsers|latency|fair|all] [--runs 3] [--duration 3]

tests/integration/test_http_door.py runs the fair scenario, shorter.
"""

from __future__ import annotations

import os
import sys

# This file is named like the standard library's http package: its own directory must
# come after the standard library's, or ``import http.client`` (here, or in any library)
# would import this file instead.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE] + [_HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

BUCKET_NS = 100_000_000
CURL_REQUEST = b"GET /v1/ids?count=1 HTTP/1.1\r\nHost: 127.0.0.1:40000\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n"


# -- parsers ----------------------------------------------------------------------------------


def parsers(n: int = 100_000) -> dict:
    """Microseconds per request: httptools parsing (one request per feed, as the door sees a
    keep-alive client's), h11 parsing, and h11 parsing with its response written."""
    import h11
    import httptools

    class Protocol:
        def __init__(self) -> None:
            self.url = b""
            self.n = 0

        def on_url(self, url: bytes) -> None:
            self.url = url

        def on_message_complete(self) -> None:
            self.n += 1

    out = {}
    proto = Protocol()
    parser = httptools.HttpRequestParser(proto)
    t0 = time.perf_counter()
    for _ in range(n):
        parser.feed_data(CURL_REQUEST)
        parser.should_keep_alive()
        parser.get_method()
    out["httptools_us"] = (time.perf_counter() - t0) / n * 1e6
    assert proto.n == n

    conn = h11.Connection(h11.SERVER)
    t0 = time.perf_counter()
    for _ in range(n):
        conn.receive_data(CURL_REQUEST)
        assert type(conn.next_event()) is h11.Request
        assert type(conn.next_event()) is h11.EndOfMessage
        conn.send(h11.Response(status_code=200, headers=[("content-length", "0")]))
        conn.send(h11.EndOfMessage())
        conn.start_next_cycle()
    out["h11_us"] = (time.perf_counter() - t0) / n * 1e6

    body = b'{"ids":["122793300666093568"]}'
    conn = h11.Connection(h11.SERVER)
    t0 = time.perf_counter()
    for _ in range(n):
        conn.receive_data(CURL_REQUEST)
        conn.next_event()
        conn.next_event()
        head = [("content-type", "application/json"), ("content-length", str(len(body))), ("cache-control", "no-store")]
        conn.send(h11.Response(status_code=200, headers=head))
        conn.send(h11.Data(data=body))
        conn.send(h11.EndOfMessage())
        conn.start_next_cycle()
    out["h11_with_response_us"] = (time.perf_counter() - t0) / n * 1e6
    return out


# -- latency ------------------------------------------------------------------------------------


def http_port(endpoint: str) -> int:
    from snowfence import Client

    with Client(endpoint, timeout_s=5.0, discover=False) as c:
        return c.nodes()["http_port"]


def quantiles(samples_ns: list[int]) -> dict:
    s = sorted(samples_ns)
    return {"p50": s[len(s) // 2] / 1000, "p99": s[min(len(s) - 1, int(len(s) * 0.99))] / 1000, "n": len(s)}


def latency(fast_endpoint: str, zmq_endpoint: str, duration_s: float, curl_runs: int) -> dict:
    import http.client

    from single_id import alternating

    from snowfence import Client

    port = http_port(fast_endpoint)
    keep = http.client.HTTPConnection("127.0.0.1", port, timeout=5)

    def http_client() -> None:
        keep.request("GET", "/v1/ids")
        r = keep.getresponse()
        body = r.read()
        assert r.status == 200, body

    raw = socket.create_connection(("127.0.0.1", port))
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    request = b"GET /v1/ids HTTP/1.1\r\nHost: x\r\n\r\n"

    def http_raw() -> None:
        raw.sendall(request)
        data = raw.recv(4096)
        while not data.endswith(b"]}"):
            data += raw.recv(4096)

    with Client(fast_endpoint, timeout_s=5.0) as fast, Client(zmq_endpoint, timeout_s=5.0) as zmq_client:
        out = alternating(
            {
                "http_keepalive_http_client": http_client,
                "http_keepalive_raw_socket": http_raw,
                "client_fast_port": lambda: fast.reserve(1),
                "client_zeromq": lambda: zmq_client.reserve(1),
            },
            duration_s,
        )
        assert fast._fast is not None and zmq_client._fast is None
    keep.close()
    raw.close()
    out.update(curl(port, curl_runs))
    return out


def curl(port: int, runs: int) -> dict:
    """``curl`` once per ID: the whole run, and curl's own time_total."""
    url = f"http://127.0.0.1:{port}/v1/ids"
    whole, own = [], []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        p = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{time_total}", url], capture_output=True)
        whole.append(time.perf_counter_ns() - t0)
        assert p.returncode == 0, p.stderr
        own.append(int(float(p.stdout) * 1e9))
    return {"curl_process": quantiles(whole), "curl_time_total": quantiles(own)}


# -- fair shares ------------------------------------------------------------------------------


def _bucket(buckets: dict, n: int) -> None:
    b = time.monotonic_ns() // BUCKET_NS
    buckets[b] = buckets.get(b, 0) + n


def role_zmq(endpoint: str, depth: int, duration_s: float) -> dict:
    """Keep ``depth`` RESERVEs of 4,096 in flight on a DEALER."""
    import zmq

    from snowfence import protocol

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    buckets: dict[int, int] = {}
    blocks, errors = [], 0
    for rid in range(depth):
        sock.send(protocol.encode_reserve(rid + 1, 4096))
    rid = depth
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
                _bucket(buckets, reply.count)
                blocks.append((reply.first, reply.count))
            else:
                errors += 1
            rid += 1
            sock.send(protocol.encode_reserve(rid, 4096))
    sock.close()
    ctx.term()
    return {"buckets": buckets, "blocks": blocks, "errors": errors}


def role_fast(endpoint: str, depth: int, duration_s: float) -> dict:
    """Keep ``depth`` RESERVEs of 4,096 in flight on the fast port."""
    from snowfence import Client, protocol

    with Client(endpoint, timeout_s=5.0, discover=False) as c:
        port = c.nodes()["fast_port"]
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(0.1)
    stream = protocol.Stream(1 << 24)
    buckets: dict[int, int] = {}
    blocks, errors = [], 0
    sock.sendall(b"".join(protocol.encode_stream(protocol.encode_reserve(i + 1, 4096)) for i in range(depth)))
    rid = depth
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        try:
            data = sock.recv(1 << 16)
        except TimeoutError:
            continue
        if not data:
            break
        out = []
        for body in stream.feed(data):
            reply = protocol.decode_reply(body)
            if reply.type == protocol.BLOCK:
                _bucket(buckets, reply.count)
                blocks.append((reply.first, reply.count))
            else:
                errors += 1
            rid += 1
            out.append(protocol.encode_stream(protocol.encode_reserve(rid, 4096)))
        sock.sendall(b"".join(out))
    sock.close()
    return {"buckets": buckets, "blocks": blocks, "errors": errors}


def role_http(endpoint: str, depth: int, duration_s: float, count: int = 20_000) -> dict:
    """Keep ``depth`` pipelined ``GET /v1/ids?count=...&blocks=1`` in flight on one connection."""
    import httptools

    port = http_port(endpoint)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(0.1)
    request = f"GET /v1/ids?count={count}&blocks=1 HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    buckets: dict[int, int] = {}
    blocks: list[tuple[int, int]] = []
    done: list[tuple[int, bytes]] = []

    class Reader:
        body = b""

        def on_body(self, chunk: bytes) -> None:
            self.body += chunk

        def on_message_complete(self) -> None:
            done.append((parser.get_status_code(), self.body))
            self.body = b""

    parser = httptools.HttpResponseParser(Reader())
    errors = 0
    sock.sendall(request * depth)
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            continue
        if not data:
            break
        parser.feed_data(data)
        for status, body in done:
            if status == 200:
                got = [(int(b["first"]), b["count"]) for b in json.loads(body)["blocks"]]
                _bucket(buckets, sum(c for _, c in got))
                blocks += got
            else:
                errors += 1
        if done:
            sock.sendall(request * len(done))
            done.clear()
    sock.close()
    return {"buckets": buckets, "blocks": blocks, "errors": errors}


ROLES = {"zmq": role_zmq, "fast": role_fast, "http": role_http}


def spawn(role: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, role, json.dumps(kw)], stdout=subprocess.PIPE, text=True)


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


def overlaps(blocks: list[tuple[int, int]]) -> int:
    """Blocks that share an ID with the block before them, in order of their first ID."""
    s = sorted(blocks)
    return sum(1 for (f0, c0), (f1, _) in zip(s, s[1:], strict=False) if f0 + c0 > f1)


def fair(endpoint: str, duration_s: float, depth: int = 256, http_depth: int = 16) -> dict:
    """One client per door, each flooding it: shares of the IDs all three received in the same window."""
    names = ["zmq", "fast", "http"]
    procs = [
        spawn("zmq", endpoint=endpoint, depth=depth, duration_s=duration_s + 2.0),
        spawn("fast", endpoint=endpoint, depth=depth, duration_s=duration_s + 2.0),
        spawn("http", endpoint=endpoint, depth=http_depth, duration_s=duration_s + 2.0),
    ]
    results = [collect(p, duration_s + 60) for p in procs]
    # The window all three were running at full pipeline: skip the first and last second.
    firsts = [min(map(int, r["buckets"]), default=0) for r in results]
    lasts = [max(map(int, r["buckets"]), default=0) for r in results]
    lo, hi = max(firsts) + 10, min(lasts) - 10
    counts = [sum(v for k, v in r["buckets"].items() if lo <= int(k) < hi) for r in results]
    window_s = max(hi - lo, 1) * BUCKET_NS / 1e9
    total = sum(counts)
    every = [tuple(b) for r in results for b in r["blocks"]]
    return {
        "doors": names,
        "window_s": window_s,
        "ids_per_s": [c / window_s for c in counts],
        "shares": [c / total if total else 0.0 for c in counts],
        "errors": [r["errors"] for r in results],
        "ids": sum(c for _, c in every),
        "overlapping_blocks": overlaps(every),
    }


# -- the script -----------------------------------------------------------------------------------


def start(root: Path, name: str, workers: int, *args: str) -> tuple[subprocess.Popen, str]:
    log = open(root / f"{name}.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "snowfence", "serve", "--bind", "tcp://127.0.0.1:0", "--workers", str(workers),
         "--state-dir", str(root / f"{name}-state"), *args],
        stdout=log, stderr=log, start_new_session=True,
    )  # fmt: skip
    log.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = (root / f"{name}.log").read_text()
        if "snowfence serving on " in text:
            endpoint = text.split("snowfence serving on ", 1)[1].split()[0]
            from common import wait_ready
            from single_id import wait_own_worker_id

            wait_ready(endpoint, workers)
            wait_own_worker_id(endpoint)
            return proc, endpoint
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not start: see {root / (name + '.log')}")


def main() -> None:
    import signal

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="all", choices=["parsers", "latency", "fair", "all"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--curl-runs", type=int, default=300)
    args = parser.parse_args()
    if args.scenario in ("parsers", "all"):
        rows = [parsers() for _ in range(args.runs)]
        print(
            "parsing one curl request: "
            + ", ".join(f"{k.removesuffix('_us')} {statistics.median(r[k] for r in rows):.2f} us" for k in rows[0])
            + f" (medians of {args.runs})",
            flush=True,
        )
    if args.scenario == "parsers":
        return
    root = Path(tempfile.mkdtemp(prefix="sfhttp-"))
    procs = []
    try:
        if args.scenario in ("latency", "all"):
            a, fast_ep = start(root, "doors", 1)
            procs.append(a)
            # A region of its own beside "doors" (a host serves a region from one state directory).
            b, zmq_ep = start(root, "zeromq", 1, "--fast-bind", "off", "--region", "1")
            procs.append(b)
            rows = [latency(fast_ep, zmq_ep, args.duration, args.curl_runs) for _ in range(args.runs)]
            print(f"single ID round trip, us (medians of {args.runs} runs' p50 and p99):", flush=True)
            for k in rows[0]:
                p50 = statistics.median(r[k]["p50"] for r in rows)
                p99 = statistics.median(r[k]["p99"] for r in rows)
                print(f"  {k:30} p50 {p50:8.1f}  p99 {p99:8.1f}  (n={rows[0][k]['n']})", flush=True)
            for p in procs:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(10)
            procs.clear()
        if args.scenario in ("fair", "all"):
            c, ep = start(root, "fair", 2)
            procs.append(c)
            for _ in range(args.runs):
                r = fair(ep, args.duration)
                shares = " / ".join(f"{d} {s:.3f}" for d, s in zip(r["doors"], r["shares"], strict=True))
                print(
                    f"three doors flooded at once: shares {shares}; {sum(r['ids_per_s']) / 1e6:.2f}M IDs/s together; "
                    f"errors {r['errors']}; {r['ids']} IDs, overlapping blocks {r['overlapping_blocks']}",
                    flush=True,
                )
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(p.pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ROLES:
        print(json.dumps(ROLES[sys.argv[1]](**json.loads(sys.argv[2]))))
    else:
        main()
