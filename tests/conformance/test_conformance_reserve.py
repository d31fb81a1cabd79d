"""RESERVE and BLOCK, per docs/PROTOCOL.md: framing, header, block semantics, pipelining, uniqueness."""

from __future__ import annotations

import random
import time

import pytest
import sfwire
import zmq
from sfwire import BLOCK, ERROR, MAX_COUNT

#: How far a minted millisecond may be from this host's clock (same host, loaded CI machine).
CLOCK_SLACK_MS = 10_000


def current_worker_ids(server) -> set[int]:
    return sfwire.held_worker_ids(server.status())


def check_block(reply: sfwire.Reply, request_id: int, requested: int, layout: sfwire.Layout, worker_ids, region=0):
    """The BLOCK semantics of the doc; returns ``(first, count)``."""
    assert reply.version == 1, reply
    assert reply.type == BLOCK, reply
    assert reply.flags == 0, reply
    assert reply.request_id == request_id, reply
    first, count = reply.block
    assert 1 <= count <= requested, f"count {count} outside 1..{requested}"
    assert first >> 63 == 0, f"bit 63 of {first} is set"
    a, z = layout.decode(first), layout.decode(first + count - 1)
    # One worker ID within one millisecond: the whole block shares everything but the sequence,
    # and the sequence does not carry into the worker field.
    assert (a.unix_ms, a.region, a.worker) == (z.unix_ms, z.region, z.worker), (a, z)
    assert z.sequence == a.sequence + count - 1, (a, z)
    assert a.region == region, a
    assert a.worker in worker_ids, f"worker {a.worker} not in the status list {sorted(worker_ids)}"
    now_ms = time.time() * 1000
    assert abs(a.unix_ms - now_ms) < CLOCK_SLACK_MS, f"minted at {a.unix_ms}, now {now_ms:.0f}: layout/byte order?"
    return first, count


def test_reserve_over_dealer(server, sockets, layout, worker_ids):
    sock = sockets()
    sock.send(sfwire.reserve(42, 100))
    frames = sfwire.recv_frames(sock)
    assert len(frames) == 1, f"a request without delimiter gets a reply without one: {frames!r}"
    assert len(frames[0]) == 24, "a BLOCK is 24 bytes"
    check_block(sfwire.parse(frames[0]), 42, 100, layout, worker_ids)


def test_reserve_over_dealer_with_delimiter(server, sockets, layout, worker_ids):
    sock = sockets()
    sock.send_multipart([b"", sfwire.reserve(43, 100)])
    frames = sfwire.recv_frames(sock)
    assert len(frames) == 2 and frames[0] == b"", f"the reply carries the request's delimiter: {frames!r}"
    check_block(sfwire.parse(frames[1]), 43, 100, layout, worker_ids)


def test_reserve_over_req(server, sockets, layout, worker_ids):
    sock = sockets(zmq.REQ)
    # Several strict request/reply cycles: each reply must reach the REQ socket (delimiter echoed).
    for rid in (1, 2, 3):
        sock.send(sfwire.reserve(rid, 4096))
        frames = sfwire.recv_frames(sock)
        assert len(frames) == 1, frames
        check_block(sfwire.parse(frames[0]), rid, 4096, layout, worker_ids)
    sock.send(sfwire.status(4))
    reply = sfwire.parse(sfwire.recv_frames(sock)[0])
    assert reply.type == sfwire.STATUS_REPLY and reply.request_id == 4, reply


def test_doc_example_request_bytes(server, sockets, layout, worker_ids):
    """The RESERVE example of the doc, byte for byte."""
    body = bytes.fromhex("01 01 00 00  00 00 00 00 00 00 00 2a  00 00 10 00".replace(" ", ""))
    assert body == sfwire.reserve(42, 4096)
    check_block(sfwire.request(sockets(), body), 42, 4096, layout, worker_ids)


def test_header_fields_are_big_endian(server, sockets, layout, worker_ids):
    rid = 0x0102030405060708
    body = sfwire.reserve(rid, 0x0102)  # 258: little-endian would read 0x02010000, out of range
    assert body[4:12] == bytes(range(1, 9)) and body[12:16] == b"\x00\x00\x01\x02"
    sock = sockets()
    sock.send(body)
    raw = sfwire.recv_frames(sock)[0]
    assert raw[0] == 1, "version byte"
    assert raw[1] == 0x81, "type byte"
    assert raw[2:4] == b"\x00\x00", "flags"
    assert raw[4:12] == bytes(range(1, 9)), "request id echoed byte for byte, big-endian"
    assert raw[20:24] != b"\x00\x00\x00\x00" and int.from_bytes(raw[20:24], "big") <= 0x0102, raw[20:24].hex()
    # ``first`` decoded big-endian lands on this host's clock; check_block asserts that.
    check_block(sfwire.parse(raw), rid, 0x0102, layout, worker_ids)


@pytest.mark.parametrize("rid", [0, 1, 2**32, 2**63, 2**64 - 1])
def test_request_id_echoed_full_range(server, sockets, layout, worker_ids, rid):
    check_block(sfwire.request(sockets(), sfwire.reserve(rid, 1)), rid, 1, layout, worker_ids)


@pytest.mark.parametrize("count", [1, 2, 7, 1000, 4095, 4096])
def test_block_semantics(server, sockets, layout, count):
    status = server.status()
    ids = sfwire.held_worker_ids(status)
    reply = sfwire.request(sockets(), sfwire.reserve(7, count))
    check_block(reply, 7, count, layout, ids, region=status["region"])
    assert status["region"] == 0, "embedded default region"


def test_partial_grants_sum_to_the_request(server, sockets, layout):
    """Ask, sum the counts, ask again while short (rule 5); pipelined so that partial grants happen."""
    ids = current_worker_ids(server)
    target = 60_000
    sock = sockets()
    rid = 1000
    got, blocks, partial = 0, [], 0
    deadline = time.monotonic() + 15
    while got < target:
        assert time.monotonic() < deadline, f"only {got} of {target} IDs granted in time"
        asked = {}
        remaining = target - got
        # A wave of up to 8 requests of at most 3000 for what is still missing.
        while remaining and len(asked) < 8:
            n = min(3000, remaining)
            rid += 1
            asked[rid] = n
            remaining -= n
            sock.send(sfwire.reserve(rid, n))
        for _ in range(len(asked)):
            reply = sfwire.parse(sfwire.body_of(sfwire.recv_frames(sock)))
            assert reply.request_id in asked, reply
            n = asked.pop(reply.request_id)
            if reply.type == ERROR:
                assert reply.json["retriable"] is True, reply.json
                continue
            first, count = check_block(reply, reply.request_id, n, layout, ids)
            partial += count < n
            blocks.append((first, count))
            got += count
    assert got == target, "the grants never exceed what was asked"
    assert_disjoint(blocks)
    print(f"{len(blocks)} blocks, {partial} partial grants")


def test_pipelined_requests_are_matched_by_request_id(server, sockets, layout):
    """Many requests in flight on one DEALER; replies (RESERVE and STATUS mixed) in any order."""
    ids = current_worker_ids(server)
    rng = random.Random(1)
    sock = sockets()
    asked: dict[int, int | None] = {}
    for i in range(600):
        rid = rng.getrandbits(64)
        while rid in asked:
            rid = rng.getrandbits(64)
        if i % 100 == 50:
            asked[rid] = None  # a STATUS among the RESERVEs
            sock.send(sfwire.status(rid))
        else:
            asked[rid] = rng.randint(1, MAX_COUNT)
            sock.send(sfwire.reserve(rid, asked[rid]))
    order, blocks = [], []
    for _ in range(len(asked)):
        reply = sfwire.parse(sfwire.body_of(sfwire.recv_frames(sock)))
        assert reply.request_id in asked, f"reply to an unknown or already answered request: {reply}"
        n = asked.pop(reply.request_id)
        order.append(reply.request_id)
        if n is None:
            assert reply.type == sfwire.STATUS_REPLY, reply
            continue
        if reply.type == ERROR:
            assert reply.json["retriable"] is True, reply.json
            continue
        blocks.append(check_block(reply, reply.request_id, n, layout, ids))
    assert not asked
    sock.setsockopt(zmq.RCVTIMEO, 200)
    with pytest.raises(zmq.Again):
        sock.recv_multipart()  # one reply per request, no more
    assert len(blocks) >= 500, f"only {len(blocks)} of 594 RESERVEs were granted"
    assert_disjoint(blocks)


def test_ids_unique_across_thousands_of_requests(server, sockets, layout):
    """4,000 requests of random sizes from 4 pipelined DEALER sockets: no ID is granted twice."""
    ids = current_worker_ids(server)
    rng = random.Random(2)
    socks = [sockets() for _ in range(4)]
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    total, depth = 4000, 32
    sent, done = 0, 0
    inflight: dict[zmq.Socket, dict[int, int]] = {s: {} for s in socks}
    blocks = []
    rid = 0

    def top_up(s):
        nonlocal sent, rid
        while len(inflight[s]) < depth and sent < total:
            rid += 1
            n = rng.randint(1, MAX_COUNT)
            inflight[s][rid] = n
            s.send(sfwire.reserve(rid, n))
            sent += 1

    for s in socks:
        top_up(s)
    deadline = time.monotonic() + 20
    while done < total:
        assert time.monotonic() < deadline, f"{done} of {total} replies in time"
        for s, _ in poller.poll(1000):
            while True:
                try:
                    frames = s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                reply = sfwire.parse(sfwire.body_of(frames))
                assert reply.request_id in inflight[s], f"reply to no request in flight on this socket: {reply}"
                n = inflight[s].pop(reply.request_id)
                done += 1
                if reply.type == ERROR:
                    assert reply.json["retriable"] is True, reply.json
                    continue
                blocks.append(check_block(reply, reply.request_id, n, layout, ids))
            top_up(s)
    assert len(blocks) >= total * 0.9
    assert_disjoint(blocks)


def assert_disjoint(blocks: list[tuple[int, int]]) -> None:
    """No two blocks ``(first, count)`` share an ID."""
    prev_end, prev = -1, None
    for first, count in sorted(blocks):
        assert first > prev_end, f"block {(first, count)} overlaps {prev}: an ID was granted twice"
        prev_end, prev = first + count - 1, (first, count)
