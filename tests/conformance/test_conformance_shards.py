"""Shard-prefixed layouts and causal tokens, per docs/PROTOCOL.md ("The ID inside a block",
RESERVE): the shard of an ID is the documented hash of its region and worker; a token is
honoured whenever a worker ID the node's workers hold is in its shard or above, whichever
worker takes the request, and otherwise answered bad_request every time; on ZeroMQ and on
the fast port alike (found with NODES, as a client does).

The node: 2 workers of 2 worker IDs each in region 4, 2 shard bits, bound to tcp:// (so it
has a fast port, ``--fast-bind auto``). Region 4's worker IDs 0-3 are in shards 1, 0, 2, 1:
one worker holds no worker ID of the highest shard held, and no worker ID is in shard 3.
"""

from __future__ import annotations

import time

import pytest
import sfwire

REGION = 4
ARGS = ("--time-bits", "39", "--shard-bits", "2", "--region", str(REGION))
#: Requests per check: enough that each worker takes the request first many times.
N = 40


@pytest.fixture(scope="module")
def node(start_node, tmp_path_factory):
    srv = start_node(tmp_path_factory.mktemp("shards"), workers=2, args=ARGS, tcp=True, ids_per_worker=2)
    try:
        yield srv
    finally:
        srv.kill()


@pytest.fixture(scope="module")
def layout(node) -> sfwire.Layout:
    return sfwire.Layout.of(node.ready_status)


@pytest.fixture(scope="module")
def shards(node, layout) -> dict[int, set[int]]:
    """The shards of the worker IDs each worker (slot) holds, by the document's formula."""
    by_slot: dict[int, set[int]] = {}
    for w in node.ready_status["workers"]:
        by_slot.setdefault(w["slot"], set()).add(layout.shard_of(REGION, w["worker_id"]))
    return by_slot


@pytest.fixture(scope="module")
def fast_address(node) -> tuple[str, int]:
    """The fast port as the document says to find it: NODES' ``fast_port``, on the endpoint's host."""
    sock = sfwire.connect(node.ctx, node.endpoint)
    try:
        reply = sfwire.request(sock, sfwire.nodes(node.request_id()))
    finally:
        sock.close(0)
    port = reply.json["fast_port"]
    assert isinstance(port, int) and port > 0, reply.json
    host = node.endpoint.removeprefix("tcp://").rpartition(":")[0]
    return host, port


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def ask_all(node, fast_address, transport: str, bodies: list[bytes]) -> list[sfwire.Reply]:
    """Send every body at once (pipelined) on one connection; the replies, by request id."""
    if transport == "fast":
        conn = sfwire.FastConn(*fast_address)
        try:
            conn.send(*bodies)
            got = conn.replies(len(bodies))
        finally:
            conn.close()
    else:
        sock = sfwire.connect(node.ctx, node.endpoint)
        try:
            for body in bodies:
                sock.send(body)
            got = [sfwire.parse(sfwire.body_of(sfwire.recv_frames(sock))) for _ in bodies]
        finally:
            sock.close(0)
    assert len(got) == len(bodies)
    return sorted(got, key=lambda r: r.request_id)


def test_the_layout_has_the_shard_bits_and_its_widths_sum_to_63(layout):
    assert layout.shard_bits == 2
    assert layout.shard_bits + layout.time_bits + layout.region_bits + layout.worker_bits + layout.sequence_bits == 63


def test_every_ids_shard_is_the_documented_hash_of_its_region_and_worker(node, layout):
    sock = sfwire.connect(node.ctx, node.endpoint)
    seen = set()
    try:
        for count in (1, 4096) * 20:  # small ones from the broker's own worker ID too
            first, got = sfwire.request(sock, sfwire.reserve(node.request_id(), count)).block
            for id_ in (first, first + got - 1):
                d = layout.decode(id_)
                assert d.region == REGION and d.shard == layout.shard_of(d.region, d.worker), d
                assert abs(d.unix_ms - now_ms()) < 60_000, d  # the timestamp sits below the shard
                seen.add(d.worker)
    finally:
        sock.close(0)
    assert len(seen) >= 2


def test_the_node_is_as_this_module_needs_it(shards):
    # One worker holds no worker ID of the highest shard held (so which worker takes a
    # request matters), and a shard above every worker ID exists (so the refusal can be seen).
    highest = max(max(s) for s in shards.values())
    assert highest < 3, shards
    assert any(max(s) < highest for s in shards.values()), shards
    assert any(highest in s and len(s) > 1 for s in shards.values()), shards  # and it holds a lower one too


@pytest.mark.parametrize("transport", ["zmq", "fast"])
def test_a_token_up_to_the_highest_shard_held_is_honoured_whichever_worker_takes_it(
    node, layout, shards, fast_address, transport
):
    highest = max(max(s) for s in shards.values())
    for shard in range(highest + 1):
        # The last ID another node could mint in this millisecond of that shard.
        token = layout.compose(shard, now_ms(), 7, (1 << layout.worker_bits) - 1, (1 << layout.sequence_bits) - 1)
        bodies = [sfwire.reserve_after(node.request_id(), 3, token) for _ in range(N)]
        for reply in ask_all(node, fast_address, transport, bodies):
            first, count = reply.block  # a BLOCK, never an ERROR
            assert first > token and count >= 1, (shard, reply)
            assert layout.decode(first).shard >= shard


@pytest.mark.parametrize("transport", ["zmq", "fast"])
def test_a_token_from_a_shard_above_every_worker_id_held_gets_bad_request_every_time(
    node, layout, shards, fast_address, transport
):
    above = max(max(s) for s in shards.values()) + 1
    token = layout.compose(above, now_ms() - 1000, 0, 0)
    bodies = [sfwire.reserve_after(node.request_id(), 1, token) for _ in range(N)]
    replies = ask_all(node, fast_address, transport, bodies)
    for body, reply in zip(bodies, replies, strict=True):
        assert reply.type == sfwire.ERROR and reply.request_id == sfwire.HEADER.unpack_from(body)[3], reply
        assert reply.json["code"] == "bad_request" and reply.json["retriable"] is False, reply.json
    # The node still serves every other request from all its worker IDs: none left rotation.
    assert all(w["in_rotation"] for w in node.status()["workers"])


def test_the_fast_port_of_a_tcp_bind_is_in_nodes_and_status_and_serves_there(node, fast_address):
    host, port = fast_address
    status = node.status()
    assert status["broker"]["fast_port"]["port"] == port and status["broker"]["fast_port"]["host"] == host
    sock = sfwire.connect(node.ctx, node.endpoint)
    try:
        nodes = sfwire.request(sock, sfwire.nodes(node.request_id())).json
    finally:
        sock.close(0)
    assert [n["fast_port"] for n in nodes["nodes"]] == [port]
    conn = sfwire.FastConn(host, port)
    try:
        first, count = conn.request(sfwire.reserve(9, 10)).block
        assert count >= 1
    finally:
        conn.close()


def test_status_of_four_worker_ids_is_within_the_documented_size(node):
    sock = sfwire.connect(node.ctx, node.endpoint)
    try:
        sock.send(sfwire.status(1))
        body = sfwire.body_of(sfwire.recv_frames(sock))
    finally:
        sock.close(0)
    reply = sfwire.parse(body)
    assert len(body) < 8 * 1024 + 1024 * len(reply.json["workers"]), len(body)
