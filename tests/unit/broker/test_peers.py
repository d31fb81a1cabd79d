"""Clock offsets to a node's peers and the verdicts drawn from them: out of rotation
when a majority of the cluster (the node included) disagrees with its clock, no claims
unless a majority vouches for it, and nothing claimed before a majority of the known
members answered and vouched (or a bounded wait found nobody to answer).

``verdicts`` and ``ClockJudge`` are checked with plain calls on a given time;
``PeerClocks`` against peers answering over inproc sockets, on a fake wall and
monotonic clock given to it."""

from __future__ import annotations

import itertools
import socket

import pytest
import zmq
from fakeclock import FakeClock

from snowfence import protocol
from snowfence.broker.peers import (
    ALONE,
    FIRST_VERDICT_WAIT_INTERVALS,
    PENDING,
    STALE_AFTER_INTERVALS,
    UNBOUNDED,
    UNVOUCHED,
    VETOED,
    VOUCHED,
    ClockJudge,
    PeerClocks,
    verdicts,
)
from snowfence.clock import PENDING_VERDICT

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
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def peer_clocks(ctx, peers, clock: FakeClock, bound_ms=500) -> PeerClocks:
    return PeerClocks(
        ctx,
        [p.endpoint for p in peers],
        interval_s=INTERVAL / 1e9,
        bound_ms=bound_ms,
        wall_ns=clock.wall_ns,
        mono_ns=clock.mono_ns,
    )


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
    pc.tick(clock.mono_ns())  # the loop's next turn takes the verdict on what came


def next_round(clock: FakeClock, pc: PeerClocks) -> None:
    clock.mono_ns_value = max(clock.mono_ns(), pc._next_ns)


def test_an_answer_gives_the_peers_offset_and_the_round_trip(ctx, clock):
    b, c = Peer(ctx, 700), Peer(ctx, -30)
    pc = peer_clocks(ctx, [b, c], clock)
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
    pc = peer_clocks(ctx, [b], clock)
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


def test_no_verdict_is_taken_on_rounds_sent_but_on_answers(ctx, clock):
    b, c = Peer(ctx, 900), Peer(ctx, 950)
    pc = peer_clocks(ctx, [b, c], clock)
    assert not pc.judged and pc.veto is None and pc.claim_veto == PENDING_VERDICT
    for _ in range(3):  # rounds go out, nobody answers: still pending, nothing claimed
        pc.tick(clock.mono_ns())
        b.requests(), c.requests()
        next_round(clock, pc)
    assert pc.rounds == 3 and not pc.judged and pc.claim_veto == PENDING_VERDICT
    measure(pc, clock, [b, c])  # both answer, both disagree: vetoed at once, by name
    assert pc.judged and pc.verdict.state == VETOED
    assert pc.veto is not None and pc.veto == pc.claim_veto
    assert pc.veto.startswith("clock disagrees with 2 of 2 peers by more than 500 ms")
    pc.close()


def test_a_node_whose_membership_is_not_read_yet_is_pending_not_alone(ctx, clock):
    # etcd mode: the members are not known until the membership is first read; a node that
    # took itself for alone meanwhile would claim on a clock nobody judged.
    pc = PeerClocks(
        ctx, [], interval_s=INTERVAL / 1e9, bound_ms=500, complete=False, wall_ns=clock.wall_ns, mono_ns=clock.mono_ns
    )
    pc.tick(clock.mono_ns())
    assert not pc.complete and pc.verdict.state == PENDING and pc.claim_veto == PENDING_VERDICT
    pc.set_peers([], complete=True)  # read: nobody else is registered
    pc.tick(clock.mono_ns())
    assert pc.verdict.state == ALONE and pc.claim_veto is None
    pc.close()


def test_a_peer_not_connected_yet_is_tried_again_before_the_next_round(ctx, clock, tmp_path):
    endpoint = f"ipc://{tmp_path}/late"  # nobody listens yet: a send would block, and is not made
    pc = peer_clocks(ctx, [], clock)
    pc.set_peers([endpoint])
    pc.tick(clock.mono_ns())
    assert pc._sent == {} and pc.rounds == 1
    late = Peer(ctx, 0)
    late.sock.bind(endpoint)
    for _ in range(300):  # the loop's next turns, well inside the round (libzmq reconnects in 0.1 s)
        clock.advance_ms(1)
        pc.tick(clock.mono_ns())
        if pc._sent:
            break
        late.sock.poll(10)
    assert pc.rounds == 1 and len(pc._sent) == 1
    ((_, sent, _),) = pc._sent.values()
    (request,) = late.requests()
    late.answer(request, sent)
    clock.advance_ms(2 * ONE_WAY_MS + PEER_MS)
    deliver(pc)
    pc.tick(clock.mono_ns())
    assert pc.verdict.state == VOUCHED and pc.claim_veto is None  # one round, not two
    pc.close()


def test_unanswered_and_stale_peers_do_not_vote_once_the_clock_was_vouched_for(ctx, clock):
    b, c, d = Peer(ctx, 5), Peer(ctx, 5), Peer(ctx, 5)
    pc = peer_clocks(ctx, [b, c, d], clock)
    measure(pc, clock, [b, c, d])
    assert pc.verdict.state == VOUCHED
    b.ahead_ms, c.ahead_ms, d.ahead_ms = 900, None, None  # b's clock moves off; c and d fall silent
    for _ in range(STALE_AFTER_INTERVALS):
        next_round(clock, pc)
        measure(pc, clock, [b, c, d])
    assert set(pc.offsets) == {b.endpoint, c.endpoint, d.endpoint}
    assert pc.veto is None  # a cluster of two as far as anyone can tell: nobody can tell who is wrong
    assert pc.claim_veto.startswith("clock disagrees with 1 of 1 peers") and pc.verdict.state == VETOED
    c.ahead_ms = d.ahead_ms = 5  # they answer again: b is the odd one out
    next_round(clock, pc)
    measure(pc, clock, [b, c, d])
    assert (pc.veto, pc.claim_veto) == (None, None) and pc.verdict.state == VOUCHED
    b.ahead_ms = c.ahead_ms = d.ahead_ms = None  # all fall silent: alone, not judged
    for _ in range(STALE_AFTER_INTERVALS):
        next_round(clock, pc)
        measure(pc, clock, [b, c, d])
    assert pc.verdict.state == ALONE and pc.claim_veto is None
    pc.close()


def test_a_majority_of_peers_disagreeing_takes_the_node_out_of_rotation(ctx, clock):
    peers = [Peer(ctx, 900), Peer(ctx, 910), Peer(ctx, 20)]
    pc = peer_clocks(ctx, peers, clock)
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
    pc = peer_clocks(ctx, [b], clock, bound_ms=0)
    measure(pc, clock, [b])
    next_round(clock, pc)
    pc.tick(clock.mono_ns())
    assert pc.offsets[b.endpoint][0] == 5000 * MS
    assert pc.judged and (pc.veto, pc.claim_veto) == (None, None) and pc.verdict.state == UNBOUNDED
    pc.close()


def test_answers_to_an_older_round_do_not_count(ctx, clock):
    b = Peer(ctx, 900)
    pc = peer_clocks(ctx, [b], clock)
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
    pc = peer_clocks(ctx, [b, c], clock)
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
    pc = PeerClocks(
        ctx, [b.endpoint, closed], interval_s=1.0, bound_ms=500, wall_ns=clock.wall_ns, mono_ns=clock.mono_ns
    )
    pc.tick(clock.mono_ns())
    assert pc.rounds == 1 and set(pc.sockets.values()) == {b.endpoint, closed}
    assert [sock for sock, _, _ in pc._sent.values()] == [s for s, ep in pc.sockets.items() if ep == b.endpoint]
    pc.close()


def test_peers_follow_the_membership_and_one_that_left_no_longer_votes(ctx, clock):
    b, c, d = Peer(ctx, 900), Peer(ctx, 900), Peer(ctx, 0)
    pc = peer_clocks(ctx, [b, c, b], clock)  # listed twice: one socket
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
    # b disagrees, d has not answered: no majority is possible yet, nor ruled out.
    assert pc.judge(clock.mono_ns()) is None and pc.claim_veto == PENDING_VERDICT
    assert pc.verdict.to_dict() == {
        "state": PENDING,
        "reason": "waiting up to 5 s for 1 of 2 members",
        "refusal": None,
        "vouching": 0,
        "answered": 1,
        "members": 2,
    }
    socks = list(pc.sockets)
    pc.close()
    assert all(s.closed for s in socks)


def test_a_reply_to_another_peers_request_does_not_use_that_request_up(ctx, clock):
    b, c = Peer(ctx, 900), Peer(ctx, 0)
    pc = peer_clocks(ctx, [b, c], clock)
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


# -- the first verdict, on a given time -------------------------------------------------------------

WAIT = FIRST_VERDICT_WAIT_INTERVALS * INTERVAL
START = NOW - 10 * MS


def judge_at(judge: ClockJudge, offsets, members, answered=None, complete=True, at=NOW):
    return judge.judge(offsets, members, set(offsets) if answered is None else answered, complete, at)


def new_judge(bound_ns: int = BOUND) -> ClockJudge:
    return ClockJudge(bound_ns=bound_ns, interval_ns=INTERVAL, wait_ns=WAIT, started_ns=START)


def test_nothing_is_claimed_until_a_majority_of_the_known_members_answered_and_vouched():
    members = ["b", "c", "d", "e"]  # a cluster of five: this node and two more make a majority
    judge = new_judge()
    for offsets in ({}, {"b": off(10)}):
        v = judge_at(judge, offsets, members)
        assert (v.state, v.claims, v.rotation) == (PENDING, PENDING_VERDICT, None)
    v = judge_at(judge, {"b": off(10), "c": off(-20)}, members)
    assert (v.state, v.claims, v.rotation) == (VOUCHED, None, None)
    assert (v.vouching, v.answered, v.members) == (2, 2, 4)
    assert v.reason == "2 of 4 other members vouch"


def test_a_clock_no_majority_can_vouch_for_is_vetoed_by_name_without_waiting():
    # A node 10 s behind joining a healthy cluster of three: two answers settle it.
    judge = new_judge()
    members = ["b", "c", "d"]
    assert judge_at(judge, {"b": off(10_000)}, members).state == PENDING  # two may still vouch
    v = judge_at(judge, {"b": off(10_000), "c": off(10_001)}, members)
    assert v.state == VETOED and v.refused
    assert v.claims == v.rotation == "clock disagrees with 2 of 2 peers by more than 500 ms (c: +10001.0 ms)"
    assert v.to_dict()["refusal"] == v.claims
    # Never vouched for, it stays out until a majority of the known members vouches: the
    # disagreeing peers falling silent does not make it alone.
    later = NOW + WAIT + 10 * INTERVAL
    v = judge_at(judge, {"b": off(10_000), "c": off(10_001)}, members, at=later)
    assert v.state == UNVOUCHED and v.claims == (
        "no majority of the cluster vouches for this clock: 0 of 3 other members do (2 answered within 5 s), 2 must"
    )


def test_after_the_wait_nobody_answering_is_alone_and_too_few_answering_is_refused():
    members = ["b", "c", "d"]
    judge = new_judge()
    assert judge_at(judge, {}, members, at=START + WAIT - 1).state == PENDING
    v = judge_at(judge, {}, members, at=START + WAIT)
    assert (v.state, v.claims) == (ALONE, None)
    assert v.reason == "alone, not judged: none of the 3 other members answered within 5 s"
    assert judge.settled
    # One of three answered and vouches: not a majority of four; refused by name after the wait.
    judge = new_judge()
    v = judge_at(judge, {"b": off(10, at_ns=START + WAIT)}, members, at=START + WAIT)
    assert v.state == UNVOUCHED and v.refused and v.rotation is None
    assert "1 of 3 other members do (1 answered within 5 s), 2 must" in v.claims
    # A second one answers: vouched, and from then on those answering lately vote.
    offsets = {"b": off(10, at_ns=START + WAIT), "c": off(0, at_ns=START + WAIT)}
    assert judge_at(judge, offsets, members, at=START + WAIT).state == VOUCHED
    later = START + WAIT + STALE_AFTER_INTERVALS * INTERVAL
    assert judge_at(judge, offsets, members, at=later).state == ALONE  # all stale: nobody answers lately


def test_with_no_other_member_a_node_is_alone_once_the_members_are_known():
    judge = new_judge()
    assert judge_at(judge, {}, [], complete=False).state == PENDING  # the membership not read yet
    v = judge_at(judge, {}, [], complete=True)
    assert (v.state, v.claims, v.reason) == (ALONE, None, "alone, not judged: no other member is registered")
    # Never read (etcd away): the wait ends it the same way.
    judge = new_judge()
    v = judge_at(judge, {}, [], complete=False, at=START + WAIT)
    assert (v.state, v.reason) == (ALONE, "alone, not judged: no other member known")


def test_two_nodes_whose_clocks_disagree_are_both_refused():
    # a was alone (settled); b joins with its clock 600 ms behind: nobody can tell who is
    # wrong, so neither keeps minting, and each says why by name.
    a, b = new_judge(), new_judge()
    assert judge_at(a, {}, [], complete=True).state == ALONE
    va = judge_at(a, {"b": off(-600)}, ["b"])
    vb = judge_at(b, {"a": off(600)}, ["a"])
    for v in (va, vb):
        assert v.state == VETOED and v.refused and v.rotation is None
        assert v.claims.endswith(": no majority of the cluster vouches for this clock (nor for the others)")
    # b stops (its entry leaves the membership): a is alone again and claims.
    assert judge_at(a, {}, [], complete=True).state == ALONE
    # Within the bound, both are vouched for.
    a, b = new_judge(), new_judge()
    assert judge_at(a, {"b": off(-400)}, ["b"]).state == VOUCHED
    assert judge_at(b, {"a": off(400)}, ["a"]).state == VOUCHED


def test_without_a_bound_nothing_is_pending_or_refused():
    judge = new_judge(bound_ns=0)
    for offsets in ({}, {"b": off(10_000)}):
        v = judge_at(judge, offsets, ["b"])
        assert (v.state, v.claims, v.rotation) == (UNBOUNDED, None, None)
