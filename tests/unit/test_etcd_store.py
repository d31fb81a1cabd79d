"""The etcd store on an in-memory etcd: claims and fencing tokens, the mark and
the conditions on every write of it, leases that lapse, errors from etcd and
from what etcd holds, the cluster's census and membership.

The real ``EtcdStore``/``EtcdLease`` talk to ``fake_etcd.EtcdServer`` (the
simulator's etcd, checked against a real one by ``tests/sim/test_fake_etcd.py``)
through ``fake_etcd.DirectClient``, which can fail calls on demand. Leases
lapse on the fake clock. The same behaviour against a real etcd is covered by
``tests/integration/test_etcd.py``.
"""

from __future__ import annotations

import logging

import orjson
import pytest
from fake_etcd import DirectClient, EtcdServer, RpcError, ServerTime
from fakeclock import FakeClock

from snowfence.config import Config
from snowfence.errors import ConfigError, EtcdUnavailable, LayoutMismatch, LeaseLost
from snowfence.workers import etcd as etcd_mod
from snowfence.workers.etcd import REBUILD_AFTER_FAILURES, EtcdStore
from snowfence.workers.genesis import Genesis
from snowfence.workers.lease import Keeper
from snowfence.workers.minter import Minter

LAYOUT = dict(time_bits=53, region_bits=2, worker_bits=2, sequence_bits=6)  # worker IDs 0..3
PREFIX = "/snowfence/unit/"
TTL_S = 10
NOW_MS = 1_000_000
AHEAD_MS = 5_000


def config(**overrides) -> Config:
    values = dict(
        etcd=("http://127.0.0.1:2379",),
        cluster="unit",
        region=1,
        lease_ttl_s=TTL_S,
        keepalive_interval_s=2.0,
        fence_after_s=5.0,
        reservation_window_s=5.0,
        max_ahead_ms=1000,
        etcd_timeout_s=1.0,
        workers=1,
        **LAYOUT,
    )
    values.update(overrides)
    return Config(**values)


class Etcd:
    """One in-memory etcd, the fake clock its leases lapse on, and stores onto it."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.server = EtcdServer(ServerTime(self.clock.mono_ns))
        self.clients: list[DirectClient] = []
        # A store that has been in use for a while, upgraded from an older release's
        # layout record (so marks without a store ID are its own) and long past any
        # quarantine: the setting most tests need. Tests of new stores delete it.
        self.genesis = Genesis(Config(**LAYOUT).layout, "ab" * 16, window_ms=5_000, legacy=True)
        self.put("layout", self.genesis.to_dict())

    def store(self, labels=("127.0.0.1:2379",), **overrides) -> EtcdStore:
        store = EtcdStore(config(**overrides), mono_ns=self.clock.mono_ns)

        def build():
            client = DirectClient(self.server, labels)
            self.clients.append(client)
            return client

        store._build_client = build
        return store

    def value(self, key: str):
        self.server.expire()
        kv = self.server.kv.get(PREFIX + key)
        return None if kv is None else kv.value

    def json(self, key: str):
        value = self.value(key)
        return None if value is None else orjson.loads(value)

    def put(self, key: str, value) -> None:
        """An operator's ``etcdctl put`` (no lease)."""
        from pyetcd.client import Transactions

        raw = value if isinstance(value, bytes) else orjson.dumps(value)
        self.server.txn([], [Transactions().put(PREFIX + key, raw)], [])

    def delete(self, key: str) -> None:
        """An operator's ``etcdctl del``."""
        assert self.server.delete_key(PREFIX + key)

    def mark(self, worker_id: int, region: int = 1):
        found = self.json(f"marks/{region}/{worker_id}")
        return None if found is None else found["reserved_until_ms"]

    def claimed(self, region: int = 1) -> set[int]:
        start = f"{PREFIX}workers/{region}/"
        self.server.expire()
        return {int(k.rsplit("/", 1)[1]) for k in self.server.kv if k.startswith(start)}

    def elapse_s(self, s: float) -> None:
        self.clock.advance_ms(s * 1000)


@pytest.fixture
def etcd() -> Etcd:
    return Etcd()


def claim(store, preferred=None, holder="h", now_ms=NOW_MS, ahead_ms=AHEAD_MS):
    return store.claim(preferred, holder, now_ms, ahead_ms)


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
    }
    assert etcd.server.kv[PREFIX + "marks/1/1"].lease == 0  # the mark outlives the owner
    lease.abandon()
    etcd.elapse_s(TTL_S)
    assert etcd.claimed() == set() and etcd.mark(1) == NOW_MS + 700


def test_an_owner_whose_claim_was_taken_over_cannot_move_the_mark(etcd):
    store, other = etcd.store(), etcd.store()
    old = claim(store, preferred=0)
    old.extend(NOW_MS + 100)
    etcd.delete("workers/1/0")
    new = claim(other, preferred=0, now_ms=NOW_MS + 200)
    new.extend(NOW_MS + 900)
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


def test_release_with_nothing_reserved_past_the_last_ms_used_writes_no_mark(etcd):
    store = etcd.store()
    lease = claim(store, preferred=0)
    lease.extend(NOW_MS + 10)
    before = etcd.server.kv[PREFIX + "marks/1/0"].mod_revision
    lease.release(NOW_MS + 10)
    assert etcd.server.kv[PREFIX + "marks/1/0"].mod_revision == before
    unused = claim(store, preferred=1)  # its claim wrote its first mark, at 0
    before = etcd.server.kv[PREFIX + "marks/1/1"].mod_revision
    unused.release(NOW_MS + 99)  # past what was reserved (nothing): the mark stays, none is raised
    assert etcd.mark(1) == 0 and unused.reserved_until_ms == 0
    assert etcd.server.kv[PREFIX + "marks/1/1"].mod_revision == before
    assert etcd.claimed() == set()


def test_a_release_after_a_takeover_leaves_the_new_owner_alone(etcd):
    store, other = etcd.store(), etcd.store()
    old = claim(store, preferred=0)
    old.extend(NOW_MS + 100)
    etcd.delete("workers/1/0")
    new = claim(other, preferred=0, now_ms=NOW_MS + 200)
    new.extend(NOW_MS + 900)
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
    store = etcd.store()
    lease = claim(store)
    node_lease = store.grant_lease(TTL_S)
    store.client.refresh_lease = lambda lease_id: iter(())
    with pytest.raises(LeaseLost):
        lease.refresh()
    assert store.refresh_lease(node_lease) is False


def test_a_keepalive_answering_one_second_left_is_alive(etcd):
    from types import SimpleNamespace

    store = etcd.store()
    lease = claim(store)
    node_lease = store.grant_lease(TTL_S)
    store.client.refresh_lease = lambda lease_id: iter([SimpleNamespace(ID=lease_id, TTL=1)])
    lease.refresh()
    assert lease.ttl_s == 1 and lease.remaining_s() == 1
    assert store.refresh_lease(node_lease) is True


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
    minter = Minter(layout, 1, lease.worker_id, wall_ns=clock.wall_ns, mono_ns=clock.mono_ns, sleep=clock.sleep)
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


# -- errors from etcd ---------------------------------------------------------------------------


class GrpcLikeError(Exception):
    """Shaped as grpc's errors: ``code()`` and ``details()``."""

    def __init__(self, code: str, details, broken: bool = False) -> None:
        super().__init__("<_InactiveRpcError of RPC that terminated>")
        self._code, self._details, self._broken = code, details, broken

    def code(self):
        if self._broken:
            raise RuntimeError("no status")
        return type("StatusCode", (), {"name": self._code})()

    def details(self):
        return self._details


def test_every_client_error_becomes_etcd_unavailable_with_its_status_and_details(etcd):
    store = etcd.store()
    lease = claim(store)
    store.client.fail(GrpcLikeError("DEADLINE_EXCEEDED", "Deadline Exceeded"))
    with pytest.raises(EtcdUnavailable) as caught:
        lease.extend(NOW_MS)
    assert str(caught.value) == "etcd call extend failed: DEADLINE_EXCEEDED: Deadline Exceeded"
    store.client.fail(GrpcLikeError("UNKNOWN", "x", broken=True))
    with pytest.raises(EtcdUnavailable) as caught:
        lease.refresh()
    assert str(caught.value) == "etcd call refresh failed: GrpcLikeError: <_InactiveRpcError of RPC that terminated>"
    store.client.fail(ConnectionResetError())
    with pytest.raises(EtcdUnavailable) as caught:
        store.taken()
    assert str(caught.value) == "etcd call _read_region failed: ConnectionResetError"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_lost_lease_is_reported_as_lost_not_as_etcd_failing(etcd):
    store = etcd.store()
    lease = claim(store)
    etcd.delete("workers/1/0")
    for _ in range(REBUILD_AFTER_FAILURES + 1):
        with pytest.raises(LeaseLost):
            lease.extend(NOW_MS)
    assert len(etcd.clients) == 1  # answers, not failures: the client is kept


def test_the_client_moves_to_the_next_member_after_each_failure_and_clears_the_librarys_marks(etcd):
    labels = ("m0:2379", "m1:2379", "m2:2379")
    store = etcd.store(labels=labels)
    client = store.client
    client._current_endpoint_label = "m1:2379"
    for endpoint in client.endpoints.values():
        endpoint.last_failed = 12345.0
    seen = []
    for _ in range(REBUILD_AFTER_FAILURES - 1):
        client.fail(RpcError("UNAVAILABLE"))
        with pytest.raises(EtcdUnavailable):
            store.taken()
        seen.append(client._current_endpoint_label)
    assert seen == ["m2:2379", "m0:2379"]
    assert all(endpoint.last_failed == 0 for endpoint in client.endpoints.values())
    client._current_endpoint_label = "elsewhere:1"  # a member the client does not list
    client.fail(RpcError("UNAVAILABLE"))
    store._succeeded()
    with pytest.raises(EtcdUnavailable):
        store.taken()
    assert client._current_endpoint_label == "m0:2379"


def test_after_repeated_failures_the_client_is_rebuilt_and_a_success_resets_the_count(etcd):
    store = etcd.store()
    first = store.client
    for _ in range(REBUILD_AFTER_FAILURES - 1):
        first.fail(RpcError("UNAVAILABLE"))
        with pytest.raises(EtcdUnavailable):
            store.taken()
    assert store.taken() == set()  # a success: the count starts again
    for _ in range(REBUILD_AFTER_FAILURES - 1):
        first.fail(RpcError("UNAVAILABLE"))
        with pytest.raises(EtcdUnavailable):
            store.taken()
    assert store.client is first and not first.closed
    first.fail(RpcError("UNAVAILABLE"))
    with pytest.raises(EtcdUnavailable):
        store.taken()
    assert first.closed and len(etcd.clients) == 1  # closed now, a new one on the next call
    assert store.taken() == set() and len(etcd.clients) == 2 and store.client is etcd.clients[1]


def test_a_rebuilt_client_starts_its_own_count_of_failures(etcd):
    store = etcd.store()
    store.client.fail(RpcError("UNAUTHENTICATED"))
    with pytest.raises(EtcdUnavailable):
        store.taken()
    for _ in range(REBUILD_AFTER_FAILURES - 1):
        store.client.fail(RpcError("UNAVAILABLE"))
        with pytest.raises(EtcdUnavailable):
            store.taken()
    assert len(etcd.clients) == 2 and not etcd.clients[1].closed
    store.client.fail(RpcError("UNAVAILABLE"))
    with pytest.raises(EtcdUnavailable):
        store.taken()
    assert etcd.clients[1].closed


def test_a_client_that_cannot_be_built_is_an_etcd_failure_and_is_tried_again(etcd):
    store = etcd.store()
    build = store._build_client
    attempts = []

    def refused():
        attempts.append(1)
        if len(attempts) == 1:
            raise RpcError("UNAVAILABLE: authentication: connection refused")
        return build()

    store._build_client = refused
    with pytest.raises(EtcdUnavailable, match="_read_region failed: RpcError: UNAVAILABLE"):
        store.taken()
    assert store.taken() == set() and len(attempts) == 2


@pytest.mark.parametrize(
    "text", ["UNAUTHENTICATED: unknown user", "INVALID_ARGUMENT: etcdserver: invalid auth token", "bad token"]
)
def test_an_authentication_error_rebuilds_the_client_at_once(etcd, text):
    store = etcd.store()
    store.taken()
    store.client.fail(RpcError(text))
    with pytest.raises(EtcdUnavailable):
        store.taken()
    assert etcd.clients[0].closed
    store.taken()
    assert len(etcd.clients) == 2


def test_a_client_that_will_not_close_is_dropped_all_the_same(etcd):
    store = etcd.store()
    client = store.client

    def refuse():
        raise RuntimeError("channel already closed")

    client.close = refuse
    store.close()
    assert store.taken() == set() and store.client is not client
    store.close()
    store.close()  # nothing built in between: nothing to close
    assert etcd.clients[1].closed


def test_a_dead_channel_is_an_etcd_failure_too(etcd):
    store = etcd.store()
    store.client.closed = True  # grpc raises ValueError on a closed channel
    with pytest.raises(EtcdUnavailable, match="ValueError: Cannot invoke RPC on closed channel"):
        store.taken()


# -- the layout ---------------------------------------------------------------------------------


def test_the_first_node_records_the_layout_and_the_same_layout_is_accepted_after(etcd, caplog):
    etcd.delete("layout")  # a new cluster
    store = etcd.store()
    caplog.set_level(logging.INFO, logger="snowfence.etcd")
    store.check_layout(store.layout)
    [message] = [r.getMessage() for r in caplog.records if r.name == "snowfence.etcd"]
    assert message.startswith(f"recorded layout for cluster unit: {store.layout.describe()}; new store ")
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
    assert len(etcd.clients) == 1 and store._failures == 0  # etcd answered: not a failure of etcd


# -- the census and membership ------------------------------------------------------------------


def test_the_census_lists_held_and_retired_worker_ids_of_every_region_in_order(etcd):
    here, there = etcd.store(), etcd.store(region=2)
    retired = claim(here, preferred=3, holder="old")
    retired.extend(NOW_MS + 7)
    retired.release(NOW_MS + 5)
    held = claim(here, preferred=1, holder="a")
    held.extend(NOW_MS + 9)
    fresh = claim(there, preferred=0, holder="b")
    etcd.elapse_s(4)
    held.refresh()
    etcd.elapse_s(1.5)
    census = here.census()
    assert census == [
        {
            "region": 1,
            "worker_id": 1,
            "state": "held",
            "mark_ms": NOW_MS + 9,
            "mark_token": held.token,
            "last_holder": "a",
            "holder": "a",
            "token": held.token,
            "lease_id": f"{held.lease_id:x}",
            "lease_remaining_s": TTL_S - 2,
            "renewed_ago_s": 2,
        },
        {
            "region": 1,
            "worker_id": 3,
            "state": "retired",
            "mark_ms": NOW_MS + 5,
            "mark_token": retired.token,
            "last_holder": "old",
        },
        {
            "region": 2,
            "worker_id": 0,
            "state": "held",
            "mark_ms": 0,  # written by its claim
            "mark_token": None,
            "last_holder": "b",
            "holder": "b",
            "token": fresh.token,
            "lease_id": f"{fresh.lease_id:x}",
            "lease_remaining_s": TTL_S - 6,
            "renewed_ago_s": 6,
        },
    ]
    assert there.census() == census


def test_the_census_shows_a_claim_whose_lease_is_gone_without_its_lease_times(etcd):
    store = etcd.store()
    etcd.put("workers/1/2", {"holder": "by hand"})  # no lease
    lease = claim(store, preferred=0)
    info = etcd.server.lease_info

    def lapsed(lease_id):  # etcd's answer for a lease that lapsed between the two reads
        return type("R", (), {"TTL": -1, "grantedTTL": 0})() if lease_id == lease.lease_id else info(lease_id)

    etcd.server.lease_info = lapsed
    by_id = {e["worker_id"]: e for e in store.census()}
    assert by_id[2]["lease_id"] == "0" and by_id[2]["lease_remaining_s"] is None and by_id[2]["renewed_ago_s"] is None
    assert by_id[2]["holder"] == "by hand" and by_id[2]["state"] == "held"
    assert by_id[0]["lease_remaining_s"] == -1 and by_id[0]["renewed_ago_s"] is None


def test_the_census_counts_a_lease_in_its_last_second_as_renewed_its_whole_ttl_ago(etcd):
    store = etcd.store()
    claim(store)
    etcd.elapse_s(TTL_S - 0.5)
    (entry,) = store.census()
    assert (entry["lease_remaining_s"], entry["renewed_ago_s"]) == (0, TTL_S)


def test_a_node_entry_lives_under_its_lease_and_goes_with_it(etcd):
    store = etcd.store()
    lease_id = store.grant_lease(4)
    store.put_node("tcp://h:1/a b", {"node": "tcp://h:1/a b", "endpoints": ["tcp://h:1"]}, lease_id)
    assert etcd.server.kv[PREFIX + "nodes/tcp%3A%2F%2Fh%3A1%2Fa%20b"].lease == lease_id
    assert store.nodes() == [{"node": "tcp://h:1/a b", "endpoints": ["tcp://h:1"]}]
    etcd.elapse_s(3)
    assert store.refresh_lease(lease_id) is True
    etcd.elapse_s(3)
    assert store.nodes() != []
    etcd.elapse_s(4)
    assert store.nodes() == [] and store.refresh_lease(lease_id) is False


def test_a_node_removed_leaves_at_once_and_its_lease_is_revoked(etcd):
    store = etcd.store()
    keep, drop = store.grant_lease(10), store.grant_lease(10)
    store.put_node("b", {"node": "b", "endpoints": []}, keep)
    store.put_node("a", {"node": "a", "endpoints": ["tcp://a:1"]}, drop)
    assert [n["node"] for n in store.nodes()] == ["a", "b"]
    store.remove_node("a", drop)
    assert [n["node"] for n in store.nodes()] == ["b"] and drop not in etcd.server.leases
    assert keep in etcd.server.leases
    store.client.fail(RpcError("UNAVAILABLE"), on="lease_revoke")
    with pytest.raises(EtcdUnavailable):
        store.remove_node("b", keep)
    assert store.nodes() == [] and keep in etcd.server.leases  # gone at once; the lease lapses


def test_unreadable_node_entries_are_left_out_and_unusable_endpoints_dropped(etcd):
    store = etcd.store()
    entries = {
        "n1": b"{not json",
        "n2": orjson.dumps(["node", "x"]),
        "n3": orjson.dumps({"node": 7}),
        "n4": orjson.dumps({"endpoints": ["tcp://x:1"]}),
        "n5": orjson.dumps({"node": "e", "endpoints": "tcp://x:1"}),
        "n6": orjson.dumps({"node": "d", "endpoints": ["tcp://x:1", 3]}),
        "n7": orjson.dumps({"node": "c"}),
        "n8": orjson.dumps({"node": "b", "endpoints": ["tcp://b:1"], "region": 1}),
    }
    for name, value in entries.items():
        etcd.put(f"nodes/{name}", value)
    assert store.nodes() == [
        {"node": "b", "endpoints": ["tcp://b:1"], "region": 1},
        {"node": "c", "endpoints": []},
        {"node": "d", "endpoints": []},
        {"node": "e", "endpoints": []},
    ]
    assert etcd.value("nodes/n6") == entries["n6"]  # left as it was


def test_a_region_is_recorded_once_by_its_first_node_and_regions_are_listed_in_order(etcd):
    store = etcd.store()
    store.record_region(2, "first")
    store.record_region(2, "second")
    store.record_region(0, "other")
    etcd.put("regions/junk", {"first_node": "x"})
    etcd.put("regions/-", {"first_node": "x"})  # listed first
    etcd.put("regions/10", {"first_node": "x"})
    assert etcd.json("regions/2") == {"first_node": "first"}
    assert store.regions() == [0, 2, 10]
    assert etcd.server.kv[PREFIX + "regions/2"].lease == 0


def test_taken_counts_claims_of_this_region_only_and_ignores_stray_keys(etcd):
    here, there = etcd.store(), etcd.store(region=2)
    claim(there, preferred=0)
    etcd.put("workers/1/notanumber", {"holder": "x"})
    etcd.put("workers/1/!", {"holder": "x"})  # listed first
    etcd.put("workers/1/3", {"holder": "x"})
    assert here.taken() == {3} and there.taken() == {0}
    assert list(here.candidates()) == [0, 1, 2]


# -- configuration ------------------------------------------------------------------------------


def test_endpoints_are_parsed_into_host_port_and_tls(etcd):
    store = etcd.store(etcd=("http://127.0.0.1:2379", "https://etcd-1.example:2380"), etcd_ca="ca.pem")
    assert store.endpoints == [("127.0.0.1", 2379, False), ("etcd-1.example", 2380, True)]
    assert store.prefix == PREFIX and store.region == 1 and store.timeout_s == 1.0
    assert store.describe() == {
        "store": "etcd",
        "cluster": "unit",
        "endpoints": ["http://127.0.0.1:2379", "https://etcd-1.example:2380"],
    }


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:",
        "http://:2379",
        "http://h:0",
        "http://h:port",
        "http://h:99999",
        "https://h",
        "http://[::1:2379",
    ],
)
def test_an_endpoint_without_a_usable_host_and_port_is_a_config_error(url):
    with pytest.raises(ConfigError, match="must look like http://host:port"):
        EtcdStore(config(etcd=(url,), etcd_ca="ca.pem"))


def test_an_endpoint_of_another_scheme_is_a_config_error():
    with pytest.raises(ConfigError, match="must look like"):
        etcd_mod._parse_endpoint("grpc://h:2379")


def test_https_without_a_ca_is_a_config_error():
    with pytest.raises(ConfigError, match="need etcd_ca"):
        EtcdStore(config(etcd=("http://a:1", "https://b:2")))


def test_a_region_outside_the_layout_is_a_config_error(monkeypatch):
    cfg = config()
    object.__setattr__(cfg, "region", 4)  # two region bits: 0..3
    with pytest.raises(ConfigError, match="region must be 0..3"):
        EtcdStore(cfg)


def test_without_the_client_library_the_error_names_the_extra(monkeypatch):
    monkeypatch.setattr(etcd_mod, "CLIENT_MODULES", ("pyetcd", "snowfence_no_such_module", "no_such_pkg.sub", "."))
    with pytest.raises(ConfigError) as caught:
        EtcdStore(config())
    assert str(caught.value) == (
        "etcd mode needs the etcd client, which is not installed (no snowfence_no_such_module, no_such_pkg.sub, .): "
        "pip install 'snowfence[etcd]'"
    )
    monkeypatch.setattr(etcd_mod, "CLIENT_MODULES", ("pyetcd", "grpc"))
    etcd_mod.require_client()


class Recorded:
    """Stands in for a class of the client library: records how it was built."""

    def __init__(self, *args, **kwargs) -> None:
        self.args, self.kwargs = args, kwargs


def test_the_client_is_built_over_every_endpoint_with_the_deadline_and_credentials(monkeypatch, tmp_path):
    import sys

    import grpc

    library = sys.modules["pyetcd.client"]
    monkeypatch.setattr(library, "Endpoint", Recorded)
    monkeypatch.setattr(library, "MultiEndpointEtcd3Client", Recorded)
    monkeypatch.setattr(grpc, "ssl_channel_credentials", lambda *files: ("creds", *files))
    for name in ("ca", "key", "cert"):
        (tmp_path / name).write_bytes(name.encode())
    store = EtcdStore(
        config(
            etcd=("http://a:1", "https://b:2", "http://c:3"),
            etcd_ca=str(tmp_path / "ca"),
            etcd_key=str(tmp_path / "key"),
            etcd_cert=str(tmp_path / "cert"),
            etcd_user="u",
            etcd_password="p",
            etcd_timeout_s=0.75,
        )
    )
    client = store.client
    assert store.client is client  # built once
    assert client.kwargs.keys() == {"endpoints", "timeout", "user", "password", "failover"}
    assert (client.kwargs["timeout"], client.kwargs["user"], client.kwargs["password"]) == (0.75, "u", "p")
    assert client.kwargs["failover"] is True
    endpoints = sorted((e.args, e.kwargs) for e in client.kwargs["endpoints"])
    creds = ("creds", b"ca", b"key", b"cert")
    assert endpoints == [
        (("a", 1), {"secure": False, "creds": None, "time_retry": 0.5}),
        (("b", 2), {"secure": True, "creds": creds, "time_retry": 0.5}),
        (("c", 3), {"secure": False, "creds": None, "time_retry": 0.5}),
    ]
    plain = EtcdStore(config(etcd=("http://a:1",))).client
    assert plain.kwargs["user"] is None and plain.kwargs["password"] is None  # no authentication
    (host_port,) = [e.args for e in plain.kwargs["endpoints"]]
    assert host_port == ("a", 1)


def test_the_client_is_built_with_ca_only_tls(monkeypatch, tmp_path):
    import sys

    import grpc

    library = sys.modules["pyetcd.client"]
    monkeypatch.setattr(library, "Endpoint", Recorded)
    monkeypatch.setattr(library, "MultiEndpointEtcd3Client", Recorded)
    monkeypatch.setattr(grpc, "ssl_channel_credentials", lambda *files: ("creds", *files))
    (tmp_path / "ca").write_bytes(b"ca")
    client = EtcdStore(config(etcd=("https://b:2",), etcd_ca=str(tmp_path / "ca"))).client
    (endpoint,) = client.kwargs["endpoints"]
    assert endpoint.kwargs["creds"] == ("creds", b"ca", None, None)


def test_unreadable_tls_files_are_a_config_error(tmp_path):
    store = EtcdStore(config(etcd=("https://b:2",), etcd_ca=str(tmp_path / "missing-ca.pem")))
    with pytest.raises(ConfigError, match="cannot read etcd TLS files: .*missing-ca.pem"):
        store.taken()


def test_each_client_starts_with_the_members_in_a_random_order(monkeypatch):
    import sys

    library = sys.modules["pyetcd.client"]
    monkeypatch.setattr(library, "Endpoint", Recorded)
    monkeypatch.setattr(library, "MultiEndpointEtcd3Client", Recorded)
    store = EtcdStore(config(etcd=("http://a:1", "http://b:2", "http://c:3")))
    orders = {tuple(e.args[0] for e in store._build_client().kwargs["endpoints"]) for _ in range(40)}
    assert len(orders) > 1


LAYOUT_MAX_MS = config().layout.max_ms


def test_the_census_shows_unreadable_entries_as_such_and_changes_nothing(etcd):
    store = etcd.store()
    lease = claim(store, preferred=0, holder="a")
    lease.extend(NOW_MS)
    stray = {
        "marks/1/junk": {"reserved_until_ms": 5},
        "marks/x/1": {"reserved_until_ms": 5},
        "marks/2/1": b"{",
        "marks/2/2": {"reserved_until_ms": "soon"},
        "marks/2/3": [1, 2],
        "workers/2/3": b"not json",
        "workers/2/x": {"holder": "x"},
        "marks/3/0": {"token": 4},
        "workers/3/0": [1],
        "marks/4/1": {"reserved_until_ms": True},
        "marks/4/2": {"reserved_until_ms": 1.9},
        "marks/4/3": {"reserved_until_ms": -5},
        "marks/4/4": {"reserved_until_ms": 10**17},  # past the layout's last millisecond
        "marks/x/5/6": {"reserved_until_ms": 5},  # a path deeper than region/worker
        "workers/5/1_0": {"holder": "x"},
        "workers/5/+7": {"holder": "x"},
        "marks/6/0": {"reserved_until_ms": 0},  # the lowest a mark can be
        "marks/6/1": {"reserved_until_ms": LAYOUT_MAX_MS},  # and the highest
    }
    for key, value in stray.items():
        etcd.put(key, value)
    before = {k: v.value for k, v in etcd.server.kv.items()}
    census = store.census()
    assert [(e["region"], e["worker_id"], e["state"], e["mark_ms"]) for e in census] == [
        (1, 0, "held", NOW_MS),
        (2, 1, "unreadable", None),
        (2, 2, "unreadable", None),
        (2, 3, "held", None),
        (3, 0, "held", None),
        (4, 1, "unreadable", None),
        (4, 2, "unreadable", None),
        (4, 3, "unreadable", None),
        (4, 4, "unreadable", None),
        (6, 0, "retired", 0),
        (6, 1, "retired", LAYOUT_MAX_MS),
    ]
    held = [e for e in census if e["state"] == "held"]
    assert held[-2]["holder"] is None and held[-2]["token"] > 0 and held[-1]["holder"] is None
    assert {k: v.value for k, v in etcd.server.kv.items()} == before
    assert store._failures == 0  # etcd answered
