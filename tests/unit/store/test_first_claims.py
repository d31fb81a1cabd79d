"""First claims on etcd: each worker ID's first use is recorded in a key of its own.

A fleet's cold start is every holder claiming at once; when each first claim rewrote
the genesis record, they all contended for that one key (and a claimer that read the
record again saw first uses its read of the marks had not: worker IDs "used, but with
no mark", logged and passed over as unknown). Here the genesis is left alone, and a
first use still makes a mark deleted later cost a quarantine.
"""

from __future__ import annotations

import logging

import orjson
import pytest
from etcdrig import NOW_MS, PREFIX, Etcd, claim

from snowfence.errors import ConfigError, LayoutMismatch
from snowfence.store.genesis import Genesis


def genesis_revision(etcd: Etcd) -> int:
    etcd.server.expire()
    return etcd.server.kv[PREFIX + "layout"].mod_revision


def test_first_claims_record_their_use_in_keys_of_their_own_and_leave_the_genesis_alone():
    etcd = Etcd()
    first = claim(etcd.store(), holder="a")  # the store's record is upgraded once, here
    assert etcd.json("layout")["used_keys"] is True
    before = genesis_revision(etcd)
    others = [claim(etcd.store(), holder=f"h{i}") for i in range(3)]
    assert {lease.worker_id for lease in [first, *others]} == {0, 1, 2, 3}
    assert genesis_revision(etcd) == before
    for worker_id in range(4):
        assert etcd.json(f"used/1/{worker_id}")["holder"] in {"a", "h0", "h1", "h2"}


def test_a_mark_deleted_after_its_worker_ids_first_claim_costs_the_next_claim_a_quarantine():
    etcd = Etcd()
    store = etcd.store()
    lease = claim(store, 0, holder="a")
    assert lease.worker_id == 0
    lease.release(NOW_MS)
    etcd.delete("marks/1/0")  # by hand: nothing says what it held
    held = [claim(etcd.store(), w, holder=f"h{w}") for w in (1, 2, 3)]  # 0 is the one left
    assert sorted(lease.worker_id for lease in held) == [1, 2, 3]
    again = etcd.store()
    got = claim(again, 0, holder="b")
    assert got.worker_id == 0
    assert got.claimed_mark_ms >= NOW_MS + again.quarantine_ms()


def test_a_claimer_whose_read_predates_others_first_claims_passes_them_over_without_calling_them_unknown(caplog):
    etcd = Etcd()
    claim(etcd.store(), 3, holder="z").release(NOW_MS)  # the record is upgraded; 3 is used, and free
    late = etcd.store()
    others = [etcd.store(), etcd.store()]
    read = late.taken

    def read_then_others_claim():
        taken = read()
        for i, other in enumerate(others):  # after late's read: first uses it cannot see
            assert claim(other, i, holder=f"o{i}").worker_id == i
        return taken

    late.taken = read_then_others_claim
    with caplog.at_level(logging.INFO, logger="snowfence"):
        got = claim(late, holder="late")
    assert got.worker_id == 2
    assert got.claimed_mark_ms < NOW_MS + late.quarantine_ms()  # 2 was never used: no quarantine
    assert "worker_id_unknown" not in caplog.text and "but it was used" not in caplog.text


def test_a_store_whose_layout_record_is_gone_while_used_keys_remain_is_not_taken_for_new():
    etcd = Etcd()
    claim(etcd.store(), 0, holder="a").release(NOW_MS)
    for key in ("layout", "marks/1/0"):
        etcd.delete(key)
    fresh = etcd.store()
    with pytest.raises(LayoutMismatch, match="used remain"):
        fresh.check_layout(fresh.layout)
    assert etcd.value("layout") is None


def test_the_genesis_field_reads_back_and_anything_but_true_is_refused():
    etcd = Etcd()
    claim(etcd.store(), holder="a")
    doc = etcd.json("layout")
    assert Genesis.from_dict(doc).used_keys is True
    assert Genesis.from_dict({k: v for k, v in doc.items() if k != "used_keys"}).used_keys is False
    for bad in (False, "yes", 1, None):
        with pytest.raises(ConfigError, match="used_keys"):
            Genesis.from_dict({**doc, "used_keys": bad})
    assert orjson.loads(orjson.dumps(Genesis.from_dict(doc).to_dict())) == doc


def test_a_worker_id_another_worker_of_the_node_claimed_after_this_ones_read_is_not_called_unknown(tmp_path, caplog):
    # The workers of a node share its journal: a claim noted there after this worker's read
    # of the region is newer than the read, not a mark gone missing.
    from etcdrig import config

    from snowfence.store.etcd import EtcdStore
    from snowfence.store.journal import Journal

    etcd = Etcd()
    claim(etcd.store(), 3, holder="z").release(NOW_MS)  # upgrade the record; 3 is used and free
    journal = Journal(tmp_path / "journal.json", "etcd-unit", marks_store_wide=True)

    def worker() -> EtcdStore:
        store = EtcdStore(config(), mono_ns=etcd.clock.mono_ns, journal=journal)
        store.connection._build_client = lambda: etcd._client(("127.0.0.1:2379",))
        return store

    late, other = worker(), worker()
    read = late.taken

    def read_then_the_other_worker_claims():
        taken = read()
        assert claim(other, 0, holder="other").worker_id == 0
        return taken

    late.taken = read_then_the_other_worker_claims
    with caplog.at_level(logging.INFO, logger="snowfence"):
        got = claim(late, holder="late")
    assert got.worker_id == 1 and got.claimed_mark_ms < NOW_MS + late.quarantine_ms()
    assert "but it was used" not in caplog.text
