"""The example C client (examples/c/snowfence_client.c): built with the system compiler, run
against the real server, and against a scripted fake server for its error handling."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest
import sfwire
import zmq

SOURCE = Path(__file__).resolve().parents[2] / "examples" / "c" / "snowfence_client.c"
RUN_TIMEOUT_S = 30
DECIMAL = re.compile(r"[1-9][0-9]*")


@pytest.fixture(scope="module")
def c_client(tmp_path_factory) -> Path:
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler: `cc` is not on PATH (install gcc or clang)")
    pkg_config = shutil.which("pkg-config")
    if pkg_config is None:
        pytest.skip("pkg-config is not on PATH (needed to find libzmq; install pkg-config)")
    if subprocess.run([pkg_config, "--exists", "libzmq"]).returncode != 0:
        pytest.skip("libzmq development files not found by `pkg-config --exists libzmq` (install libzmq3-dev)")
    flags = subprocess.run(
        [pkg_config, "--cflags", "--libs", "libzmq"], capture_output=True, text=True, check=True
    ).stdout.split()
    out = tmp_path_factory.mktemp("c-client") / "snowfence_client"
    build = subprocess.run(
        [cc, "-std=c99", "-O2", "-Wall", "-Wextra", "-o", str(out), str(SOURCE), *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert build.returncode == 0, f"build failed:\n{build.stderr}"
    assert "warning" not in build.stderr, f"the example should build without warnings:\n{build.stderr}"
    return out


def run(client: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(client), *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


# -- against the real server -------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 4096, 10_000])
def test_c_client_reserves_n_unique_ids(c_client, server, n):
    st = server.status()
    layout = sfwire.Layout.of(st)
    workers = sfwire.held_worker_ids(st)
    proc = run(c_client, server.endpoint, str(n))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert proc.stdout.endswith("\n") and len(lines) == n
    assert all(DECIMAL.fullmatch(line) for line in lines), "every line is one positive decimal ID"
    ids = [int(line) for line in lines]
    assert len(set(ids)) == n, "IDs are unique"
    now_ms = time.time() * 1000
    for id_ in ids:
        assert 0 < id_ < 2**63
        d = layout.decode(id_)
        assert d.worker in workers, f"{id_} decodes to worker {d.worker}, not in {sorted(workers)}"
        assert d.region == st["region"]
        assert abs(d.unix_ms - now_ms) < 60_000, d


def test_c_client_usage_errors(c_client):
    for args in ((), ("ipc:///nowhere",), ("ipc:///nowhere", "-1"), ("ipc:///nowhere", "12x")):
        proc = run(c_client, *args)
        assert proc.returncode == 2, (args, proc)
        assert "usage" in proc.stderr and proc.stdout == ""


def test_c_client_lists_the_nodes_of_the_cluster(c_client, server):
    proc = run(c_client, server.endpoint, "--nodes")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [n["endpoints"] for n in doc["nodes"]] == [[server.endpoint]]


def test_c_client_zero_ids(c_client, server):
    proc = run(c_client, server.endpoint, "0")
    assert (proc.returncode, proc.stdout) == (0, "")


# -- against a scripted fake server --------------------------------------------------------


def block(rid: int, first: int, count: int) -> bytes:
    return struct.pack("!BBHQQI", 1, sfwire.BLOCK, 0, rid, first, count)


def error(rid: int, code: str, retriable: bool, message: str = "scripted") -> bytes:
    doc = json.dumps({"code": code, "message": message, "retriable": retriable})
    return sfwire.header(sfwire.ERROR, rid) + doc.encode()


class FakeServer:
    """A ROUTER that answers the i-th request with ``script[i](request_id, count)``
    (None: no reply). Records every request as ``(routing_id, frames)``."""

    def __init__(self, tmp_path: Path, script) -> None:
        self.endpoint = f"ipc://{tmp_path}/fake.sock"
        self.script = list(script)
        self.requests: list[tuple[bytes, list[bytes]]] = []
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not self._stop.is_set() and time.monotonic() < deadline:
            if not self.sock.poll(50):
                continue
            ident, *frames = self.sock.recv_multipart()
            self.requests.append((ident, frames))
            i = len(self.requests) - 1
            if i >= len(self.script):
                continue
            _, _, _, rid, count = sfwire.RESERVE_BODY.unpack(frames[-1])
            reply = self.script[i](rid, count)
            if reply is not None:
                self.sock.send_multipart([ident, reply])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close(0)
        self.ctx.term()

    def reserves(self) -> list[tuple[int, int]]:
        """``(request_id, count)`` of every request, after checking it is a well-formed RESERVE."""
        out = []
        for _, frames in self.requests:
            assert len(frames) == 1, "a DEALER client sends the body frame alone"
            version, type_, flags, rid, count = sfwire.RESERVE_BODY.unpack(frames[0])
            assert (version, type_, flags) == (1, sfwire.RESERVE, 0)
            assert 1 <= count <= sfwire.MAX_COUNT
            out.append((rid, count))
        return out


@pytest.fixture
def fake(tmp_path):
    made = []

    def make(script) -> FakeServer:
        made.append(FakeServer(tmp_path, script))
        return made[-1]

    yield make
    for f in made:
        f.close()


def test_c_client_retries_retriable_errors_and_completes_partial_grants(c_client, fake):
    srv = fake(
        [
            lambda rid, n: error(rid, "unavailable", True),
            lambda rid, n: error(rid, "a_code_from_the_future", True),  # unknown: judged by its flag
            lambda rid, n: block(rid, 1000, 3),  # partial grant: 3 of 5
            lambda rid, n: block(rid, 5000, n),
        ]
    )
    proc = run(c_client, srv.endpoint, "5")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1000", "1001", "1002", "5000", "5001"]
    assert "unavailable" in proc.stderr and "a_code_from_the_future" in proc.stderr
    reqs = srv.reserves()
    assert [n for _, n in reqs] == [5, 5, 5, 2], "retries ask again; after a partial grant, for the rest"
    rids = [rid for rid, _ in reqs]
    assert rids == sorted(set(rids)) and rids[0] > 0, f"fresh, increasing request ids: {rids}"


def test_c_client_splits_large_requests(c_client, fake):
    srv = fake([lambda rid, n: block(rid, 1 << 40, n)] * 3)
    proc = run(c_client, srv.endpoint, "9000")
    assert proc.returncode == 0, proc.stderr
    assert [n for _, n in srv.reserves()] == [4096, 4096, 808]
    assert len(proc.stdout.split()) == 9000


def test_c_client_stops_on_a_non_retriable_error(c_client, fake):
    # The message holds text that a naive scan would take for a retriable flag or a code.
    tricky = 'see {"retriable": true, "code": "unavailable"} and "retriable":true'
    srv = fake([lambda rid, n: error(rid, "bad_request", False, tricky)] * 3)
    proc = run(c_client, srv.endpoint, "10")
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert "bad_request" in proc.stderr
    assert len(srv.requests) == 1, "a non-retriable error is not retried"


def test_c_client_rejects_a_reply_to_another_request(c_client, fake):
    srv = fake([lambda rid, n: block(rid + 1, 1000, n)])
    proc = run(c_client, srv.endpoint, "10")
    assert proc.returncode != 0
    assert proc.stdout == "", "IDs of a mismatched reply are never printed"
    assert "request" in proc.stderr


def test_c_client_rejects_an_oversized_grant(c_client, fake):
    srv = fake([lambda rid, n: block(rid, 1000, n + 1)])
    proc = run(c_client, srv.endpoint, "10")
    assert proc.returncode != 0 and proc.stdout == ""


def test_c_client_gives_up_after_repeated_retriable_errors(c_client, fake):
    srv = fake([lambda rid, n: error(rid, "overloaded", True)] * 20)
    proc = run(c_client, srv.endpoint, "10")
    assert proc.returncode != 0 and proc.stdout == ""
    assert 2 <= len(srv.requests) <= 10, "a few retries, bounded"


def test_c_client_reconnects_after_a_lost_request(c_client, fake):
    """Rule 3: a request without a reply in time is lost; the retry goes out on a new socket."""
    srv = fake([lambda rid, n: None, lambda rid, n: block(rid, 7000, n)])
    proc = run(c_client, srv.endpoint, "2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["7000", "7001"]
    (first_ident, _), (second_ident, _) = srv.requests
    assert first_ident != second_ident, "the retry must come from a new connection"
