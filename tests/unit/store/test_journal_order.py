"""A restore is concluded only from evidence concurrency cannot produce.

A node's processes share one journal file, and each process has several threads
(the claim path, the keepers): a revision read from etcd can come back after
another process or thread recorded a later one. Only what the journal held
before the read was sent can be compared with what the read returns (etcd's
reads are linearizable: a read's revision is at least every revision committed
before it was sent). These tests interleave a read with a later note, as two
processes of one node (two Journal objects on one file) or a keeper and the
claim path of one process, and check that nothing is refused; and that a
revision below one known before the read was sent still is.
"""

from __future__ import annotations

import pytest
from etcdrig import NOW_MS, Etcd

from snowfence.errors import StoreWentBack
from snowfence.ids import DEFAULT_LAYOUT
from snowfence.store.genesis import Genesis
from snowfence.store.journal import Journal

CLUSTER_ID = 0x5EED


def node(tmp_path, marks_store_wide=True):
    """One process's journal of the node whose journal directory is ``tmp_path``."""
    return Journal(tmp_path, "etcd-unit", marks_store_wide=marks_store_wide)


def started(tmp_path):
    """Two processes of one node on one store, the first having seen revision 10."""
    genesis = Genesis.create(DEFAULT_LAYOUT, now_unix_ms=1, window_ms=100)
    first = node(tmp_path)
    first.check_genesis(genesis, cluster_id=CLUSTER_ID, revision=10)
    first.note_mark(0, 1, rev=10, ms=500, revision=10)
    second = node(tmp_path)
    second.check_genesis(genesis, cluster_id=CLUSTER_ID, revision=10)
    return genesis, first, second


# -- the journal ----------------------------------------------------------------------------


def test_a_revision_read_before_another_process_noted_a_later_one_is_not_a_restore(tmp_path):
    genesis, first, second = started(tmp_path)
    known = second.known()  # the read is sent ...
    first.note_mark(0, 1, rev=20, ms=900, revision=20)  # ... another process writes at 20 ...
    second.load()  # ... and it is merged in (any save does) before the read's answer is checked
    second.check_genesis(genesis, cluster_id=CLUSTER_ID, revision=15, known=known)
    assert second.problem is None
    # What the journal knows only grows: the next read is compared with 20.
    with pytest.raises(StoreWentBack, match="went back from 20 .* to 19"):
        second.check_genesis(genesis, cluster_id=CLUSTER_ID, revision=19, known=second.known())


def test_a_revision_below_one_known_before_the_read_was_sent_is_a_restore(tmp_path):
    genesis, first, second = started(tmp_path)
    first.note_mark(0, 1, rev=20, ms=900, revision=20)
    second.load()
    known = second.known()  # sent after 20 was known here: 15 can only be a restore
    with pytest.raises(StoreWentBack, match="went back from 20 .* to 15"):
        second.check_genesis(genesis, cluster_id=CLUSTER_ID, revision=15, known=known)
    # Sticky, and shared with the node's other processes.
    first.load()
    with pytest.raises(StoreWentBack):
        first.check_genesis(genesis, cluster_id=CLUSTER_ID, revision=30, known=first.known())


def test_a_thread_that_noted_a_later_revision_during_the_read_is_not_a_restore(tmp_path):
    genesis, first, _ = started(tmp_path)
    known = first.known()
    first.note_mark(0, 2, rev=25, ms=900, revision=25)  # a keeper of the same process
    first.check_genesis(genesis, cluster_id=CLUSTER_ID, revision=12, known=known)
    assert first.problem is None


def test_a_mark_read_before_another_process_wrote_it_again_is_not_a_restore(tmp_path):
    genesis, first, second = started(tmp_path)
    known = second.known()
    first.note_mark(0, 1, rev=20, ms=900, revision=20)
    second.load()
    second.check_genesis(genesis, cluster_id=CLUSTER_ID, revision=12, known=known)
    second.check_mark(0, 1, 10, 500, known=known)  # the mark as it was before the write
    assert second.problem is None and second.floor_ms(0, 1) == 900
    # Read again after the write was known: the older mark can only be a restore.
    with pytest.raises(StoreWentBack, match="mark of worker ID 1 .* went back"):
        second.check_mark(0, 1, 10, 500, known=second.known())


def test_a_mark_below_one_known_before_the_read_was_sent_is_a_restore(tmp_path):
    genesis, first, second = started(tmp_path)
    first.note_mark(0, 1, rev=20, ms=900, revision=20)
    second.load()
    known = second.known()
    second.check_genesis(genesis, cluster_id=CLUSTER_ID, revision=30, known=known)
    with pytest.raises(StoreWentBack, match="revision 15 at 700 ms, this node's journal saw revision 20"):
        second.check_mark(0, 1, 15, 700, known=known)


def test_a_mark_at_a_known_revision_with_another_millisecond_is_refused_in_any_order(tmp_path):
    # One revision holds one value: a mismatch is a restore (revisions reused), whenever it was seen.
    genesis, first, second = started(tmp_path)
    known = second.known()
    first.note_mark(0, 1, rev=20, ms=900, revision=20)
    second.load()
    second.check_genesis(genesis, cluster_id=CLUSTER_ID, revision=20, known=known)
    with pytest.raises(StoreWentBack, match="revision 20 at 800 ms"):
        second.check_mark(0, 1, 20, 800, known=known)


def test_a_layout_record_missing_from_a_read_sent_before_the_node_knew_the_store_is_no_restore(tmp_path):
    # A node's first processes start at once on a new store: one reads "no layout record"
    # while another creates it and records it in the journal.
    genesis = Genesis.create(DEFAULT_LAYOUT, now_unix_ms=1, window_ms=100)
    first, second = node(tmp_path), node(tmp_path)
    known = second.known()
    first.check_genesis(genesis, cluster_id=CLUSTER_ID, revision=3)
    second.load()
    assert second.has_history
    second.check_genesis(None, known=known)
    assert second.problem is None
    # Missing from a read sent after the node knew the store: it was deleted.
    with pytest.raises(StoreWentBack, match="layout record is gone"):
        second.check_genesis(None, known=second.known())


def test_a_file_stores_mark_compared_without_a_snapshot_is_compared_with_the_journal_as_it_is(tmp_path):
    # Embedded mode reads a mark under its worker ID's lock, after every write the journal
    # holds: no snapshot is needed, and a mark put back is passed over as before.
    from snowfence.errors import WorkerIdUnusable

    journal = node(tmp_path, marks_store_wide=False)
    journal.check_genesis(Genesis.create(DEFAULT_LAYOUT, now_unix_ms=1, window_ms=100))
    journal.note_mark(0, 3, rev=5, ms=900)
    with pytest.raises(WorkerIdUnusable, match="went back"):
        journal.check_mark(0, 3, 4, 800)


# -- the etcd store: a read interleaved with another process's (or thread's) write -------------


def etcd_node(etcd: Etcd, tmp_path):
    """One process of a node whose processes share the journal in ``tmp_path``."""
    store = etcd.store()
    store.journal = node(tmp_path)
    store._wall_ns = lambda: (NOW_MS + store.layout.epoch_ms) * 1_000_000
    return store


def after_the_next_read(store, then):
    """Run ``then`` after etcd answered ``store``'s next transaction, before its answer is used."""
    client = store.client
    send = client.transaction

    def transaction(*args, **kwargs):
        client.transaction = send
        answer = send(*args, **kwargs)
        then()
        return answer

    client.transaction = transaction


def test_a_region_read_that_another_process_wrote_past_is_not_a_restore(tmp_path):
    etcd = Etcd()
    a, b = etcd_node(etcd, tmp_path), etcd_node(etcd, tmp_path)
    held = a.claim(None, "a", NOW_MS, 1000)
    b.check_layout(b.layout)

    def other_process_writes():
        held.extend(NOW_MS + 5000)  # a later revision, in the journal file
        held.extend(NOW_MS + 6000)
        b.journal.load()  # merged into b by any save of b's (a keeper's)

    after_the_next_read(b, other_process_writes)
    assert held.worker_id in b.taken()
    assert b.journal.problem is None and a.journal.problem is None
    lease = b.claim(None, "b", NOW_MS, 100_000)
    assert lease is not None and lease.worker_id != held.worker_id


def test_a_starting_process_whose_layout_read_another_process_wrote_past_is_not_refused(tmp_path):
    etcd = Etcd()
    a, b = etcd_node(etcd, tmp_path), etcd_node(etcd, tmp_path)
    held = a.claim(None, "a", NOW_MS, 1000)

    def other_process_writes():
        held.extend(NOW_MS + 5000)
        b.journal.load()

    after_the_next_read(b, other_process_writes)
    b.check_layout(b.layout)
    assert b.journal.problem is None


def test_a_region_read_that_a_keeper_of_the_same_process_wrote_past_is_not_a_restore(tmp_path):
    etcd = Etcd()
    a = etcd_node(etcd, tmp_path)
    held = a.claim(None, "a", NOW_MS, 1000)
    after_the_next_read(a, lambda: (held.extend(NOW_MS + 5000), held.extend(NOW_MS + 6000)))
    a.taken()
    assert a.journal.problem is None
    assert a.claim(None, "a", NOW_MS, 100_000) is not None


def test_a_claims_genesis_reread_that_a_keeper_wrote_past_is_not_a_restore(tmp_path):
    # A claim whose transaction failed only because the genesis moved (another worker ID's
    # first use) adopts the genesis its failure branch read: compared as of before it was sent.
    etcd = Etcd()
    a = etcd_node(etcd, tmp_path)
    a.genesis = None
    etcd.put("layout", Genesis.create(a.layout, now_unix_ms=1, window_ms=5_000).to_dict())
    held = a.claim(0, "a", NOW_MS, 1000)
    other = etcd_node(etcd, tmp_path)
    a.taken()

    def meanwhile(_kind):
        a.client.before = None
        other.claim(2, "other", NOW_MS, 100_000)  # moves the genesis: worker ID 2's first use

    a.client.before = meanwhile
    after_the_next_read(a, lambda: (held.extend(NOW_MS + 5000), held.extend(NOW_MS + 6000)))
    a._claim_lease = a._grant()
    a.try_claim(1, "a", None, NOW_MS)
    assert a.journal.problem is None


def test_an_etcd_restored_under_a_node_is_still_refused(tmp_path):
    etcd = Etcd()
    a = etcd_node(etcd, tmp_path)
    snap = etcd.server.snapshot()
    held = a.claim(None, "a", NOW_MS, 1000)
    held.extend(NOW_MS + 5000)
    etcd.server.restore(snap)
    b = etcd_node(etcd, tmp_path)  # another process of the node, started after
    with pytest.raises(StoreWentBack, match="restored from an older snapshot"):
        b.claim(None, "b", NOW_MS, 100_000)
    with pytest.raises(StoreWentBack):
        a.claim(None, "a", NOW_MS, 100_000)
