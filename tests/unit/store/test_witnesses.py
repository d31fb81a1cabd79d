"""The witnesses outside the store: the node's journal, and the genesis record beside it.

An in-memory etcd on a fake clock, and embedded stores in a temporary directory: each
test makes the store forget or go back and checks what a claim does next.
"""

from __future__ import annotations

import time

import orjson
import pytest
from etcdrig import PREFIX, Etcd

from snowfence.errors import StateDirError, StoreWentBack, WorkerIdUnusable
from snowfence.ids import DEFAULT_LAYOUT
from snowfence.store.files import FileStore
from snowfence.store.genesis import Genesis
from snowfence.store.journal import Journal

NOW_MS = 1_000_000


def etcd_store(etcd: Etcd, tmp_path, name: str = "n1"):
    journal = Journal(tmp_path / name, "etcd-unit", marks_store_wide=True)
    store = etcd.store()
    store.journal = journal
    store._wall_ns = lambda: (NOW_MS + store.layout.epoch_ms) * 1_000_000
    return store


def test_journal_roundtrip_keeps_the_peak_and_refuses_a_mark_gone_back(tmp_path):
    j = Journal(tmp_path, "embedded")
    g = Genesis.create(DEFAULT_LAYOUT, now_unix_ms=1, window_ms=100)
    j.check_genesis(g)
    j.note_mark(0, 3, rev=5, ms=900)
    j.save_if_changed()
    again = Journal(tmp_path, "embedded")
    again.check_genesis(g)
    assert again.floor_ms(0, 3) == 900
    # A later mark set lower (a release elsewhere) never lowers the floor.
    again.check_mark(0, 3, 6, 400)
    assert again.floor_ms(0, 3) == 900
    # An older revision is a copy put back: per worker ID for a file store.
    with pytest.raises(WorkerIdUnusable, match="went back"):
        again.check_mark(0, 3, 4, 800)


def test_a_damaged_journal_is_a_problem_and_is_never_overwritten(tmp_path):
    j = Journal(tmp_path, "embedded")
    j.check_genesis(Genesis.create(DEFAULT_LAYOUT, now_unix_ms=1, window_ms=100))
    j.note_mark(0, 1, rev=1, ms=10)
    path = tmp_path / "embedded.json"
    path.write_bytes(b"{not json")
    damaged = Journal(tmp_path, "embedded")
    assert damaged.problem
    with pytest.raises(StoreWentBack):
        damaged.check_genesis(Genesis.create(DEFAULT_LAYOUT, now_unix_ms=1, window_ms=100))
    assert path.read_bytes() == b"{not json"


def test_etcd_prefix_deleted_is_refused_by_a_node_that_saw_it_until_a_restore_is_accepted(tmp_path):
    etcd = Etcd()
    a = etcd_store(etcd, tmp_path)
    lease = a.claim(None, "a", NOW_MS, 1000)
    assert lease is not None
    lease.extend(NOW_MS + 5000)
    assert etcd.server.delete_prefix(PREFIX) > 0
    with pytest.raises(StoreWentBack, match="layout record"):
        a.claim(None, "a", NOW_MS, 1000)
    assert a.journal.problem and "accept-restore" in a.journal.problem
    # A node of the same cluster that never saw the store cannot tell; the operator can.
    admin = etcd.store()
    admin._wall_ns = a._wall_ns
    genesis = admin.accept_restore("deleted by hand")
    assert genesis.restore is not None and genesis.restore.reason == "deleted by hand"
    assert orjson.loads(etcd.value("layout"))["restore"]["id"] == genesis.restore.id
    again = a.claim(None, "a", NOW_MS, 100_000)
    assert a.journal.problem is None
    # The claim takes the journal's floor: everything the lost mark had reserved.
    assert again is not None and again.reserved_until_ms >= NOW_MS + 5000


def test_etcd_restore_with_bumped_revisions_still_takes_the_journals_floor(tmp_path):
    etcd = Etcd()
    a = etcd_store(etcd, tmp_path)
    lease = a.claim(None, "a", NOW_MS, 1000)
    wid = lease.worker_id
    lease.release(NOW_MS + 10)
    snap = etcd.server.snapshot()  # the mark at NOW_MS + 10, no claim
    lease = a.claim(wid, "a", NOW_MS, 1000)
    lease.extend(NOW_MS + 9000)
    lease.release(NOW_MS + 8000)
    etcd.server.restore(snap, bump=1000)
    b = etcd_store(etcd, tmp_path, "n1")  # the same node, restarted
    with pytest.raises(StoreWentBack):
        b.claim(wid, "a", NOW_MS, 100_000)
    admin = etcd.store()
    admin._wall_ns = a._wall_ns
    admin.accept_restore("restored on purpose")
    c = etcd_store(etcd, tmp_path, "n1")
    got = c.claim(wid, "a", NOW_MS, 100_000)
    assert got is not None and got.worker_id == wid and got.reserved_until_ms >= NOW_MS + 8000


def test_embedded_wipe_is_refused_by_the_journal_kept_elsewhere(tmp_path):
    state, journal_dir = tmp_path / "state", tmp_path / "journal"
    s = FileStore(state, DEFAULT_LAYOUT, 0, window_ms=1000, journal=Journal(journal_dir, "embedded"))
    lease = s.claim(None, "a", NOW_MS, 1000)
    assert lease is not None
    lease.release(NOW_MS + 10)
    for entry in sorted(state.rglob("*"), reverse=True):
        entry.rmdir() if entry.is_dir() else entry.unlink()
    t = FileStore(state, DEFAULT_LAYOUT, 0, window_ms=1000, journal=Journal(journal_dir, "embedded"))
    with pytest.raises(StoreWentBack, match="accept-restore"):
        t.claim(None, "a", NOW_MS, 1000)


def test_embedded_layout_missing_beside_marks_refuses_to_start(tmp_path):
    state = tmp_path / "state"
    s = FileStore(state, DEFAULT_LAYOUT, 0, window_ms=1000, journal=Journal(tmp_path / "j1", "embedded"))
    s.claim(None, "a", NOW_MS, 1000).release(NOW_MS + 10)
    (state / "layout.json").unlink()
    t = FileStore(state, DEFAULT_LAYOUT, 0, window_ms=1000, journal=Journal(tmp_path / "j2", "embedded"))
    with pytest.raises(StateDirError, match="mark files remain"):
        t.check_layout(DEFAULT_LAYOUT)


def test_an_older_release_refuses_a_genesis_record_and_a_new_one_upgrades_a_layout_record():
    from snowfence.errors import ConfigError
    from snowfence.ids import Layout

    genesis = Genesis.create(DEFAULT_LAYOUT, now_unix_ms=1, window_ms=100)
    # An older release reads the record with Layout.from_dict (unchanged since): it
    # refuses the fields it does not know, so it will not start on an upgraded store.
    with pytest.raises(ConfigError, match="unknown layout fields"):
        Layout.from_dict(genesis.to_dict())
    # An older release's record reads as a store that needs its genesis written.
    old = Genesis.from_dict(DEFAULT_LAYOUT.to_dict())
    assert old.layout == DEFAULT_LAYOUT and not old.upgraded
    assert Genesis.from_dict(orjson.loads(orjson.dumps(genesis.to_dict()))) == genesis


def embedded_store(state, journal_dir, now_ms: int = NOW_MS, **kw) -> FileStore:
    wall_ns = lambda: (now_ms + DEFAULT_LAYOUT.epoch_ms) * 1_000_000  # noqa: E731
    return FileStore(
        state, DEFAULT_LAYOUT, 0, window_ms=5000, journal=Journal(journal_dir, "embedded"), wall_ns=wall_ns, **kw
    )


def test_a_new_embedded_store_mints_nothing_a_holder_it_cannot_see_may_have_minted_to(tmp_path):
    # A state directory made again under a live node (or wiped under a killed hlc one): the
    # store looks new, and only the bounds every node keeps to say how far the old one got:
    # its reservation window (the store's longest) above the clock, and no less than the
    # logical clock's run-ahead.
    s = embedded_store(tmp_path / "state", tmp_path / "j1", max_ahead_ms=1500)
    lease = s.claim(None, "a", NOW_MS, 1000)
    assert lease.claimed_mark_ms >= NOW_MS + 5000
    assert s.genesis.quarantine_until_ms == NOW_MS + 5000
    # Every claim of the new store waits it out, a second worker ID too.
    assert s.claim(None, "a", NOW_MS, 1000).claimed_mark_ms >= NOW_MS + 5000
    # A node started later on it takes the recorded quarantine, and does not wait again.
    later = embedded_store(tmp_path / "state", tmp_path / "j2", now_ms=NOW_MS + 60_000)
    assert later.claim(None, "b", NOW_MS + 60_000, 1000).claimed_mark_ms == NOW_MS + 5000
    # A run-ahead longer than the window is the bound then.
    t = embedded_store(tmp_path / "other", tmp_path / "j3", max_ahead_ms=7000)
    assert t.claim(None, "c", NOW_MS, 1000).claimed_mark_ms >= NOW_MS + 7000


def test_a_wait_policy_node_takes_the_logical_clocks_bound_for_a_new_store_too(tmp_path):
    from snowfence.config import Config
    from snowfence.store import open_store

    base = {"state_dir": str(tmp_path / "state"), "bind": "tcp://127.0.0.1:5999"}
    config = Config(**base, clock_policy="wait", max_ahead_ms=1500)
    store = open_store(config)
    now_ms = time.time_ns() // 1_000_000 - config.layout.epoch_ms
    # It mints only at its wall clock, but the other nodes of its directory may run hlc.
    assert store.claim(None, "w", now_ms, 1000).claimed_mark_ms >= now_ms + 1500


def test_accept_restore_of_a_store_whose_record_is_gone_waits_out_the_run_ahead_bound(tmp_path):
    s = embedded_store(tmp_path / "state", tmp_path / "j1", max_ahead_ms=4900)
    s.window_ms = 100  # a node with a short window of its own (as the operator's flags may say)
    genesis = s.accept_restore("wiped")
    assert genesis.quarantine_until_ms >= NOW_MS + 4900


def test_an_embedded_worker_id_of_unknown_state_waits_out_the_longest_window_any_node_may_use(tmp_path):
    from snowfence.config import Config
    from snowfence.store import open_store

    config = Config(
        state_dir=str(tmp_path / "state"),
        reservation_window_s=3.0,
        keepalive_interval_s=1.0,
        max_reservation_window_s=8.0,
        max_ahead_ms=500,
    )
    store = open_store(config)
    # A node of this directory with an 8 s window may have reserved that far ahead.
    assert store.quarantine_ms() >= 8000
