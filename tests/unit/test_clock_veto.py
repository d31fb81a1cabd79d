"""The clock-skew bound a quarantine assumes is enforced: a node whose clock disagrees with
its peers' claims no worker ID of unknown state, and creates no store, until it agrees."""

from __future__ import annotations

import pytest
from etcdrig import NOW_MS, claim
from fakeclock import FakeClock
from test_routing import Rig
from test_worker_core import ScriptedStore, make_core

from snowfence import protocol
from snowfence.clock import PENDING_VERDICT, pending_verdict
from snowfence.config import Config
from snowfence.errors import ClockUnsafe, ConfigError

WHY = "clock disagrees with 2 of 2 peers by more than 500 ms (b: +900.0 ms)"


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


def test_a_worker_claims_no_worker_id_of_unknown_state_until_the_broker_has_judged_its_clock():
    store = ScriptedStore([])
    make_core(store, FakeClock(), etcd=("http://127.0.0.1:2379",))
    assert store.unknown_veto == PENDING_VERDICT
    other = ScriptedStore([])
    make_core(other, FakeClock())
    assert other.unknown_veto is None


def test_a_worker_passes_the_verdict_to_its_store():
    store = ScriptedStore([])
    core, _ = make_core(store, FakeClock())
    core.handle(protocol.encode_clock(WHY), 0)
    assert store.unknown_veto == WHY
    core.handle(protocol.encode_clock(None), 0)
    assert store.unknown_veto is None


def test_while_vetoed_a_worker_id_of_unknown_state_is_passed_over_and_a_known_one_claimed(etcd):
    store = etcd.store()
    lease = claim(store, preferred=0)
    lease.release(NOW_MS)
    etcd.delete("marks/1/0")  # worker ID 0: used (in the genesis), its mark gone: unknown
    store.unknown_veto = WHY
    got = claim(store, preferred=0)
    assert got is not None and got.worker_id != 0
    assert "not claimed until it agrees" in store.passed_over[0] and WHY in store.passed_over[0]
    got.release(NOW_MS)
    others = [claim(store, holder=f"o{i}") for i in range(3)]
    assert sorted(lease.worker_id for lease in others if lease) == [1, 2, 3]
    assert claim(store) is None  # only the unknown one is left, and it is not taken
    store.unknown_veto = None
    again = claim(store)
    assert again is not None and again.worker_id == 0  # once the clock agrees: with its quarantine
    assert again.claimed_mark_ms >= NOW_MS + store.quarantine_ms()


def test_while_vetoed_no_new_store_is_created(etcd):
    etcd.delete("layout")
    store = etcd.store()
    store.unknown_veto = WHY
    with pytest.raises(ClockUnsafe, match="looks new"):
        store.check_layout(store.layout)
    assert etcd.value("layout") is None
    store.unknown_veto = None
    store.check_layout(store.layout)
    assert etcd.value("layout") is not None
