"""The limits a client must know, per docs/PROTOCOL.md ("Limits", "Transport", "The fast
port"): requests in flight per connection, the fast port's connections, the values of
``after`` and how far ahead a token may be, reply sizes, what bad framing on the fast port
loses, routing ids never answered; and a fast port at a fixed address, found without ZeroMQ.

Most tests use this module's node: one worker, bound to ``ipc://`` (which gets no fast port
of its own) with ``--fast-bind 127.0.0.1:PORT`` and ``--max-step-back-ms 200``. The tests
that need requests to stay in flight SIGSTOP its worker for a fraction of a second (well
within the heartbeat timeout, so it stays in rotation) and ask for more IDs than the broker
mints itself, so that only the worker may answer.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import time

import pytest
import sfwire
import zmq

STEP_BACK_MS = 200
IN_FLIGHT = 1024
#: The hlc node's --max-inflight-per-client.
HLC_IN_FLIGHT = 8
FAST_CONNECTIONS = 1024
#: More than the broker's own worker ID mints (64 by default): only a worker answers these.
WORKER_COUNT = 100


@pytest.fixture(scope="module")
def fixed_port(unused_port) -> int:
    return unused_port()


@pytest.fixture(scope="module")
def node(start_node, tmp_path_factory, fixed_port):
    # The fast port's connection cap needs a descriptor per connection on both ends.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * FAST_CONNECTIONS
    if soft < want and (hard == resource.RLIM_INFINITY or hard >= want):
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    args = ("--fast-bind", f"127.0.0.1:{fixed_port}", "--max-step-back-ms", str(STEP_BACK_MS))
    srv = start_node(tmp_path_factory.mktemp("limits"), workers=1, args=args)
    try:
        yield srv
    finally:
        srv.kill()


@pytest.fixture(scope="module")
def hlc_node(start_node, tmp_path_factory):
    args = ("--clock-policy", "hlc", "--max-ahead-ms", "300", "--max-inflight-per-client", str(HLC_IN_FLIGHT))
    srv = start_node(tmp_path_factory.mktemp("hlc"), workers=1, args=args)
    try:
        yield srv
    finally:
        srv.kill()


@contextlib.contextmanager
def worker_stopped(node):
    """The node's one worker SIGSTOPped (still in rotation), then SIGCONTed."""
    [worker] = node.status()["workers"]
    os.kill(worker["pid"], signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(worker["pid"], signal.SIGCONT)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def ask(node, body: bytes, timeout_ms: int = 3000) -> sfwire.Reply:
    sock = sfwire.connect(node.ctx, node.endpoint, timeout_ms=timeout_ms)
    try:
        return sfwire.request(sock, body)
    finally:
        sock.close(0)


def error_of(reply: sfwire.Reply, code: str, request_id: int) -> dict:
    assert reply.type == sfwire.ERROR and reply.request_id == request_id, reply
    assert reply.json["code"] == code and reply.json["retriable"] is sfwire.ERROR_CODES[code], reply.json
    return reply.json


# -- the fast port at a fixed address -----------------------------------------------------------


def test_a_node_with_a_fixed_fast_port_serves_there_without_zeromq(node, fixed_port):
    # The suite's client learns nothing over ZeroMQ first: the address is all it has.
    conn = sfwire.FastConn("127.0.0.1", fixed_port)
    try:
        first, count = conn.request(sfwire.reserve(1, 10)).block
        assert count >= 1
        assert conn.request(sfwire.status(2)).json["broker"]["fast_port"]["port"] == fixed_port
    finally:
        conn.close()
    status = node.status()
    assert status["broker"]["bind"].startswith("ipc://")  # an ipc:// node has one only this way
    assert status["broker"]["fast_port"]["port"] == fixed_port
    assert status["broker"]["fast_port"]["host"] == "127.0.0.1"
    nodes = ask(node, sfwire.nodes(3)).json
    assert nodes["fast_port"] == fixed_port and [n["fast_port"] for n in nodes["nodes"]] == [fixed_port]


def test_a_fixed_fast_port_is_the_same_at_every_start(node, tmp_path, unused_port):
    port = unused_port()
    for start in range(2):  # the same node (its state directory), started twice
        srv = type(node)(tmp_path, workers=1, args=("--fast-bind", f"127.0.0.1:{port}"))
        try:
            srv.start()
            deadline = time.monotonic() + 20
            while True:
                try:
                    conn = sfwire.FastConn("127.0.0.1", port, timeout_s=1)
                except ConnectionRefusedError:
                    assert srv.proc.poll() is None, srv.log_tail()
                    assert time.monotonic() < deadline, f"start {start}: nothing listens on {port}"
                    time.sleep(0.05)
                    continue
                break
            try:
                reply = conn.request(sfwire.status(start + 1))
            finally:
                conn.close()
            assert reply.json["broker"]["pid"] == srv.proc.pid  # this start's broker
            assert reply.json["broker"]["fast_port"]["port"] == port
        finally:
            srv.kill()


def test_an_ipc_node_with_fast_bind_auto_has_no_fast_port(server):
    assert server.endpoint.startswith("ipc://") and server.ready_status["broker"]["fast_port"] is None
    nodes = ask(server, sfwire.nodes(1)).json
    assert nodes["fast_port"] is None and [n["fast_port"] for n in nodes["nodes"]] == [None]


def test_the_fast_port_answers_every_type_and_a_framed_bad_body_keeps_the_connection(node, fixed_port):
    conn = sfwire.FastConn("127.0.0.1", fixed_port)
    try:
        bad = sfwire.header(0x09, 5)
        conn.send(
            sfwire.reserve(1, 3),
            sfwire.status(2),
            sfwire.header(sfwire.TIME, 3),
            sfwire.nodes(4),
            bad,
            sfwire.header(sfwire.WATERMARK, 6),
        )
        got = {r.request_id: r for r in conn.replies(6)}
        assert sorted(got) == [1, 2, 3, 4, 5, 6]
        assert got[1].type == sfwire.BLOCK and got[2].type == sfwire.STATUS_REPLY
        assert got[3].type == sfwire.TIME_REPLY and got[4].type == sfwire.NODES_REPLY
        assert got[6].type in (sfwire.WATERMARK_REPLY, sfwire.ERROR)
        error_of(got[5], "bad_request", 5)
        assert conn.request(sfwire.reserve(7, 1)).block[1] == 1  # still open
    finally:
        conn.close()


@pytest.mark.parametrize("length, code", [(0, "bad_request"), (256, "frame_too_large"), (1 << 31, "frame_too_large")])
def test_a_bad_length_gets_one_error_with_request_id_0_and_the_connection_closes(node, fixed_port, length, code):
    conn = sfwire.FastConn("127.0.0.1", fixed_port)
    try:
        conn.send_raw(sfwire.LENGTH.pack(length) + b"\x01" * min(length, 300))
        got = conn.replies()
        assert conn.ended == "eof" and len(got) == 1, (conn.ended, got)
        error_of(got[0], code, 0)
    finally:
        conn.close()


def test_a_bad_length_loses_every_request_in_flight_on_that_connection(node, fixed_port):
    conn = sfwire.FastConn("127.0.0.1", fixed_port)
    try:
        with worker_stopped(node):
            conn.send(*(sfwire.reserve(i, WORKER_COUNT) for i in range(1, 6)))
            time.sleep(0.05)  # read and sent to the (stopped) worker: in flight
            conn.send(sfwire.reserve(6, WORKER_COUNT))
            conn.send_raw(sfwire.LENGTH.pack(256) + b"\x01" * 256)  # the same write as request 6's, or next
            got = conn.replies(timeout_s=2)
        assert conn.ended == "eof" and len(got) == 1, (conn.ended, got)
        error_of(got[0], "frame_too_large", 0)  # the last thing sent: no reply to 1..6, ever
    finally:
        conn.close()
    # The worker answers them once it runs again; the broker has nowhere to send those replies.
    time.sleep(0.2)
    assert ask(node, sfwire.reserve(9, WORKER_COUNT)).block[1] >= 1


def test_a_zeromq_message_over_64_kib_loses_every_request_in_flight_on_that_connection(node):
    sock = sfwire.connect(node.ctx, node.endpoint, timeout_ms=3000)
    try:
        with worker_stopped(node):
            for i in range(1, 6):
                sock.send(sfwire.reserve(i, WORKER_COUNT))
            time.sleep(0.05)  # read and sent to the (stopped) worker: in flight
            sock.send(sfwire.reserve(6, 1) + b"\x00" * sfwire.MAX_MESSAGE)
            time.sleep(0.1)  # the broker's transport drops it and closes the connection
        # The worker answers 1..5 once it runs again; the connection they came on is gone.
        assert not sock.poll(1000), sfwire.recv_frames(sock)
        # The DEALER reconnects by itself, as a new connection that is served.
        assert sfwire.request(sock, sfwire.reserve(7, 1)).block[1] == 1
    finally:
        sock.close(0)


# -- requests in flight per connection ----------------------------------------------------------


def test_the_request_after_1024_in_flight_on_a_connection_is_overloaded_and_the_rest_are_answered(node, fixed_port):
    total = IN_FLIGHT + 6
    sock = sfwire.connect(node.ctx, node.endpoint, timeout_ms=5000)
    conn = sfwire.FastConn("127.0.0.1", fixed_port, timeout_s=5)
    try:
        with worker_stopped(node):
            for i in range(1, total + 1):
                sock.send(sfwire.reserve(i, WORKER_COUNT))
            conn.send(*(sfwire.reserve(i, WORKER_COUNT) for i in range(1, total + 1)))
            early_zmq = [sfwire.parse(sfwire.body_of(sfwire.recv_frames(sock))) for _ in range(total - IN_FLIGHT)]
            early_fast = conn.replies(total - IN_FLIGHT)
            for early in (early_zmq, early_fast):
                # Exactly the requests beyond the limit, at once (the worker is stopped).
                assert sorted(r.request_id for r in early) == list(range(IN_FLIGHT + 1, total + 1))
                for reply in early:
                    err = error_of(reply, "overloaded", reply.request_id)
                    assert isinstance(err["retry_after_ms"], int) and 1 <= err["retry_after_ms"] <= 1000, err
        # The requests in flight are not lost: each gets its BLOCK.
        late_zmq = [sfwire.parse(sfwire.body_of(sfwire.recv_frames(sock))) for _ in range(IN_FLIGHT)]
        late_fast = conn.replies(IN_FLIGHT)
        for late in (late_zmq, late_fast):
            assert sorted(r.request_id for r in late) == list(range(1, IN_FLIGHT + 1))
            assert all(r.block[1] >= 1 for r in late)
    finally:
        sock.close(0)
        conn.close()


def test_status_tells_the_in_flight_limit(server, hlc_node):
    assert server.ready_status["broker"]["max_inflight_per_client"] == IN_FLIGHT
    assert hlc_node.ready_status["broker"]["max_inflight_per_client"] == HLC_IN_FLIGHT


def test_the_in_flight_limit_is_max_inflight_per_client(hlc_node):
    sock = sfwire.connect(hlc_node.ctx, hlc_node.endpoint)
    try:
        with worker_stopped(hlc_node):
            for i in range(1, HLC_IN_FLIGHT + 3):
                sock.send(sfwire.reserve(i, WORKER_COUNT))
            early = [sfwire.parse(sfwire.body_of(sfwire.recv_frames(sock))) for _ in range(2)]
        assert sorted(r.request_id for r in early) == [HLC_IN_FLIGHT + 1, HLC_IN_FLIGHT + 2]
        assert all(error_of(r, "overloaded", r.request_id) for r in early)
        late = [sfwire.parse(sfwire.body_of(sfwire.recv_frames(sock))) for _ in range(HLC_IN_FLIGHT)]
        assert sorted(r.request_id for r in late) == list(range(1, HLC_IN_FLIGHT + 1))
    finally:
        sock.close(0)


# -- the fast port's connections ------------------------------------------------------------------


def test_the_fast_port_closes_a_connection_beyond_1024_without_a_byte(node, fixed_port):
    open_now = node.status()["broker"]["fast_port"]["connections"]
    conns = []
    try:
        for _ in range(FAST_CONNECTIONS - open_now):
            conns.append(sfwire.FastConn("127.0.0.1", fixed_port))
        extra = sfwire.FastConn("127.0.0.1", fixed_port)
        conns.append(extra)
        assert extra.replies(timeout_s=3) == [] and extra.ended == "eof" and extra.buf == b""
        stats = node.status()["broker"]["fast_port"]
        assert stats["connections"] == FAST_CONNECTIONS and stats["too_many"] >= 1
        assert conns[0].request(sfwire.reserve(1, 1)).block[1] == 1  # the ones within the cap serve
    finally:
        for conn in conns:
            conn.close()
    deadline = time.monotonic() + 5
    while node.status()["broker"]["fast_port"]["connections"] > 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    conn = sfwire.FastConn("127.0.0.1", fixed_port)  # room again
    try:
        assert conn.request(sfwire.reserve(2, 1)).block[1] == 1
    finally:
        conn.close()


# -- after: its values and how far ahead -----------------------------------------------------------


def test_after_0_is_accepted(server):
    first, count = ask(server, sfwire.reserve_after(1, 5, 0)).block
    assert first > 0 and count >= 1


@pytest.mark.parametrize("after", [sfwire.TOKEN_LIMIT, sfwire.TOKEN_LIMIT + 1, (1 << 64) - 1])
def test_after_of_2_to_the_63_or_more_is_bad_request(server, after):
    error_of(ask(server, sfwire.reserve_after(2, 1, after)), "bad_request", 2)


def test_the_largest_after_is_accepted_and_is_far_ahead(server):
    error_of(ask(server, sfwire.reserve_after(3, 1, sfwire.TOKEN_LIMIT - 1)), "token_ahead", 3)


def test_ids_granted_after_a_token_are_strictly_greater_even_than_the_last_id_just_granted(server):
    sock = sfwire.connect(server.ctx, server.endpoint)
    try:
        for i in range(50):
            first, count = sfwire.request(sock, sfwire.reserve(i, 7)).block
            last = first + count - 1
            for token in (first, last):
                got, _ = sfwire.request(sock, sfwire.reserve_after(i, 7, token)).block
                assert got > token
    finally:
        sock.close(0)


def token_ahead_by(layout: sfwire.Layout, ahead_ms: int) -> int:
    """The largest ID of the millisecond ``ahead_ms`` from now (no worker ID sorts after it in it)."""
    return layout.compose(
        0, now_ms() + ahead_ms, (1 << layout.region_bits) - 1, (1 << layout.worker_bits) - 1, (1 << 12) - 1
    )


def test_a_token_within_max_step_back_ms_is_waited_for_and_one_beyond_is_token_ahead(node):
    layout = sfwire.Layout.of(node.ready_status)
    token = token_ahead_by(layout, 120)
    start = time.monotonic()
    first, _ = ask(node, sfwire.reserve_after(1, 1, token)).block
    assert first > token and time.monotonic() - start >= 0.1  # the worker waited for its clock
    start = time.monotonic()
    error_of(ask(node, sfwire.reserve_after(2, 1, token_ahead_by(layout, 2 * STEP_BACK_MS))), "token_ahead", 2)
    assert time.monotonic() - start < 0.3  # at once, not after the 400 ms the token is ahead


def test_token_ahead_says_when_the_token_comes_within_reach(node, hlc_node):
    # retry_after_ms: about how far the token is ahead, less the wait (wait) or the run ahead
    # (hlc) the node allows it; never more than the token is ahead, at least 1.
    for srv, allowed_ms in ((node, STEP_BACK_MS), (hlc_node, 300)):
        layout = sfwire.Layout.of(srv.ready_status)
        for ahead_ms in (allowed_ms + 400, allowed_ms + 5000):
            err = error_of(ask(srv, sfwire.reserve_after(1, 1, token_ahead_by(layout, ahead_ms))), "token_ahead", 1)
            hint = err.get("retry_after_ms")
            assert type(hint) is int, err
            assert ahead_ms - allowed_ms - 100 <= hint <= ahead_ms - allowed_ms + 1, (ahead_ms, err)


def test_the_default_token_wait_is_10_ms(server, layout):
    error_of(ask(server, sfwire.reserve_after(1, 1, token_ahead_by(layout, 120))), "token_ahead", 1)
    token = token_ahead_by(layout, 3)
    first, _ = ask(server, sfwire.reserve_after(2, 1, token)).block
    assert first > token


def test_hlc_mints_at_once_in_the_tokens_millisecond_up_to_max_ahead_ms(hlc_node):
    layout = sfwire.Layout.of(hlc_node.ready_status)
    token = token_ahead_by(layout, 200)
    first, _ = ask(hlc_node, sfwire.reserve_after(1, 1, token)).block
    # Minted in the token's millisecond (+1), still ahead of the clock: no wait for it.
    assert first > token and layout.decode(first).unix_ms > now_ms()
    error_of(ask(hlc_node, sfwire.reserve_after(2, 1, token_ahead_by(layout, 600))), "token_ahead", 2)


# -- routing ids never answered -------------------------------------------------------------------


def silent(sock: zmq.Socket, body: bytes, wait_ms: int = 500) -> bool:
    sock.send(body)
    return not sock.poll(wait_ms)


def test_a_routing_id_of_a_zero_byte_and_8_more_is_never_answered(server, sockets):
    sock = sockets(connect=False, timeout_ms=500)
    sock.setsockopt(zmq.ROUTING_ID, b"\x00" + b"\x07" * 8)
    sock.connect(server.endpoint)
    assert silent(sock, sfwire.reserve(1, 1)) and silent(sock, sfwire.status(2))


def test_a_routing_id_in_use_by_another_connection_is_never_answered(server, sockets):
    first = sockets(connect=False)
    first.setsockopt(zmq.ROUTING_ID, b"conformance-dup")
    first.connect(server.endpoint)
    assert sfwire.request(first, sfwire.reserve(1, 1)).type == sfwire.BLOCK
    second = sockets(connect=False)
    second.setsockopt(zmq.ROUTING_ID, b"conformance-dup")
    second.connect(server.endpoint)
    assert silent(second, sfwire.reserve(2, 1))
    assert sfwire.request(first, sfwire.reserve(3, 1)).type == sfwire.BLOCK  # the first is unaffected


# -- reply sizes ------------------------------------------------------------------------------------


def raw(node, body: bytes) -> bytes:
    sock = sfwire.connect(node.ctx, node.endpoint)
    try:
        sock.send(body)
        return sfwire.body_of(sfwire.recv_frames(sock))
    finally:
        sock.close(0)


@pytest.mark.parametrize("which", ["server", "node"])
def test_status_and_nodes_replies_are_within_the_documented_sizes(which, request):
    srv = request.getfixturevalue(which)
    status = raw(srv, sfwire.status(1))
    assert len(status) < 8 * 1024 + 1024 * len(sfwire.parse(status).json["workers"]), len(status)
    nodes = raw(srv, sfwire.nodes(2))
    listed = sfwire.parse(nodes).json["nodes"]
    offsets = sum(len(n.get("clock_offsets_ms") or {}) for n in listed)
    assert len(nodes) < 1024 * len(listed) + 64 * offsets, len(nodes)


def test_fixed_size_replies_and_errors_are_as_documented(server):
    assert len(raw(server, sfwire.reserve(1, 1))) == 24
    assert len(raw(server, sfwire.header(sfwire.TIME, 2))) == 28
    errors = [
        sfwire.reserve(3, 0),
        sfwire.header(0x09, 4),
        sfwire.reserve(5, 1, version=2),
        b"\x01" * 255,
        b"\x01" * 256,
        sfwire.reserve_after(6, 1, sfwire.TOKEN_LIMIT - 1),
        sfwire.reserve_after(7, 1, sfwire.TOKEN_LIMIT),
    ]
    for body in errors:
        reply = raw(server, body)
        assert sfwire.parse(reply).type == sfwire.ERROR and len(reply) < 1024, reply
