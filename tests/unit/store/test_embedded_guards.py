"""The embedded store's guards: checked exclusivity, never guessing on missing or
inconsistent state, atomic layout creation, durable and leak-free mark writes.

Real files and real flocks in a temporary directory; the fake clock drives the
keeper and the minter; faults are injected at the os-module boundary."""

from __future__ import annotations

import errno
import fcntl
import gc
import os
import shutil
import tempfile
import threading
from pathlib import Path

import orjson
import pytest
from fakeclock import FakeClock
from filerig import file_store

from snowfence.errors import ConfigError, LayoutMismatch, LeaseLost, StateDirBusy, StateDirError, WorkerIdUnusable
from snowfence.ids import DEFAULT_LAYOUT, Layout
from snowfence.store import filesystems
from snowfence.store.files import FileStore, mark_checksum
from snowfence.store.genesis import Genesis
from snowfence.store.journal import Journal
from snowfence.store.preference import PreferenceFile, embedded_namespace, node_key

HOLDER = "test"


def at_epoch(layout) -> dict:
    """A store whose clock reads its layout's epoch and whose nodes never mint or reserve
    ahead of it (so a new one waits nothing out): its first marks are at 0, and these tests
    count milliseconds from there."""
    return {"max_ahead_ms": 0, "window_ms": 0, "wall_ns": lambda: layout.epoch_ms * 1_000_000}


def store(tmp_path, layout=DEFAULT_LAYOUT) -> FileStore:
    s = file_store(tmp_path, layout, 0, **at_epoch(layout))
    s.check_layout(layout)
    return s


def region(tmp_path):
    return tmp_path / "regions" / "0"


def elsewhere(tmp_path, layout=DEFAULT_LAYOUT) -> FileStore:
    """The store as a process in another network namespace sees it: the kernel's witness
    (an abstract socket) is not shared there, so only the files and their locks guard."""
    s = store(tmp_path, layout)
    names = s.witness_names
    s.witness_names = lambda worker_id, region=None: tuple(name + "-elsewhere" for name in names(worker_id, region))
    return s


def keeper_for(lease, clock=None):
    clock = clock or FakeClock()
    minter = clock.minter(DEFAULT_LAYOUT, 0, lease.worker_id)
    minter.start_after(lease.claimed_mark_ms)
    events = []
    return clock, minter, clock.keeper(lease, minter, events), events


# -- checked exclusivity ----------------------------------------------------------------------


def test_a_holder_whose_lock_file_was_removed_loses_the_lease_on_the_keepers_timer(tmp_path):
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    clock, minter, keeper, events = keeper_for(lease)
    keeper.renew_once()
    assert minter.reserved_until_ms > 0
    (region(tmp_path) / "worker-0.lock").unlink()
    clock.advance_ms(2000)
    keeper.run()  # returns at once: the lease is lost
    assert isinstance(keeper.lost, LeaseLost) and "removed" in str(keeper.lost)
    assert minter.fence_deadline_ns == -1  # fenced: mints nothing more
    assert events[-1][0] == "lease_lost"


def test_two_holders_of_different_lock_files_at_one_path_cannot_both_extend(tmp_path):
    s = store(tmp_path)
    old = s.try_claim(0, HOLDER, None)
    old.extend(5_000)
    (region(tmp_path) / "worker-0.lock").unlink()  # a cleanup job
    new = elsewhere(tmp_path).try_claim(0, "second", None)
    assert new is not None, "a new lock file at the path can be locked"
    assert new.claimed_mark_ms == 5_000 and new.token == old.token + 1  # it waits out the old mark
    with pytest.raises(LeaseLost, match="replaced by another file; a live process that could not see this holder"):
        old.extend(9_000)
    assert s.read_mark(0) == (5_000, new.token), "the stale holder wrote nothing"
    with pytest.raises(LeaseLost):
        old.refresh()
    new.extend(9_000)
    assert s.read_mark(0) == (9_000, new.token)
    # The stale holder's release must not lower the new holder's mark either.
    with pytest.raises(LeaseLost):
        old.release(0)
    assert old.released and s.read_mark(0) == (9_000, new.token)


def wipe(state) -> None:
    """Remove everything under ``state``, as ``rm -rf state/*`` does; the directory stays."""
    for entry in state.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def test_a_second_path_to_the_directory_finds_a_live_holders_worker_id_taken_after_a_wipe(tmp_path):
    state, link = tmp_path / "state", tmp_path / "link"
    state.mkdir()
    link.symlink_to(state)
    holder = store(state).try_claim(0, HOLDER, None)
    wipe(state)  # nothing in the files says worker ID 0 is held
    by_link = store(link)
    # As a bind mount's or a container's path would, this path hashes to another name:
    # only the directory's device and inode still name the same witness.
    by_link._witness_prefix = "snowfence:another-path"
    assert by_link.witness_names(0)[1] == store(state).witness_names(0)[1]
    assert by_link.witness_names(0)[0] != store(state).witness_names(0)[0]
    assert by_link.try_claim(0, "second", None) is None, "claimed a worker ID a live process holds"
    assert by_link.unheld() == DEFAULT_LAYOUT.max_worker
    holder.abandon()  # its process died: the kernel frees both names
    assert by_link.try_claim(0, "second", None) is not None


def test_a_directory_made_anew_at_the_path_finds_a_live_holders_worker_id_taken(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    first = store(state)
    holder, bound = first.try_claim(0, HOLDER, None), first.witness_names(0)
    old = os.open(state, os.O_RDONLY | os.O_DIRECTORY)  # its inode is not free to be reused
    try:
        shutil.rmtree(state)
        state.mkdir()
        again = store(state)
        path_name, dir_name = again.witness_names(0)
        assert path_name == bound[0] and dir_name != bound[1]  # only the path's name is the one it bound
        assert again.try_claim(0, "second", None) is None, "claimed a worker ID a live process holds"
        holder.abandon()
        assert again.try_claim(0, "second", None) is not None
    finally:
        os.close(old)


def test_a_worker_id_whose_directory_witness_alone_is_taken_is_passed_over_and_its_path_witness_let_go(tmp_path):
    import socket

    s = store(tmp_path)
    taken = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    taken.bind(s.witness_names(0)[1])  # bound through another path to this directory
    try:
        assert s.try_claim(0, HOLDER, None) is None
        assert not region(tmp_path).joinpath("worker-0.lock").exists(), "it claimed nothing"
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        probe.bind(s.witness_names(0)[0])  # the name it did bind, it let go
        probe.close()
    finally:
        taken.close()
    assert s.try_claim(0, HOLDER, None) is not None


def test_a_mark_taken_over_by_another_token_loses_the_lease(tmp_path):
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    s.write_mark(0, 100, lease.token + 1, "intruder")
    with pytest.raises(LeaseLost, match="token"):
        lease.refresh()
    with pytest.raises(LeaseLost):
        lease.extend(1_000)
    assert s.read_mark(0) == (100, lease.token + 1)


@pytest.mark.parametrize(
    "how, reason",
    [
        ("removed", "its mark file {mark} was removed"),
        ("set_back", "its mark was set back to 4000 ms, below our 5000 ms"),
        ("rolled_back", "its mark was rolled back to token 0"),
        ("corrupted", "{unparsable}"),
    ],
)
def test_a_mark_damaged_under_its_holder_is_restored_and_the_lease_let_go(tmp_path, how, reason):
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    lease.extend(5_000)
    mark = region(tmp_path) / "worker-0.mark"
    if how == "removed":
        mark.unlink()
    elif how == "set_back":
        s.write_mark(0, 4_000, lease.token, HOLDER)  # an older copy put back
    elif how == "rolled_back":
        s.write_mark(0, 4_000, lease.token - 1, "earlier")
    else:
        mark.write_bytes(b"\0" * 20)
    unparsable = ""
    if how == "corrupted":
        with pytest.raises(WorkerIdUnusable, match="cannot be parsed") as why:
            s.mark(0)
        unparsable = str(why.value)
    with pytest.raises(LeaseLost) as info:
        lease.refresh()
    # It says what happened and what it did about it.
    assert str(info.value) == f"worker ID 0: {reason.format(mark=mark, unparsable=unparsable)}; restored it to 5000 ms"
    # Only the holder knew how far it had gone; it put that back before letting go.
    assert s.read_mark(0) == (5_000, lease.token)
    lease.abandon()
    again = s.try_claim(0, HOLDER, None)
    assert again.claimed_mark_ms == 5_000 and again.token == lease.token + 1


def test_a_stale_holder_restores_nothing_once_another_process_claimed(tmp_path):
    s = store(tmp_path)
    old = s.try_claim(0, HOLDER, None)
    old.extend(5_000)
    (region(tmp_path) / "worker-0.lock").unlink()
    new = elsewhere(tmp_path).try_claim(0, "second", None)
    (region(tmp_path) / "worker-0.mark").unlink()
    with pytest.raises(LeaseLost, match="replaced"):
        old.refresh()
    assert not (region(tmp_path) / "worker-0.mark").exists(), "the stale holder wrote nothing"
    with pytest.raises(LeaseLost, match="restored"):
        new.refresh()  # the current holder knows its mark
    assert s.read_mark(0) == (5_000, new.token)


def test_a_holder_that_checks_out_keeps_extending(tmp_path):
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    clock, minter, keeper, _ = keeper_for(lease)
    for _ in range(5):
        keeper.renew_once()
        assert s.read_mark(0) == (minter.reserved_until_ms, lease.token)
        clock.advance_ms(2000)
    assert keeper.lost is None and keeper.renewals == 5


# -- never guess ----------------------------------------------------------------------------------


def corrupt(path, how):
    doc = orjson.loads(path.read_bytes())
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:10])
    elif how == "bad_checksum":
        doc["reserved_until_ms"] -= 1000  # a bit flip in the time: the checksum no longer matches
        doc["reserved_until_unix_ms"] -= 1000
        path.write_bytes(orjson.dumps(doc))
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "negative":
        doc["token"] = -1
        doc["checksum"] = mark_checksum(doc)
        path.write_bytes(orjson.dumps(doc))
    elif how == "times_disagree":
        doc["reserved_until_unix_ms"] += 1
        doc["checksum"] = mark_checksum(doc)
        path.write_bytes(orjson.dumps(doc))


@pytest.mark.parametrize("how", ["truncated", "bad_checksum", "empty", "negative", "times_disagree"])
def test_an_untrustworthy_mark_passes_the_worker_id_over(tmp_path, how):
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    lease.extend(50_000)
    lease.abandon()  # a crash
    corrupt(region(tmp_path) / "worker-0.mark", how)
    with pytest.raises(WorkerIdUnusable):
        s.try_claim(0, HOLDER, None)
    other = s.claim(preferred=0, holder=HOLDER, now_ms=0, max_ahead_ms=0)
    assert other.worker_id == 1
    assert 0 in s.passed_over and s.passed_over[0]
    # The lock of the passed-over worker ID was not kept: nothing leaked.
    fd = os.open(region(tmp_path) / "worker-0.lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_a_lock_file_without_a_mark_is_passed_over_not_fresh(tmp_path):
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    lease.extend(50_000)
    lease.abandon()
    (region(tmp_path) / "worker-0.mark").unlink()
    with pytest.raises(WorkerIdUnusable, match="lock file without a mark"):
        s.try_claim(0, HOLDER, None)
    assert s.claim(0, HOLDER, 0, 0).worker_id == 1
    assert "without a mark" in s.passed_over[0]


def test_a_never_used_worker_id_is_fresh_and_a_crash_between_mark_and_lock_leaves_it_usable(tmp_path, monkeypatch):
    s = store(tmp_path)
    real_lock = FileStore._lock

    def crash_before_the_lock_file_exists(self, path, *, create):
        if create:
            raise KeyboardInterrupt("crash")  # the process dies right after writing the mark
        return real_lock(self, path, create=create)

    monkeypatch.setattr(FileStore, "_lock", crash_before_the_lock_file_exists)
    with pytest.raises(KeyboardInterrupt):
        s.try_claim(0, HOLDER, None)
    monkeypatch.undo()
    assert (region(tmp_path) / "worker-0.mark").exists() and not (region(tmp_path) / "worker-0.lock").exists()
    lease = s.try_claim(0, HOLDER, None)
    assert lease is not None and lease.claimed_mark_ms == 0 and lease.token == 1


def test_a_mark_rolled_back_below_a_recorded_token_is_passed_over(tmp_path):
    s = store(tmp_path)
    pref = PreferenceFile(tmp_path, embedded_namespace(0) + "/" + node_key("tcp://127.0.0.1:5555"), "slot-0")
    first = s.try_claim(0, HOLDER, None)
    first.extend(5_000)
    saved = (region(tmp_path) / "worker-0.mark").read_bytes()
    first.release(5_000)
    second = s.try_claim(0, HOLDER, None)
    pref.write(0, second.token)
    second.extend(9_000)
    second.abandon()
    (region(tmp_path) / "worker-0.mark").write_bytes(saved)  # a backup put back: checksum fine, token old
    with pytest.raises(WorkerIdUnusable, match="rolled back"):
        s.try_claim(0, HOLDER, None)
    # With the lock and the mark both gone, the recorded token still says it was used.
    (region(tmp_path) / "worker-0.mark").unlink()
    (region(tmp_path) / "worker-0.lock").unlink()
    with pytest.raises(WorkerIdUnusable, match="deleted"):
        s.try_claim(0, HOLDER, None)


def test_a_token_the_broker_recorded_for_its_own_worker_id_guards_it_as_a_slots_does(tmp_path):
    from snowfence.config import Config
    from snowfence.workers.core import broker_preference_file

    s = store(tmp_path)
    broker = broker_preference_file(Config(state_dir=str(tmp_path), bind="tcp://127.0.0.1:5555"))
    first = s.try_claim(0, HOLDER, None)
    saved = (region(tmp_path) / "worker-0.mark").read_bytes()
    first.release(0)
    second = s.try_claim(0, HOLDER, None)
    broker.write(0, second.token)  # the broker's own worker ID held it last
    second.abandon()
    (region(tmp_path) / "worker-0.mark").write_bytes(saved)  # a backup put back: checksum fine, token old
    assert PreferenceFile.recorded_tokens(tmp_path, embedded_namespace(0)) == {0: second.token}
    # A node that never saw the later mark (its own journal elsewhere): only the token tells.
    other = FileStore(tmp_path, DEFAULT_LAYOUT, 0, journal=Journal(tmp_path / "other-journal", "embedded"))
    other.check_layout(DEFAULT_LAYOUT)
    with pytest.raises(WorkerIdUnusable, match=f"below token {second.token} recorded"):
        other.try_claim(0, HOLDER, None)
    (region(tmp_path) / "worker-0.mark").unlink()
    (region(tmp_path) / "worker-0.lock").unlink()
    with pytest.raises(WorkerIdUnusable, match=f"token {second.token} was recorded for it: its state was deleted"):
        other.try_claim(0, HOLDER, None)


def test_a_mark_from_before_checksums_is_accepted_if_consistent_and_rewritten_with_one(tmp_path):
    # A state directory of an older release: its layout record holds the layout alone.
    (tmp_path / "layout.json").write_bytes(orjson.dumps(DEFAULT_LAYOUT.to_dict()))
    region(tmp_path).mkdir(parents=True)
    mark = region(tmp_path) / "worker-0.mark"
    (region(tmp_path) / "worker-0.lock").write_bytes(b"")
    legacy = {
        "reserved_until_ms": 7_000,
        "reserved_until_unix_ms": 7_000 + DEFAULT_LAYOUT.epoch_ms,
        "token": 4,
        "holder": "old",
    }
    mark.write_bytes(orjson.dumps(legacy))
    s = store(tmp_path)  # upgrades the record: its marks without a store ID are its own
    assert s.genesis.legacy and s.genesis.is_used(0, 0)
    lease = s.try_claim(0, HOLDER, None)
    assert (lease.claimed_mark_ms, lease.token) == (7_000, 5)
    doc = orjson.loads(mark.read_bytes())
    assert doc["checksum"] == mark_checksum(doc)
    lease.abandon()
    for bad in ({**legacy, "extra": 1}, {**legacy, "reserved_until_unix_ms": 0}):
        mark.write_bytes(orjson.dumps(bad))
        with pytest.raises(WorkerIdUnusable):
            s.try_claim(0, HOLDER, None)


# -- the layout file --------------------------------------------------------------------------


def test_layout_is_created_exclusively_so_a_racing_node_reads_the_winner_back(tmp_path, monkeypatch):
    other = Layout(time_bits=41, region_bits=2, worker_bits=8, sequence_bits=12)
    s = file_store(tmp_path, DEFAULT_LAYOUT, 0)
    real_read = FileStore.read_genesis
    calls = []

    def raced(self):
        calls.append(self)
        if len(calls) == 1:
            # Both nodes found no layout; the other one records its layout first.
            file_store(tmp_path, other, 0).check_layout(other)
            return None
        return real_read(self)

    monkeypatch.setattr(FileStore, "read_genesis", raced)
    with pytest.raises(LayoutMismatch):
        s.check_layout(DEFAULT_LAYOUT)
    monkeypatch.undo()
    assert Genesis.from_dict(orjson.loads((tmp_path / "layout.json").read_bytes())).layout == other
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_of_many_threads_racing_on_fresh_directories_exactly_one_layout_wins_each(tmp_path):
    layouts = [DEFAULT_LAYOUT, Layout(time_bits=41, region_bits=2, worker_bits=8, sequence_bits=12)]
    dirs = [tmp_path / f"d{i}" for i in range(40)]
    results: dict[tuple[int, int], bool] = {}
    barrier = threading.Barrier(2)

    def racer(k):
        for i, d in enumerate(dirs):
            s = file_store(d, layouts[k], 0)
            barrier.wait()
            try:
                s.check_layout(layouts[k])
                results[(i, k)] = True
            except LayoutMismatch:
                results[(i, k)] = False

    threads = [threading.Thread(target=racer, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(results[(i, 0)] != results[(i, 1)] for i in range(len(dirs))), results


def test_an_unreadable_layout_file_is_a_state_dir_error(tmp_path):
    (tmp_path / "layout.json").write_bytes(b'{"epoch_ms": ')
    with pytest.raises(StateDirError):
        file_store(tmp_path, DEFAULT_LAYOUT, 0).check_layout(DEFAULT_LAYOUT)


# -- the filesystem -----------------------------------------------------------------------------


def test_a_state_dir_on_a_filesystem_without_exclusive_flock_is_refused_unless_allowed(tmp_path, monkeypatch):
    assert isinstance(filesystems.filesystem_type(tmp_path), int)  # the real statfs answers
    monkeypatch.setattr(filesystems, "filesystem_type", lambda path: 0x6969)
    with pytest.raises(ConfigError) as info:
        file_store(tmp_path, DEFAULT_LAYOUT, 0)
    assert not isinstance(info.value, StateDirError)  # a configuration error: exit 78, not 73
    assert "NFS" in str(info.value) and "--allow-unsafe-filesystem" in str(info.value)
    file_store(tmp_path, DEFAULT_LAYOUT, 0, allow_unsafe_filesystem=True)
    monkeypatch.setattr(filesystems, "filesystem_type", lambda path: 0xEF53)  # ext4
    file_store(tmp_path, DEFAULT_LAYOUT, 0)


# -- preference files -----------------------------------------------------------------------------


def test_preference_files_are_per_node_and_keep_the_highest_token_of_every_worker_id(tmp_path):
    ns = embedded_namespace(0)
    a = PreferenceFile(tmp_path, f"{ns}/{node_key('tcp://127.0.0.1:5555')}", "slot-0")
    b = PreferenceFile(tmp_path, f"{ns}/{node_key('tcp://127.0.0.1:5556')}", "slot-0")
    assert a.path != b.path
    a.write(3, 7)
    b.write(4, 2)
    a.write(5, 1)
    assert a.read() == 5 and b.read() == 4
    assert PreferenceFile.recorded_tokens(tmp_path, ns) == {3: 7, 4: 2, 5: 1}
    a.write(3, 9)
    assert a.read() == 3 and PreferenceFile.recorded_tokens(tmp_path, ns)[3] == 9
    legacy = tmp_path / "last-worker-id" / ns / "slot-1"
    legacy.write_text("6\n")  # a file from before tokens: still a preference, no token
    assert PreferenceFile(tmp_path, ns, "slot-1").read() == 6
    assert 6 not in PreferenceFile.recorded_tokens(tmp_path, ns)
    legacy.write_text("garbage\n")
    assert PreferenceFile(tmp_path, ns, "slot-1").read() is None


# -- a failed mark write, durability, lock errors, descriptors ---------------------------------


def test_a_mark_write_that_fails_mid_run_never_lets_the_reservation_pass_the_persisted_mark(tmp_path, monkeypatch):
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    clock, minter, keeper, _ = keeper_for(lease)
    real_fsync = os.fsync
    failing = {"on": False}

    def fsync(fd):
        if failing["on"]:
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    for step in range(12):
        failing["on"] = 4 <= step < 8  # the disk fails for a while, then recovers
        try:
            keeper.renew_once()
        except StateDirError:
            assert failing["on"]
        else:
            assert not failing["on"]
        persisted = s.read_mark(0)[0]
        assert minter.reserved_until_ms <= persisted, f"step {step}: reservation past the persisted mark"
        assert lease.reserved_until_ms <= persisted
        clock.advance_ms(2000)
    assert minter.reserved_until_ms == s.read_mark(0)[0] > 0  # it recovered


def test_a_mark_is_written_then_fsynced_then_renamed_then_its_directory_fsynced(tmp_path, monkeypatch):
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    names: dict[int, str] = {}
    ops: list[tuple[str, str]] = []
    real = {name: getattr(os, name) for name in ("open", "write", "fsync", "replace", "close")}

    def op_open(path, flags, *a, **kw):
        fd = real["open"](path, flags, *a, **kw)
        names[fd] = os.fspath(path)
        return fd

    def op_write(fd, data):
        ops.append(("write", names.get(fd, "?")))
        return real["write"](fd, data)

    def op_fsync(fd):
        ops.append(("fsync", names.get(fd, "?")))
        return real["fsync"](fd)

    def op_replace(src, dst):
        ops.append(("rename", f"{os.fspath(src)} -> {os.fspath(dst)}"))
        return real["replace"](src, dst)

    for name, fn in (("open", op_open), ("write", op_write), ("fsync", op_fsync), ("replace", op_replace)):
        monkeypatch.setattr(os, name, fn)
    lease.extend(1_000)
    monkeypatch.undo()
    mark = str(region(tmp_path) / "worker-0.mark")
    ops = [op for op in ops if "worker-0.mark" in op[1] or op == ("fsync", str(region(tmp_path)))]
    ops = ops[: ops.index(("fsync", str(region(tmp_path)))) + 1]  # the mark's write, then the journal's
    kinds = [k for k, _ in ops]
    assert kinds == ["write", "fsync", "rename", "fsync"], ops
    tmp = ops[0][1]
    assert tmp != mark and tmp.endswith(".tmp")
    assert ops[1] == ("fsync", tmp), "the data is on disk before the rename makes it the mark"
    assert ops[2] == ("rename", f"{tmp} -> {mark}")
    assert ops[3] == ("fsync", str(region(tmp_path))), "then the rename itself is made durable"


def test_a_lock_error_other_than_busy_never_becomes_a_lease(tmp_path, monkeypatch):
    s = store(tmp_path)
    s.try_claim(0, HOLDER, None).release(0)  # worker ID 0 exists, free
    real_flock = fcntl.flock

    def flock(fd, op):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("worker-0.lock"):
            raise OSError(errno.ENOLCK, "No locks available")
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(StateDirError, match="No locks available"):
        s.try_claim(0, HOLDER, None)
    assert len(os.listdir("/proc/self/fd")) == before, "the descriptor was closed"
    lease = s.claim(preferred=0, holder=HOLDER, now_ms=0, max_ahead_ms=0)
    assert lease.worker_id == 1 and "No locks available" in s.passed_over[0]


@pytest.fixture
def fast_dir(tmp_path):
    """A directory on tmpfs if the host has /dev/shm (fsync is free there), else tmp_path."""
    if not os.path.isdir("/dev/shm"):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="snowfence-test-") as d:
        yield Path(d)


def test_thousands_of_renewals_and_busy_claims_leak_no_descriptors(fast_dir):
    tmp_path = fast_dir
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    clock, minter, keeper, _ = keeper_for(lease)
    keeper.renew_once()
    (region(tmp_path) / "worker-1.lock").write_bytes(b"")  # a lock without a mark: passed over every time

    def open_fds():
        return len(os.listdir("/proc/self/fd"))

    # Objects earlier tests left for the collector close their descriptors when it runs:
    # collected now, and not during the count.
    gc.collect()
    gc.disable()
    try:
        before = open_fds()
        for _ in range(2000):
            clock.advance_ms(6000)  # past the window: every renewal writes the mark
            keeper.renew_once()
            assert s.try_claim(0, HOLDER, None) is None  # busy
            with pytest.raises(WorkerIdUnusable):
                s.try_claim(1, HOLDER, None)
        assert keeper.renewals == 2001
        assert open_fds() == before
    finally:
        gc.enable()
    lease.release(minter.last_ms)
    assert open_fds() == before - 3  # the lock's descriptor and the two witness sockets, and nothing else, were closed


def test_a_region_lock_held_elsewhere_is_a_retriable_refusal_that_changes_nothing(tmp_path):
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    lease.extend(1_000)
    fd = os.open(region(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another process stopped in the middle of a mark write
        with pytest.raises(StateDirBusy) as info:
            lease.extend(2_000)
        assert info.value.retriable
        with pytest.raises(StateDirBusy):
            s.try_claim(1, HOLDER, None)
        assert lease.reserved_until_ms == 1_000 and s.read_mark(0) == (1_000, lease.token)
    finally:
        os.close(fd)
    lease.extend(2_000)
    assert s.read_mark(0) == (2_000, lease.token)


def test_a_region_directory_removed_under_its_holders_loses_their_leases_and_keeps_used_ids_passed_over(tmp_path):
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    PreferenceFile(tmp_path, f"{embedded_namespace(0)}/{node_key('tcp://127.0.0.1:5555')}", "slot-0").write(
        0, lease.token
    )
    lease.extend(5_000)
    shutil.rmtree(region(tmp_path))
    with pytest.raises(LeaseLost, match="removed"):
        lease.refresh()
    lease.abandon()
    again = s.claim(preferred=0, holder=HOLDER, now_ms=0, max_ahead_ms=0)
    assert again.worker_id == 1 and "deleted" in s.passed_over[0]


def test_the_region_lock_is_taken_on_the_directory_at_the_path_not_on_one_removed_from_it(tmp_path, monkeypatch):
    s = store(tmp_path)
    stale = s.dir.with_name("stale")
    os.rename(s.dir, stale)  # the region directory is removed and made again...
    s.dir.mkdir()
    holder = os.open(s.dir, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(holder, fcntl.LOCK_EX)  # ...and another process holds the new one's lock
    real_open, opened = os.open, []

    def open_stale_first(path, flags, *args):
        # As if this process had opened the directory before it was swapped.
        if Path(path) == s.dir and not opened:
            opened.append(path)
            return real_open(stale, flags, *args)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", open_stale_first)
    try:
        with pytest.raises(StateDirBusy):
            with s.region_lock():
                pass
    finally:
        os.close(holder)
    assert opened  # the stale directory was opened, locked, and found not to be the one at the path
    with s.region_lock():  # once the holder is gone, the real one is taken
        pass


def test_a_lease_given_up_twice_closes_its_descriptor_once(tmp_path, monkeypatch):
    s = store(tmp_path)
    lease = s.claim(None, "h", 0, 10_000)
    closed = []
    real_close = os.close
    monkeypatch.setattr(os, "close", lambda fd: (closed.append(fd), real_close(fd)))
    threads = [threading.Thread(target=lease.abandon) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(closed) == 1


def test_a_preference_file_with_a_bad_line_keeps_the_tokens_on_its_other_lines(tmp_path):
    pref = PreferenceFile(tmp_path, "ns", "slot-0")
    pref.path.parent.mkdir(parents=True)
    pref.path.write_text("3 17\nthis is not a line\n5 9\n")
    assert PreferenceFile.parse(pref.path.read_text()) == [(3, 17), (5, 9)]
    pref.write(4, 2)
    assert sorted(PreferenceFile.parse(pref.path.read_text())) == [(3, 17), (4, 2), (5, 9)]


def test_a_worker_id_seen_held_and_then_found_with_no_record_waits_out_its_holders_run_ahead(tmp_path):
    # A holder (hlc) whose directory was wiped under it mints until its next check finds
    # its files gone, up to its run-ahead above the clock; a claimer that saw it held
    # takes the worker ID after that, long after the new store's own wait has passed.
    state = tmp_path / "state"
    state.mkdir()
    now = [0]
    holder = store(state).try_claim(0, HOLDER, None)
    wipe(state)
    claimer = file_store(
        state, DEFAULT_LAYOUT, 0, max_ahead_ms=1000, window_ms=1000, wall_ns=lambda: now[0] * 1_000_000
    )
    now[0] = DEFAULT_LAYOUT.epoch_ms + 50_000
    claimer.check_layout(DEFAULT_LAYOUT)
    assert claimer.genesis.quarantine_until_ms == 51_000
    assert claimer.try_claim(0, "second", None) is None  # its witness is taken
    now[0] += 8_000  # the holder's next check: its lock file is gone, it lets go
    holder.abandon()
    lease = claimer.try_claim(0, "second", None)
    assert lease.claimed_mark_ms >= 59_000, "it minted where the holder may have run ahead to"
    # A worker ID nobody was seen holding takes the new store's wait alone.
    assert claimer.try_claim(1, "second", None).claimed_mark_ms == 51_000
