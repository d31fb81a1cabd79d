"""Guards against a store that forgets or goes back, each tripped here on its own: with the
guard removed, what it refuses would be taken (each was seen to pass unnoticed by every
other unit test before)."""

from __future__ import annotations

import orjson
import pytest
from etcdrig import Etcd, claim
from test_witnesses import NOW_MS, embedded_store

from snowfence.errors import LayoutMismatch, StoreWentBack
from snowfence.ids import Layout
from snowfence.store.files import FileStore
from snowfence.store.genesis import Genesis
from snowfence.store.journal import Journal


def mark_path(state, worker_id: int):
    return state / "regions" / "0" / f"worker-{worker_id}.mark"


def test_an_older_mark_file_put_back_is_passed_over_at_claim_by_the_journal_that_saw_a_newer_one(tmp_path):
    # The journal's check of an embedded mark at claim time: a copy of the mark from before
    # the last write (a backup put back) has a revision below the one this node's journal saw.
    state = tmp_path / "state"
    s = embedded_store(state, tmp_path / "j")
    lease = s.claim(0, "a", NOW_MS, 1000)
    assert lease.worker_id == 0
    older = mark_path(state, 0).read_bytes()
    lease.extend(lease.reserved_until_ms + 5_000)  # a newer mark, at a higher revision
    lease.release(lease.reserved_until_ms)
    newer = mark_path(state, 0).read_bytes()
    mark_path(state, 0).write_bytes(older)
    again = s.claim(0, "b", NOW_MS, 1000)
    assert again is None or again.worker_id != 0
    assert "went back" in s.passed_over[0]
    assert mark_path(state, 0).read_bytes() == older  # nothing written over the evidence
    mark_path(state, 0).write_bytes(newer)


def test_a_state_directory_of_another_layout_is_refused_by_name_and_left_as_it_is(tmp_path):
    state = tmp_path / "state"
    embedded_store(state, tmp_path / "j").check_layout(embedded_store(state, tmp_path / "j").layout)
    before = (state / "layout.json").read_bytes()
    other = Layout(worker_bits=3, sequence_bits=16)
    s = embedded_store(state, tmp_path / "j2")
    with pytest.raises(LayoutMismatch, match="was created for layout"):
        s.check_layout(other)
    assert (state / "layout.json").read_bytes() == before


# -- a record or a mark of another layout ---------------------------------------------------
# IDs of two layouts can be the same 64 bits: a layout record that names another layout,
# or a mark written under one, is never read as this store's.

OTHER = Layout(time_bits=41, region_bits=3, worker_bits=6, sequence_bits=13)


def other_genesis() -> dict:
    return Genesis.create(OTHER, now_unix_ms=1_700_000_000_000, window_ms=5000).to_dict()


def relayout(record: dict) -> dict:
    """The same record (the same store) edited by hand to name another layout."""
    bits = {"worker_bits": 6, "sequence_bits": 13, "shard_bits": 0}
    return {**record, **bits, "time_bits": 63 - record["region_bits"] - 6 - 13}


def test_etcd_a_layout_record_replaced_by_another_layouts_under_a_live_node_is_refused_at_its_next_claim():
    etcd = Etcd()
    store = etcd.store()
    first = claim(store, preferred=0, holder="a")
    assert first is not None
    etcd.put("layout", relayout(etcd.json("layout")))
    with pytest.raises(StoreWentBack, match="now names another layout"):
        claim(store, preferred=1, holder="b")
    assert etcd.claimed() == {0}


def test_etcd_a_mark_written_under_another_layout_is_passed_over():
    etcd = Etcd()
    etcd.put("marks/1/0", {"reserved_until_ms": 1, "layout": OTHER.digest()})
    store = etcd.store()
    got = claim(store, preferred=0)
    assert got is not None and got.worker_id != 0
    assert "written under another layout" in store.passed_over[0]
    assert etcd.json("marks/1/0")["layout"] == OTHER.digest()  # left as it was


def test_etcd_accept_restore_refuses_a_record_or_a_mark_of_another_layout_and_writes_nothing():
    etcd = Etcd()
    etcd.put("layout", other := other_genesis())
    with pytest.raises(LayoutMismatch, match="records layout"):
        etcd.store().accept_restore("restored")
    assert etcd.json("layout") == other
    etcd2 = Etcd()
    etcd2.put("marks/1/2", {"reserved_until_ms": 1, "layout": OTHER.digest()})
    before = etcd2.json("layout")
    with pytest.raises(LayoutMismatch, match="was written under another layout"):
        etcd2.store().accept_restore("restored")
    assert etcd2.json("layout") == before


def foreign_mark(tmp_path, worker_id: int) -> bytes:
    """A mark file as a store of another layout writes it."""
    other = FileStore(tmp_path / "other", OTHER, 0, window_ms=5000, journal=Journal(tmp_path / "jo", "embedded"))
    lease = other.claim(worker_id, "x", NOW_MS, 1000)
    assert lease.worker_id == worker_id
    data = mark_path(tmp_path / "other", worker_id).read_bytes()
    lease.abandon()
    return data


def test_embedded_a_mark_written_under_another_layout_is_passed_over(tmp_path):
    state = tmp_path / "state"
    s = embedded_store(state, tmp_path / "j")
    s.check_layout(s.layout)
    mark_path(state, 1).parent.mkdir(parents=True, exist_ok=True)
    mark_path(state, 1).write_bytes(foreign := foreign_mark(tmp_path, 1))
    got = s.claim(1, "a", NOW_MS, 1000)
    assert got is not None and got.worker_id != 1
    assert "written under another layout" in s.passed_over[1]
    assert mark_path(state, 1).read_bytes() == foreign


def test_embedded_a_layout_record_replaced_by_another_layouts_under_a_live_node_is_refused(tmp_path):
    state = tmp_path / "state"
    s = embedded_store(state, tmp_path / "j")
    assert s.claim(0, "a", NOW_MS, 1000) is not None
    (state / "layout.json").write_bytes(orjson.dumps(relayout(orjson.loads((state / "layout.json").read_bytes()))))
    with pytest.raises(StoreWentBack, match="now names another layout"):
        s.claim(None, "b", NOW_MS, 1000)


def test_embedded_accept_restore_refuses_a_record_or_a_mark_of_another_layout_and_writes_nothing(tmp_path):
    state = tmp_path / "state"
    s = embedded_store(state, tmp_path / "j")
    s.check_layout(s.layout)
    (state / "layout.json").write_bytes(orjson.dumps(other_genesis()))
    with pytest.raises(LayoutMismatch, match="records layout"):
        embedded_store(state, tmp_path / "j2").accept_restore("wiped")
    assert orjson.loads((state / "layout.json").read_bytes())["time_bits"] == OTHER.time_bits
    fresh = tmp_path / "fresh"
    mark_path(fresh, 2).parent.mkdir(parents=True)
    mark_path(fresh, 2).write_bytes(foreign_mark(tmp_path, 2))
    with pytest.raises(LayoutMismatch, match="written under another layout"):
        embedded_store(fresh, tmp_path / "j3").accept_restore("wiped")
    assert not (fresh / "layout.json").exists()


def test_etcd_an_older_releases_layout_record_upgraded_keeps_every_worker_id_with_a_mark_as_used():
    # Upgrading a layout record with no genesis fields records every worker ID that has a
    # mark as used: if that mark is deleted later, its worker ID is of unknown state and
    # waits out the quarantine, not taken for never used.
    etcd = Etcd()
    old = {k: v for k, v in etcd.json("layout").items() if k in LAYOUT_FIELDS}
    etcd.put("layout", old)
    etcd.put("marks/1/2", {"reserved_until_ms": NOW_MS + 1_000})
    store = etcd.store()
    store.check_layout(store.layout)
    assert store.genesis.is_used(1, 2) and not store.genesis.is_used(1, 1)
    etcd.delete("marks/1/2")
    got = {lease.worker_id: lease for lease in (claim(store, holder=f"h{i}") for i in range(4))}
    assert got[2].claimed_mark_ms >= NOW_MS + store.quarantine_ms()
    assert got[1].claimed_mark_ms < NOW_MS + store.quarantine_ms()


LAYOUT_FIELDS = ("epoch_ms", "time_bits", "region_bits", "worker_bits", "sequence_bits", "shard_bits")
