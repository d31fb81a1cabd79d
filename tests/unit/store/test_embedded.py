"""Embedded leases: real file locks across real processes, durable marks."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import orjson
import pytest
from filerig import file_store

from snowfence.errors import LayoutMismatch, StateDirError
from snowfence.ids import DEFAULT_LAYOUT, Layout

HOLDER = "test"


def at_epoch(layout) -> dict:
    """A store whose clock reads its layout's epoch and whose nodes never mint or reserve
    ahead of it (so a new one waits nothing out): its first marks are at 0, and these tests
    count milliseconds from there."""
    return {"max_ahead_ms": 0, "window_ms": 0, "wall_ns": lambda: layout.epoch_ms * 1_000_000}


def store(tmp_path, region=0, layout=DEFAULT_LAYOUT):
    s = file_store(tmp_path, layout, region, **at_epoch(layout))
    s.check_layout(layout)
    return s


def hold_in_child(tmp_path, worker_id):
    """A separate process that claims ``worker_id`` and holds it until killed."""
    code = textwrap.dedent(f"""
        import sys, time
        from snowfence.ids import DEFAULT_LAYOUT
        from snowfence.store.files import FileStore
        from snowfence.store.journal import Journal
        s = FileStore({str(tmp_path)!r}, DEFAULT_LAYOUT, 0, journal=Journal({str(tmp_path / "journal")!r}, "embedded"))
        lease = s.try_claim({worker_id}, "child", None)
        assert lease is not None
        lease.extend(lease.reserved_until_ms + 123456)
        print("held", flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_worker_id_is_held_by_one_process_only_and_freed_when_it_dies(tmp_path):
    s = store(tmp_path)
    child = hold_in_child(tmp_path, 0)
    try:
        assert s.try_claim(0, HOLDER, None) is None
        lease = s.claim(preferred=0, holder=HOLDER, now_ms=0, max_ahead_ms=0)
        assert lease.worker_id == 1  # the preferred one is taken, so the next free one
        lease.release(0)
    finally:
        child.kill()
        child.wait()
    lease = s.try_claim(0, HOLDER, None)  # the kernel dropped the dead process's lock
    assert lease is not None
    assert lease.claimed_mark_ms == 123456  # and its mark is what the new owner starts after
    assert lease.token == 2
    lease.release(lease.claimed_mark_ms)


def test_claims_within_one_process_are_exclusive_too(tmp_path):
    s = store(tmp_path)
    a = s.try_claim(3, HOLDER, None)
    assert a is not None and s.try_claim(3, HOLDER, None) is None
    a.release(0)
    assert s.try_claim(3, HOLDER, None) is not None


def test_mark_is_durable_and_release_lowers_it_to_the_last_used_ms(tmp_path):
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    lease.extend(5_000)
    assert s.read_mark(0) == (5_000, lease.token)
    lease.release(1_234)
    assert s.read_mark(0) == (1_234, lease.token)
    assert lease.released
    again = s.try_claim(0, HOLDER, None)
    assert again.claimed_mark_ms == 1_234 and again.token == lease.token + 1


def test_release_never_lowers_below_the_mark_it_started_from(tmp_path):
    s = store(tmp_path)
    first = s.try_claim(0, HOLDER, None)
    first.extend(9_000)
    first.abandon()  # a crash: the mark stays at 9000
    second = s.try_claim(0, HOLDER, None)
    assert second.claimed_mark_ms == 9_000
    second.release(0)  # it never minted
    assert s.read_mark(0)[0] == 9_000


def test_all_worker_ids_taken_gives_none(tmp_path):
    layout = Layout(time_bits=41, region_bits=3, worker_bits=1, sequence_bits=18)
    s = store(tmp_path, layout=layout)
    a = s.claim(None, HOLDER, 0, 0)
    b = s.claim(None, HOLDER, 0, 0)
    assert {a.worker_id, b.worker_id} == {0, 1}
    assert s.claim(None, HOLDER, 0, 0) is None


def test_regions_have_separate_worker_ids(tmp_path):
    a = store(tmp_path, region=0).try_claim(0, HOLDER, None)
    b = store(tmp_path, region=1).try_claim(0, HOLDER, None)
    assert a is not None and b is not None


def test_foreign_layout_is_refused(tmp_path):
    store(tmp_path)
    other = Layout(time_bits=41, region_bits=2, worker_bits=8, sequence_bits=12)
    with pytest.raises(LayoutMismatch) as info:
        file_store(tmp_path, other, 0).check_layout(other)
    assert "region" in str(info.value) and "will not start" in str(info.value)
    other_epoch = Layout(epoch_ms=0)
    with pytest.raises(LayoutMismatch):
        file_store(tmp_path, other_epoch, 0).check_layout(other_epoch)


def test_unreadable_mark_refuses_rather_than_guesses(tmp_path):
    s = store(tmp_path)
    (tmp_path / "regions" / "0" / "worker-0.mark").write_text("{not json")
    with pytest.raises(StateDirError):
        s.try_claim(0, HOLDER, None)
    # The lock was not leaked: a leaked one would make this a quiet None.
    with pytest.raises(StateDirError):
        s.try_claim(0, HOLDER, None)
    # Claiming passes over the unreadable worker ID instead of using or failing on it.
    lease = s.claim(preferred=0, holder=HOLDER, now_ms=0, max_ahead_ms=0)
    assert lease is not None and lease.worker_id == 1


def test_unusable_state_dir_is_a_named_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StateDirError):
        file_store(blocker / "state", DEFAULT_LAYOUT, 0)


def test_mark_file_is_replaced_atomically(tmp_path):
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    for ms in range(1, 20):
        lease.extend(ms * 100)
        data = orjson.loads((tmp_path / "regions" / "0" / "worker-0.mark").read_bytes())
        assert data["reserved_until_ms"] == ms * 100
    leftovers = [p.name for p in (tmp_path / "regions" / "0").iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
