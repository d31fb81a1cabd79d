"""What every store shares: the order in which a claim tries worker IDs, the
preference file a restart reads, and the lease handle's defaults."""

from __future__ import annotations

import logging

import pytest

from snowfence.errors import StateDirError
from snowfence.store.base import Lease, Store
from snowfence.store.preference import PreferenceFile


class MapStore(Store):
    """Worker IDs with marks in a dict; records every try, in order."""

    genesis = "a store that knows itself"  # claims need no check_layout first

    def __init__(self, marks: dict[int, int], taken=(), broken=(), skips_far_marks=False) -> None:
        self.marks = marks
        self.taken = set(taken)
        self.broken = set(broken)
        self.skips_far_marks = skips_far_marks
        self.tries: list[tuple[int, int | None]] = []
        self.holders: list[str] = []

    def candidates(self):
        return iter(sorted(self.marks))

    def try_claim(self, worker_id, holder, max_mark_ms, now_ms=None):
        self.tries.append((worker_id, max_mark_ms))
        self.holders.append(holder)
        if worker_id in self.broken:
            raise StateDirError(f"mark of worker ID {worker_id} is unreadable")
        if worker_id in self.taken:
            return None
        if max_mark_ms is not None and self.marks[worker_id] > max_mark_ms:
            return None
        self.taken.add(worker_id)
        return Lease(0, worker_id, token=1, mark_ms=self.marks[worker_id])


def test_claim_tries_the_preferred_worker_id_first():
    s = MapStore({0: 0, 1: 0, 2: 0, 3: 0})
    lease = s.claim(preferred=2, holder="node-a/slot-0", now_ms=100, max_ahead_ms=10)
    assert lease.worker_id == 2 and s.tries == [(2, None)]
    assert s.holders == ["node-a/slot-0"]  # the store records who holds it


def test_claim_falls_back_in_candidate_order_when_the_preferred_one_is_taken():
    s = MapStore({0: 0, 1: 0, 2: 0, 3: 0}, taken={2, 0})
    lease = s.claim(preferred=2, holder="h", now_ms=100, max_ahead_ms=10)
    assert lease.worker_id == 1 and s.tries == [(2, None), (0, None), (1, None)]


def test_a_preference_outside_the_candidates_is_ignored():
    s = MapStore({0: 0, 1: 0}, taken={0})
    lease = s.claim(preferred=99, holder="h", now_ms=100, max_ahead_ms=10)
    assert lease.worker_id == 1 and s.tries == [(0, None), (1, None)]


def test_nothing_free_gives_none_after_trying_each_once():
    s = MapStore({0: 0, 1: 0}, taken={0, 1})
    assert s.claim(None, "h", 100, 10) is None
    assert s.tries == [(0, None), (1, None)]


def test_an_unreadable_worker_id_is_passed_over_with_a_warning(caplog):
    s = MapStore({0: 0, 1: 0, 2: 0}, broken={0, 1})
    with caplog.at_level(logging.WARNING, logger="snowfence.lease"):
        lease = s.claim(None, "h", 100, 10)
    assert lease.worker_id == 2
    assert "passing over worker ID 0: mark of worker ID 0 is unreadable" in caplog.text
    assert "passing over worker ID 1" in caplog.text


def test_a_store_that_skips_far_marks_prefers_passed_then_near_then_any():
    now, ahead = 1000, 50
    marks = {0: now + 500, 1: now + 40, 2: now - 5}
    s = MapStore(dict(marks), skips_far_marks=True)
    assert s.claim(None, "h", now, ahead).worker_id == 2  # its mark has passed: serve at once
    assert s.tries == [(0, now), (1, now), (2, now)]
    s.tries.clear()
    assert s.claim(None, "h", now, ahead).worker_id == 1  # a plausible wait away
    assert s.tries == [(0, now), (1, now), (2, now), (0, now + ahead), (1, now + ahead)]
    s.tries.clear()
    assert s.claim(None, "h", now, ahead).worker_id == 0  # only then one far ahead
    assert s.tries[-1] == (0, None)


def test_on_one_host_a_far_mark_is_taken_and_waited_for():
    s = MapStore({0: 10**9}, skips_far_marks=False)
    assert s.claim(None, "h", 0, 10).worker_id == 0 and s.tries == [(0, None)]


def test_preference_file_round_trip_and_bad_contents(tmp_path):
    pref = PreferenceFile(tmp_path, "ns", "slot-0")
    assert pref.read() is None  # nothing recorded yet
    pref.write(17)
    assert pref.read() == 17
    assert pref.path == tmp_path / "last-worker-id" / "ns" / "slot-0"
    assert pref.path.read_text().split()[0] == "17"
    assert sorted(p.name for p in pref.path.parent.iterdir()) == ["slot-0"]  # no temp file left
    pref.write(3)
    assert pref.read() == 3
    pref.path.write_text("not a number\n")
    assert pref.read() is None


def test_preference_file_is_written_durably_its_directory_fsynced_after_the_rename(tmp_path, monkeypatch):
    import os

    pref = PreferenceFile(tmp_path, "ns", "slot-0")
    pref.write(1, token=5)
    synced, real_fsync, real_replace = [], os.fsync, os.replace

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def replace(src, dst):
        synced.append(("rename", os.fspath(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    pref.write(2, token=6)
    monkeypatch.undo()
    assert synced[1:] == [("rename", str(pref.path)), str(pref.path.parent)], synced
    assert PreferenceFile.parse(pref.path.read_text()) == [(2, 6), (1, 5)]


def test_preference_file_that_cannot_be_written_warns_and_carries_on(tmp_path, caplog):
    (tmp_path / "last-worker-id").write_text("a file where a directory should be")
    pref = PreferenceFile(tmp_path, "ns", "slot-0")
    with caplog.at_level(logging.WARNING, logger="snowfence.lease"):
        pref.write(5)
    assert f"cannot record last worker ID in {pref.path}: " in caplog.text
    assert "Not a directory" in caplog.text  # and why
    assert pref.read() is None


def test_lease_handle_defaults():
    lease = Lease(region=2, worker_id=9, token=4, mark_ms=1234)
    assert (lease.region, lease.worker_id, lease.token) == (2, 9, 4)
    assert (lease.claimed_mark_ms, lease.reserved_until_ms, lease.released) == (1234, 1234, False)
    assert lease.describe() == {"worker_id": 9, "token": 4, "reserved_until_ms": 1234}
    assert lease.remaining_s() is None and not lease.expires
    lease.refresh()  # a lease that cannot lapse has nothing to renew
    with pytest.raises(NotImplementedError):
        lease.extend(2000)
    with pytest.raises(NotImplementedError):
        lease.release(1500)
    with lease as held:
        assert held is lease
    assert lease.released  # leaving the block without a release abandons it


def test_leaving_a_released_lease_does_not_abandon_it_again():
    abandoned = []

    class Counted(Lease):
        def abandon(self):
            abandoned.append(1)
            super().abandon()

    with Counted(0, 1, 1, 0) as lease:
        lease.released = True
    assert abandoned == []
    with Counted(0, 1, 1, 0):
        pass
    assert abandoned == [1]


def test_store_defaults():
    s = Store()
    assert s.describe() == {} and not s.skips_far_marks
    s.close()
    for call in (lambda: s.check_layout(None), lambda: s.try_claim(0, "h", None), lambda: list(s.candidates())):
        with pytest.raises(NotImplementedError):
            call()


# -- passed-over worker IDs, node keys, the preference file's token record -------------------------


def test_a_passed_over_worker_id_is_recorded_logged_once_per_reason_and_forgotten_once_readable(caplog):
    s = MapStore({0: 0, 1: 0}, broken={0}, taken={1})
    with caplog.at_level(logging.WARNING, logger="snowfence.lease"):
        s.claim(None, "h", 100, 10)
        s.claim(None, "h", 100, 10)  # the same reason again: not logged again
    assert s.passed_over == {0: "mark of worker ID 0 is unreadable"}
    records = [r for r in caplog.records if getattr(r, "event", None) == "worker_id_passed_over"]
    assert len(records) == 1
    assert records[0].fields == {"worker_id": 0, "reason": "mark of worker ID 0 is unreadable"}
    assert records[0].getMessage() == "passing over worker ID 0: mark of worker ID 0 is unreadable"
    s.broken.clear()
    assert s.claim(None, "h", 100, 10).worker_id == 0
    assert s.passed_over == {}


def test_node_key_is_a_safe_stable_file_name_per_bind_endpoint():
    import hashlib

    from snowfence.store.preference import node_key

    bind = "tcp://127.0.0.1:5555"
    assert node_key(bind) == "tcp-127.0.0.1-5555-" + hashlib.sha256(bind.encode()).hexdigest()[:8]
    long = "ipc:///" + "a" * 100
    assert node_key(long) == "ipc-" + "a" * 44 + "-" + hashlib.sha256(long.encode()).hexdigest()[:8]
    assert node_key("tcp://[::1]:1") != node_key("tcp://[::2]:1")
    assert node_key("ipc:///run/Node-X").startswith("ipc-run-Node-X-")  # letters of either case kept
    assert node_key("ipc:///run/s/") == "ipc-run-s-" + hashlib.sha256(b"ipc:///run/s/").hexdigest()[:8]


@pytest.mark.parametrize(
    "text, entries",
    [
        ("3\n", [(3, None)]),
        ("3 7\n", [(3, 7)]),
        ("3 0\n", [(3, 0)]),
        ("3 7\n\n4 2\n", [(3, 7), (4, 2)]),  # a blank line is skipped, not the end
        ("3 7 9\n", []),
        ("-1\n", []),
        ("3 -1\n", []),
        ("x\n", []),
        ("\n", []),
        ("", []),
        # A line that does not read is left out, and the lines after it still count.
        ("3 7\nx\n4 2\n", [(3, 7), (4, 2)]),
        ("3 7\n-1 5\n4 2\n", [(3, 7), (4, 2)]),
        ("3 7\n5 -2\n4 2\n", [(3, 7), (4, 2)]),
        ("3 7\n1 2 3\n4 2\n", [(3, 7), (4, 2)]),
    ],
)
def test_preference_file_lines_are_a_worker_id_and_an_optional_token(text, entries):
    assert PreferenceFile.parse(text) == entries


def test_preference_file_keeps_the_highest_token_per_worker_id(tmp_path):
    pref = PreferenceFile(tmp_path, "ns", "slot-0")
    pref.write(3, 7)
    pref.write(4, 2)
    pref.write(3, 5)  # a lower token does not lower the record
    assert PreferenceFile.parse(pref.path.read_text()) == [(3, 7), (4, 2)]
    assert pref.read() == 3


def test_recorded_tokens_are_the_highest_of_every_slot_of_every_node(tmp_path):
    base = tmp_path / "last-worker-id" / "ns"
    for rel, text in [
        ("a/slot-0", "3 7\n4 2\n"),
        ("a/slot-1", "not a preference\n"),  # unreadable files are skipped, not the end
        ("b/slot-0", "3 9\n4 0\n5\n"),
        ("b/slot-1", "4 1\n"),
        ("b/slot-2.tmp", "3 99\n"),  # half-written, not a record
    ]:
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(text)
    assert PreferenceFile.recorded_tokens(tmp_path, "ns") == {3: 9, 4: 2}
    assert PreferenceFile.recorded_tokens(tmp_path, "other") == {}


def test_an_unreadable_preference_file_is_skipped_wherever_it_comes(tmp_path, monkeypatch):
    from pathlib import Path

    base = tmp_path / "last-worker-id" / "ns"
    (base / "a").mkdir(parents=True)
    (base / "a" / "slot-0").write_text("garbage\n")
    (base / "a" / "slot-1").write_bytes(b"\xff\xfe 3 8\n")  # not UTF-8
    (base / "a" / "slot-2").mkdir()  # not a file
    (base / "a" / "slot-3").write_text("3 7\n")
    listed = [base / "a" / f"slot-{n}" for n in range(4)]  # the unreadable ones first
    monkeypatch.setattr(Path, "rglob", lambda self, pattern: iter(listed))
    assert PreferenceFile.recorded_tokens(tmp_path, "ns") == {3: 7}
