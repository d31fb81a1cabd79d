"""The embedded store at its edges: what it tells the operator when the state
directory fails, what its files look like, and what it leaves behind.

Every error names the file it is about and the operating system's reason, in
one line; a failed write leaves no temporary file; a claim that fails or
declines lets go of the lock it took. Real files and flocks in a temporary
directory; faults are injected at the os-module boundary."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import subprocess

import orjson
import pytest
from filerig import file_store

from snowfence.errors import ConfigError, LayoutMismatch, LeaseLost, StateDirBusy, StateDirError, WorkerIdUnusable
from snowfence.ids import DEFAULT_LAYOUT, Layout
from snowfence.store import durable, filesystems
from snowfence.store import files as embedded
from snowfence.store.files import FileStore, locks
from snowfence.store.journal import Journal
from snowfence.store.preference import PreferenceFile, embedded_namespace, node_key

HOLDER = "node-a:41:slot0"
EIO = OSError(errno.EIO, "Input/output error")


def at_epoch(layout) -> dict:
    """A store whose clock reads its layout's epoch and whose nodes never mint or reserve
    ahead of it (so a new one waits nothing out): its first marks are at 0, and these tests
    count milliseconds from there."""
    return {"max_ahead_ms": 0, "window_ms": 0, "wall_ns": lambda: layout.epoch_ms * 1_000_000}


def store(tmp_path) -> FileStore:
    s = file_store(tmp_path, DEFAULT_LAYOUT, 0, **at_epoch(DEFAULT_LAYOUT))
    s.check_layout(DEFAULT_LAYOUT)
    return s


def region(tmp_path):
    return tmp_path / "regions" / "0"


def temp_files(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".tmp"))


def fail_for(monkeypatch, name: str, target, error: OSError = EIO) -> None:
    """Make ``os.<name>`` raise ``error`` when its first argument is ``target`` (a path, or a predicate)."""
    real = getattr(os, name)

    def wrapper(first, *args, **kwargs):
        hit = target(first) if callable(target) else os.fspath(first) == os.fspath(target)
        if hit:
            raise error
        return real(first, *args, **kwargs)

    monkeypatch.setattr(os, name, wrapper)


def is_temp_file_fd(fd) -> bool:
    return isinstance(fd, int) and os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp")


def refuse_to_remove_temp_files(monkeypatch) -> None:
    """A temp file cannot be cleaned up after a failed write: unlink says EACCES."""
    fail_for(
        monkeypatch,
        "unlink",
        lambda p: os.fspath(p).endswith(".tmp"),
        PermissionError(errno.EACCES, "Permission denied"),
    )


def held_by_another(s: FileStore, worker_id: int) -> bool:
    """Whether a second open of the lock file finds it locked (flocks are per open file)."""
    other = file_store(s.root, s.layout, s.region)
    fd = other._lock(other.paths(worker_id)[0], create=False)
    if fd is None:
        return True
    os.close(fd)
    return False


# -- the files ----------------------------------------------------------------------------------


def test_filesystem_type_is_the_real_statfs_magic_number(tmp_path):
    stat_f = shutil.which("stat")
    paths = [tmp_path] + (["/dev/shm"] if os.path.isdir("/dev/shm") else [])
    for path in paths:
        expected = int(
            subprocess.run([stat_f, "-f", "-c", "%t", str(path)], capture_output=True, text=True, check=True).stdout, 16
        )
        assert filesystems.filesystem_type(path) == expected, path
    assert filesystems.filesystem_type(tmp_path / "missing") is None


def test_lock_mark_and_layout_files_are_readable_by_all_and_writable_by_the_owner(tmp_path):
    old = os.umask(0o022)
    try:
        s = store(tmp_path)
        s.try_claim(0, HOLDER, None)
    finally:
        os.umask(old)
    for path in (tmp_path / "layout.json", *s.paths(0)):
        assert os.stat(path).st_mode & 0o777 == 0o644, path


def test_a_lock_is_not_inherited_by_programs_a_worker_runs(tmp_path):
    lease = store(tmp_path).try_claim(0, HOLDER, None)
    assert fcntl.fcntl(lease._fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC


def test_the_layout_file_is_indented_for_the_operator_who_reads_it(tmp_path):
    s = store(tmp_path)
    assert (tmp_path / "layout.json").read_bytes() == orjson.dumps(s.genesis.to_dict(), option=orjson.OPT_INDENT_2)


def test_marks_name_the_holder_that_wrote_them(tmp_path):
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    assert lease.holder == HOLDER and lease.region == 0
    assert s.mark(0).holder == HOLDER  # the claim's own write
    lease.extend(1_000)
    assert s.mark(0).holder == HOLDER
    region(tmp_path).joinpath("worker-0.mark").unlink()
    with pytest.raises(LeaseLost):
        lease.refresh()
    assert s.mark(0).holder == HOLDER  # restored by its holder before letting go


def test_a_crash_between_mark_and_lock_leaves_a_mark_naming_its_writer(tmp_path, monkeypatch):
    s = store(tmp_path)

    def crash(self, path, *, create):
        if create:
            raise KeyboardInterrupt("crash")
        raise FileNotFoundError(path)

    monkeypatch.setattr(FileStore, "_lock", crash)
    with pytest.raises(KeyboardInterrupt):
        s.try_claim(0, HOLDER, None)
    assert s.mark(0) == embedded.Mark(0, 0, HOLDER, store=s.genesis.store_id, layout=DEFAULT_LAYOUT.digest())


def test_the_store_and_its_leases_describe_themselves_for_status(tmp_path):
    s = store(tmp_path)
    assert s.describe() == {"store": "embedded", "state_dir": str(tmp_path)}
    lease = s.try_claim(3, HOLDER, None)
    lease.extend(2_000)
    assert lease.describe() == {"worker_id": 3, "token": 1, "reserved_until_ms": 2_000, "store": "embedded"}


# -- writes that fail -----------------------------------------------------------------------------


def test_a_temp_file_left_by_an_earlier_process_with_our_pid_is_overwritten_whole(tmp_path):
    path = tmp_path / "x.mark"
    durable._tmp_name(path).write_bytes(b"{" * 4096)  # a crashed process's, our PID reused
    durable.write_atomic(path, b'{"short":1}')
    assert path.read_bytes() == b'{"short":1}'
    assert temp_files(tmp_path) == []


def test_a_write_that_fails_leaves_no_temp_file_and_reports_the_disk_error(tmp_path, monkeypatch):
    path = tmp_path / "x.mark"
    fail_for(monkeypatch, "fsync", is_temp_file_fd)
    with pytest.raises(OSError) as info:
        durable.write_atomic(path, b"data")
    assert info.value.errno == errno.EIO
    assert temp_files(tmp_path) == [] and not path.exists()


def test_a_write_whose_cleanup_also_fails_still_reports_the_first_error(tmp_path, monkeypatch):
    path = tmp_path / "x.mark"
    fail_for(monkeypatch, "fsync", is_temp_file_fd)
    refuse_to_remove_temp_files(monkeypatch)
    with pytest.raises(OSError) as info:
        durable.write_atomic(path, b"data")
    assert info.value.errno == errno.EIO


def test_a_rename_that_fails_leaves_no_temp_file_and_the_old_mark_whole(tmp_path, monkeypatch):
    path = tmp_path / "x.mark"
    durable.write_atomic(path, b"old")
    fail_for(monkeypatch, "replace", lambda p: os.fspath(p).endswith(".tmp"))
    with pytest.raises(OSError) as info:
        durable.write_atomic(path, b"new")
    assert info.value.errno == errno.EIO
    assert temp_files(tmp_path) == [] and path.read_bytes() == b"old"
    refuse_to_remove_temp_files(monkeypatch)
    with pytest.raises(OSError) as info:
        durable.write_atomic(path, b"new")
    assert info.value.errno == errno.EIO  # not the cleanup's error


def test_a_failed_extension_names_the_worker_id_and_the_disk_error(tmp_path, monkeypatch):
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    fail_for(monkeypatch, "replace", lambda p: os.fspath(p).endswith(".tmp"))
    with pytest.raises(StateDirError) as info:
        lease.extend(1_000)
    assert str(info.value) == "cannot persist the mark of worker ID 0: Input/output error"
    assert lease.reserved_until_ms == 0 and s.read_mark(0) == (0, 1)


# -- the lease's own checks -------------------------------------------------------------------------


def test_losing_exclusivity_is_logged_as_an_error_event_with_its_reason(tmp_path, caplog):
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    s.write_mark(0, 0, 5, "intruder")
    caplog.set_level(logging.INFO, logger="snowfence.embedded")
    with pytest.raises(LeaseLost) as info:
        lease.refresh()
    why = "its mark carries token 5, not ours (1): another process claimed it"
    assert str(info.value) == f"worker ID 0: {why}"
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "lease_exclusivity_lost"]
    assert record.levelno == logging.ERROR
    assert record.getMessage() == f"worker ID 0: {why}; the lease is lost"
    assert record.fields == {"worker_id": 0, "token": 1, "reason": why}


def test_a_mark_that_cannot_be_restored_says_so(tmp_path, monkeypatch):
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    mark = region(tmp_path) / "worker-0.mark"
    mark.unlink()
    fail_for(monkeypatch, "replace", lambda p: os.fspath(p).endswith(".tmp"))
    with pytest.raises(LeaseLost) as info:
        lease.refresh()
    assert (
        str(info.value) == f"worker ID 0: its mark file {mark} was removed; could not restore it (Input/output error)"
    )


def test_a_lock_file_that_cannot_be_checked_is_a_state_dir_error_naming_it(tmp_path, monkeypatch):
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    lock = region(tmp_path) / "worker-0.lock"
    fail_for(monkeypatch, "stat", lock, PermissionError(errno.EACCES, "Permission denied"))
    with pytest.raises(StateDirError) as info:
        lease.refresh()
    assert str(info.value) == f"cannot check the lock file {lock}: Permission denied"


def test_a_release_at_the_mark_keeps_it_and_one_below_lowers_it(tmp_path):
    s = store(tmp_path)
    lease = s.try_claim(0, HOLDER, None)
    lease.extend(3_000)
    floor = region(tmp_path) / "worker-0.floor"
    assert orjson.loads(floor.read_bytes())["released"] is False
    lease.release(3_000)  # nothing to lower: the mark stays where it is, and says the holder let go
    assert s.read_mark(0)[0] == 3_000 and lease.released
    assert orjson.loads(floor.read_bytes())["released"] is True
    again = s.try_claim(0, HOLDER, None)
    again.extend(9_000)
    again.release(6_000)
    assert again.reserved_until_ms == 6_000 == s.read_mark(0)[0]


# -- the store's errors ---------------------------------------------------------------------------


def test_a_state_dir_under_a_file_is_not_usable_and_says_why(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StateDirError) as info:
        file_store(tmp_path / "file" / "state", DEFAULT_LAYOUT, 0, journal=Journal(tmp_path / "journal", "embedded"))
    assert str(info.value) == f"state directory {tmp_path / 'file' / 'state'} is not usable: Not a directory"


def test_an_unsafe_filesystem_is_refused_with_the_ways_out_or_allowed_with_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(filesystems, "filesystem_type", lambda path: 0x65735546)
    what = (
        f"state directory {tmp_path} is on FUSE (statfs type 0x65735546), where file locks are not known to be "
        "exclusive across processes and hosts, so two nodes could mint as one worker ID"
    )
    with pytest.raises(ConfigError) as info:
        file_store(tmp_path, DEFAULT_LAYOUT, 0)
    assert str(info.value) == (
        f"{what}; use a local filesystem (ext4, xfs, btrfs, tmpfs), or etcd mode, or set "
        "--allow-unsafe-filesystem true if this filesystem's flock is known to be exclusive"
    )
    caplog.set_level(logging.INFO, logger="snowfence.embedded")
    file_store(tmp_path, DEFAULT_LAYOUT, 0, allow_unsafe_filesystem=True)
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "unsafe_filesystem_allowed"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == f"{what}; allowed by allow_unsafe_filesystem"


@pytest.mark.parametrize("content", [b"[]", b"{}", b'""', b"0", b'{"epoch_ms": 1767225600000}'])
def test_a_layout_file_that_does_not_say_the_whole_layout_is_unreadable_not_the_default(tmp_path, content):
    (tmp_path / "layout.json").write_bytes(content)
    with pytest.raises(StateDirError) as info:
        file_store(tmp_path, DEFAULT_LAYOUT, 0).check_layout(DEFAULT_LAYOUT)
    assert str(info.value).startswith(f"{tmp_path / 'layout.json'} is unreadable: ")
    assert (tmp_path / "layout.json").read_bytes() == content  # changed nothing


def test_a_layout_file_from_before_shard_bits_reads_as_no_shard_bits(tmp_path):
    doc = DEFAULT_LAYOUT.to_dict()
    del doc["shard_bits"]
    (tmp_path / "layout.json").write_bytes(orjson.dumps(doc))
    file_store(tmp_path, DEFAULT_LAYOUT, 0).check_layout(DEFAULT_LAYOUT)
    with pytest.raises(LayoutMismatch):
        file_store(tmp_path, Layout(shard_bits=2, time_bits=39), 0).check_layout(Layout(shard_bits=2, time_bits=39))


def test_layout_errors_name_the_file_and_the_layouts(tmp_path, monkeypatch):

    other = Layout(DEFAULT_LAYOUT.epoch_ms + 1)
    fresh = tmp_path / "fresh"
    file_store(fresh, other, 0).check_layout(other)
    with pytest.raises(LayoutMismatch) as info:
        file_store(fresh, DEFAULT_LAYOUT, 0).check_layout(DEFAULT_LAYOUT)
    assert str(info.value) == (
        f"state directory {fresh} was created for layout [{other.describe()}] but this node is configured for "
        f"[{DEFAULT_LAYOUT.describe()}]; IDs from two layouts could collide, so this node will not start"
    )

    failing = tmp_path / "failing"
    s = file_store(failing, DEFAULT_LAYOUT, 0)
    fail_for(monkeypatch, "link", lambda p: os.fspath(p).endswith(".tmp"))
    with pytest.raises(StateDirError) as info:
        s.check_layout(DEFAULT_LAYOUT)
    assert str(info.value) == f"cannot record the layout in {failing / 'layout.json'}: Input/output error"
    assert temp_files(failing) == []
    monkeypatch.undo()

    monkeypatch.setattr(FileStore, "read_genesis", lambda self: None)
    with pytest.raises(StateDirError) as info:
        file_store(tmp_path / "vanishing", DEFAULT_LAYOUT, 0).check_layout(DEFAULT_LAYOUT)
    assert str(info.value) == f"{tmp_path / 'vanishing' / 'layout.json'} vanished right after it was recorded"


@pytest.mark.parametrize(
    "doc, problem",
    [
        ([], "not an object"),
        ({"reserved_until_ms": -1, "token": 0}, "reserved_until_ms is -1"),
        ({"reserved_until_ms": 5, "token": "7"}, "token is '7'"),
        ({"token": 1}, "'reserved_until_ms'"),
    ],
)
def test_a_mark_that_does_not_parse_says_which_field_is_wrong(tmp_path, doc, problem):
    s = store(tmp_path)
    mark = s.paths(0)[1]
    mark.write_bytes(orjson.dumps(doc))
    with pytest.raises(WorkerIdUnusable) as info:
        s.mark(0)
    assert str(info.value) == f"mark file {mark} cannot be parsed ({problem})"


def test_a_mark_that_cannot_be_read_is_a_state_dir_error_naming_it(tmp_path):
    s = store(tmp_path)
    mark = s.paths(0)[1]
    mark.mkdir()
    with pytest.raises(StateDirError) as info:
        s.mark(0)
    assert str(info.value) == f"cannot read mark file {mark}: Is a directory"


# -- claims that fail or decline ---------------------------------------------------------------------


def test_a_lock_file_that_cannot_be_opened_or_locked_is_named_with_the_reason(tmp_path, monkeypatch):
    s = store(tmp_path)
    s.try_claim(0, HOLDER, None).release(0)
    lock = region(tmp_path) / "worker-0.lock"
    with monkeypatch.context() as m:
        fail_for(m, "open", lock, PermissionError(errno.EACCES, "Permission denied"))
        with pytest.raises(StateDirError) as info:
            s.try_claim(0, HOLDER, None)
    assert str(info.value) == f"cannot open lock file {lock}: Permission denied"
    real_flock = fcntl.flock

    def flock(fd, op):
        if os.readlink(f"/proc/self/fd/{fd}") == str(lock):
            raise OSError(errno.ENOLCK, "No locks available")
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    with pytest.raises(StateDirError) as info:
        s.try_claim(0, HOLDER, None)
    assert str(info.value) == f"cannot lock {lock}: No locks available"


def test_a_recorded_token_guards_only_its_own_worker_id(tmp_path):
    s = store(tmp_path)
    pref = PreferenceFile(tmp_path, embedded_namespace(0) + "/" + node_key("tcp://127.0.0.1:5555"), "slot-0")
    pref.write(0, 4)  # worker ID 0 was claimed with token 4, and its state deleted since
    with pytest.raises(WorkerIdUnusable) as info:
        s.try_claim(0, HOLDER, None)
    assert str(info.value) == (
        "worker ID 0 has neither lock nor mark, but token 4 was recorded for it: its state was deleted"
    )
    lease = s.try_claim(3, HOLDER, None)  # never used: fresh, whatever worker ID 0 recorded
    assert lease is not None and lease.token == 1


def test_a_region_directory_gone_before_the_lock_file_is_made_is_a_state_dir_error(tmp_path, monkeypatch):
    s = store(tmp_path)
    lock = region(tmp_path) / "worker-0.lock"
    fail_for(monkeypatch, "open", lock, FileNotFoundError(errno.ENOENT, "No such file or directory"))
    with pytest.raises(StateDirError) as info:
        s.try_claim(0, HOLDER, None)
    assert str(info.value) == f"cannot create lock file {lock}: its directory is gone"


def test_a_fresh_claim_whose_mark_cannot_be_written_names_the_mark_file(tmp_path, monkeypatch):
    s = store(tmp_path)
    fail_for(monkeypatch, "replace", lambda p: os.fspath(p).endswith(".tmp") and ".worker-0.mark" in os.fspath(p))
    with pytest.raises(StateDirError) as info:
        s.try_claim(0, HOLDER, None)
    assert str(info.value) == f"cannot write mark file {s.paths(0)[1]}: Input/output error"


def test_the_messages_of_passed_over_worker_ids_say_what_is_wrong(tmp_path):
    s = store(tmp_path)
    region(tmp_path).joinpath("worker-0.lock").write_bytes(b"")
    with pytest.raises(WorkerIdUnusable) as info:
        s.try_claim(0, HOLDER, None)
    assert str(info.value) == ("worker ID 0 has a lock file without a mark: it was used, but how far ahead is unknown")
    pref = PreferenceFile(tmp_path, embedded_namespace(0) + "/" + node_key("tcp://127.0.0.1:5555"), "slot-0")
    pref.write(1, 6)
    s.write_mark(1, 100, 2, "earlier")
    with pytest.raises(WorkerIdUnusable) as info:
        s.try_claim(1, HOLDER, None)
    assert str(info.value) == (
        "mark of worker ID 1 carries token 2, below token 6 recorded when it was claimed: the mark was rolled back"
    )


def test_a_claim_takes_a_mark_up_to_the_limit_and_lets_go_of_one_beyond_it(tmp_path):
    s = store(tmp_path)
    s.try_claim(0, HOLDER, None).release(0)
    s.write_mark(0, 5_000, 1, HOLDER)
    assert s.try_claim(0, HOLDER, max_mark_ms=4_999) is None
    assert not held_by_another(s, 0), "a declined claim let go of the lock"
    lease = s.try_claim(0, HOLDER, max_mark_ms=5_000)
    assert lease is not None and lease.claimed_mark_ms == 5_000
    assert held_by_another(s, 0)


def test_a_claim_that_fails_to_write_its_token_lets_go_of_the_lock(tmp_path, monkeypatch):
    s = store(tmp_path)
    s.try_claim(0, HOLDER, None).release(0)
    with monkeypatch.context() as m:
        fail_for(m, "replace", lambda p: os.fspath(p).endswith(".tmp"))
        with pytest.raises(StateDirError) as info:
            s.try_claim(0, HOLDER, None)
    assert str(info.value) == "cannot claim worker ID 0: Input/output error"
    assert not held_by_another(s, 0)
    assert s.read_mark(0) == (0, 1)  # the token did not move: the next claim is token 2
    assert s.try_claim(0, HOLDER, None).token == 2


def test_a_lock_file_replaced_while_claiming_is_not_taken(tmp_path, monkeypatch):
    s = store(tmp_path)
    s.try_claim(0, HOLDER, None).release(0)
    lock = region(tmp_path) / "worker-0.lock"
    real_stat = os.stat

    def replaced_in_between(path, *args, **kwargs):
        if os.fspath(path) == str(lock):
            os.unlink(lock)
            lock.write_bytes(b"")  # another process's new lock file at the path
            monkeypatch.setattr(os, "stat", real_stat)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", replaced_in_between)
    with pytest.raises(StateDirError) as info:
        s.try_claim(0, HOLDER, None)
    assert str(info.value) == f"lock file {lock} was replaced while claiming"
    assert s.read_mark(0) == (0, 1)


# -- the region lock --------------------------------------------------------------------------------


class SteppedTime:
    """Stands in for the time module in embedded.py: monotonic() moves only when sleep() is called."""

    def __init__(self, readings=None):
        self.now = 0.0
        self.sleeps: list[float] = []
        self._readings = list(readings or [])

    def monotonic(self) -> float:
        return self._readings.pop(0) if self._readings else self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


@pytest.fixture
def held_region(tmp_path):
    """The region directory locked by another open file, as another process in a mark write."""
    s = store(tmp_path)
    fd = os.open(region(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield s
    os.close(fd)


def test_a_busy_region_lock_is_retried_in_short_steps_for_the_wait_it_promises(held_region, monkeypatch):
    fake = SteppedTime()
    monkeypatch.setattr(locks, "time", fake)
    with pytest.raises(StateDirBusy) as info:
        with held_region.region_lock():
            pass
    assert str(info.value) == f"another process has held {held_region.dir} locked for {locks.REGION_LOCK_WAIT_S} s"
    assert all(0 < s <= 0.01 for s in fake.sleeps)
    assert locks.REGION_LOCK_WAIT_S <= sum(fake.sleeps) <= locks.REGION_LOCK_WAIT_S + 0.01


def test_a_busy_region_lock_gives_up_at_its_deadline_without_another_wait(held_region, monkeypatch):
    wait = locks.REGION_LOCK_WAIT_S
    fake = SteppedTime(readings=[0.0, wait, wait + 1])  # the first retry falls on the deadline itself
    monkeypatch.setattr(locks, "time", fake)
    with pytest.raises(StateDirBusy):
        with held_region.region_lock():
            pass
    assert fake.sleeps == []


def test_a_region_lock_released_while_waiting_is_taken(tmp_path, monkeypatch):
    s = store(tmp_path)
    fd = os.open(region(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    fake = SteppedTime()

    def sleep(seconds):
        fake.sleeps.append(seconds)
        fake.now += seconds
        if len(fake.sleeps) == 3:
            os.close(fd)  # the other process's write is done

    fake.sleep = sleep
    monkeypatch.setattr(locks, "time", fake)
    with s.region_lock():
        assert held_by_another_region(s)  # by us, now
    assert len(fake.sleeps) == 3


def held_by_another_region(s: FileStore) -> bool:
    fd = os.open(s.dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_region_lock_is_held_inside_and_let_go_after(tmp_path):
    s = store(tmp_path)
    with s.region_lock():
        assert held_by_another_region(s)
    assert not held_by_another_region(s)


def test_the_whole_regions_tree_removed_is_made_again_by_the_next_lock(tmp_path):
    s = store(tmp_path)
    shutil.rmtree(tmp_path / "regions")
    with s.region_lock():
        assert s.dir.is_dir()


def test_a_region_directory_made_again_by_another_process_at_the_same_moment_is_used(tmp_path, monkeypatch):
    s = store(tmp_path)
    shutil.rmtree(s.dir)
    real_mkdir = type(s.dir).mkdir

    def raced(path, *args, **kwargs):
        real_mkdir(path)  # the other process made it first
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(type(s.dir), "mkdir", raced)
    with s.region_lock():
        assert s.dir.is_dir()


def test_a_region_directory_removed_after_it_was_opened_is_not_the_one_locked(tmp_path, monkeypatch):
    s = store(tmp_path)
    real_flock = fcntl.flock
    removed = []

    def remove_then_lock(fd, op):
        if not removed and os.readlink(f"/proc/self/fd/{fd}") == str(s.dir):
            shutil.rmtree(s.dir)  # removed between our open and our lock
            removed.append(True)
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", remove_then_lock)
    with s.region_lock():
        assert s.dir.is_dir() and held_by_another_region(s)
    assert removed


def test_region_lock_errors_name_the_directory_and_the_reason(tmp_path, monkeypatch):
    s = store(tmp_path)
    with monkeypatch.context() as m:
        fail_for(m, "open", s.dir, PermissionError(errno.EACCES, "Permission denied"))
        with pytest.raises(StateDirError) as info:
            with s.region_lock():
                pass
    assert str(info.value) == f"region directory {s.dir} is not usable: Permission denied"
    real_flock = fcntl.flock

    def flock(fd, op):
        if os.readlink(f"/proc/self/fd/{fd}") == str(s.dir):
            raise OSError(errno.ENOLCK, "No locks available")
        return real_flock(fd, op)

    before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(fcntl, "flock", flock)
    with pytest.raises(StateDirError) as info:
        with s.region_lock():
            pass
    assert str(info.value) == f"cannot lock {s.dir}: No locks available"
    assert len(os.listdir("/proc/self/fd")) == before, "the directory's descriptor was closed"
