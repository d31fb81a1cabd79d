"""The fast port: its framing (protocol.Stream), the broker's side (FastPort) on real
loopback sockets with a scripted routing core, its setting, how a client decides
to use it, and both clients' one-request paths. Real nodes: tests/integration/test_fast_port.py."""

from __future__ import annotations

import asyncio
import select
import socket
import struct
import time

import pytest

from snowfence import protocol
from snowfence.broker.doors import fast as fastmod
from snowfence.broker.doors.addresses import is_fast_addr
from snowfence.broker.doors.fast import FastPort, fast_address
from snowfence.clients.core import Block, ClientBase
from snowfence.config import Config
from snowfence.errors import BadRequest, ConfigError, FrameTooLarge

# -- framing -----------------------------------------------------------------------------


def test_a_stream_gives_back_each_body_once_however_the_reads_cut_it():
    bodies = [protocol.encode_reserve(i, i) for i in range(1, 6)] + [b"x" * 200]
    wire = b"".join(protocol.encode_stream(b) for b in bodies)
    for cut in (1, 3, 4, 5, 7, 16, 21, len(wire)):
        stream = protocol.Stream(255)
        got = []
        for at in range(0, len(wire), cut):
            got += stream.feed(wire[at : at + cut])
        assert got == bodies, cut
        assert not stream.partial


def test_a_stream_keeps_a_partial_frame_for_the_next_read():
    stream = protocol.Stream(255)
    frame = protocol.encode_stream(b"abcdef")
    assert stream.feed(frame[:5]) == [] and stream.partial
    assert stream.feed(frame[5:]) == [b"abcdef"] and not stream.partial


def test_a_stream_refuses_an_empty_or_oversized_frame():
    with pytest.raises(FrameTooLarge):
        protocol.Stream(255).feed(struct.pack("!I", 256) + b"x" * 256)
    with pytest.raises(BadRequest):
        protocol.Stream(255).feed(struct.pack("!I", 0))
    # Refused from the length alone, before the body arrives.
    with pytest.raises(FrameTooLarge):
        protocol.Stream(255).feed(struct.pack("!I", 1 << 31))


# -- the broker's side ---------------------------------------------------------------------


class Core:
    """What FastPort calls on the routing core: records, answers plain RESERVEs at once
    and any other request with an error. The real core behind a fast port:
    test_a_fast_ports_requests_go_through_the_routing_cores_intake."""

    def __init__(self):
        self.port: FastPort | None = None
        self.admitted: list[tuple[bytes, int, int]] = []
        self.others: list[bytes] = []
        self.bad: list[BadRequest] = []
        self.answer = True

    def requests(self, batch):
        for meta, addr, body in batch:
            assert meta == 0 and is_fast_addr(addr)
            plain = protocol.plain_reserve(body)
            if plain is None:
                self.others.append(body)
                self.port.send(addr, protocol.encode_error(protocol.request_id_of(body), BadRequest("scripted")))
                continue
            request_id, count = plain
            self.admitted.append((addr, count, request_id))
            if self.answer:
                self.port.send(addr, protocol.encode_block(request_id, 1000, count))

    def bad_request(self, meta, addr, err):
        self.bad.append(err)
        self.port.send(addr, protocol.encode_error(0, err))


def core_and_port() -> tuple[Core, FastPort]:
    """A FastPort on a loopback port the kernel picks, wired to a scripted core."""
    core = Core()
    core.port = FastPort("127.0.0.1", 0, requests=core.requests, bad_request=core.bad_request)
    return core, core.port


@pytest.fixture
def served():
    core, port = core_and_port()
    clients: list[socket.socket] = []

    def connect() -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port.port), timeout=5)
        clients.append(sock)
        turn(port)
        return sock

    try:
        yield core, port, connect
    finally:
        for sock in clients:
            sock.close()
        port.close()


def turn(port: FastPort, rounds: int = 20) -> None:
    """What the broker's loop does: hand each readable descriptor to the port, a few rounds."""
    for _ in range(rounds):
        fds = [port.listen_fd, *port.by_fd]
        readable, writable, _ = select.select(fds, [c.fd for c in port.by_fd.values() if c.unsent], [], 0.01)
        for fd in writable:
            port.on_event(fd, select.EPOLLOUT)
        for fd in readable:
            port.on_event(fd, select.EPOLLIN)


def read_bodies(sock: socket.socket, n: int) -> list[bytes]:
    stream, got = protocol.Stream(1 << 20), []
    deadline = time.monotonic() + 5
    while len(got) < n and time.monotonic() < deadline:
        data = sock.recv(65536)
        if not data:
            break
        got += stream.feed(data)
    return got


def closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_requests_on_the_fast_port_reach_the_core_and_replies_come_back_framed(served):
    core, port, connect = served
    sock = connect()
    sock.sendall(b"".join(protocol.encode_stream(protocol.encode_reserve(rid, 3)) for rid in (7, 8, 9)))
    sock.sendall(protocol.encode_stream(protocol.encode_status(10)))
    turn(port)
    replies = [protocol.decode_reply(b) for b in read_bodies(sock, 4)]
    assert [(r.type, r.request_id) for r in replies[:3]] == [
        (protocol.BLOCK, 7),
        (protocol.BLOCK, 8),
        (protocol.BLOCK, 9),
    ]
    assert replies[3].type == protocol.ERROR and replies[3].request_id == 10
    assert [c for _, c, _ in core.admitted] == [3, 3, 3] and len(core.others) == 1
    assert port.stats["requests"] == 4
    assert port.describe()["connections"] == 1


def test_a_fast_ports_requests_go_through_the_routing_cores_intake():
    from snowfence.broker.routing import Routing

    to_worker: list[bytes] = []
    ports: list[FastPort] = []
    core = Routing(
        Config(),
        lambda meta, addr, reply: ports[0].send(addr, reply),
        lambda ident, frame: to_worker.append(frame) or True,
    )
    core.on_worker(
        b"w0", protocol.encode_state(protocol.WorkerState(slot=0, pid=1000, ready=True, ready_ids=1, credits=32))
    )
    port = FastPort("127.0.0.1", 0, requests=core.requests, bad_request=core.bad_request)
    ports.append(port)
    sock = None
    try:
        sock = socket.create_connection(("127.0.0.1", port.port), timeout=5)
        turn(port)
        sock.sendall(b"".join(protocol.encode_stream(protocol.encode_reserve(rid, 3)) for rid in (7, 8)))
        sock.sendall(protocol.encode_stream(protocol.encode_status(9)))
        turn(port)
        # Counted, the plain RESERVEs sent to the worker at once (waited 0 s), STATUS answered.
        assert core.counters["requests"] == 3 and core.queued_ns[0].counts[0] == 2
        work = [protocol.split_routed(f) for f in to_worker if f[0] == protocol.WORK]
        assert [protocol.plain_reserve(body) for _, _, body in work] == [(7, 3), (8, 3)]
        assert all(meta == 0 and is_fast_addr(addr) for meta, addr, _ in work)
        (status,) = read_bodies(sock, 1)
        assert protocol.decode_reply(status).request_id == 9
        for meta, addr, body in work:
            rid, count = protocol.plain_reserve(body)
            core.on_worker(b"w0", protocol.encode_reply(meta, addr, protocol.encode_block(rid, rid << 30, count)))
        replies = [protocol.decode_reply(b) for b in read_bodies(sock, 2)]
        assert [(r.request_id, r.first, r.count) for r in replies] == [(7, 7 << 30, 3), (8, 8 << 30, 3)]
        assert core.active_connections() == 0
    finally:
        if sock is not None:
            sock.close()
        port.close()


def test_each_connection_has_its_own_address_no_zeromq_peer_can_have():
    addrs = set()
    for _ in range(3):
        addr = b"\x00" + len(addrs).to_bytes(8, "big")
        assert is_fast_addr(addr)
        addrs.add(addr)
    # libzmq's own routing ids are 5 bytes from a zero byte; ids a peer sets may not start with one.
    assert not is_fast_addr(b"\x00\x00\x00\x00\x01")
    assert not is_fast_addr(b"\x01" * 9)
    assert not is_fast_addr(b"client-id")


def test_two_connections_get_two_addresses(served):
    core, port, connect = served
    a, b = connect(), connect()
    for sock, rid in ((a, 1), (b, 2)):
        sock.sendall(protocol.encode_stream(protocol.encode_reserve(rid, 1)))
    turn(port)
    assert [protocol.decode_reply(x).request_id for x in read_bodies(a, 1)] == [1]
    assert [protocol.decode_reply(x).request_id for x in read_bodies(b, 1)] == [2]
    assert len({addr for addr, _, _ in core.admitted}) == 2


def test_a_bad_length_gets_one_error_and_the_connection_is_closed(served):
    core, port, connect = served
    sock = connect()
    sock.sendall(struct.pack("!I", 4000) + b"x" * 10)
    turn(port)
    (body,) = read_bodies(sock, 1)
    reply = protocol.decode_reply(body)
    assert reply.type == protocol.ERROR and reply.request_id == 0
    assert reply.error.code == "frame_too_large"
    assert closed_by_peer(sock)
    assert port.stats["bad_frame"] == 1 and not port.by_fd and core.admitted == []
    # The port goes on serving others.
    other = connect()
    other.sendall(protocol.encode_stream(protocol.encode_reserve(5, 1)))
    turn(port)
    assert protocol.decode_reply(read_bodies(other, 1)[0]).request_id == 5


def test_a_reply_for_a_connection_that_closed_is_dropped(served):
    core, port, connect = served
    core.answer = False
    sock = connect()
    sock.sendall(protocol.encode_stream(protocol.encode_reserve(1, 1)))
    turn(port)
    sock.close()
    turn(port)
    assert not port.by_fd
    (addr, _, rid) = core.admitted[0]
    port.send(addr, protocol.encode_block(rid, 1, 1))  # the worker's answer, late: nowhere to go
    assert port.stats["closed"] == 1


def test_a_client_that_does_not_read_its_replies_is_cut_off(served, monkeypatch):
    monkeypatch.setattr(fastmod, "MAX_UNSENT_BYTES", 64 * 1024)
    core, port, connect = served
    sock = connect()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    core.answer = False
    sock.sendall(protocol.encode_stream(protocol.encode_reserve(1, 1)))
    turn(port)
    (addr, _, _) = core.admitted[0]
    port.by_addr[addr].sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    big = protocol.encode_status_reply(1, {"pad": "x" * 60_000})
    for _ in range(200):  # far more than the kernel's buffers and the port's limit together
        port.send(addr, big)
        if addr not in port.by_addr:
            break
    assert addr not in port.by_addr and port.stats["not_reading"] == 1


def test_replies_the_kernel_will_not_take_at_once_are_sent_when_it_will(served):
    core, port, connect = served
    sock = connect()
    core.answer = False
    sock.sendall(protocol.encode_stream(protocol.encode_reserve(1, 1)))
    turn(port)
    (addr, _, _) = core.admitted[0]
    port.by_addr[addr].sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    bodies = [protocol.encode_status_reply(i, {"pad": "y" * 50_000}) for i in range(1, 11)]  # ~500 KB
    for body in bodies:
        port.send(addr, body)
    assert port.by_addr[addr].unsent  # more than the socket buffers took
    got, stream = [], protocol.Stream(1 << 20)
    deadline = time.monotonic() + 10
    sock.setblocking(False)
    while len(got) < len(bodies) and time.monotonic() < deadline:
        turn(port, 1)
        try:
            got += stream.feed(sock.recv(1 << 20))
        except BlockingIOError:
            pass
    assert got == bodies
    assert not port.by_addr[addr].unsent


def test_one_connection_more_than_the_limit_is_closed_at_once(served):
    core, port, connect = served
    port.max_connections = 2  # MAX_CONNECTIONS, as the port was made with it
    connect(), connect()
    third = connect()
    assert closed_by_peer(third)
    assert port.stats["too_many"] == 1 and len(port.by_fd) == 2


def test_a_read_takes_a_bounded_number_of_requests_per_turn(served):
    core, port, connect = served
    sock = connect()
    frame = protocol.encode_stream(protocol.encode_reserve(1, 1))
    sock.sendall(frame * 1000)  # 20,000 bytes: more than one read takes
    time.sleep(0.05)
    conn = next(iter(port.by_fd))
    port.on_event(conn, select.EPOLLIN)
    assert 0 < len(core.admitted) <= fastmod.READ_BYTES // len(frame) + 1
    turn(port)
    assert len(core.admitted) == 1000


# -- the setting -----------------------------------------------------------------------------


def test_fast_bind_auto_is_the_binds_host_on_a_port_the_system_picks():
    assert fast_address("auto", "tcp://127.0.0.1:5555", curve=False) == ("127.0.0.1", 0)
    assert fast_address("auto", "tcp://*:5555", curve=False) == ("0.0.0.0", 0)
    assert fast_address("auto", "tcp://[::1]:5555", curve=False) == ("::1", 0)
    assert fast_address("auto", "ipc:///run/sf.sock", curve=False) is None
    assert fast_address("off", "tcp://127.0.0.1:5555", curve=False) is None
    assert fast_address("127.0.0.1:7000", "tcp://127.0.0.1:5555", curve=False) == ("127.0.0.1", 7000)
    assert fast_address(":7000", "tcp://127.0.0.1:5555", curve=False) == ("0.0.0.0", 7000)
    # Never with CURVE: it carries no encryption.
    assert fast_address("auto", "tcp://127.0.0.1:5555", curve=True) is None


def test_fast_bind_is_checked_up_front(tmp_path):
    assert Config(fast_bind="AUTO").fast_bind == "auto"
    for bad in ("7000", "localhost", "127.0.0.1:99999", "[::1:7000"):
        with pytest.raises(ConfigError, match="fast_bind"):
            Config(fast_bind=bad)
    key = tmp_path / "server.key_secret"
    with pytest.raises(ConfigError, match="no encryption"):
        Config(fast_bind="127.0.0.1:7000", curve_secret_key=str(key))


def test_a_port_that_cannot_be_bound_is_a_config_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(ConfigError, match="cannot bind the fast port"):
            FastPort("127.0.0.1", taken.getsockname()[1], requests=None, bad_request=None)


# -- the client's choice -------------------------------------------------------------------------


def client(endpoint="tcp://10.0.0.5:5555", **kw) -> ClientBase:
    c = ClientBase(endpoint, **kw)
    c._core.heard = True
    return c


def learn(c: ClientBase, answer: dict) -> None:
    """The fast ports of a NODES answer the client's current node gave."""
    c.fast_path.learn(answer, c.endpoint)


def route(c: ClientBase, n: int, chunk: int, now_ns: int) -> tuple[str, int] | None:
    """Where on the fast port the client sends a reservation of ``n``, or None for ZeroMQ."""
    return c.fast_path.route(c.endpoint, n, chunk, now_ns, c.curve is not None)


def test_a_client_learns_each_nodes_fast_port_and_uses_it_only_for_one_request():
    c = client()
    learn(
        c,
        {
            "fast_port": 40001,
            "nodes": [
                {"endpoints": ["tcp://10.0.0.5:5555"], "fast_port": 40001},
                {"endpoints": ["tcp://10.0.0.6:5555"], "fast_port": 40002},
                {"endpoints": ["tcp://10.0.0.7:5555"], "fast_port": True},
                {"endpoints": ["tcp://10.0.0.8:5555"], "fast_port": "40004"},
                {"endpoints": ["tcp://10.0.0.9:5555"], "fast_port": 70000},
                "garbage",
            ],
        },
    )
    assert route(c, 1, protocol.MAX_BLOCK, 0) == ("10.0.0.5", 40001)
    assert route(c, protocol.MAX_BLOCK, protocol.MAX_BLOCK, 0) == ("10.0.0.5", 40001)
    assert route(c, protocol.MAX_BLOCK + 1, 10**6, 0) is None  # more than one request
    assert route(c, 100, 64, 0) is None  # split in requests of 64
    c.directory.current = "tcp://10.0.0.6:5555"
    assert route(c, 1, protocol.MAX_BLOCK, 0) == ("10.0.0.6", 40002)
    for bad in ("tcp://10.0.0.7:5555", "tcp://10.0.0.8:5555", "tcp://10.0.0.9:5555"):
        c.directory.current = bad
        assert route(c, 1, protocol.MAX_BLOCK, 0) is None, bad
        assert not c._fast_unknown()  # listed without one: not asked again


def test_after_a_failure_a_client_leaves_the_fast_port_alone_for_a_while():
    c = client()
    learn(c, {"fast_port": 40001, "nodes": []})
    c._fast_failed(1_000)
    assert route(c, 1, protocol.MAX_BLOCK, 2_000) is None
    assert c._fast_unknown()  # asked again: a node restarted with auto has another port
    learn(c, {"fast_port": 40007, "nodes": []})
    assert route(c, 1, protocol.MAX_BLOCK, 3_000) is None  # still left alone
    later = 1_000 + int(30 * 1e9)
    assert route(c, 1, protocol.MAX_BLOCK, later) == ("10.0.0.5", 40007)


def test_a_client_asks_a_new_node_for_its_fast_port_once_and_never_over_ipc_or_with_curve():
    c = client(discover=False)
    assert c._fast_unknown()
    pending, frame = c._discovery(0)
    assert pending.kind == protocol.NODES
    assert not c._fast_unknown() and c._discovery(1) is None  # asked: not again
    c._discovered(protocol.Reply(protocol.NODES_REPLY, pending.request_id, nodes={"nodes": [], "fast_port": None}))
    assert route(c, 1, protocol.MAX_BLOCK, 0) is None
    assert c.endpoints == ["tcp://10.0.0.5:5555"]  # without discovery, the list stays the seeds
    assert not client("ipc:///run/sf.sock")._fast_unknown()
    curved = client()
    curved.curve = object()
    assert not curved._fast_unknown()


def test_the_answering_nodes_own_port_is_used_at_the_host_the_client_reached_it_on():
    c = client("tcp://[::1]:5555")
    learn(c, {"fast_port": 40001, "nodes": [{"endpoints": ["tcp://10.0.0.5:5555"], "fast_port": 40009}]})
    assert route(c, 1, protocol.MAX_BLOCK, 0) == ("::1", 40001)


# -- the asyncio client's one-request path -------------------------------------------------------


class ScriptedTransport:
    """A fast connection's transport that answers each request with the next scripted reply
    (a function of the request id and count), on the loop's next turn."""

    def __init__(self, proto, script):
        self.proto, self.script, self.asked = proto, list(script), []
        self.loop = asyncio.get_running_loop()

    def write(self, data):
        body = data[4:]
        rid, count = struct.unpack_from("!QI", body, 4)
        self.asked.append(count)
        reply = self.script.pop(0)(rid, count)
        if reply is not None:
            self.loop.call_soon(self.proto.data_received, protocol.encode_stream(reply))

    def close(self):
        pass


def scripted_client(script, **kw):
    from snowfence import AsyncClient
    from snowfence.clients import aio

    c = AsyncClient("tcp://127.0.0.1:1", **kw)
    c._core.heard = True
    c._fast_ports = {c.endpoint: 1}
    c._fast_asked = c.endpoint
    c.directory._next_ns = 1 << 62  # discovery not due
    proto = aio._FastProtocol(c, ("127.0.0.1", 1), c.endpoint)
    proto.transport = ScriptedTransport(proto, script)
    c._fast = proto
    return c, proto.transport


def run_async(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


def test_the_asyncio_clients_single_request_takes_the_whole_grant_in_one_round_trip():
    async def main():
        c, t = scripted_client([lambda rid, n: protocol.encode_block(rid, 1000, n)])
        assert await c.reserve(7) == [Block(1000, 7)]
        assert t.asked == [7] and not c._core.inflight

    run_async(main())


def test_the_asyncio_clients_single_request_hands_a_partial_grant_to_its_rounds():
    async def main():
        c, t = scripted_client(
            [lambda rid, n: protocol.encode_block(rid, 1000, 3), lambda rid, n: protocol.encode_block(rid, 5000, n)]
        )
        assert await c.reserve(10) == [Block(1000, 3), Block(5000, 7)]
        assert t.asked == [10, 7] and not c._core.inflight

    run_async(main())


def test_the_asyncio_clients_single_request_retries_a_retriable_error_and_raises_another():
    from snowfence.errors import ClockUnsafe

    async def main():
        c, t = scripted_client(
            [
                lambda rid, n: protocol.encode_error(rid, ClockUnsafe("scripted")),
                lambda rid, n: protocol.encode_block(rid, 9000, n),
            ]
        )
        assert await c.reserve(2) == [Block(9000, 2)]
        assert t.asked == [2, 2]
        c, t = scripted_client([lambda rid, n: protocol.encode_error(rid, BadRequest("scripted"))])
        with pytest.raises(BadRequest):
            await c.reserve(2)
        assert t.asked == [2] and not c._core.inflight  # not retriable: raised at once

    run_async(main())


def test_a_bad_frame_whose_error_cannot_be_sent_closes_the_connection_once(monkeypatch):
    # The ERROR for a bad frame fails to send (the client reset the connection at once):
    # send() closes the connection, and the close after it must not close it again (a
    # second unregister of its descriptor stopped the broker's loop).
    registered: set[int] = set()

    class Watcher:  # the loop's epoll set, as the door sees it
        def watch(self, fd, mask, owner=None):
            registered.add(fd)

        def unwatch(self, fd):
            registered.remove(fd)  # raises KeyError, as epoll's unregister raises, for one not there

    core, port = core_and_port()
    port.attach(Watcher())
    try:
        sock = socket.create_connection(("127.0.0.1", port.port), timeout=5)
        turn(port)
        (conn,) = port.by_fd.values()

        class Resetting:  # the kernel's answer to a send after the peer's reset
            def __init__(self, real):
                self.real = real

            def recv(self, n):
                return self.real.recv(n)

            def send(self, data):
                raise ConnectionResetError(104, "Connection reset by peer")

            def close(self):
                self.real.close()

        conn.sock = Resetting(conn.sock)
        sock.sendall(struct.pack("!I", 0))
        time.sleep(0.05)
        port.on_event(conn.fd, select.EPOLLIN)
        assert not port.by_fd and port.stats["closed"] == 1
        assert registered == {port.listen_fd}
        sock.close()
    finally:
        port.close()


# -- the blocking client's one-request path ------------------------------------------------------


class ScriptedFast:
    """A blocking client's fast connection that answers each request with the next scripted
    reply (a function of the request id and count; None: no answer, a wait that times out;
    ``OSError``: the connection closes under the request)."""

    def __init__(self, endpoint, script):
        self.where, self.endpoint = ("127.0.0.1", 1), endpoint
        self.script, self.asked, self.replies, self.closed = list(script), [], [], False

    def send(self, frame):
        rid, count = struct.unpack_from("!QI", frame, 4)
        self.asked.append(count)
        reply = self.script.pop(0)(rid, count)
        if reply is OSError:
            raise ConnectionResetError("scripted")
        if reply is not None:
            self.replies.append(reply)

    def recv_within(self, timeout_ms):
        return self.replies.pop(0) if self.replies else None

    def recv_ready(self):
        return self.replies.pop(0) if self.replies else None

    def close(self):
        self.closed = True


def blocking_scripted(script, **kw):
    from snowfence import Client

    c = Client("tcp://127.0.0.1:1", **kw)
    c._core.heard = True
    c._fast_ports = {c.endpoint: 1}
    c._fast_asked = c.endpoint
    c.directory._next_ns = 1 << 62  # discovery not due
    c._fast = ScriptedFast(c.endpoint, script)
    return c, c._fast


def test_the_blocking_clients_single_request_takes_the_whole_grant_in_one_round_trip(monkeypatch):
    from snowfence.clients import blocking

    c, fast = blocking_scripted([lambda rid, n: protocol.encode_block(rid, 1000, n)])
    monkeypatch.setattr(blocking.Client, "_run", lambda *a, **k: pytest.fail("a round was built"))
    assert c.reserve(7) == [Block(1000, 7)]
    assert fast.asked == [7] and not c._core.inflight


def test_the_blocking_clients_single_request_hands_a_partial_grant_to_its_rounds():
    c, fast = blocking_scripted(
        [lambda rid, n: protocol.encode_block(rid, 1000, 3), lambda rid, n: protocol.encode_block(rid, 5000, n)]
    )
    assert c.reserve(10) == [Block(1000, 3), Block(5000, 7)]
    assert fast.asked == [10, 7] and not c._core.inflight


def test_the_blocking_clients_single_request_retries_a_retriable_error_and_raises_another():
    from snowfence.errors import ClockUnsafe

    c, fast = blocking_scripted(
        [
            lambda rid, n: protocol.encode_error(rid, ClockUnsafe("scripted")),
            lambda rid, n: protocol.encode_block(rid, 9000, n),
        ]
    )
    assert c.reserve(2) == [Block(9000, 2)]
    assert fast.asked == [2, 2] and not c._core.inflight
    c, fast = blocking_scripted([lambda rid, n: protocol.encode_error(rid, BadRequest("scripted"))])
    with pytest.raises(BadRequest):
        c.reserve(2)
    assert fast.asked == [2] and not c._core.inflight  # not retriable: raised at once


def test_the_blocking_clients_single_request_skips_a_stale_reply_and_goes_to_zeromq_when_the_connection_closes():
    c, fast = blocking_scripted([lambda rid, n: protocol.encode_block(rid - 1, 1, 1)])  # stale, then nothing
    calls = []

    def zeromq_round(round_, chunk=protocol.MAX_BLOCK, sent=None):
        calls.append(sent)
        c._take_over(round_, *sent)
        round_.job.on_block(round_.job.unasked or 1, Block(77, 1))
        round_.job.unasked = 0
        round_.waiting.clear()

    # A reply to an older request is not this one's: the wait goes on (and here times out).
    c._run = zeromq_round
    assert c.reserve(1) == [Block(77, 1)]
    (sent,) = calls
    assert sent[1] is None  # handed over as unanswered: the round's settle counts the timeout
    c, fast = blocking_scripted([lambda rid, n: OSError])
    calls.clear()
    c._run = zeromq_round
    assert c.reserve(1) == [Block(77, 1)]
    from snowfence.clients import blocking

    assert calls[0][1] is blocking._LOST
    assert c._fast is None and fast.closed and c.fast_path.off_until_ns  # ZeroMQ for a while


def test_the_blocking_clients_single_request_that_times_out_is_a_timeout_of_its_round():
    from snowfence.errors import Timeout

    c, fast = blocking_scripted([lambda rid, n: None], timeout_s=0.01, retries=0)
    started = time.monotonic()
    with pytest.raises(Timeout, match="gave up after 1 failed attempt"):
        c.reserve(1)
    assert time.monotonic() - started >= 0.01  # the deadline, not the first empty read
    assert fast.asked == [1] and not c._core.inflight


def test_the_blocking_clients_single_request_backs_off_after_a_refusal_before_asking_again():
    from snowfence.errors import Overloaded

    sent_at = []

    def overloaded(rid, n):
        sent_at.append(time.monotonic())
        err = Overloaded("scripted")
        err.retry_after_ms = 300
        return protocol.encode_error(rid, err)

    def granted(rid, n):
        sent_at.append(time.monotonic())
        return protocol.encode_block(rid, 4000, n)

    c, fast = blocking_scripted([overloaded, granted])
    assert c.reserve(1) == [Block(4000, 1)]
    assert sent_at[1] - sent_at[0] >= 0.3  # the server's hint, as on the rounds' own path
