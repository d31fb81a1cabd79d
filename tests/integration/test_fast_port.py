"""The fast port with real nodes: real processes, real TCP and ZeroMQ sockets on loopback.

Nodes here bind tcp:// (the harness's default is ipc://, which has no fast port)."""

from __future__ import annotations

import asyncio
import re
import socket
import struct
import time

import pytest
import uvloop
from checks import check_blocks
from nodes import wait_for
from test_edges import run_snowfence
from test_operations import get, health

from snowfence import AsyncClient, Client, protocol
from snowfence.ids import DEFAULT_LAYOUT

L = DEFAULT_LAYOUT
TCP = "tcp://127.0.0.1:0"
ONE_HOP = ("--broker-mint-max-ids", "64")


def fast_stats(node) -> dict:
    return node.status()["broker"]["fast_port"]


def start(nodes, *args, name="node", workers=1, state_dir=None):
    node = nodes.start(name, workers=workers, bind=TCP, args=args, state_dir=state_dir)
    node.wait_bound()
    node.wait_ready()
    return node


def own_ready(node) -> bool:
    return bool((node.status()["broker"].get("own_worker_id") or {}).get("ready"))


def raw_connection(node) -> socket.socket:
    with node.client() as c:
        port = c.nodes()["fast_port"]
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_bodies(sock: socket.socket, n: int, timeout_s: float = 10.0) -> list[bytes]:
    stream, got = protocol.Stream(1 << 24), []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        data = sock.recv(1 << 16)
        if not data:
            break
        got += stream.feed(data)
    return got


def test_small_reservations_of_both_clients_go_over_the_fast_port_and_large_ones_over_zeromq(nodes):
    node = start(nodes, *ONE_HOP)
    wait_for(lambda: own_ready(node), 20, what="the broker's own worker ID")
    listed = Client(node.endpoint, timeout_s=2.0, discover=False).nodes()
    assert isinstance(listed["fast_port"], int) and listed["nodes"][0]["fast_port"] == listed["fast_port"]
    before = fast_stats(node)
    blocks = []
    with node.client() as c:
        blocks += [b for _ in range(50) for b in c.reserve(1)]
        assert c._fast is not None  # learned from NODES after its first answer
        blocks += c.reserve(4096)
        after_small = fast_stats(node)["requests"]
        blocks += c.reserve(20_000)  # five requests and more: ZeroMQ, pipelined
        assert fast_stats(node)["requests"] == after_small

    async def asynchronous():
        async with AsyncClient(node.endpoint, timeout_s=2.0, discover=False) as a:
            got = [b for _ in range(50) for b in await a.reserve(1)]
            got += [b for r in await asyncio.gather(*(a.reserve(3) for _ in range(40))) for b in r]
            assert a._fast is not None
            return got

    blocks += uvloop.run(asynchronous())
    stats = fast_stats(node)
    # All but the first call of each client (its ZeroMQ answer teaches it the port): 1 + 48 + 1 + 49 + 40.
    assert stats["requests"] - before["requests"] >= 48 + 1 + 49 + 40, stats
    assert stats["accepted"] - before["accepted"] >= 2
    assert sum(b.count for b in blocks) == 50 + 4096 + 20_000 + 50 + 120
    check_blocks([[(b.first, b.count) for b in blocks]])
    own = {h["worker_id"] for h in node.status()["broker"]["own_worker_id"]["held"]}
    assert own & {L.decompose(b.first).worker for b in blocks if b.count == 1}  # the broker minted them


def test_a_node_with_curve_has_no_fast_port_and_refuses_to_be_given_one(nodes, tmp_path):
    assert run_snowfence("keygen", "server", "--dir", str(tmp_path / "keys"))[0].returncode == 0
    secret, public = tmp_path / "keys" / "server.key_secret", str(tmp_path / "keys" / "server.key")
    p, _ = run_snowfence(
        "serve", "--bind", TCP, "--state-dir", str(tmp_path / "refused"), "--curve-secret-key", str(secret),
        "--fast-bind", "127.0.0.1:0",
    )  # fmt: skip
    assert p.returncode != 0 and "no encryption" in p.stderr and "Traceback" not in p.stderr, p.stderr
    node = nodes.start(workers=1, bind=TCP, args=("--curve-secret-key", str(secret)))
    node.wait_bound()
    with Client(node.endpoint, timeout_s=2.0, server_key=public, discover=False) as c:
        wait_for(lambda: any(w["state"] == "ready" for w in c.status()["workers"]), 20, what="a ready worker")
        assert c.nodes()["fast_port"] is None
        assert c.status()["broker"]["fast_port"] is None
        assert c.reserve(1)[0].count == 1
        assert c._fast is None


def test_a_fast_port_that_cannot_be_bound_stops_serve_with_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        p, _ = run_snowfence(
            "serve", "--bind", TCP, "--state-dir", str(tmp_path / "state"), "--workers", "1",
            "--fast-bind", f"127.0.0.1:{port}",
        )  # fmt: skip
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    assert f"cannot bind the fast port 127.0.0.1:{port}" in p.stderr, p.stderr


def test_bad_frames_on_the_fast_port_get_an_error_and_the_node_goes_on(nodes):
    node = start(nodes, "--metrics-bind", "127.0.0.1:0")
    addr = health(node)
    for garbage in (struct.pack("!I", 0), struct.pack("!I", 1 << 20) + b"x" * 100):
        with raw_connection(node) as sock:
            sock.sendall(garbage)
            (body,) = read_bodies(sock, 1)
            reply = protocol.decode_reply(body)
            assert reply.type == protocol.ERROR and reply.request_id == 0, reply
            assert sock.recv(10) == b""  # closed after it
    # A bad frame, and a reset before its ERROR can go out: the node must not trip over
    # closing the connection twice (it once stopped its loop).
    for _ in range(5):
        sock = raw_connection(node)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.sendall(struct.pack("!I", 0))
        sock.close()
    with raw_connection(node) as sock:
        # Framed right but wrong: an error, and the connection stays.
        sock.sendall(protocol.encode_stream(b"\x07" + bytes(11)))
        sock.sendall(protocol.encode_stream(protocol.encode_reserve(77, 5)))
        first, second = (protocol.decode_reply(b) for b in read_bodies(sock, 2))
        assert first.type == protocol.ERROR and first.error.code == "unsupported_version"
        assert second.type == protocol.BLOCK and second.request_id == 77 and second.count == 5
    stats = fast_stats(node)
    assert stats["bad_frame"] >= 2  # the reset ones may have gone before their frame was read

    def counted():  # the metrics are a snapshot of at most a second ago
        text = get(addr, "/metrics")[1]
        return re.search(r'snowfence_fast_port_closed_total\{why="bad_frame"\} [2-7]\.0', text) and re.search(
            r"snowfence_fast_port_requests_total [1-9]", text
        )

    wait_for(counted, 5, what="the fast port's bad frames and requests in the metrics")
    with node.client() as c:
        assert c.reserve(1)[0].count == 1


def test_the_in_flight_limit_and_overloaded_hold_on_the_fast_port(nodes):
    node = start(nodes, "--max-inflight-per-client", "4", "--worker-credits", "1")
    with raw_connection(node) as sock:
        n = 400
        sock.sendall(b"".join(protocol.encode_stream(protocol.encode_reserve(i, 4096)) for i in range(1, n + 1)))
        replies = [protocol.decode_reply(b) for b in read_bodies(sock, n, 30)]
    assert len(replies) == n and sorted(r.request_id for r in replies) == list(range(1, n + 1))
    codes = {r.error.code for r in replies if r.type == protocol.ERROR}
    granted = [r for r in replies if r.type == protocol.BLOCK]
    assert codes == {"overloaded"} and 4 <= len(granted) < n
    check_blocks([[(r.first, r.count) for r in granted]])


def test_a_client_whose_fast_port_stops_answering_goes_on_over_zeromq(nodes):
    node = start(nodes, *ONE_HOP)
    with node.client(timeout_s=2.0, retries=1) as c:
        c.reserve(1)
        c.reserve(1)
        assert c._fast is not None
        # Its fast port as the client knows it now leads nowhere: a closed port.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead = s.getsockname()[1]
        c._fast_ports[c.endpoint] = dead
        started = time.monotonic()
        blocks = [b for _ in range(20) for b in c.reserve(1)]
        took = time.monotonic() - started
        assert c._fast is None and c.fast_path.off_until_ns > 0
    assert sum(b.count for b in blocks) == 20
    assert took < 2.0, f"a refused connection cost {took:.2f} s"  # refused at once: no timeout waited
    check_blocks([[(b.first, b.count) for b in blocks]])


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
def test_a_client_on_a_fast_port_whose_node_is_killed_goes_on_at_the_next_node(nodes, tmp_path, kind):
    # Two embedded nodes on one state directory: one host's file locks keep their worker IDs apart.
    shared = tmp_path / "shared-state"
    a, b = (start(nodes, *ONE_HOP, name=name, state_dir=shared) for name in "ab")
    timeout_s = 1.0

    def check(client, blocks, took):
        assert sum(x.count for x in blocks) == 21
        assert {L.decompose(x.first).worker for x in blocks[-20:]} <= b.all_worker_ids()
        # The connection's end is seen at once; ZeroMQ on A then times out once, and B answers.
        assert took < 2 * timeout_s + 1.5, f"{took:.2f} s"
        check_blocks([[(x.first, x.count) for x in blocks]])

    if kind == "blocking":
        with Client([a.endpoint, b.endpoint], timeout_s=timeout_s, discover=False) as c:
            blocks = c.reserve(1) + c.reserve(1)
            assert c._fast is not None and c.endpoint == a.endpoint
            a.kill()
            started = time.monotonic()
            blocks = blocks[1:] + [x for _ in range(20) for x in c.reserve(1)]
            check(c, blocks, time.monotonic() - started)
        return

    async def run():
        async with AsyncClient([a.endpoint, b.endpoint], timeout_s=timeout_s, discover=False) as c:
            blocks = await c.reserve(1) + await c.reserve(1)
            assert c._fast is not None and c.endpoint == a.endpoint
            a.kill()
            started = time.monotonic()
            blocks = blocks[1:] + [x for _ in range(20) for x in await c.reserve(1)]
            check(c, blocks, time.monotonic() - started)

    uvloop.run(run())


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
def test_a_fast_port_that_stops_answering_sends_the_client_back_to_zeromq(nodes, kind):
    node = start(nodes, *ONE_HOP)
    with socket.socket() as silent:  # accepts, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]

        def check(c, blocks, took):
            assert sum(x.count for x in blocks) == 10
            assert c.fast_path.off_until_ns > 0  # ZeroMQ from the first timeout on, for a while
            assert took < 0.5 + 1.5, f"{took:.2f} s: more than the one timeout"  # not one per call
            check_blocks([[(x.first, x.count) for x in blocks]])

        if kind == "blocking":
            with node.client(timeout_s=0.5, retries=2) as c:
                c.reserve(1)
                c.reserve(1)
                assert c._fast is not None
                c._close_fast()
                c._fast_ports[c.endpoint] = port
                started = time.monotonic()
                blocks = [x for _ in range(10) for x in c.reserve(1)]
                check(c, blocks, time.monotonic() - started)
            return

        async def run():
            async with AsyncClient(node.endpoint, timeout_s=0.5, retries=2, discover=False) as c:
                await c.reserve(1)
                await c.reserve(1)
                assert c._fast is not None
                c._close_fast()
                c._fast_ports[c.endpoint] = port
                started = time.monotonic()
                blocks = [x for _ in range(10) for x in await c.reserve(1)]
                check(c, blocks, time.monotonic() - started)

        uvloop.run(run())


def test_a_zeromq_peer_that_claims_a_fast_connections_address_is_not_answered(nodes):
    import zmq

    node = start(nodes, "--metrics-bind", "127.0.0.1:0")
    with raw_connection(node) as fast:
        fast.sendall(protocol.encode_stream(protocol.encode_reserve(5, 1)))
        (body,) = read_bodies(fast, 1)
        assert protocol.decode_reply(body).request_id == 5
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, b"\x00" + (1).to_bytes(8, "big"))  # the first fast connection's
        try:
            sock.connect(node.endpoint)
            sock.send(protocol.encode_reserve(6, 1))
            assert sock.poll(1000) == 0  # no answer: an answer would go to the fast connection
        finally:
            sock.close()
        fast.settimeout(0.5)
        with pytest.raises(TimeoutError):
            fast.recv(64)  # nor did the fast connection get anything it did not ask for
    with node.client() as c:
        assert c.reserve(1)[0].count == 1
        counters = c.status()["broker"]["counters"]
        assert counters["impostors"] == 1 and counters["bad_request"] >= 1
    addr = health(node)
    wait_for(  # the metrics are a snapshot of at most a second ago
        lambda: 'snowfence_requests_dropped_total{why="impostor"} 1.0' in get(addr, "/metrics")[1],
        5,
        what="the impostor in the metrics",
    )


def test_a_node_with_a_fast_port_stops_cleanly_on_sigterm_with_a_connection_open(nodes):
    # The loop's epoll set is closed before the router closes the fast port: closing its
    # listener and connections then must not unregister them from it (it raised, and
    # serve exited 1 with a traceback on every stop).
    import signal

    node = start(nodes)
    sock = raw_connection(node)
    sock.sendall(protocol.encode_stream(protocol.encode_reserve(7, 1)))
    (body,) = read_bodies(sock, 1)
    assert protocol.decode_reply(body).count == 1
    assert node.stop(signal.SIGTERM) == 0
    log = node.log()
    assert "Traceback" not in log and "snowfence stopped (exit status 0)" in log, log
    sock.settimeout(5)
    assert sock.recv(16) == b""  # its connection was closed, not left open
    sock.close()
