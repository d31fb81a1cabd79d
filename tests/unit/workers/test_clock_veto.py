"""The clock-skew bound every claim counts on is enforced: a node claims no worker ID, and
creates no store, unless a majority of its cluster vouches for its clock."""

from __future__ import annotations

import pytest
from etcdrig import NOW_MS, claim
from fakeclock import FakeClock
from test_routing import Rig
from test_worker_core import ScriptedLease, ScriptedStore, make_core, ready_core, replies, work

from snowfence import protocol
from snowfence.broker.peers import verdicts
from snowfence.clock import PENDING_VERDICT, pending_verdict
from snowfence.config import Config
from snowfence.errors import ClockUnsafe, ConfigError

WHY = "clock disagrees with 2 of 2 peers by more than 500 ms (b: +900.0 ms)"


def dump(etcd) -> tuple:
    return etcd.server.rev, {k: v.value for k, v in etcd.server.kv.items()}, set(etcd.server.leases)


def clock_frames(frames: list[bytes]) -> list[str | None]:
    return [protocol.decode_clock(f) for f in frames if f[:1] == bytes((protocol.CLOCK,))]


def test_the_peer_offset_bound_is_enforced_by_default_at_half_the_skew_bound():
    assert Config().peer_offset_bound_ms == 500
    assert Config(max_clock_skew_ms=3000).peer_offset_bound_ms == 1500
    assert Config(max_peer_offset_ms=0).peer_offset_bound_ms == 0  # only measures, when asked
    assert Config(max_peer_offset_ms=40).peer_offset_bound_ms == 40
    with pytest.raises(ConfigError, match="max_peer_offset_ms"):
        Config(max_peer_offset_ms=-2)


def test_the_workers_are_told_when_the_clock_disagrees_and_when_it_agrees_again():
    r = Rig(workers=2)
    w0 = r.worker(0)
    r.sent_to_workers.clear()
    r.core.clock_verdict = WHY
    r.core.clock_verdict = WHY  # no change, nothing sent
    r.core.clock_verdict = None
    assert clock_frames(r.sent_to_workers[w0]) == [WHY, None]


def test_each_worker_is_told_the_verdict_when_it_connects_pending_until_the_peers_were_heard():
    r = Rig(workers=2, etcd=("http://127.0.0.1:2379",), max_clock_skew_ms=1000)
    w0 = r.worker(0)
    assert clock_frames(r.sent_to_workers[w0]) == [PENDING_VERDICT]
    r.core.clock_verdict = WHY
    w1 = r.worker(1)
    assert clock_frames(r.sent_to_workers[w1]) == [WHY]
    r.core.clock_verdict = None
    assert clock_frames(r.sent_to_workers[w1]) == [WHY, None]
    assert clock_frames(r.sent_to_workers[w0]) == [PENDING_VERDICT, WHY, None]


def test_nothing_is_pending_where_no_peer_will_judge_the_clock():
    assert pending_verdict(Config()) is None  # embedded, no peers
    assert pending_verdict(Config(peers=("tcp://127.0.0.1:5556",))) == PENDING_VERDICT
    assert pending_verdict(Config(etcd=("http://127.0.0.1:2379",))) == PENDING_VERDICT
    assert pending_verdict(Config(etcd=("http://127.0.0.1:2379",), max_peer_offset_ms=0)) is None


def test_a_worker_claims_no_worker_id_until_the_broker_has_judged_its_clock():
    store = ScriptedStore([])
    make_core(store, FakeClock(), etcd=("http://127.0.0.1:2379",))
    assert store.claim_veto == PENDING_VERDICT
    other = ScriptedStore([])
    make_core(other, FakeClock())
    assert other.claim_veto is None


def test_a_worker_passes_the_verdict_to_its_store():
    store = ScriptedStore([])
    core, _ = make_core(store, FakeClock())
    core.handle(protocol.encode_clock(WHY), 0)
    assert store.claim_veto == WHY
    core.handle(protocol.encode_clock(None), 0)
    assert store.claim_veto is None


def test_while_vetoed_no_worker_id_is_claimed_known_or_unknown_and_nothing_is_written(etcd):
    store = etcd.store()
    lease = claim(store, preferred=0)
    lease.release(NOW_MS)
    etcd.delete("marks/1/0")  # worker ID 0: used (in the genesis), its mark gone: unknown
    before = dump(etcd)
    store.claim_veto = WHY
    for preferred in (0, 1, None):  # unknown, never used, any
        with pytest.raises(ClockUnsafe, match="not vouched for") as err:
            claim(store, preferred=preferred)
        assert WHY in str(err.value)
    assert dump(etcd) == before
    store.claim_veto = None
    got = {lease.worker_id: lease for lease in (claim(store, holder=f"o{i}") for i in range(4))}
    assert sorted(got) == [0, 1, 2, 3]  # once vouched for, every one (the unknown one last)
    assert got[0].claimed_mark_ms >= NOW_MS + store.quarantine_ms()  # with its quarantine


def test_while_vetoed_no_new_store_is_created(etcd):
    etcd.delete("layout")
    store = etcd.store()
    store.claim_veto = WHY
    with pytest.raises(ClockUnsafe, match="looks new"):
        store.check_layout(store.layout)
    assert etcd.value("layout") is None
    store.claim_veto = None
    store.check_layout(store.layout)
    assert etcd.value("layout") is not None


def test_a_vetoed_worker_asks_its_store_nothing_and_claims_at_once_when_vouched_for():
    clock = FakeClock()
    store = ScriptedStore([ScriptedLease(3, mark_ms=0)])
    core, sent = make_core(store, clock, etcd=("http://127.0.0.1:2379",))
    for _ in range(5):
        core.tick(clock.mono_ns())
        clock.advance_ms(300)
    assert store.claims == [] and not core.held
    assert "until the clock is vouched for" in core.reason and PENDING_VERDICT in core.reason
    core.handle(protocol.encode_clock(WHY), clock.mono_ns())
    core.tick(clock.mono_ns())
    assert store.claims == [] and WHY in core.reason
    core.handle(protocol.encode_clock(None), clock.mono_ns())  # no wait for the recheck
    core.tick(clock.mono_ns())
    assert len(store.claims) == 1 and [h.lease.worker_id for h in core.held] == [3]


def test_a_refused_clock_lets_every_held_worker_id_go_and_mints_nothing_more(caplog):
    clock = FakeClock()
    core, sent, leases = ready_core(clock, ids=2)
    claims = len(core.store.claims)
    core.turn(protocol.encode_clock(WHY), clock.mono_ns())  # the timers run at once
    assert core.held == [] and core.ready == []
    assert [[call[0] for call in lease.calls] for lease in leases] == [["release"], ["release"]]
    assert core.counters["clock_releases"] == 1
    assert f"let worker ID 0, 1 go: the clock is not vouched for: {WHY}" in caplog.text
    assert core.reason == f"claiming no worker ID until the clock is vouched for: {WHY}"
    sent.clear()
    work(core, clock, 7, 1)
    (reply,) = replies(sent)
    assert reply.error is not None  # refused: nothing stamped with that clock
    for _ in range(5):
        clock.advance_ms(300)
        core.tick(clock.mono_ns())
    assert len(core.store.claims) == claims and core.held == []  # and nothing claimed while refused


def test_the_broker_own_worker_id_lets_go_when_its_store_is_told():
    # The broker sets its own worker ID's store's veto (no frame): its next timer turn lets go.
    clock = FakeClock()
    core, _, leases = ready_core(clock, ids=1)
    core.store.claim_veto = WHY
    core.tick(clock.mono_ns())
    assert core.held == [] and [call[0] for call in leases[0].calls] == ["release"]


def test_a_pending_verdict_lets_nothing_go():
    clock = FakeClock()
    core, _, leases = ready_core(clock, ids=1)
    core.store.claim_veto = PENDING_VERDICT
    core.tick(clock.mono_ns())
    assert len(core.held) == 1 and leases[0].calls == []


def test_a_verdict_the_broker_already_sent_counts_for_the_next_claim():
    # The claim takes in the frames waiting on the socket first: a veto sent (and logged)
    # before the claim stops it, even when it waits behind other frames.
    clock = FakeClock()
    store = ScriptedStore([ScriptedLease(3, mark_ms=0)])
    waiting = [protocol.PING_FRAME, protocol.encode_clock(WHY)]
    core, _ = make_core(store, clock)
    core.queued = lambda: [waiting.pop(0) for _ in range(len(waiting))]
    core.tick(clock.mono_ns())
    assert store.claims == [] and not core.held and store.claim_veto == WHY
    assert WHY in core.reason


def off(ms: float, at_ns: int = 0) -> tuple[int, int, int]:
    return int(ms * 1e6), 2_000_000, at_ns  # (offset, round trip, measured at)


BOUND, INTERVAL = 500_000_000, 1_000_000_000


@pytest.mark.parametrize(
    "offsets, rotation, claims",
    [
        ({}, False, False),  # alone: nobody disagrees
        ({"b": off(100)}, False, False),
        ({"b": off(900)}, False, True),  # two apart: nobody can tell who is wrong
        ({"b": off(-900)}, False, True),  # whichever is behind
        ({"b": off(900), "c": off(50)}, False, False),  # b is the odd one out, not this node
        ({"b": off(900), "c": off(950)}, True, True),  # this node is the odd one out
        ({"b": off(900), "c": off(10), "d": off(-950)}, False, True),  # two against two
        ({"b": off(900), "c": off(900, at_ns=-10 * INTERVAL)}, False, True),  # c stale: does not vote
        ({"b": off(501)}, False, False),  # within the bound allowing for half the round trip
    ],
)
def test_the_cluster_vouches_for_a_clock_by_majority(offsets, rotation, claims):
    got_rotation, got_claims = verdicts(offsets, 0, BOUND, INTERVAL)
    assert bool(got_rotation) == rotation
    assert bool(got_claims) == claims
    if got_claims:
        assert "by more than 500 ms" in got_claims


def test_nothing_is_vetoed_where_the_bound_is_off():
    assert verdicts({"b": off(5000), "c": off(5000)}, 0, 0, INTERVAL) == (None, None)


def test_frames_taken_in_before_a_claim_are_word_from_the_broker():
    # A worker whose broker's heartbeats are taken in by its claims (the loop spent its wait
    # inside a slow claim, say) heard its broker: it must not leave it as gone.
    clock = FakeClock()
    store = ScriptedStore([])
    core, _ = make_core(store, clock)
    waiting = [protocol.encode_clock(WHY)]
    core.queued = lambda: [waiting.pop(0) for _ in range(len(waiting))]
    for _ in range(int(4 * core._silence_ns / 500_000_000)):  # four silence bounds, in half seconds
        waiting.append(protocol.PING_FRAME)
        core.tick(clock.mono_ns())
        clock.advance_ms(500)
    assert store.claim_veto == WHY and len(waiting) <= 1  # taken in by the claims (one a second)
    assert not core.stopping, core.reason
