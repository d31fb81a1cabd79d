"""The HTTP door (broker/doors/http.py) on real loopback sockets, driven by an epoll loop of the
test's own, in front of a scripted routing core (and, once, the real one, and the router):
what each path asks of the core, the JSON it answers, pipelining order, errors and their
statuses, and the bounds on bad or slow clients. Real nodes: tests/integration/test_http_door.py."""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
import time

import httptools
import pytest
import zmq

from snowfence import protocol
from snowfence.broker.doors import http as httpmod
from snowfence.broker.doors import http_requests
from snowfence.broker.doors.addresses import is_fast_addr
from snowfence.broker.doors.http import HttpDoor, http_address
from snowfence.config import Config
from snowfence.errors import ConfigError, Fenced, Overloaded, WatermarkUnavailable

STATUS = {"version": 1, "broker": {"counters": {"requests": 1}}}
NODES = {"cluster": None, "nodes": [{"node": "n1", "http_port": 1}], "fast_port": None, "http_port": 1}


def _is_http_addr(addr: bytes) -> bool:
    """An HTTP connection's routing address: a fast connection's shape, second byte 1."""
    return is_fast_addr(addr) and addr[1] == 1


class Core:
    """What the door calls on the routing core: records each body, and answers it at
    once (``hold`` False) or when the test says (``release``)."""

    def __init__(self) -> None:
        self.door: HttpDoor | None = None
        self.bodies: list[bytes] = []
        self.addrs: set[bytes] = set()
        self.hold = False
        self.held: list[tuple[bytes, bytes]] = []
        self.first = 1 << 40
        #: An error to answer every RESERVE with, or a count to grant instead of the one asked.
        self.error = None
        self.grant: int | None = None

    def requests(self, batch) -> None:
        for meta, addr, body in batch:
            assert meta == 0 and _is_http_addr(addr)
            self.bodies.append(body)
            self.addrs.add(addr)
            if self.hold:
                self.held.append((addr, body))
            else:
                self.answer(addr, body)

    def answer(self, addr: bytes, body: bytes) -> None:
        req = protocol.decode_request(body)
        rid = req.request_id
        if req.type == protocol.RESERVE:
            if self.error is not None:
                reply = protocol.encode_error(rid, self.error)
            else:
                n = min(req.count, self.grant or req.count)
                reply = protocol.encode_block(rid, self.first, n)
                self.first += 1 << 22  # the next millisecond
        elif req.type == protocol.STATUS:
            reply = protocol.encode_status_reply(rid, STATUS)
        elif req.type == protocol.NODES:
            reply = protocol.encode_nodes_reply(rid, NODES)
        elif req.type == protocol.WATERMARK:
            if self.error is not None:
                reply = protocol.encode_error(rid, self.error)
            else:
                reply = protocol.encode_watermark_reply(rid, 1_700_000_000_000, 5 << 22)
        else:
            raise AssertionError(req)
        self.door.send(addr, reply)

    def release(self, order=None) -> None:
        held, self.held = self.held, []
        for addr, body in held if order is None else order(held):
            self.answer(addr, body)

    def reserves(self) -> list[int]:
        return [protocol.decode_request(b).count for b in self.bodies if b[1] == protocol.RESERVE]


class Loop:
    """The broker's loop, as far as the door needs it: its epoll set and its events."""

    def __init__(self, door: HttpDoor) -> None:
        self.door = door
        self.ep = select.epoll()
        door.attach(self)

    def watch(self, fd: int, mask: int, owner=None) -> None:
        try:
            self.ep.modify(fd, mask)
        except FileNotFoundError:
            self.ep.register(fd, mask)

    def unwatch(self, fd: int) -> None:
        self.ep.unregister(fd)

    def turn(self, rounds: int = 20, timeout_s: float = 0.01) -> None:
        for _ in range(rounds):
            for fd, events in self.ep.poll(timeout_s):
                self.door.on_event(fd, events)


@pytest.fixture
def served():
    core = Core()
    door = core.door = HttpDoor("127.0.0.1", 0, Config(), requests=core.requests)
    loop = Loop(door)
    clients: list[socket.socket] = []

    def connect() -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", door.port), timeout=5)
        clients.append(sock)
        loop.turn(2)
        return sock

    try:
        yield core, door, loop, connect
    finally:
        for sock in clients:
            sock.close()
        door.close()
        loop.ep.close()


class Response:
    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.body = b""
        self.status = 0

    def json(self):
        return json.loads(self.body)


class _Reader:
    def __init__(self) -> None:
        self.done: list[Response] = []
        self.cur = Response()
        self.parser = None

    def on_headers_complete(self):
        self.cur.status = self.parser.get_status_code()

    def on_header(self, name, value):
        self.cur.headers[name.decode().lower()] = value.decode()

    def on_body(self, body):
        self.cur.body += body

    def on_message_complete(self):
        self.done.append(self.cur)
        self.cur = Response()


def responses(sock: socket.socket, n: int, loop: Loop | None = None, timeout_s: float = 5.0) -> list[Response]:
    """Read ``n`` HTTP responses (turning the loop meanwhile, if given)."""
    reader = _Reader()
    parser = reader.parser = httptools.HttpResponseParser(reader)
    sock.setblocking(False)
    deadline = time.monotonic() + timeout_s
    try:
        while len(reader.done) < n and time.monotonic() < deadline:
            if loop is not None:
                loop.turn(1)
            try:
                data = sock.recv(1 << 20)
            except BlockingIOError:
                if loop is None:
                    time.sleep(0.005)
                continue
            if not data:
                break
            parser.feed_data(data)
    finally:
        sock.setblocking(True)
    return reader.done


def get(path: str, extra: str = "", method: str = "GET", body: bytes = b"") -> bytes:
    length = f"Content-Length: {len(body)}\r\n" if body else ""
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\n{length}{extra}\r\n".encode() + body


def closed_by_peer(sock: socket.socket, loop: Loop) -> bool:
    sock.setblocking(False)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        loop.turn(1)
        try:
            if not sock.recv(1 << 20):
                return True
        except BlockingIOError:
            continue
        except ConnectionResetError:
            return True
    return False


# -- answers ---------------------------------------------------------------------------------


def test_one_id_by_default_as_a_string_and_never_cached(served):
    core, door, loop, connect = served
    sock = connect()
    sock.sendall(get("/v1/ids"))
    (r,) = responses(sock, 1, loop)
    assert r.status == 200 and r.headers["content-type"] == "application/json"
    assert r.headers["cache-control"] == "no-store"
    assert r.json() == {"ids": [str(1 << 40)]}
    assert core.reserves() == [1]


def test_many_ids_are_asked_in_reserves_of_up_to_4096_and_come_back_in_order(served):
    core, door, loop, connect = served
    sock = connect()
    sock.sendall(get("/v1/ids?count=10000"))
    (r,) = responses(sock, 1, loop)
    ids = [int(i) for i in r.json()["ids"]]
    assert core.reserves() == [4096, 4096, 1808]
    assert len(ids) == 10_000 == len(set(ids)) and ids == sorted(ids)
    sock.sendall(get("/v1/ids?count=10000&blocks=1"))
    (r,) = responses(sock, 1, loop)
    blocks = r.json()["blocks"]
    assert [b["count"] for b in blocks] == [4096, 4096, 1808]
    assert all(isinstance(b["first"], str) for b in blocks)


def test_a_post_takes_its_parameters_in_the_query_or_a_json_body(served):
    core, door, loop, connect = served
    sock = connect()
    sock.sendall(get("/v1/ids?count=3", method="POST"))
    sock.sendall(get("/v1/ids", method="POST", body=b'{"count": 5, "blocks": true}'))
    sock.sendall(get("/v1/ids?count=2", method="POST", body=b'{"count": 5}'))
    sock.sendall(get("/v1/ids", method="POST", body=b"[1]"))
    a, b, c, d = responses(sock, 4, loop)
    assert len(a.json()["ids"]) == 3
    assert b.json() == {"blocks": [{"first": str(core.first - (1 << 22)), "count": 5}]}
    assert c.status == 400 and "both" in c.json()["message"]
    assert d.status == 400 and d.json()["code"] == "bad_request"


def test_a_json_body_is_as_strict_as_a_query(served):
    core, door, loop, connect = served
    sock = connect()
    bad = [
        b'{"count": 10, "count": 11}',  # a name twice, as ?count=10&count=11 is
        b'{"count": "10"}',
        b'{"count": 10.0}',
        b'{"count": true}',
        b'{"count": NaN}',
        b'{"blocks": "true"}',
        b'{"blocks": 1}',
        b'{"format": 1}',
        b'{"count": 2, "nested": {"a": 1, "a": 2}}',
        b"\xff\xfe{}",
    ]
    for body in bad:
        sock.sendall(get("/v1/ids", method="POST", body=body))
    sock.sendall(get("/v1/ids", method="POST", body=b'{"count": 10, "blocks": false, "format": "decimal"}'))
    rs = responses(sock, len(bad) + 1, loop)
    for body, r in zip(bad, rs, strict=False):
        assert r.status == 400 and r.json()["code"] == "bad_request", (body, r.body)
    assert "twice" in rs[0].json()["message"] and "an integer" in rs[1].json()["message"], rs[1].body
    assert rs[-1].status == 200 and len(rs[-1].json()["ids"]) == 10
    assert core.reserves() == [10]


@pytest.mark.parametrize(
    "line", [b"GET /v1/ids\r\n\r\n", b"GET /v1/ids HTTP/0.9\r\n\r\n", b"GET /v1/ids HTTP/2.0\r\n\r\n"]
)
def test_a_request_line_of_another_http_version_is_400_then_the_end(served, line):
    core, door, loop, connect = served
    sock = connect()
    sock.sendall(get("/v1/ids") + line + get("/v1/ids"))
    a, b = responses(sock, 2, loop)
    assert a.status == 200 and b.status == 400 and "not an HTTP/1.x request" in b.json()["message"], b.body
    assert b.headers["connection"] == "close"
    assert closed_by_peer(sock, loop)
    assert core.reserves() == [1]


def test_fewer_ids_than_asked_are_asked_for_again_until_all_are_granted(served):
    core, door, loop, connect = served
    core.grant = 1000
    sock = connect()
    sock.sendall(get("/v1/ids?count=5000"))
    (r,) = responses(sock, 1, loop)
    assert len(r.json()["ids"]) == 5000
    assert sum(core.reserves()) > 5000  # what came short was asked for again


def test_status_nodes_and_watermark_are_the_cores_answers_as_json(served):
    core, door, loop, connect = served
    sock = connect()
    sock.sendall(get("/v1/status") + get("/v1/nodes") + get("/v1/watermark"))
    s, n, w = responses(sock, 3, loop)
    assert s.json() == STATUS and n.json() == NODES
    assert w.json() == {"unix_ms": 1_700_000_000_000, "lowest": str(5 << 22)}
    assert [b[1] for b in core.bodies] == [protocol.STATUS, protocol.NODES, protocol.WATERMARK]
    core.error = WatermarkUnavailable("none yet")
    sock.sendall(get("/v1/watermark"))
    (w,) = responses(sock, 1, loop)
    assert w.status == 503 and w.json() == {"code": "watermark_unavailable", "message": "none yet", "retriable": True}
    assert w.headers["retry-after"] == "1"


def test_bounds_are_answered_from_the_layout_without_the_core(served):
    core, door, loop, connect = served
    sock = connect()
    sock.sendall(get("/v1/bounds?start=2026-03-01T00:00:00Z&end=2026-03-01T01:00:00Z"))
    sock.sendall(get("/v1/bounds?start=1772323200000"))
    sock.sendall(get("/v1/bounds?end=5"))
    sock.sendall(get("/v1/bounds?start=1000"))  # before the epoch
    a, b, c, d = responses(sock, 4, loop)
    layout = Config().layout
    (expected,) = layout.bounds("2026-03-01T00:00:00Z", "2026-03-01T01:00:00Z")
    assert a.json() == {"ranges": [expected.to_dict()]}
    assert b.json()["ranges"][0]["start_ms"] == 1772323200000 == b.json()["ranges"][0]["end_ms"]
    assert c.status == 400 and "start is required" in c.json()["message"]
    assert d.status == 400 and d.json()["code"] == "bad_request"
    assert core.bodies == []


# -- keep-alive and pipelining -----------------------------------------------------------------


def test_keep_alive_one_connection_many_requests_with_http_client():
    core = Core()
    door = core.door = HttpDoor("127.0.0.1", 0, Config(), requests=core.requests)
    loop = Loop(door)
    stop = threading.Event()

    def run():
        while not stop.is_set():
            loop.turn(1)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", door.port, timeout=5)
        got = []
        for i in range(200):
            conn.request("GET", "/v1/ids?count=2" if i % 2 else "/v1/ids")
            r = conn.getresponse()
            assert r.status == 200
            got += json.loads(r.read())["ids"]
        conn.close()
    finally:
        stop.set()
        t.join(5)
        door.close()
        loop.ep.close()
    assert len(got) == 300 == len(set(got))
    assert door.stats["accepted"] == 1 and door.stats["requests"] == 200
    (addr,) = core.addrs  # one connection: one routing address for the core
    assert is_fast_addr(addr) and addr[1] == 1


def test_pipelined_requests_are_answered_in_order_whatever_order_the_core_answers_in(served):
    core, door, loop, connect = served
    core.hold = True
    sock = connect()
    sock.sendall(get("/v1/ids?count=1") + get("/v1/status") + get("/v1/nope") + get("/v1/ids?count=5000"))
    loop.turn()
    assert len(core.held) == 1 + 1 + 2  # the 404 is answered by the door itself
    core.release(order=reversed)
    a, b, c, d = responses(sock, 4, loop)
    assert [r.status for r in (a, b, c, d)] == [200, 200, 404, 200]
    assert len(a.json()["ids"]) == 1 and b.json() == STATUS and len(d.json()["ids"]) == 5000


def test_only_so_many_requests_are_asked_at_once_and_a_connection_is_not_read_past_its_queue(served):
    core, door, loop, connect = served
    core.hold = True
    sock = connect()
    sock.sendall(b"".join(get("/v1/ids") for _ in range(40)))
    loop.turn()
    conn = next(iter(door.by_fd.values()))
    assert len(core.held) == httpmod.MAX_STARTED
    assert len(conn.queue) == 40 and not conn.mask & select.EPOLLIN
    sock.sendall(b"".join(get("/v1/ids") for _ in range(60)))
    loop.turn()
    assert len(conn.queue) == 40 and len(core.held) == httpmod.MAX_STARTED  # not read meanwhile
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 100 and time.monotonic() < deadline:
        core.release()
        got += responses(sock, 1, loop, timeout_s=0.2)
    assert len(got) == 100 and all(r.status == 200 for r in got)
    assert door.stats["requests"] == 100


def test_http_10_closes_unless_asked_to_keep_alive(served):
    core, door, loop, connect = served
    sock = connect()
    sock.sendall(b"GET /v1/ids HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    (r,) = responses(sock, 1, loop)
    assert r.status == 200 and r.headers["connection"] == "keep-alive"
    sock.sendall(b"GET /v1/ids HTTP/1.0\r\n\r\n")
    (r,) = responses(sock, 1, loop)
    assert r.headers["connection"] == "close"
    assert closed_by_peer(sock, loop)


def test_a_client_that_stops_sending_gets_its_answers_then_the_end(served):
    core, door, loop, connect = served
    core.hold = True
    sock = connect()
    sock.sendall(get("/v1/ids") + get("/v1/ids?count=2"))
    sock.shutdown(socket.SHUT_WR)
    loop.turn()
    core.release()
    a, b = responses(sock, 2, loop)
    assert (a.status, b.status) == (200, 200) and b.headers["connection"] == "close"
    assert closed_by_peer(sock, loop) and not door.by_fd


# -- errors --------------------------------------------------------------------------------------


def test_errors_are_json_with_the_binary_codes_and_fitting_statuses(served):
    core, door, loop, connect = served
    sock = connect()
    sock.sendall(
        get("/nope")
        + get("/v1/ids", method="DELETE")
        + get("/v1/status", method="POST")
        + get("/v1/ids?count=0")
        + get("/v1/ids?count=100001")
        + get("/v1/ids?count=abc")
        + get("/v1/ids?cout=5")
        + get("/v1/ids?count=1&count=2")
        + get("/v1/ids?blocks=maybe")
        + get("/v1/status?x=1")
    )
    rs = responses(sock, 10, loop)
    assert [r.status for r in rs] == [404, 405, 405, 400, 400, 400, 400, 400, 400, 400]
    assert rs[1].headers["allow"] == "GET, POST" and rs[2].headers["allow"] == "GET"
    for r in rs:
        assert set(r.json()) == {"code", "message", "retriable"} and r.json()["code"] == "bad_request", r.body
        assert r.json()["retriable"] is False
    assert core.bodies == []


def test_overloaded_is_429_with_retry_after_and_a_refusal_is_503(served):
    core, door, loop, connect = served
    sock = connect()
    err = Overloaded("more than 4 requests in flight on this connection")
    err.retry_after_ms = 1500
    core.error = err
    sock.sendall(get("/v1/ids?count=9000"))
    (r,) = responses(sock, 1, loop)
    assert r.status == 429 and r.headers["retry-after"] == "2"
    assert r.json() == {
        "code": "overloaded",
        "message": "more than 4 requests in flight on this connection",
        "retriable": True,
        "retry_after_ms": 1500,
    }
    core.error = Fenced("fenced")
    sock.sendall(get("/v1/ids"))
    (r,) = responses(sock, 1, loop)
    assert r.status == 503 and r.json()["code"] == "fenced" and r.json()["retriable"] is True
    assert r.headers["retry-after"] == "1"
    core.error = None
    sock.sendall(get("/v1/ids"))  # the connection goes on
    assert responses(sock, 1, loop)[0].status == 200


def test_a_request_that_cannot_be_parsed_is_400_after_those_before_it_then_the_end(served):
    core, door, loop, connect = served
    sock = connect()
    sock.sendall(get("/v1/ids") + b"NOT HTTP AT ALL\r\n\r\n")
    a, b = responses(sock, 2, loop)
    assert a.status == 200 and b.status == 400 and b.json()["code"] == "bad_request"
    assert b.headers["connection"] == "close"
    assert closed_by_peer(sock, loop)
    assert door.stats["bad_request"] == 1


def test_huge_heads_and_bodies_are_431_and_413(served):
    core, door, loop, connect = served
    for data, status in (
        (get("/v1/ids?" + "x" * 20_000), 431),
        (get("/v1/ids", extra="X-Big: " + "y" * 20_000 + "\r\n"), 431),
        (b"GET /v1/ids HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(3000)) + b"\r\n", 431),
        (get("/v1/ids", method="POST", body=b"{" + b" " * 5000 + b"}"), 413),
        (b"POST /v1/ids HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" + b"z" * 2048 + b"\r\n0\r\n\r\n", 413),
    ):
        sock = connect()
        try:
            sock.sendall(data)
        except OSError:  # the door stopped reading: what it read was enough to answer
            pass
        (r,) = responses(sock, 1, loop)
        assert r.status == status and r.json()["code"] == "frame_too_large", (data[:40], r.body)
        assert closed_by_peer(sock, loop)
        sock.close()
        loop.turn(3)
    # A head that never ends is refused once it is too long, without waiting for its end.
    sock = connect()
    sock.sendall(b"GET /v1/ids HTTP/1.1\r\nX-Slow: ")
    for _ in range(10):
        try:
            sock.sendall(b"a" * 4096)
        except OSError:
            break
        loop.turn(2)
    (r,) = responses(sock, 1, loop)
    assert r.status == 431
    sock.close()
    loop.turn(3)
    assert not door.by_fd and core.bodies == []


def test_a_protocol_upgrade_is_not_offered(served):
    core, door, loop, connect = served
    sock = connect()
    sock.sendall(get("/v1/ids", extra="Connection: Upgrade\r\nUpgrade: websocket\r\n") + b"\x81\x00")
    (r,) = responses(sock, 1, loop)
    assert r.status == 200 and r.headers["connection"] == "close"
    assert closed_by_peer(sock, loop)


# -- bounds on clients -------------------------------------------------------------------------


def test_connections_beyond_the_cap_get_a_503_and_are_closed(served, monkeypatch):
    core, door, loop, connect = served
    door.max_connections = 2  # MAX_CONNECTIONS, as the door was made with it
    a, _b, c = connect(), connect(), connect()
    (r,) = responses(c, 1, loop)
    assert r.status == 503 and r.json()["code"] == "unavailable" and r.headers["retry-after"] == "1"
    assert closed_by_peer(c, loop)
    assert door.stats["too_many"] == 1 and len(door.by_fd) == 2
    a.sendall(get("/v1/ids"))
    assert responses(a, 1, loop)[0].status == 200


def test_a_slow_request_is_408_an_unanswered_one_503_and_an_idle_connection_closed(served):
    core, door, loop, connect = served
    now = [0]

    def tick(seconds: float) -> None:
        end = now[0] + int(seconds * 1e9)
        while now[0] < end:
            now[0] += int(http_requests.SCAN_S * 1e9)
            door.tick(now[0])

    slow = connect()
    slow.sendall(b"GET /v1/ids HTTP/1.1\r\nHost: x\r\n")  # and nothing more
    loop.turn()
    tick(http_requests.REQUEST_READ_S + 1)
    (r,) = responses(slow, 1, loop)
    assert r.status == 408 and door.stats["slow_request"] == 1
    assert closed_by_peer(slow, loop)

    core.hold = True
    waiting = connect()
    waiting.sendall(get("/v1/ids?count=5000"))
    loop.turn()
    tick(http_requests.ANSWER_S + 1)
    (r,) = responses(waiting, 1, loop)
    assert r.status == 503 and r.json()["code"] == "unavailable" and door.stats["timed_out"] == 1
    core.release()  # late answers are dropped
    loop.turn()
    waiting.sendall(get("/v1/status"))
    loop.turn()
    core.release()
    assert responses(waiting, 1, loop)[0].json() == STATUS

    tick(http_requests.IDLE_S + 1)
    assert closed_by_peer(waiting, loop)
    assert door.stats["idle"] == 1 and not door.by_fd


def test_a_client_that_does_not_read_its_answers_holds_little_and_is_closed_in_time(served):
    core, door, loop, connect = served
    sock = connect()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(b"".join(get("/v1/ids?count=100000") for _ in range(20)))
    loop.turn(50)
    (conn,) = door.by_fd.values()
    # Answers are rendered only while little waits: one of 2.2 MB at most beyond that.
    assert 0 < len(conn.unsent) < httpmod.UNSENT_LOW + 2_300_000
    assert len(conn.queue) > 10
    now = 0
    for _ in range(int((http_requests.IDLE_S + 2) / http_requests.SCAN_S)):
        now += int(http_requests.SCAN_S * 1e9)
        door.tick(now)
    assert door.stats["idle"] == 1 and not door.by_fd


# -- the real routing core and the router ------------------------------------------------------


def test_the_doors_requests_go_through_the_routing_cores_intake():
    from snowfence.broker.routing import Routing

    to_worker: list[bytes] = []
    doors: list[HttpDoor] = []
    core = Routing(
        Config(),
        lambda meta, addr, reply: doors[0].send(addr, reply),
        lambda ident, frame: to_worker.append(frame) or True,
    )
    core.on_worker(
        b"w0", protocol.encode_state(protocol.WorkerState(slot=0, pid=1000, ready=True, ready_ids=1, credits=32))
    )
    door = HttpDoor("127.0.0.1", 0, Config(), requests=core.requests)
    doors.append(door)
    loop = Loop(door)
    sock = socket.create_connection(("127.0.0.1", door.port), timeout=5)
    try:
        sock.sendall(get("/v1/ids?count=5000") + get("/v1/status"))
        loop.turn()
        # Counted: two RESERVEs (the second waits for the worker's room) and STATUS.
        assert core.counters["requests"] == 3
        work = [protocol.split_routed(f) for f in to_worker if f[0] == protocol.WORK]
        for meta, addr, body in work:
            rid, count = protocol.plain_reserve(body)
            core.on_worker(b"w0", protocol.encode_reply(meta, addr, protocol.encode_block(rid, rid << 30, count)))
        core.schedule()  # as the router does after each batch of worker frames
        loop.turn()
        work = [protocol.split_routed(f) for f in to_worker if f[0] == protocol.WORK][len(work) :]
        for meta, addr, body in work:
            rid, count = protocol.plain_reserve(body)
            core.on_worker(b"w0", protocol.encode_reply(meta, addr, protocol.encode_block(rid, rid << 30, count)))
        a, b = responses(sock, 2, loop)
        assert len(a.json()["ids"]) == 5000
        assert b.json()["broker"]["counters"]["requests"] == 3
        assert core.active_connections() == 0
    finally:
        sock.close()
        door.close()
        loop.ep.close()


def test_the_router_sends_replies_for_http_addresses_to_the_door_and_refuses_zeromq_peers_posing_as_one():
    from snowfence.broker.main import open_doors

    ctx = zmq.Context()
    _, router, fast, door = open_doors(ctx, Config(bind="tcp://127.0.0.1:*"), "inproc://back-http-test")
    assert door is not None and fast is not None
    loop = Loop(door)
    sock = socket.create_connection(("127.0.0.1", door.port), timeout=5)
    poser = ctx.socket(zmq.DEALER)
    try:
        worker = ctx.socket(zmq.DEALER)
        worker.setsockopt(zmq.ROUTING_ID, b"w0")
        worker.setsockopt(zmq.LINGER, 0)
        worker.connect("inproc://back-http-test")
        worker.send(protocol.encode_state(protocol.WorkerState(slot=0, pid=1000, ready=True, ready_ids=1, credits=32)))
        time.sleep(0.05)
        router.on_backend()
        sock.sendall(get("/v1/ids?count=3"))
        loop.turn()
        frame = worker.recv()
        while frame[0] != protocol.WORK:
            frame = worker.recv()
        meta, addr, body = protocol.split_routed(frame)
        assert _is_http_addr(addr)
        rid, count = protocol.plain_reserve(body)
        worker.send(protocol.encode_reply(meta, addr, protocol.encode_block(rid, 77 << 22, count)))
        time.sleep(0.05)
        router.on_backend()
        (r,) = responses(sock, 1, loop)
        assert r.json() == {"ids": [str((77 << 22) + i) for i in range(3)]}
        # A ZeroMQ peer that names itself as that HTTP connection is not answered.
        poser.setsockopt(zmq.ROUTING_ID, addr)
        poser.setsockopt(zmq.LINGER, 0)
        poser.connect(router.endpoint())
        poser.send(protocol.encode_reserve(1, 1))
        before = router.core.counters["bad_request"]
        deadline = time.monotonic() + 5
        while router.core.counters["bad_request"] == before and time.monotonic() < deadline:
            router.on_frontend()
            time.sleep(0.01)
        assert router.core.counters["bad_request"] == before + 1 and router.core.counters["impostors"] == 1
        worker.close()
    finally:
        poser.close(0)
        sock.close()
        for opened in (fast, door, router):
            opened.close()
        loop.ep.close()
        ctx.term()


# -- the setting ---------------------------------------------------------------------------------


def test_where_the_door_binds_and_never_with_curve():
    assert http_address("auto", "tcp://127.0.0.1:5555", False) == ("127.0.0.1", 0)
    assert http_address("auto", "tcp://*:5555", False) == ("0.0.0.0", 0)
    assert http_address("auto", "ipc:///tmp/x", False) is None
    assert http_address("off", "tcp://127.0.0.1:5555", False) is None
    assert http_address("127.0.0.1:8080", "ipc:///tmp/x", False) == ("127.0.0.1", 8080)
    assert http_address("auto", "tcp://127.0.0.1:5555", True) is None
    with pytest.raises(ConfigError, match="neither encryption nor authentication"):
        Config(http_bind="127.0.0.1:8080", curve_secret_key="/nonexistent/key")
    with pytest.raises(ConfigError, match="http_bind"):
        Config(http_bind="8080")


def test_a_door_that_cannot_bind_says_so():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot bind the HTTP port 127.0.0.1:{port}"):
            HttpDoor("127.0.0.1", port, Config(), requests=lambda batch: None)


# -- rendering -------------------------------------------------------------------------------------
