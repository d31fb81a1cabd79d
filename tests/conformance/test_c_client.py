"""The example C client (examples/c/snowfence_client.c): built with the system compiler, run
against the real server, and against a scripted fake server for its error handling; for a
tcp:// endpoint it reserves over the node's fast port (plain TCP), and falls back to ZeroMQ
when that port fails."""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest
import sfwire
import zmq

RUN_TIMEOUT_S = 30
DECIMAL = re.compile(r"[1-9][0-9]*")
NODES = 0x04
NODES_REPLY = 0x84


def run(client: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """The client with ``args``, in an environment without SNOWFENCE_* settings but ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SNOWFENCE_")}
    return subprocess.run(
        [str(client), *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env={**base, **env}
    )


def assert_valid_ids(stdout: str, n: int, st: dict) -> None:
    """``stdout`` is ``n`` unique IDs, one per line, minted by the server whose STATUS is ``st``."""
    layout = sfwire.Layout.of(st)
    workers = sfwire.held_worker_ids(st)
    lines = stdout.splitlines()
    assert stdout.endswith("\n") and len(lines) == n
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


# -- against the real server -------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 4096, 10_000])
def test_c_client_reserves_n_unique_ids(c_client, server, n):
    st = server.status()
    proc = run(c_client, server.endpoint, str(n))
    assert proc.returncode == 0, proc.stderr
    assert_valid_ids(proc.stdout, n, st)


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


# -- the fast port of the real server --------------------------------------------------------


@pytest.fixture(scope="module")
def tcp_server(server, tmp_path_factory):
    """A 1-worker server like the suite's, but bound to tcp://127.0.0.1 on a port the system
    picks: a tcp:// bind gets a fast port (fast_bind auto), the suite's ipc:// one has none.
    Built with the class of the ``server`` fixture; its endpoint is read from its log."""
    srv = type(server)(tmp_path_factory.mktemp("fast"), workers=1)
    srv.endpoint = "tcp://127.0.0.1:0"
    try:
        srv.start()
        deadline = time.monotonic() + 20
        while (found := re.search(r"snowfence serving on (tcp://\S+)", srv.log_tail(200))) is None:
            assert srv.proc.poll() is None, f"server exited; log:\n{srv.log_tail()}"
            assert time.monotonic() < deadline, f"server did not bind; log:\n{srv.log_tail()}"
            time.sleep(0.05)
        srv.endpoint = found.group(1)
        srv.ready_status = srv.wait_ready()
        assert srv.ready_status["broker"]["fast_port"] is not None, "a tcp:// bind has a fast port"
        yield srv
    finally:
        srv.kill()


def fast_stats(srv) -> dict:
    """The broker's fast port counters (STATUS ``broker.fast_port``)."""
    stats = srv.status()["broker"]["fast_port"]
    assert stats is not None, "the server has no fast port"
    return stats


def wait_closed(srv, closed: int) -> dict:
    """The fast port counters once ``closed`` connections have closed (the client's close reaches
    the broker a little after the client exits)."""
    deadline = time.monotonic() + 5
    while (stats := fast_stats(srv))["closed"] < closed and time.monotonic() < deadline:
        time.sleep(0.02)
    return stats


@pytest.mark.parametrize("n", [1, 10_000])
def test_c_client_reserves_over_the_fast_port(c_client, tcp_server, n):
    before = fast_stats(tcp_server)
    proc = run(c_client, tcp_server.endpoint, str(n))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", "the fast port worked: no fall back to ZeroMQ"
    assert_valid_ids(proc.stdout, n, tcp_server.status())
    after = wait_closed(tcp_server, before["closed"] + 1)
    assert after["accepted"] == before["accepted"] + 1, "all its requests on one fast connection"
    assert after["closed"] == before["closed"] + 1, "the client closes its fast connection"
    assert after["connections"] == 0, after
    assert after["requests"] - before["requests"] >= -(-n // 4096), "its RESERVEs came on the fast port"


def test_c_client_uses_zeromq_only_when_told(c_client, tcp_server):
    before = fast_stats(tcp_server)
    proc = run(c_client, tcp_server.endpoint, "100", SNOWFENCE_NO_FAST="1")
    assert proc.returncode == 0, proc.stderr
    assert_valid_ids(proc.stdout, 100, tcp_server.status())
    assert fast_stats(tcp_server)["accepted"] == before["accepted"], "SNOWFENCE_NO_FAST=1: no fast connection"


# -- against a scripted fake server --------------------------------------------------------


def block(rid: int, first: int, count: int) -> bytes:
    return struct.pack("!BBHQQI", 1, sfwire.BLOCK, 0, rid, first, count)


def error(rid: int, code: str, retriable: bool, message: str = "scripted") -> bytes:
    doc = json.dumps({"code": code, "message": message, "retriable": retriable})
    return sfwire.header(sfwire.ERROR, rid) + doc.encode()


def nodes_reply(rid: int, fast_port: object = None, **extra) -> bytes:
    """A NODES_REPLY whose top-level ``fast_port`` is ``fast_port`` (``extra`` replaces members);
    its node's own ``fast_port`` is a decoy (port 1): the client must read the top-level one."""
    doc = {"cluster": None, "nodes": [{"node": "fake", "endpoints": [], "fast_port": 1}], "fast_port": fast_port}
    doc.update(extra)
    return sfwire.header(NODES_REPLY, rid) + json.dumps(doc).encode()


class FakeServer:
    """A ROUTER that answers the i-th RESERVE with ``script[i](request_id, count)`` (None: no
    reply), and each NODES with ``nodes(request_id)``. Records every RESERVE as ``(routing_id,
    frames)`` in ``requests``, every NODES as ``(routing_id, request_id)`` in ``nodes_asked``.
    Bound to ipc://, or with ``tcp`` to tcp://127.0.0.1 (where the client asks NODES)."""

    def __init__(self, tmp_path: Path, script, tcp: bool = False, nodes=None) -> None:
        self.script = list(script)
        self.nodes = nodes or (lambda rid: None)
        self.requests: list[tuple[bytes, list[bytes]]] = []
        self.nodes_asked: list[tuple[bytes, int]] = []
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*" if tcp else f"ipc://{tmp_path}/fake.sock")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not self._stop.is_set() and time.monotonic() < deadline:
            if not self.sock.poll(50):
                continue
            ident, *frames = self.sock.recv_multipart()
            if len(frames[-1]) == sfwire.HEADER_SIZE and frames[-1][1] == NODES:
                rid = sfwire.HEADER.unpack(frames[-1])[3]
                self.nodes_asked.append((ident, rid))
                reply = self.nodes(rid)
                if reply is not None:
                    self.sock.send_multipart([ident, reply])
                continue
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

    def make(script, **kw) -> FakeServer:
        made.append(FakeServer(tmp_path, script, **kw))
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
    assert srv.nodes_asked == [], "an ipc:// endpoint has no fast port: no NODES asked"


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


# -- the fast port, scripted ---------------------------------------------------------------

#: In a fake fast port's script: close the connection here.
CLOSE = object()


def frame(body: bytes) -> bytes:
    """A body as the fast port carries it: its length (u32, big-endian), then itself."""
    return struct.pack("!I", len(body)) + body


class FakeFastPort:
    """A plain TCP listener on 127.0.0.1 that reads length-prefixed RESERVE bodies and answers
    the i-th with ``script[i](request_id, count)``: a list of bytes to send as they are (framed
    or not) and ``CLOSE``; nothing for no reply. ``close_at_once`` closes each connection as
    soon as it is accepted. Records every request body in ``requests``."""

    def __init__(self, script, close_at_once: bool = False) -> None:
        self.script = list(script)
        self.close_at_once = close_at_once
        self.requests: list[bytes] = []
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.port = self.listener.getsockname()[1]
        self.conn: socket.socket | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        buf = b""
        while not self._stop.is_set() and time.monotonic() < deadline:
            if self.conn is None:
                try:
                    self.conn, _ = self.listener.accept()
                except TimeoutError:
                    continue
                self.connections += 1
                self.conn.settimeout(0.05)
                buf = b""
                if self.close_at_once:
                    self._close()
                continue
            try:
                data = self.conn.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if not data:
                self._close()
                continue
            buf += data
            while self.conn is not None and len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from("!I", buf)[0]:
                n = struct.unpack_from("!I", buf)[0]
                body, buf = buf[4 : 4 + n], buf[4 + n :]
                self.requests.append(body)
                i = len(self.requests) - 1
                _, _, _, rid, count = sfwire.RESERVE_BODY.unpack(body)
                for out in self.script[i](rid, count) if i < len(self.script) else ():
                    if out is CLOSE:
                        self._close()
                        break
                    self.conn.sendall(out)

    def _close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._close()
        self.listener.close()

    def reserves(self) -> list[tuple[int, int]]:
        """``(request_id, count)`` of every request, after checking it is a well-formed RESERVE."""
        out = []
        for body in self.requests:
            version, type_, flags, rid, count = sfwire.RESERVE_BODY.unpack(body)
            assert (version, type_, flags) == (1, sfwire.RESERVE, 0)
            assert 1 <= count <= sfwire.MAX_COUNT
            out.append((rid, count))
        return out


@pytest.fixture
def fast_fake():
    made = []

    def make(script, **kw) -> FakeFastPort:
        made.append(FakeFastPort(script, **kw))
        return made[-1]

    yield make
    for f in made:
        f.close()


@pytest.fixture
def closed_port():
    """A port on 127.0.0.1 where nobody listens (bound, never listening: connecting is refused,
    and no one else can take the port while the test runs)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()


def test_c_client_retries_and_completes_partial_grants_on_the_fast_port(c_client, fake, fast_fake):
    port = fast_fake(
        [
            lambda rid, n: [frame(error(rid, "unavailable", True))],
            lambda rid, n: [frame(block(rid, 1000, 3))],  # partial grant: 3 of 5
            lambda rid, n: [frame(block(rid, 5000, n))],
        ]
    )
    srv = fake([], tcp=True, nodes=lambda rid: nodes_reply(rid, port.port))
    proc = run(c_client, srv.endpoint, "5")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1000", "1001", "1002", "5000", "5001"]
    assert "unavailable" in proc.stderr and "fast port" not in proc.stderr, proc.stderr
    reqs = port.reserves()
    assert [n for _, n in reqs] == [5, 5, 2], "retries ask again; after a partial grant, for the rest"
    rids = [rid for rid, _ in reqs]
    assert rids == sorted(set(rids)) and rids[0] > srv.nodes_asked[0][1], f"fresh, increasing request ids: {rids}"
    assert len(srv.nodes_asked) == 1 and srv.requests == [], "NODES on ZeroMQ, every RESERVE on the fast port"
    assert port.connections == 1


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(lambda rid, n: block(rid + 1, 1000, n), id="another-request-id"),
        pytest.param(lambda rid, n: block(rid, 1000, n + 1), id="oversized-grant"),
        pytest.param(lambda rid, n: error(rid, "bad_request", False), id="non-retriable"),
    ],
)
def test_c_client_checks_fast_port_replies_as_zeromq_ones(c_client, fake, fast_fake, reply):
    port = fast_fake([lambda rid, n: [frame(reply(rid, n))]] * 3)
    srv = fake([lambda rid, n: block(rid, 5000, n)] * 3, tcp=True, nodes=lambda rid: nodes_reply(rid, port.port))
    proc = run(c_client, srv.endpoint, "10")
    assert proc.returncode == 1 and proc.stdout == "", proc
    assert len(port.requests) == 1 and srv.requests == [], "a bad reply ends the run, on either transport"


@pytest.mark.parametrize(
    ("nodes", "note"),
    [
        pytest.param(lambda rid, port: nodes_reply(rid, None), "", id="fast_port-null"),
        pytest.param(
            lambda rid, port: sfwire.header(NODES_REPLY, rid) + b'{"cluster": null, "nodes": []}', "", id="absent"
        ),
        pytest.param(lambda rid, port: nodes_reply(rid, port), "cannot connect", id="refused"),
        pytest.param(lambda rid, port: nodes_reply(rid, str(port)), "not a port", id="a-string"),
        pytest.param(lambda rid, port: nodes_reply(rid, 70000), "not a port", id="out-of-range"),
        pytest.param(lambda rid, port: nodes_reply(rid, port + 0.5), "not a port", id="a-fraction"),
        pytest.param(lambda rid, port: error(rid, "bad_request", False), "NODES", id="nodes-error"),
        pytest.param(lambda rid, port: None, "NODES", id="nodes-unanswered"),
    ],
)
def test_c_client_uses_zeromq_without_a_usable_fast_port(c_client, fake, closed_port, nodes, note):
    srv = fake([lambda rid, n: block(rid, 5000, n)], tcp=True, nodes=lambda rid: nodes(rid, closed_port))
    proc = run(c_client, srv.endpoint, "5")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["5000", "5001", "5002", "5003", "5004"]
    assert (note in proc.stderr) if note else proc.stderr == "", proc.stderr
    ((nodes_ident, nodes_rid),) = srv.nodes_asked
    ((reserve_ident, _),) = srv.requests
    (rid, count), *_ = srv.reserves()
    assert count == 5 and rid > nodes_rid
    if nodes(nodes_rid, closed_port) is None:
        assert reserve_ident != nodes_ident, "after a lost NODES, the RESERVE goes out on a new socket"


FAST_FAILURES = [
    pytest.param(lambda rid, n: [b"\0\0\0\0"], id="garbled-zero-length"),
    pytest.param(lambda rid, n: [struct.pack("!I", 0xFFFFFFFF) + block(rid, 1, n)], id="garbled-huge-length"),
    pytest.param(lambda rid, n: [frame(block(rid, 1, n))[:10], CLOSE], id="closed-mid-reply"),
    pytest.param(lambda rid, n: [CLOSE], id="closed-mid-request"),
    pytest.param(lambda rid, n: [], id="silent"),
]


@pytest.mark.parametrize("failure", FAST_FAILURES)
def test_c_client_falls_back_to_zeromq_when_the_fast_port_fails(c_client, fake, fast_fake, failure):
    """The first reply on the fast port is a partial grant; the second request fails there: it
    is asked again on ZeroMQ, and no ID is printed twice (or from the failed reply)."""
    port = fast_fake([lambda rid, n: [frame(block(rid, 1000, 3))], failure, lambda rid, n: [frame(block(rid, 1, n))]])
    srv = fake([lambda rid, n: block(rid, 5000, n)] * 2, tcp=True, nodes=lambda rid: nodes_reply(rid, port.port))
    proc = run(c_client, srv.endpoint, "10")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    assert lines == ["1000", "1001", "1002", *(str(5000 + i) for i in range(7))], proc.stdout
    assert len(set(lines)) == len(lines)
    assert "fast port" in proc.stderr and "using ZeroMQ" in proc.stderr, proc.stderr
    fast_reqs, zmq_reqs = port.reserves(), srv.reserves()
    assert [n for _, n in fast_reqs] == [10, 7] and [n for _, n in zmq_reqs] == [7], "the lost request, again"
    rids = [rid for rid, _ in fast_reqs + zmq_reqs]
    assert rids == sorted(set(rids)), f"fresh, increasing request ids: {rids}"
    assert port.connections == 1, "the fast port is not tried again"


def test_c_client_falls_back_when_the_fast_port_closes_at_once(c_client, fake, fast_fake):
    port = fast_fake([], close_at_once=True)
    srv = fake([lambda rid, n: block(rid, 5000, n)], tcp=True, nodes=lambda rid: nodes_reply(rid, port.port))
    proc = run(c_client, srv.endpoint, "3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["5000", "5001", "5002"]
    assert "fast port" in proc.stderr and port.connections == 1 and port.requests == []
    assert [n for _, n in srv.reserves()] == [3]
