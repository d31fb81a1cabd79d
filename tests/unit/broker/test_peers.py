"""Clock offsets to a node's peers and the two verdicts drawn from them: out of rotation
when a majority of the cluster (the node included) disagrees with its clock, no claims
unless a majority vouches for it.

``verdicts`` is checked with plain calls; ``PeerClocks`` against peers answering over
inproc sockets, on a fake wall and monotonic clock."""

from __future__ import annotations

import itertools
import socket
from types import SimpleNamespace

import pytest
import zmq
from fakeclock import FakeClock

from snowfence import protocol
from snowfence.broker import peers as peers_module
from snowfence.broker.peers import STALE_AFTER_INTERVALS, PeerClocks, verdicts

MS = 1_000_000
BOUND = 500 * MS
INTERVAL = 1_000 * MS
NOW = 100 * INTERVAL


def off(ms: float, rtt_ms: float = 0, at_ns: int = NOW) -> tuple[int, int, int]:
    """An offset as PeerClocks keeps it: (offset, round trip, measured at monotonic ns)."""
    return int(ms * MS), int(rtt_ms * MS), at_ns


def cluster(agree: int, disagree: int) -> dict[str, tuple[int, int, int]]:
    """Peers of which ``agree`` are close to this clock and ``disagree`` far ahead of it."""
    offsets = {f"a{i}": off(10) for i in range(agree)}
    offsets.update({f"d{i}": off(900) for i in range(disagree)})
    return offsets


# -- majorities ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "agree, disagree, rotation, claims",
    [
        # 1 node: nobody to disagree with
        (0, 0, False, False),
        # 2 nodes: nobody can tell who is wrong; both keep rotation, neither claims
        (1, 0, False, False),
        (0, 1, False, True),
        # 3 nodes: one odd peer is outvoted; this node the odd one out leaves rotation
        (2, 0, False, False),
        (1, 1, False, False),
        (0, 2, True, True),
        # 4 nodes: two against two is no majority either way; three against one is
        (3, 0, False, False),
        (2, 1, False, False),
        (1, 2, False, True),
        (0, 3, True, True),
        # 5 nodes: three of five is a majority
        (2, 2, False, False),
        (1, 3, True, True),
    ],
)
def test_the_verdicts_follow_the_majority_of_the_whole_cluster(agree, disagree, rotation, claims):
    got_rotation, got_claims = verdicts(cluster(agree, disagree), NOW, BOUND, INTERVAL)
    assert (got_rotation is not None, got_claims is not None) == (rotation, claims)


def test_the_verdicts_name_how_many_disagree_and_the_worst_offset():
    offsets = {"b": off(900), "c": off(-950), "d": off(10)}
    rotation, claims = verdicts(offsets, NOW, BOUND, INTERVAL)
    assert rotation is None
    assert claims == (
        "clock disagrees with 2 of 3 peers by more than 500 ms (c: -950.0 ms)"
        ": no majority of the cluster vouches for this clock (nor for the others)"
    )
    offsets["d"] = off(700)
    rotation, claims = verdicts(offsets, NOW, BOUND, INTERVAL)
    assert rotation == claims == "clock disagrees with 3 of 3 peers by more than 500 ms (c: -950.0 ms)"


def test_peers_that_did_not_answer_do_not_vote():
    # Three peers configured, one heard from: a cluster of two as far as anyone can tell.
    assert verdicts({"b": off(900)}, NOW, BOUND, INTERVAL)[0] is None
    assert verdicts({"b": off(900)}, NOW, BOUND, INTERVAL)[1] is not None
    # Nobody heard from: nothing to disagree with.
    assert verdicts({}, NOW, BOUND, INTERVAL) == (None, None)


def test_no_verdict_without_a_bound_whatever_the_offsets():
    assert verdicts(cluster(0, 4), NOW, 0, INTERVAL) == (None, None)
    assert verdicts({"b": off(10**6)}, NOW, 0, INTERVAL) == (None, None)


# -- the bound -------------------------------------------------------------------------------------


@pytest.mark.parametrize("sign", [1, -1])
def test_an_offset_at_the_bound_agrees_and_one_nanosecond_past_it_disagrees(sign):
    at = {"b": (sign * BOUND, 0, NOW)}
    past = {"b": (sign * (BOUND + 1), 0, NOW)}
    assert verdicts(at, NOW, BOUND, INTERVAL) == (None, None)
    assert verdicts(past, NOW, BOUND, INTERVAL)[1] is not None


@pytest.mark.parametrize("sign", [1, -1])
def test_half_the_round_trip_is_allowed_for_and_no_more(sign):
    rtt = 40 * MS
    assert verdicts({"b": (sign * (BOUND + rtt // 2), rtt, NOW)}, NOW, BOUND, INTERVAL) == (None, None)
    assert verdicts({"b": (sign * (BOUND + rtt // 2 + 1), rtt, NOW)}, NOW, BOUND, INTERVAL)[1] is not None
    # Three peers, each far off within its own round trip's allowance: no majority disagrees.
    wide = {ep: (sign * (BOUND + rtt // 2), rtt, NOW) for ep in "bcd"}
    assert verdicts(wide, NOW, BOUND, INTERVAL) == (None, None)


# -- stale offsets ---------------------------------------------------------------------------------


def test_an_offset_is_stale_after_three_intervals_and_then_does_not_vote():
    assert STALE_AFTER_INTERVALS == 3
    edge = NOW - STALE_AFTER_INTERVALS * INTERVAL
    # b agrees, c disagrees: fresh, b outvotes c (a cluster of three); stale, c stands alone.
    fresh = {"b": off(10, at_ns=edge + 1), "c": off(900)}
    stale = {"b": off(10, at_ns=edge), "c": off(900)}
    assert verdicts(fresh, NOW, BOUND, INTERVAL) == (None, None)
    rotation, claims = verdicts(stale, NOW, BOUND, INTERVAL)
    assert rotation is None and claims.startswith("clock disagrees with 1 of 1 peers")


def test_stale_disagreeing_offsets_veto_nothing():
    old = NOW - 10 * INTERVAL
    assert verdicts({ep: off(900, at_ns=old) for ep in "bcd"}, NOW, BOUND, INTERVAL) == (None, None)
    # One fresh disagreeing peer among stale ones: a cluster of two.
    offsets = {"b": off(900), "c": off(900, at_ns=old), "d": off(900, at_ns=old)}
    rotation, claims = verdicts(offsets, NOW, BOUND, INTERVAL)
    assert rotation is None and claims.startswith("clock disagrees with 1 of 1 peers")


# -- PeerClocks over sockets -----------------------------------------------------------------------

ONE_WAY_MS, PEER_MS = 4, 2  # each way on the network; between the peer's receiving and replying
ROUND_TRIP = (2 * ONE_WAY_MS) * MS
_names = itertools.count()


class Peer:
    """A node answering TIME requests with its clock ``ahead_ms`` ahead of ours (None: silent)."""

    def __init__(self, ctx: zmq.Context, ahead_ms: float | None = 0) -> None:
        self.endpoint = f"inproc://peer-{next(_names)}"
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.endpoint)
        self.ahead_ms = ahead_ms

    def requests(self) -> list[list[bytes]]:
        got = []
        while self.sock.poll(200 if not got else 0):
            got.append(self.sock.recv_multipart())
        return got

    def answer(self, request: list[bytes], sent_wall_ns: int, request_id: int | None = None, ahead_ms=None) -> None:
        identity, body = request
        rid = protocol.request_id_of(body) if request_id is None else request_id
        ahead = self.ahead_ms if ahead_ms is None else ahead_ms
        received = sent_wall_ns + int((ONE_WAY_MS + ahead) * MS)
        self.sock.send_multipart([identity, protocol.encode_time_reply(rid, received, received + PEER_MS * MS)])


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    clock = FakeClock()
    monkeypatch.setattr(peers_module, "time", SimpleNamespace(time_ns=clock.wall_ns, monotonic_ns=clock.mono_ns))
    return clock


@pytest.fixture
def ctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def peer_clocks(ctx, peers, bound_ms=500) -> PeerClocks:
    return PeerClocks(ctx, [p.endpoint for p in peers], interval_s=INTERVAL / 1e9, bound_ms=bound_ms)


def deliver(pc: PeerClocks) -> None:
    for sock in list(pc.sockets):
        if sock.poll(200):
            pc.on_readable(sock)


def measure(pc: PeerClocks, clock: FakeClock, peers: list[Peer]) -> None:
    """One round: tick, every peer that is not silent answers, the answers are read."""
    sent = clock.wall_ns()
    pc.tick(clock.mono_ns())
    for peer in peers:
        for request in peer.requests():
            if peer.ahead_ms is not None:
                peer.answer(request, sent)
    clock.advance_ms(2 * ONE_WAY_MS + PEER_MS)
    deliver(pc)


def next_round(clock: FakeClock, pc: PeerClocks) -> None:
    clock.mono_ns_value = max(clock.mono_ns(), pc._next_ns)


def test_an_answer_gives_the_peers_offset_and_the_round_trip(ctx, clock):
    b, c = Peer(ctx, 700), Peer(ctx, -30)
    pc = peer_clocks(ctx, [b, c])
    measure(pc, clock, [b, c])
    assert pc.offsets == {
        b.endpoint: (700 * MS, ROUND_TRIP, clock.mono_ns()),
        c.endpoint: (-30 * MS, ROUND_TRIP, clock.mono_ns()),
    }
    assert pc.describe() == {
        b.endpoint: {"offset_s": 0.7, "delay_s": ROUND_TRIP / 1e9},
        c.endpoint: {"offset_s": -0.03, "delay_s": ROUND_TRIP / 1e9},
    }
    pc.close()


def test_the_round_trip_is_measured_on_the_monotonic_clock(ctx, clock):
    b = Peer(ctx, 0)
    pc = peer_clocks(ctx, [b])
    sent = clock.wall_ns()
    pc.tick(clock.mono_ns())
    b.answer(b.requests()[0], sent)
    clock.advance_ms(2 * ONE_WAY_MS + PEER_MS)
    clock.step_ms(-4000)  # our wall clock stepped back while the request was out
    deliver(pc)
    offset, rtt, _ = pc.offsets[b.endpoint]
    assert rtt == ROUND_TRIP
    assert offset == 2000 * MS  # the step shows in the offset, half of it (NTP's estimate)
    pc.close()


def test_no_verdict_is_taken_before_the_peers_had_a_round_to_answer(ctx, clock):
    b, c = Peer(ctx, 900), Peer(ctx, 950)
    pc = peer_clocks(ctx, [b, c])
    assert not pc.judged and pc.veto is None and pc.claim_veto is None
    measure(pc, clock, [b, c])
    assert pc.rounds == 1 and not pc.judged
    assert pc.veto is None and pc.claim_veto is None  # judged on no answers: not a verdict yet
    pc.tick(pc._next_ns - 1)
    assert pc.rounds == 1 and not pc.judged and b.requests() == []  # not before the interval
    next_round(clock, pc)
    pc.tick(clock.mono_ns())
    assert pc.rounds == 2 and pc.judged
    assert pc.veto is not None and pc.veto == pc.claim_veto
    assert pc.veto.startswith("clock disagrees with 2 of 2 peers by more than 500 ms")
    pc.close()


def test_unanswered_and_stale_peers_do_not_vote(ctx, clock):
    b, c, d = Peer(ctx, 900), Peer(ctx, None), Peer(ctx, None)
    pc = peer_clocks(ctx, [b, c, d])
    measure(pc, clock, [b, c, d])
    next_round(clock, pc)
    measure(pc, clock, [b, c, d])
    assert set(pc.offsets) == {b.endpoint}
    assert pc.veto is None  # a cluster of two: nobody can tell who is wrong
    assert pc.claim_veto.startswith("clock disagrees with 1 of 1 peers")
    c.ahead_ms = d.ahead_ms = 5  # they answer: b is the odd one out
    next_round(clock, pc)
    measure(pc, clock, [b, c, d])
    next_round(clock, pc)
    pc.tick(clock.mono_ns())
    assert (pc.veto, pc.claim_veto) == (None, None)
    c.ahead_ms = d.ahead_ms = None  # they fall silent: their offsets go stale
    for _ in range(STALE_AFTER_INTERVALS - 1):
        next_round(clock, pc)
        measure(pc, clock, [b, c, d])
    assert pc.claim_veto is None  # still fresh
    next_round(clock, pc)
    measure(pc, clock, [b, c, d])
    assert pc.veto is None and pc.claim_veto.startswith("clock disagrees with 1 of 1 peers")
    pc.close()


def test_a_majority_of_peers_disagreeing_takes_the_node_out_of_rotation(ctx, clock):
    peers = [Peer(ctx, 900), Peer(ctx, 910), Peer(ctx, 20)]
    pc = peer_clocks(ctx, peers)
    measure(pc, clock, peers)
    next_round(clock, pc)
    pc.tick(clock.mono_ns())
    assert pc.veto is None and pc.claim_veto.startswith("clock disagrees with 2 of 3 peers")
    peers[2].ahead_ms = 880
    for peer in peers:
        peer.requests()  # the requests of the round just sent go unanswered
    next_round(clock, pc)
    measure(pc, clock, peers)
    next_round(clock, pc)
    pc.tick(clock.mono_ns())
    assert (
        pc.veto
        == pc.claim_veto
        == "clock disagrees with 3 of 3 peers by more than 500 ms " + (f"({peers[1].endpoint}: +910.0 ms)")
    )
    pc.close()


def test_without_a_bound_offsets_are_measured_and_nothing_is_vetoed(ctx, clock):
    b = Peer(ctx, 5000)
    pc = peer_clocks(ctx, [b], bound_ms=0)
    measure(pc, clock, [b])
    next_round(clock, pc)
    pc.tick(clock.mono_ns())
    assert pc.offsets[b.endpoint][0] == 5000 * MS
    assert pc.judged and (pc.veto, pc.claim_veto) == (None, None)
    pc.close()


def test_answers_to_an_older_round_do_not_count(ctx, clock):
    b = Peer(ctx, 900)
    pc = peer_clocks(ctx, [b])
    sent = clock.wall_ns()
    pc.tick(clock.mono_ns())
    (old,) = b.requests()
    next_round(clock, pc)
    pc.tick(clock.mono_ns())
    b.answer(old, sent)  # late, after the next round went out
    deliver(pc)
    assert pc.offsets == {}
    (current,) = b.requests()
    b.answer(current, clock.wall_ns())
    b.answer(current, clock.wall_ns())  # twice: counted once
    deliver(pc)
    assert set(pc.offsets) == {b.endpoint}
    pc.close()


def test_answers_that_are_not_the_peers_own_time_replies_are_passed_over(ctx, clock):
    b, c = Peer(ctx, 900), Peer(ctx, 0)
    pc = peer_clocks(ctx, [b, c])
    sent = clock.wall_ns()
    pc.tick(clock.mono_ns())
    (to_b,), (to_c,) = b.requests(), c.requests()
    b.answer(to_b, sent)  # b's own answer to its own request
    b.answer(to_b, sent, request_id=protocol.request_id_of(to_c[1]), ahead_ms=5000)  # c's request, answered by b
    b.sock.send_multipart([to_b[0], b"\x01"])  # not a reply at all
    b.answer(to_b, sent, request_id=999_999, ahead_ms=5000)  # a request never sent
    c.sock.send_multipart([to_c[0], protocol.encode_block(protocol.request_id_of(to_c[1]), 1, 1)])  # no times
    clock.advance_ms(2 * ONE_WAY_MS + PEER_MS)
    deliver(pc)
    assert pc.offsets == {b.endpoint: (900 * MS, ROUND_TRIP, clock.mono_ns())}
    pc.close()


def test_a_peer_that_is_not_connected_is_not_waited_for(ctx, clock):
    b = Peer(ctx, 0)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    pc = PeerClocks(ctx, [b.endpoint, closed], interval_s=1.0, bound_ms=500)
    pc.tick(clock.mono_ns())
    assert pc.rounds == 1 and set(pc.sockets.values()) == {b.endpoint, closed}
    assert [sock for sock, _, _ in pc._sent.values()] == [s for s, ep in pc.sockets.items() if ep == b.endpoint]
    pc.close()


def test_peers_follow_the_membership_and_one_that_left_no_longer_votes(ctx, clock):
    b, c, d = Peer(ctx, 900), Peer(ctx, 900), Peer(ctx, 0)
    pc = peer_clocks(ctx, [b, c, b])  # listed twice: one socket
    assert sorted(pc.sockets.values()) == sorted([b.endpoint, c.endpoint])
    before = dict(pc.sockets)
    pc.set_peers([c.endpoint, b.endpoint])  # the same peers: the same sockets
    assert pc.sockets == before
    measure(pc, clock, [b, c])
    assert set(pc.offsets) == {b.endpoint, c.endpoint}
    (gone,) = [s for s, ep in pc.sockets.items() if ep == c.endpoint]
    pc.set_peers([b.endpoint, d.endpoint, "tcp://no port"])  # c left; an endpoint libzmq will not take
    assert sorted(pc.sockets.values()) == sorted([b.endpoint, d.endpoint])
    assert gone.closed and set(pc.offsets) == {b.endpoint}
    assert [s for s in pc.sockets if s in before] == [s for s, ep in before.items() if ep == b.endpoint]
    assert pc.judge(clock.mono_ns()) is None and pc.claim_veto.startswith("clock disagrees with 1 of 1 peers")
    socks = list(pc.sockets)
    pc.close()
    assert all(s.closed for s in socks)


def test_a_reply_to_another_peers_request_does_not_use_that_request_up(ctx, clock):
    b, c = Peer(ctx, 900), Peer(ctx, 0)
    pc = peer_clocks(ctx, [b, c])
    sent = clock.wall_ns()
    pc.tick(clock.mono_ns())
    (to_b,), (to_c,) = b.requests(), c.requests()
    b.answer(to_b, sent, request_id=protocol.request_id_of(to_c[1]))
    clock.advance_ms(2 * ONE_WAY_MS + PEER_MS)
    deliver(pc)
    c.answer(to_c, sent)
    deliver(pc)
    assert pc.offsets == {c.endpoint: (0, ROUND_TRIP, clock.mono_ns())}
    pc.close()
