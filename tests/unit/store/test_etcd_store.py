"""The etcd lease store on an in-memory etcd: claims and fencing tokens, the mark
and the conditions on every write of it, leases that lapse, the layout record,
and errors from what etcd holds.

The real ``EtcdStore``/``EtcdLease`` talk to the in-memory etcd of ``etcdrig``.
The same behaviour against a real etcd is covered by
``tests/integration/test_etcd.py``; the client underneath (failover, rebuilds,
the error boundary) by ``test_etcd_client.py``.
"""

from __future__ import annotations

import logging

import orjson
import pytest
from etcdrig import AHEAD_MS, NOW_MS, PREFIX, TTL_S, claim, config
from fake_etcd import RpcError

from snowfence.errors import ConfigError, EtcdUnavailable, LayoutMismatch, LeaseLost
from snowfence.store.etcd import EtcdStore
from snowfence.store.genesis import Genesis
from snowfence.workers.keeper import Keeper

# -- claims and fencing tokens ------------------------------------------------------------------


def test_a_claim_takes_the_preferred_worker_id_under_a_lease_with_its_creation_as_token(etcd):
    store = etcd.store()
    lease = claim(store, preferred=2, holder="node-a/0")
    assert (lease.region, lease.worker_id) == (1, 2)
    assert etcd.json("workers/1/2") == {"holder": "node-a/0"}
    kv = etcd.server.kv[PREFIX + "workers/1/2"]
    assert lease.token == kv.create_revision
    assert kv.lease == lease.lease_id and lease.lease_id in etcd.server.leases
    assert (lease.claimed_mark_ms, lease.reserved_until_ms) == (0, 0)  # no mark yet
    assert lease.expires and lease.ttl_s == TTL_S and lease.holder == "node-a/0"
    assert lease.describe() == {
        "worker_id": 2,
        "token": lease.token,
        "reserved_until_ms": 0,
        "store": "etcd",
        "lease_id": f"{lease.lease_id:x}",
        "lease_ttl_s": TTL_S,
    }


def test_without_a_preference_the_lowest_free_worker_id_is_taken_and_claims_are_disjoint(etcd):
    a, b = etcd.store(), etcd.store()
    first = [claim(a, holder="a").worker_id, claim(b, holder="b").worker_id, claim(a, holder="a").worker_id]
    assert first == [0, 1, 2]
    assert b.taken() == a.taken() == {0, 1, 2}
    assert list(a.candidates()) == [3]
    assert claim(b, preferred=1).worker_id == 3  # the preferred one is taken: the free one


def test_unheld_counts_the_worker_ids_no_live_lease_holds(etcd):
    a, b = etcd.store(), etcd.store()
    assert a.unheld() == 4
    claim(a, holder="a"), claim(b, holder="b")
    assert a.unheld() == b.unheld() == 2
    a.passed_over[3] = "its mark is unreadable"  # a claim could not take it either
    assert a.unheld() == 1
    etcd.elapse_s(TTL_S + 1)  # neither lease is renewed: both lapse
    assert b.unheld() == 4


def test_a_worker_id_claimed_by_another_node_since_it_was_seen_free_is_not_claimed_twice(etcd):
    mine, theirs = etcd.store(), etcd.store()
    raced = []

    def other_node_claims_first(what):
        if what == "txn" and not raced:  # after this node listed the free worker IDs
            raced.append(claim(theirs, preferred=0, holder="theirs"))

    mine.client.before = other_node_claims_first
    lease = claim(mine, preferred=0, holder="mine")
    assert raced[0].worker_id == 0 and lease.worker_id == 1
    assert etcd.json("workers/1/0") == {"holder": "theirs"} and etcd.json("workers/1/1") == {"holder": "mine"}


def test_the_token_grows_each_time_a_worker_id_is_claimed_again(etcd):
    store = etcd.store()
    tokens = []
    for _ in range(3):
        lease = claim(store, preferred=1)
        assert lease.worker_id == 1
        tokens.append(lease.token)
        lease.release(NOW_MS)
    assert tokens == sorted(set(tokens))


def test_with_every_worker_id_taken_a_claim_finds_none_and_its_lease_is_revoked(etcd):
    holder, late = etcd.store(), etcd.store()
    leases = [claim(holder) for _ in range(4)]
    granted = set(etcd.server.leases)
    assert claim(late) is None
    assert set(etcd.server.leases) == granted  # the lease granted for the attempt is gone
    assert etcd.claimed() == {0, 1, 2, 3} and all(not lease.released for lease in leases)


def test_a_claim_that_fails_in_etcd_raises_and_gives_its_lease_back(etcd):
    store = etcd.store()
    store.client.fail(RpcError("UNAVAILABLE: no leader"), on="lease_grant")
    with pytest.raises(EtcdUnavailable, match="_grant failed"):
        claim(store)
    assert etcd.server.leases == {} and etcd.claimed() == set()
    store.check_layout(store.layout)
    store.client.fail(RpcError("UNAVAILABLE: no leader"), on="txn")
    store.client.calls.clear()
    with pytest.raises(EtcdUnavailable, match="_read_region failed"):
        claim(store)
    assert [what for _, what in store.client.calls] == ["lease_grant", "txn", "lease_revoke"]
    store.client.calls.clear()
    real_read = store._read_region

    def read_then_fail():  # the read goes through, the claim's own transaction fails
        found = real_read()
        store.client.fail(RpcError("UNAVAILABLE: no leader"), on="txn")
        return found

    store._read_region = read_then_fail
    with pytest.raises(EtcdUnavailable, match="try_claim failed"):
        claim(store)
    assert [what for _, what in store.client.calls] == ["lease_grant", "txn", "txn", "lease_revoke"]
    assert etcd.server.leases == {} and etcd.claimed() == set()


def test_a_claim_whose_reply_was_lost_is_undone_with_its_lease(etcd):
    store = etcd.store()
    store.client.fail(RpcError("DEADLINE_EXCEEDED"), on="txn", after=True)
    with pytest.raises(EtcdUnavailable):
        claim(store)
    assert etcd.claimed() == set() and etcd.server.leases == {}  # it had committed: revoking took it back
    assert claim(store).worker_id == 0


def test_a_claim_whose_lease_cannot_be_revoked_still_reports_the_claims_error(etcd):
    store = etcd.store()
    store.check_layout(store.layout)
    real_read = store._read_region

    def read_then_fail():  # the read goes through; the claim commits, its reply is lost
        found = real_read()
        store.client.fail(RpcError("UNAVAILABLE: a"), on="txn", after=True)
        return found

    store._read_region = read_then_fail
    store.client.fail(RpcError("UNAVAILABLE: b"), on="lease_revoke")
    with pytest.raises(EtcdUnavailable, match="try_claim failed: RpcError: UNAVAILABLE: a"):
        claim(store)
    assert len(etcd.server.leases) == 1 and etcd.claimed() == {0}  # left to lapse on its own
    etcd.elapse_s(TTL_S)
    assert etcd.claimed() == set()
    store._read_region = real_read
    assert claim(store).worker_id == 0 and len(etcd.server.leases) == 1


def test_a_claim_reads_the_previous_owners_mark(etcd):
    store = etcd.store()
    first = claim(store, preferred=3)
    first.extend(NOW_MS - 10)
    first.abandon()
    etcd.delete("workers/1/3")  # its lease lapsed, say
    again = claim(store, preferred=3)
    assert again.worker_id == 3 and again.claimed_mark_ms == again.reserved_until_ms == NOW_MS - 10
    assert again.token > first.token


@pytest.mark.parametrize(
    "mark",
    [
        b"not json",
        b"[1]",
        orjson.dumps({"token": 3}),
        orjson.dumps({"reserved_until_ms": "soon"}),
        b"null",
        orjson.dumps({"reserved_until_ms": True}),
        orjson.dumps({"reserved_until_ms": "77"}),
        orjson.dumps({"reserved_until_ms": 1.9}),
        orjson.dumps({"reserved_until_ms": -5}),
        orjson.dumps({"reserved_until_ms": 10**17}),
    ],
    ids=[
        "not-json",
        "a-list",
        "no-mark-field",
        "not-a-number",
        "null",
        "bool",
        "a-string",
        "a-float",
        "negative",
        "past-the-layout",
    ],
)
def test_a_worker_id_whose_mark_is_unreadable_is_passed_over_and_left_as_it_was(etcd, mark):
    store = etcd.store()
    etcd.put("marks/1/0", mark)
    lease = claim(store, preferred=0)
    assert lease.worker_id == 1
    assert etcd.claimed() == {1}  # the claim of worker ID 0 was taken back
    assert etcd.value("marks/1/0") == mark


def test_an_older_mark_put_back_by_hand_is_passed_over_not_read_as_the_floor(etcd):
    # Found by the simulator (seed 106634822): an owner on one node reserved far ahead;
    # `etcdctl put` then put back an older value of the mark; a node that had never read the
    # later mark (its journal had no floor for it) claimed, waited only for the old value,
    # and minted below IDs of the previous owner. Each mark now names the version etcd
    # gives the key with it: a value put back by hand carries an older one.
    store, other = etcd.store(), etcd.store()
    first = claim(store, preferred=0, holder="a")
    first.extend(NOW_MS + 1000)
    older = etcd.value("marks/1/0")
    first.extend(NOW_MS + 9000)
    first.release(NOW_MS + 8000)  # used up to here
    assert etcd.json("marks/1/0")["version"] == etcd.server.kv[PREFIX + "marks/1/0"].version
    etcd.put("marks/1/0", older)  # the rollback: 1,000 ms reserved, where 8,000 were used
    lease = claim(other, preferred=0, holder="b")
    assert lease.worker_id != 0
    assert "version" in other.passed_over[0] and "by hand" in other.passed_over[0]
    assert etcd.value("marks/1/0") == older  # left as it was, for an operator to look at
    # A mark without a version (a release before marks named theirs) is read as it always was.
    legacy = {k: v for k, v in orjson.loads(older).items() if k != "version"}
    legacy.update(reserved_until_ms=NOW_MS - 5, reserved_until_unix_ms=NOW_MS - 5 + store.layout.epoch_ms)
    etcd.put("marks/1/2", legacy)
    assert claim(other, preferred=2).worker_id == 2 and 2 not in other.passed_over


def test_with_only_unreadable_marks_no_worker_id_is_claimed(etcd):
    store = etcd.store()
    for w in range(4):
        etcd.put(f"marks/1/{w}", b"{")
    assert claim(store) is None
    assert etcd.claimed() == set() and etcd.server.leases == {}


def test_a_mark_up_to_now_is_taken_at_once_one_later_only_if_nothing_better_is_free(etcd):
    store = etcd.store()
    etcd.put("marks/1/0", {"reserved_until_ms": NOW_MS + 1})
    etcd.put("marks/1/1", {"reserved_until_ms": NOW_MS})
    lease = claim(store, preferred=0)
    assert lease.worker_id == 1 and lease.claimed_mark_ms == NOW_MS
    assert etcd.claimed() == {1}  # worker ID 0 was tried and given back


def test_a_far_mark_is_taken_only_when_every_worker_id_is_far_ahead(etcd):
    store = etcd.store()
    marks = {0: NOW_MS + AHEAD_MS + 50, 1: NOW_MS + AHEAD_MS + 1, 2: NOW_MS + AHEAD_MS, 3: NOW_MS + AHEAD_MS + 9}
    for w, ms in marks.items():
        etcd.put(f"marks/1/{w}", {"reserved_until_ms": ms})
    near = claim(store, preferred=0)
    assert near.worker_id == 2  # within the wait allowed
    near.release(0)
    etcd.put("marks/1/2", {"reserved_until_ms": NOW_MS + AHEAD_MS + 2})
    far = claim(store, preferred=3)
    assert far.worker_id == 3 and far.claimed_mark_ms == marks[3]  # none near: the preferred, far ahead
    assert etcd.claimed() == {3}


# -- the mark -----------------------------------------------------------------------------------


def test_extend_persists_the_mark_with_its_token_and_holder(etcd):
    store = etcd.store()
    lease = claim(store, preferred=1, holder="node-a/0")
    lease.extend(NOW_MS + 700)
    assert lease.reserved_until_ms == NOW_MS + 700
    assert etcd.json("marks/1/1") == {
        "reserved_until_ms": NOW_MS + 700,
        "reserved_until_unix_ms": NOW_MS + 700 + store.layout.epoch_ms,
        "token": lease.token,
        "holder": "node-a/0",
        "store": etcd.genesis.store_id,
        "layout": store.layout.digest(),
        "version": 2,  # the claim wrote the first, this extension the second
        "floor_ms": 1,  # what the holder promises not to mint below (its claim's: the mark found, plus one)
        "released": False,
    }
    assert etcd.server.kv[PREFIX + "marks/1/1"].lease == 0  # the mark outlives the owner
    lease.abandon()
    etcd.elapse_s(TTL_S)
    assert etcd.claimed() == set() and etcd.mark(1) == NOW_MS + 700


def taken_over(etcd):
    """Worker ID 0 claimed and its mark extended; its claim deleted under it, and claimed and
    extended by another store: (the old lease, the new one)."""
    old = claim(etcd.store(), preferred=0)
    old.extend(NOW_MS + 100)
    etcd.delete("workers/1/0")
    new = claim(etcd.store(), preferred=0, now_ms=NOW_MS + 200)
    new.extend(NOW_MS + 900)
    return old, new


def test_an_owner_whose_claim_was_taken_over_cannot_move_the_mark(etcd):
    old, new = taken_over(etcd)
    with pytest.raises(LeaseLost, match=f"worker ID 0: its claim carries token {new.token}, not ours"):
        old.extend(NOW_MS + 5000)
    assert old.reserved_until_ms == NOW_MS + 100
    assert etcd.mark(0) == NOW_MS + 900 and etcd.json("marks/1/0")["token"] == new.token


def test_an_owner_whose_claim_was_deleted_cannot_write_the_mark(etcd):
    store = etcd.store()
    lease = claim(store, preferred=0)
    lease.extend(NOW_MS)
    etcd.delete("workers/1/0")
    with pytest.raises(LeaseLost):
        lease.extend(NOW_MS + 1)
    assert etcd.mark(0) == NOW_MS and lease.reserved_until_ms == NOW_MS


# -- release ------------------------------------------------------------------------------------


def test_release_lowers_the_mark_to_the_last_ms_used_and_frees_the_worker_id_at_once(etcd):
    store = etcd.store()
    lease = claim(store, preferred=2)
    lease.extend(NOW_MS + 5000)
    lease.release(NOW_MS + 40)
    assert lease.released and lease.reserved_until_ms == NOW_MS + 40
    assert etcd.mark(2) == NOW_MS + 40 and etcd.json("marks/1/2")["token"] == lease.token
    assert etcd.claimed() == set() and lease.lease_id not in etcd.server.leases


def test_release_never_lowers_the_mark_below_the_one_claimed(etcd):
    store = etcd.store()
    etcd.put("marks/1/0", {"reserved_until_ms": NOW_MS + 300})
    lease = claim(store, preferred=0, now_ms=NOW_MS + 400)
    assert lease.claimed_mark_ms == NOW_MS + 300
    lease.extend(NOW_MS + 2000)
    lease.release(5)  # nothing minted
    assert etcd.mark(0) == lease.reserved_until_ms == NOW_MS + 300


def test_release_with_nothing_reserved_past_the_last_ms_used_keeps_the_mark_and_says_it_let_go(etcd):
    store = etcd.store()
    lease = claim(store, preferred=0)
    lease.extend(NOW_MS + 10)
    assert etcd.json("marks/1/0")["released"] is False
    lease.release(NOW_MS + 10)
    assert etcd.mark(0) == NOW_MS + 10 and etcd.json("marks/1/0")["released"] is True
    unused = claim(store, preferred=1)  # its claim wrote its first mark, at 0
    unused.release(NOW_MS + 99)  # past what was reserved (nothing): the mark stays, none is raised
    assert etcd.mark(1) == 0 and unused.reserved_until_ms == 0
    assert etcd.json("marks/1/1")["released"] is True
    assert etcd.claimed() == set()


def test_a_release_after_a_takeover_leaves_the_new_owner_alone(etcd):
    old, new = taken_over(etcd)
    old.release(NOW_MS + 50)
    assert old.released and old.reserved_until_ms == NOW_MS + 100
    assert etcd.mark(0) == NOW_MS + 900 and etcd.claimed() == {0}
    assert old.lease_id not in etcd.server.leases and new.lease_id in etcd.server.leases


def test_release_happens_once_even_when_etcd_fails(etcd):
    store = etcd.store()
    lease = claim(store)
    lease.extend(NOW_MS + 100)
    store.client.fail(RpcError("UNAVAILABLE"))
    with pytest.raises(EtcdUnavailable):
        lease.release(NOW_MS)
    assert lease.released
    calls = len(store.client.calls)
    lease.release(NOW_MS)
    assert len(store.client.calls) == calls  # a second release writes nothing
    assert etcd.mark(0) == NOW_MS + 100  # the failed release left the mark as it was


def test_release_frees_the_worker_id_and_lowers_the_mark_even_if_the_lease_cannot_be_revoked(etcd):
    store = etcd.store()
    lease = claim(store)
    lease.extend(NOW_MS + 100)
    store.client.fail(RpcError("UNAVAILABLE"), on="lease_revoke")
    with pytest.raises(EtcdUnavailable):
        lease.release(NOW_MS + 10)
    assert etcd.claimed() == set() and etcd.mark(0) == NOW_MS + 10 and lease.released
    assert lease.lease_id in etcd.server.leases  # it lapses on its own


def test_abandon_writes_nothing_and_the_worker_id_frees_when_the_lease_lapses(etcd):
    store = etcd.store()
    with claim(store) as lease:
        lease.extend(NOW_MS + 100)
        calls = len(store.client.calls)
    assert lease.released and len(store.client.calls) == calls
    assert etcd.claimed() == {0}
    etcd.elapse_s(TTL_S)
    assert etcd.claimed() == set() and etcd.mark(0) == NOW_MS + 100


# -- the lease ----------------------------------------------------------------------------------


def test_refreshing_keeps_the_claim_and_restarts_the_ttl_count(etcd):
    store = etcd.store()
    lease = claim(store)
    assert lease.remaining_s() == TTL_S
    etcd.elapse_s(2.5)
    assert lease.remaining_s() == TTL_S - 2.5
    lease.refresh()
    for _ in range(3):
        etcd.elapse_s(TTL_S - 1)
        lease.refresh()
        assert lease.remaining_s() == TTL_S
    assert etcd.claimed() == {0}
    etcd.elapse_s(TTL_S)
    assert etcd.claimed() == set()


def test_a_lease_that_lapsed_is_lost_on_refresh(etcd):
    store = etcd.store()
    lease = claim(store)
    etcd.elapse_s(TTL_S)
    with pytest.raises(LeaseLost, match=f"lease {lease.lease_id:x} of worker ID 0 has expired"):
        lease.refresh()
    with pytest.raises(LeaseLost):
        lease.extend(NOW_MS)
    assert lease.remaining_s() == 0  # as last known


def test_a_keepalive_stream_that_ends_without_an_answer_is_a_lost_lease(etcd):
    store, cluster = etcd.store(), etcd.cluster()
    lease = claim(store)
    node_lease = cluster.grant_lease(TTL_S)
    store.client.refresh_lease = cluster.client.refresh_lease = lambda lease_id: iter(())
    with pytest.raises(LeaseLost):
        lease.refresh()
    assert cluster.refresh_lease(node_lease) is False


def test_a_keepalive_answering_one_second_left_is_alive(etcd):
    from types import SimpleNamespace

    store, cluster = etcd.store(), etcd.cluster()
    lease = claim(store)
    node_lease = cluster.grant_lease(TTL_S)

    def answer(lease_id):
        return iter([SimpleNamespace(ID=lease_id, TTL=1)])

    store.client.refresh_lease = cluster.client.refresh_lease = answer
    lease.refresh()
    assert lease.ttl_s == 1 and lease.remaining_s() == 1
    assert cluster.refresh_lease(node_lease) is True


def test_the_remaining_ttl_is_given_to_the_millisecond(etcd):
    lease = claim(etcd.store())
    etcd.clock.mono_ns_value += 1_234_567
    assert lease.remaining_s() == 9.999  # 9.998765 s left, rounded
    etcd.clock.mono_ns_value += 2_000_000_000
    assert lease.remaining_s() == 7.999


def test_the_keeper_renews_an_etcd_lease_persists_ahead_and_stops_on_a_takeover(etcd):
    store = etcd.store()
    lease = claim(store)
    clock = etcd.clock
    layout = store.layout
    minter = clock.minter(layout, 1, lease.worker_id)
    minter.start_after(lease.claimed_mark_ms)
    keeper = Keeper(lease, minter, interval_s=2.0, fence_after_s=5.0, window_ms=5000, mono_ns=clock.mono_ns)
    for _ in range(8):
        keeper.renew_once()
        assert etcd.mark(0) == lease.reserved_until_ms == minter.reserved_until_ms
        assert minter.reserved_until_ms >= clock.wall_ms - layout.epoch_ms + 4000
        etcd.elapse_s(2)
    etcd.delete("workers/1/0")
    claim(etcd.store(), preferred=0, now_ms=etcd.mark(0) + 1)
    reserved = minter.reserved_until_ms
    etcd.elapse_s(2)
    with pytest.raises(LeaseLost):
        keeper.renew_once()
    assert minter.reserved_until_ms == reserved and etcd.mark(0) == reserved


# -- the layout ---------------------------------------------------------------------------------


def test_the_first_node_records_the_layout_and_the_same_layout_is_accepted_after(etcd, caplog):
    etcd.delete("layout")  # a new cluster
    store = etcd.store()
    caplog.set_level(logging.INFO, logger="snowfence.etcd")
    store.check_layout(store.layout)
    [message] = [r.getMessage() for r in caplog.records if r.name == "snowfence.etcd"]
    assert message.startswith(
        f"recorded layout for cluster unit: {store.layout.describe()}, and its claim of region 1; "
    )
    assert "its first claims mint nothing for 6000 ms" in message
    assert Genesis.from_dict(etcd.json("layout")).layout == store.layout
    revision = etcd.server.kv[PREFIX + "layout"].mod_revision
    etcd.store().check_layout(store.layout)
    assert etcd.server.kv[PREFIX + "layout"].mod_revision == revision


def test_a_different_layout_is_refused_and_the_recorded_one_stays(etcd):
    etcd.store().check_layout(config().layout)
    recorded = etcd.value("layout")
    other = config(worker_bits=3, sequence_bits=5)
    with pytest.raises(LayoutMismatch, match="cluster 'unit' uses layout .* this node will not start"):
        etcd.store(worker_bits=3, sequence_bits=5).check_layout(other.layout)
    assert etcd.value("layout") == recorded


@pytest.mark.parametrize(
    "recorded",
    [b"", b"{", b"[]", b"7", orjson.dumps({"time_bits": 53, "colour": "red"}), orjson.dumps({"time_bits": "x"})],
    ids=["empty", "not-json", "a-list", "a-number", "unknown-field", "wrong-type"],
)
def test_an_unreadable_recorded_layout_is_a_clear_error_and_is_left_alone(etcd, recorded):
    etcd.put("layout", recorded)
    store = etcd.store()
    with pytest.raises(LayoutMismatch, match="the layout recorded for cluster 'unit' is unreadable"):
        store.check_layout(store.layout)
    assert etcd.value("layout") == recorded
    assert len(etcd.clients) == 1 and store.connection._failures == 0  # etcd answered: not a failure of etcd


def test_taken_counts_claims_of_this_region_only_and_ignores_stray_keys(etcd):
    here, there = etcd.store(), etcd.store(region=2)
    claim(there, preferred=0)
    etcd.put("workers/1/notanumber", {"holder": "x"})
    etcd.put("workers/1/!", {"holder": "x"})  # listed first
    etcd.put("workers/1/3", {"holder": "x"})
    assert here.taken() == {3} and there.taken() == {0}
    assert list(here.candidates()) == [0, 1, 2]


# -- configuration ------------------------------------------------------------------------------


def test_a_region_outside_the_layout_is_a_config_error(monkeypatch):
    cfg = config()
    object.__setattr__(cfg, "region", 4)  # two region bits: 0..3
    with pytest.raises(ConfigError, match="region must be 0..3"):
        EtcdStore(cfg)
