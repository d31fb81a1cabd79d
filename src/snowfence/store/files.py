"""Embedded mode: worker IDs by file lock, the high-water mark in a file.

Layout of the state directory::

    layout.json                        the ID layout and the store's genesis (see genesis.py)
    regions/<r>/                       flock(2)ed briefly around every read-compare-write of a mark
    regions/<r>/worker-<w>.lock        flock(2)ed by the worker holding worker ID w
    regions/<r>/worker-<w>.mark        {"reserved_until_ms", "token", "rev", "store", "layout", ..., "checksum"}
    last-worker-id/<ns>/<node>/slot-N  "<worker ID> <token>" a worker slot claimed last
    journal/embedded.json              what the node's processes saw the store hold (see journal.py)

The kernel releases a flock when its process dies, so a crashed worker's ID
frees at once; its mark stays and makes the next owner wait until the wall
clock has passed it. Marks are written to a temporary file, fsynced, renamed
over the old one, and the directory fsynced, before the minter may use them.

The store does not trust its own belief that it holds a worker ID, as etcd does
not trust a stale lease: before every write of the mark, and on the keeper's
timer, the holder checks that the file it holds the lock on is still the lock
file at the path (device and inode) and that the mark is the one it wrote (its
token and its revision). The check and the write happen under the region
directory's flock, which every claim takes too, so a second process that locked
a new lock file at the same path (the old one deleted) and a holder of the old
one cannot interleave: one of them sees the other's token and drops the worker ID.

Files can be deleted; the kernel's own records cannot. A holder also keeps two
abstract unix sockets bound, each named after the state directory, its region and
the worker ID: one names the directory by its real path (a directory removed and
made again there is the same store to a claimer), the other by its device and
inode (a bind mount, a symlink or a container's own mount of it is the same
directory, whatever its path). The kernel frees the names when the process dies,
and no file operation touches them. A claimer that finds either name taken passes
over the worker ID, whatever the directory says: so a state directory wiped under
live holders gives their worker IDs to nobody else while they run.

Abstract socket names live in a network namespace: a node in another one (another
container that does not share the host's network) sees neither name. Such a node
is guarded by the files alone: a holder whose lock file was removed or replaced,
or whose mark another process wrote, fences at its next keeper check, and says
so when a live process it could not see holds the new lock file; until that
check (one keep-alive interval) it may mint as a worker ID a node there claimed
on a wiped directory.

State that is missing or inconsistent is never read as "fresh". A worker ID is
passed over, with the reason logged and shown in ``snowfence status``, when its
lock file exists without a mark, when its mark cannot be parsed or fails its
checksum, when its mark's token is below one a worker recorded when it claimed
it, or when its mark is of another layout. A worker ID without a mark is never
used only if the genesis record says so (its ``used`` set); otherwise it is
unknown, and its claim waits out a quarantine. A mark whose revision is below
the one the journal saw was put back from an older copy: refused by name.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import logging
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from ..errors import (
    ConfigError,
    LayoutMismatch,
    LeaseLost,
    StateDirBusy,
    StateDirError,
    StoreWentBack,
    WatermarkRecordUnreadable,
    WorkerIdUnusable,
)
from ..ids import Layout
from ..logs import event
from . import filesystems, watermark
from .base import Lease, Store, exclusivity_lost
from .durable import _fsync_dir, _tmp_name, _write_synced, write_atomic
from .genesis import Genesis, legacy_genesis, restore_base
from .journal import Journal
from .preference import PreferenceFile, embedded_namespace

log = logging.getLogger("snowfence.embedded")

#: How long a claim or an extension waits for another process's mark write.
REGION_LOCK_WAIT_S = 0.5

#: The fields of a mark of an older release (before genesis records), and of this one.
_MARK_FIELDS = ("holder", "reserved_until_ms", "reserved_until_unix_ms", "token")
_MARK_FIELDS_V2 = (*_MARK_FIELDS, "rev", "store", "layout")


def layout_path(state_dir: str | os.PathLike) -> Path:
    """The genesis record of the store in ``state_dir``."""
    return Path(state_dir) / "layout.json"


def read_genesis(state_dir: str | os.PathLike) -> Genesis | None:
    """The genesis record of the store in ``state_dir``, read without writing anything; None
    if there is none. Raises StateDirError if it is unreadable."""
    path = layout_path(state_dir)
    try:
        return Genesis.from_dict(orjson.loads(path.read_bytes()))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateDirError(f"{path} is unreadable: {exc.strerror or exc}") from None
    except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError, ConfigError) as exc:
        raise StateDirError(
            f"{path} is unreadable: {exc}; restore it from a backup, or move it out of the state directory "
            "and run `snowfence accept-restore --reason TEXT` with this node's settings, which records the "
            "layout anew and has claims wait out a quarantine"
        ) from None


def _mark_layout(path: Path) -> str | None:
    """The layout digest a mark file names (None: an older release's mark, or unreadable)."""
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return doc.get("layout") if isinstance(doc, dict) and isinstance(doc.get("layout"), str) else None


def _unseen_holder(lock_path: Path) -> str:
    """Why a lock file at a holder's path is not its own, if a live process holds it: that
    process claimed while this holder still had the kernel's witnesses bound, so it could
    not see them. Only on the way to fencing: one open and one flock."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return (
                "; a live process that could not see this holder's witnesses holds the new one (a node in another "
                "network namespace, such as another container, or on another path to a directory made anew: "
                "only the files guard then)"
            )
        return ""
    finally:
        os.close(fd)
    return ""


def mark_checksum(doc: dict) -> str:
    """The checksum a mark carries: CRC-32 of its other fields, canonically encoded."""
    fields = _MARK_FIELDS_V2 if "rev" in doc else _MARK_FIELDS
    canonical = orjson.dumps({k: doc.get(k) for k in fields}, option=orjson.OPT_SORT_KEYS)
    return f"crc32:{zlib.crc32(canonical):08x}"


@dataclass(frozen=True)
class Mark:
    reserved_until_ms: int
    token: int
    holder: str
    #: False for a mark written before marks carried a checksum.
    checked: bool = True
    #: Raised by one at every write: a copy put back has a lower one. 0 in older releases' marks.
    rev: int = 0
    #: The genesis store ID and the layout digest it was written under; None in older releases' marks.
    store: str | None = None
    layout: str | None = None


#: Up to this many worker IDs per region, a watermark round asks the kernel's witnesses about
#: every one; beyond it (wide worker fields), only those with files in the region directory.
WITNESS_PROBE_LIMIT = 4096


class RegionLock:
    """The flock of a region directory, as a context manager.

    It is taken on the directory at the path, never on one removed from it, and
    waits at most ``REGION_LOCK_WAIT_S`` for another process's mark write.
    """

    _FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def _open(self) -> int:
        try:
            try:
                return os.open(self.dir, self._FLAGS)
            except FileNotFoundError:
                # Removed under us: make it again. What was in it is gone, and the
                # tokens recorded in last-worker-id/ keep those worker IDs passed over.
                self.dir.mkdir(parents=True, exist_ok=True)
                return os.open(self.dir, self._FLAGS)
        except OSError as exc:
            raise StateDirError(f"region directory {self.dir} is not usable: {exc.strerror or exc}") from None

    def _flock(self, fd: int) -> bool:
        """Lock ``fd``; False if another process holds the lock."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise StateDirError(f"cannot lock {self.dir}: {exc.strerror or exc}") from None
        return True

    def _at_path(self, fd: int) -> bool:
        """Whether ``fd`` is the directory at the path (a lock on one removed from it locks nothing)."""
        held = os.fstat(fd)
        try:
            now = os.stat(self.dir)
        except OSError:
            return False
        return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)

    def __enter__(self) -> None:
        deadline = time.monotonic() + REGION_LOCK_WAIT_S
        while True:
            fd = self._open()
            try:
                if self._flock(fd) and self._at_path(fd):
                    self._fd = fd
                    return
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # busy, or a directory since removed from the path: try the one there again
            if time.monotonic() >= deadline:
                raise StateDirBusy(f"another process has held {self.dir} locked for {REGION_LOCK_WAIT_S} s")
            time.sleep(0.002)

    def __exit__(self, *exc_info) -> None:
        os.close(self._fd)  # closing the descriptor drops the flock


class FileLease(Lease):
    """A worker ID held by an flock on its lock file."""

    def __init__(
        self,
        store: FileStore,
        fd: int,
        lock_id: tuple[int, int],
        worker_id: int,
        token: int,
        mark_ms: int,
        holder: str,
        *,
        rev: int = 0,
        witnesses: tuple[socket.socket, ...] = (),
    ) -> None:
        super().__init__(store.region, worker_id, token, mark_ms)
        self._store = store
        self._fd = fd
        self._abandon_lock = threading.Lock()
        #: (st_dev, st_ino) of the lock file we hold the flock on.
        self.lock_id = lock_id
        self.holder = holder
        #: The revision of the mark we wrote last: the mark at the path must still be it.
        self.rev = rev
        #: The abstract sockets that tell other claimers, through the kernel, that we hold it.
        self._witnesses = witnesses

    def _lost(self, why: str) -> LeaseLost:
        return exclusivity_lost(self, why)

    def check(self) -> None:
        """Raise LeaseLost unless our lock file is at its path and the mark carries our token.

        Called under the region lock. If the lock file at the path is still ours but
        the mark was removed, damaged, set back or rolled back to an older token, no
        other process can have claimed the worker ID since (a claim needs our flock
        and raises the token), so we alone know its mark: we put it back before
        letting go, so the next owner waits for every millisecond we may have used.
        """
        lock_path, mark_path = self._store.paths(self.worker_id)
        try:
            st = os.stat(lock_path)
        except FileNotFoundError:
            raise self._lost(f"its lock file {lock_path} was removed") from None
        except OSError as exc:
            raise StateDirError(f"cannot check the lock file {lock_path}: {exc.strerror or exc}") from None
        if (st.st_dev, st.st_ino) != self.lock_id:
            raise self._lost(f"its lock file {lock_path} was replaced by another file" + _unseen_holder(lock_path))
        mark = None
        try:
            mark = self._store.mark(self.worker_id)
        except WorkerIdUnusable as exc:
            problem = str(exc)
        else:
            if mark is None:
                problem = f"its mark file {mark_path} was removed"
            elif mark.token > self.token:
                raise self._lost(
                    f"its mark carries token {mark.token}, not ours ({self.token}): another process claimed it"
                )
            elif mark.token < self.token:
                problem = f"its mark was rolled back to token {mark.token}"
            elif mark.rev < self.rev:
                problem = f"its mark was put back from an older copy (revision {mark.rev}, ours is {self.rev})"
            elif mark.reserved_until_ms < self.reserved_until_ms:
                problem = f"its mark was set back to {mark.reserved_until_ms} ms, below our {self.reserved_until_ms} ms"
            elif (mark.rev, mark.reserved_until_ms, mark.store) != (self.rev, self.reserved_until_ms, self._store_id):
                problem = f"its mark was changed (revision {mark.rev} at {mark.reserved_until_ms} ms)"
            else:
                return
        try:
            rev = max(self.rev, mark.rev if mark is not None else 0) + 1
            self._store.write_mark(self.worker_id, self.reserved_until_ms, self.token, self.holder, rev=rev)
            self.rev = rev
            problem += f"; restored it to {self.reserved_until_ms} ms"
        except OSError as exc:
            problem += f"; could not restore it ({exc.strerror or exc})"
        raise self._lost(problem)

    @property
    def _store_id(self) -> str:
        genesis = self._store.genesis
        return genesis.store_id if genesis is not None else ""

    def refresh(self) -> None:
        with self._store.region_lock():
            self.check()

    def _checked_write(self, mark_ms: int, released: bool = False) -> None:
        """Compare, then rename, under the region lock: a second holder cannot interleave.
        The floor file follows the mark: the holder's floor, or that it let go (the watermark's)."""
        try:
            with self._store.region_lock():
                self.check()
                self._store.write_mark(self.worker_id, mark_ms, self.token, self.holder, rev=self.rev + 1)
                self.rev += 1
                self._store.write_floor(self.worker_id, self.floor_ms, self.token, released=released)
        except OSError as exc:
            raise StateDirError(
                f"cannot persist the mark of worker ID {self.worker_id}: {exc.strerror or exc}"
            ) from None
        # The journal is written before the minter may use the new mark: it is never behind it.
        self._store.journal.note_mark(self.region, self.worker_id, self.rev, mark_ms)

    def extend(self, until_ms: int) -> None:
        self._checked_write(until_ms)
        self.reserved_until_ms = until_ms

    def release(self, last_used_ms: int) -> None:
        if self.released:
            return
        try:
            # Lowering is a write like any other: only while the worker ID is ours. It is
            # written even when nothing is lowered: it says the holder let go (the watermark's).
            lowered = min(max(last_used_ms, self.claimed_mark_ms), self.reserved_until_ms)
            self._checked_write(lowered, released=True)
            self.reserved_until_ms = lowered
        finally:
            self.abandon()

    def abandon(self) -> None:
        # The keeper (giving up for a stalled loop) and the worker may both get
        # here: the descriptor is taken once, so it is closed once.
        with self._abandon_lock:
            fd, self._fd = self._fd, -1
            witnesses, self._witnesses = self._witnesses, ()
            self.released = True
        if fd >= 0:
            os.close(fd)  # closing the descriptor drops the flock
        for witness in witnesses:
            witness.close()  # and the kernel's names: claimers may try it again

    def describe(self) -> dict:
        return {**super().describe(), "store": "embedded"}


class FileStore(Store):
    """Worker IDs of one region, leased by file locks under ``state_dir``."""

    def __init__(
        self,
        state_dir: str | os.PathLike,
        layout: Layout,
        region: int,
        *,
        journal: Journal,
        allow_unsafe_filesystem: bool = False,
        window_ms: int = 5000,
        max_ahead_ms: int = 1000,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.root = Path(state_dir)
        #: The wall clock a genesis is stamped with and a quarantine counted from (the minter's).
        self._wall_ns = wall_ns
        self.layout = layout
        self.region = layout.check_region(region)
        self.dir = self.root / "regions" / str(region)
        #: This node's reservation window: recorded in the genesis if it is the longest.
        self.window_ms = window_ms
        #: How far any node of this directory may mint ahead of the wall clock (``max_ahead_ms``,
        #: set alike on every node whatever its clock policy: a node after an hlc one waits too).
        self.max_ahead_ms = max_ahead_ms
        #: The store's genesis record, read (or written) by :meth:`check_layout`.
        self.genesis: Genesis | None = None
        #: Worker IDs this process found held by a live process (its witness taken): one of
        #: them later found without lock or mark was held with no record left of it.
        self._seen_held: set[int] = set()
        #: The first name of the kernel's witnesses: the state directory as its real path names it.
        self._witness_prefix = "snowfence:" + hashlib.sha256(os.fsencode(os.path.realpath(self.root))).hexdigest()[:24]
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            probe = self.dir / f".writable.{os.getpid()}.{threading.get_ident()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise StateDirError(f"state directory {self.root} is not usable: {exc.strerror or exc}") from None
        self._check_filesystem(allow_unsafe_filesystem)
        #: The witness outside the store's records: shared by the processes on this state directory
        #: (``open_store`` decides which, as it does for the etcd store).
        self.journal = journal

    def _check_filesystem(self, allowed: bool) -> None:
        fstype = filesystems.filesystem_type(self.dir)
        name = filesystems.UNSAFE_FILESYSTEMS.get(fstype) if fstype is not None else None
        if name is None:
            return
        what = (
            f"state directory {self.root} is on {name} (statfs type {fstype:#x}), where file locks are not "
            "known to be exclusive across processes and hosts, so two nodes could mint as one worker ID"
        )
        if not allowed:
            raise ConfigError(
                f"{what}; use a local filesystem (ext4, xfs, btrfs, tmpfs), or etcd mode, or set "
                "--allow-unsafe-filesystem true if this filesystem's flock is known to be exclusive"
            )
        event(log, "unsafe_filesystem_allowed", f"{what}; allowed by allow_unsafe_filesystem", level=logging.WARNING)

    # -- the layout and the genesis ------------------------------------------------------

    def _layout_path(self) -> Path:
        return layout_path(self.root)

    def read_genesis(self) -> Genesis | None:
        """The genesis record in layout.json; None if there is none. Raises StateDirError if unreadable."""
        return read_genesis(self.root)

    def _write_genesis(self, genesis: Genesis) -> None:
        try:
            write_atomic(self._layout_path(), orjson.dumps(genesis.to_dict(), option=orjson.OPT_INDENT_2))
        except OSError as exc:
            raise StateDirError(f"cannot record the genesis in {self._layout_path()}: {exc.strerror or exc}") from None

    def root_lock(self) -> RegionLock:
        """The state directory's flock, held around every change of the genesis record
        (taken after a region's lock, never before it)."""
        return RegionLock(self.root)

    def _mark_files(self) -> list[Path]:
        try:
            return sorted((self.root / "regions").glob("*/worker-*.mark"))
        except OSError:
            return []

    def check_layout(self, layout: Layout) -> None:
        """Read the genesis record, or write it on a new store; check the layout and the journal.

        A layout record that is gone while marks remain is never taken for a new
        store; nor one that is gone while the journal shows this store held IDs.
        """
        path = self._layout_path()
        recorded = self.read_genesis()
        if recorded is None:
            marks = self._mark_files()
            if marks:
                raise StateDirError(
                    f"{path} is missing, but {len(marks)} mark files remain (such as {marks[0]}): the layout those "
                    "IDs were minted with is unknown, so this node will not start; put the layout record back"
                )
            if self.journal.has_history:
                self.journal.check_genesis(None)  # raises: the store forgot what the journal saw
            # First start: record ours by an exclusive create of a complete file
            # (link(2) fails if the name exists), so of two nodes starting at once
            # exactly one records its genesis and the other reads it back.
            # A store that looks new may be a directory made again under a live node this
            # one cannot see (in another network namespace: the region's home and the
            # witnesses are out of its sight). Such a holder goes on minting until its
            # keeper finds its files gone, never above its mark, which it set at most a
            # reservation window ahead (the longest any node of this store may use; an hlc
            # node's run-ahead is below it): the new store mints nothing until that passed.
            now_unix_ms = self._wall_ns() // 1_000_000
            wait_ms = self.quarantine_ms()
            genesis = Genesis.create(
                layout,
                now_unix_ms=now_unix_ms,
                window_ms=self.window_ms,
                quarantine_until_ms=now_unix_ms - layout.epoch_ms + wait_ms,
            )
            tmp = _tmp_name(path)
            try:
                _write_synced(tmp, orjson.dumps(genesis.to_dict(), option=orjson.OPT_INDENT_2))
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    pass
                else:
                    event(
                        log,
                        "store_created",
                        f"new store {genesis.store_id} in {self.root}: it mints nothing for {wait_ms} ms, the "
                        "longest a node of a directory this one may have replaced could still mint",
                        store=genesis.store_id,
                        quarantine_ms=wait_ms,
                    )
                finally:
                    os.unlink(tmp)
                _fsync_dir(self.root)
            except OSError as exc:
                raise StateDirError(f"cannot record the layout in {path}: {exc.strerror or exc}") from None
            recorded = self.read_genesis()
            if recorded is None:
                raise StateDirError(f"{path} vanished right after it was recorded")
        if recorded.layout != layout:
            raise LayoutMismatch(
                f"state directory {self.root} was created for layout [{recorded.layout.describe()}] "
                f"but this node is configured for [{layout.describe()}]; IDs from two layouts "
                "could collide, so this node will not start"
            )
        if not recorded.upgraded or recorded.window_ms < self.window_ms:
            recorded = self._amend_genesis(lambda g: g)
        self.journal.check_genesis(recorded)
        self.genesis = recorded

    def _amend_genesis(self, change) -> Genesis:
        """Re-read the genesis under the root lock, upgrade an older release's record, raise
        the window to ours, apply ``change``, and write it back if anything changed."""
        with self.root_lock():
            genesis = self.read_genesis()
            if genesis is None:
                self.journal.check_genesis(None)  # the journal knew it: refused, and remembered
                raise StoreWentBack(f"{self._layout_path()} was removed while this node used it")
            before = genesis
            if not genesis.upgraded:
                genesis = legacy_genesis(genesis.layout, self._wall_ns() // 1_000_000, self._used_by_marks())
                event(
                    log,
                    "store_upgraded",
                    f"upgraded the layout record of {self.root} to a genesis record (store {genesis.store_id}); "
                    "nodes of older releases can no longer start on it",
                    level=logging.WARNING,
                    store=genesis.store_id,
                )
            if genesis.window_ms < self.window_ms:
                genesis = dataclasses.replace(genesis, window_ms=self.window_ms)
            genesis = change(genesis)
            if genesis != before:
                self._write_genesis(genesis)
            return genesis

    def accept_restore(self, reason: str, *, dry_run: bool = False) -> Genesis:
        """An operator's acknowledgement that this store went back (restored, wiped) on
        purpose: a new restore record in the genesis (written anew, with this layout, if it
        is gone), and a quarantine every claim of it waits out. Nodes that refused take it
        at their next claim, with their journal's floors; it is accepted once. With
        ``dry_run``, the genesis it would write, nothing written; ``found_genesis`` says
        whether a layout record was there."""
        now_unix_ms = self._wall_ns() // 1_000_000
        with self.root_lock():
            recorded = self.read_genesis()
            self.found_genesis = recorded is not None
            marks = [
                (int(path.parent.name), int(path.name[7:-5]), _mark_layout(path), f"the mark file {path}")
                for path in self._mark_files()
                if path.parent.name.isdigit() and path.name[7:-5].isdigit()
            ]
            genesis, used = restore_base(
                recorded,
                marks,
                self.layout,
                now_unix_ms=now_unix_ms,
                window_ms=self.window_ms,
                where=f"state directory {self.root}",
            )
            self.genesis = genesis  # quarantine_ms() counts its window
            genesis = genesis.restored(
                reason,
                now_unix_ms=now_unix_ms,
                window_ms=self.window_ms,
                used=used,
                quarantine_until_ms=now_unix_ms - self.layout.epoch_ms + self.quarantine_ms(),
            )
            if dry_run:
                #: The worker IDs of this region whose mark is below what this host's journal
                #: saw minted (an older copy put back): a sign the store went back.
                self.marks_behind = []
                for region, worker_id, _, _ in marks:
                    if region != self.region:
                        continue
                    try:
                        mark = self.mark(worker_id)
                    except (WorkerIdUnusable, StateDirError):
                        continue
                    if mark is not None and mark.reserved_until_ms < self.journal.floor_ms(region, worker_id):
                        self.marks_behind.append(worker_id)
                return genesis
            self._write_genesis(genesis)
        self.genesis = genesis
        return genesis

    def _used_by_marks(self) -> dict[int, set[int]]:
        """The worker IDs with a mark file, by region."""
        used: dict[int, set[int]] = {}
        for mark in self._mark_files():
            region, name = mark.parent.name, mark.name
            if region.isdigit() and name[7:-5].isdigit():
                used.setdefault(int(region), set()).add(int(name[7:-5]))
        return used

    def run_ahead_ms(self) -> int:
        """How far above the host's clock any node of this directory may have minted: the
        logical clock's bound, whatever this node's own clock policy (a node whose records
        were lost holds no reservation any more, and minted only up to its clock and this).
        Every node's reservation window is above its own bound (the configuration checks
        it), so the windows the genesis and the journal recorded bound it too; a store that
        looks new has neither (a journal that knew a store refuses one that looks new)."""
        return self.max_ahead_ms

    def quarantine_ms(self) -> int:
        """How far past the moment it is seen a worker ID of unknown state stays unused: the
        longest reservation window any node of this store used (one host: no clock skew), and
        no less than the logical clock's run-ahead."""
        windows = [self.window_ms, self.journal.window_ms, self.run_ahead_ms()]
        if self.genesis is not None:
            windows.append(self.genesis.window_ms)
        return max(windows)

    # -- marks ----------------------------------------------------------------------

    def candidates(self) -> Iterator[int]:
        self._refresh_genesis()
        return iter(range(self.layout.max_worker + 1))

    def _refresh_genesis(self) -> None:
        """Read the genesis again at each claim pass: a restore an operator accepted, or a
        record removed, is seen by a running node, not only by the next start."""
        if self.genesis is None:
            return  # check_layout reads it first
        recorded = self.read_genesis()
        if recorded is None:
            self.journal.check_genesis(None)
            raise StoreWentBack(f"{self._layout_path()} was removed while this node used it")
        if recorded != self.genesis:
            if recorded.layout != self.layout:
                raise StoreWentBack(f"{self._layout_path()} now names another layout")
            self.journal.check_genesis(recorded)
            self.genesis = recorded

    def paths(self, worker_id: int) -> tuple[Path, Path]:
        return self.dir / f"worker-{worker_id}.lock", self.dir / f"worker-{worker_id}.mark"

    def region_lock(self) -> RegionLock:
        """The region directory's flock, held around every read-compare-write of a mark."""
        return RegionLock(self.dir)

    def mark(self, worker_id: int) -> Mark | None:
        """The mark of a worker ID; None if it has no mark file.

        Raises WorkerIdUnusable if the mark cannot be trusted.
        """
        _, mark_path = self.paths(worker_id)
        try:
            raw = mark_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateDirError(f"cannot read mark file {mark_path}: {exc.strerror or exc}") from None
        try:
            doc = orjson.loads(raw)
            if not isinstance(doc, dict):
                raise ValueError("not an object")
            ms, token, holder = doc["reserved_until_ms"], doc["token"], doc.get("holder", "")
            for name, value in (("reserved_until_ms", ms), ("token", token)):
                if type(value) is not int or value < 0:
                    raise ValueError(f"{name} is {value!r}")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise WorkerIdUnusable(f"mark file {mark_path} cannot be parsed ({exc})") from None
        checksum = doc.get("checksum")
        if checksum is not None:
            fields = _MARK_FIELDS_V2 if "rev" in doc else _MARK_FIELDS
            if checksum != mark_checksum(doc) or set(doc) != {*fields, "checksum"}:
                raise WorkerIdUnusable(f"mark file {mark_path} fails its checksum")
        elif set(doc) != set(_MARK_FIELDS) or not isinstance(holder, str):
            # A mark from before marks carried checksums must at least be exactly what we wrote then.
            raise WorkerIdUnusable(f"mark file {mark_path} has no checksum and unexpected fields")
        if doc["reserved_until_unix_ms"] != ms + self.layout.epoch_ms:
            raise WorkerIdUnusable(f"mark file {mark_path} is inconsistent: its two times disagree")
        rev, store, layout = doc.get("rev", 0), doc.get("store"), doc.get("layout")
        if "rev" in doc and not (type(rev) is int and rev >= 0 and isinstance(store, str) and isinstance(layout, str)):
            raise WorkerIdUnusable(f"mark file {mark_path} cannot be parsed (rev, store or layout is damaged)")
        return Mark(ms, token, holder, checked=checksum is not None, rev=rev, store=store, layout=layout)

    def read_mark(self, worker_id: int) -> tuple[int, int]:
        """``(reserved_until_ms, token)`` of a worker ID; ``(0, 0)`` if it has no mark."""
        mark = self.mark(worker_id)
        return (0, 0) if mark is None else (mark.reserved_until_ms, mark.token)

    def write_mark(self, worker_id: int, mark_ms: int, token: int, holder: str, *, rev: int | None = None) -> None:
        """Write a mark durably; ``rev`` by default one above the mark there now (0 if none)."""
        _, mark_path = self.paths(worker_id)
        if rev is None:
            try:
                current = self.mark(worker_id)
            except WorkerIdUnusable:
                current = None
            rev = 0 if current is None else current.rev + 1
        doc = {
            "reserved_until_ms": mark_ms,
            "reserved_until_unix_ms": mark_ms + self.layout.epoch_ms,
            "token": token,
            "holder": holder,
            "rev": rev,
            "store": self.genesis.store_id if self.genesis is not None else "",
            "layout": self.layout.digest(),
        }
        doc["checksum"] = mark_checksum(doc)
        write_atomic(mark_path, orjson.dumps(doc))

    def recorded_tokens(self) -> dict[int, int]:
        """The highest token a worker recorded per worker ID, from the preference files."""
        return PreferenceFile.recorded_tokens(self.root, embedded_namespace(self.region))

    # -- claiming -------------------------------------------------------------------

    def _lock(self, lock_path: Path, *, create: bool) -> int | None:
        """An fd holding the flock of ``lock_path``; None if it is locked by another.

        Raises FileNotFoundError if it does not exist and ``create`` is false.
        """
        flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        try:
            fd = os.open(lock_path, flags, 0o644)
        except FileNotFoundError:
            if not create:
                raise
            raise StateDirError(f"cannot create lock file {lock_path}: its directory is gone") from None
        except OSError as exc:
            raise StateDirError(f"cannot open lock file {lock_path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            # Anything else (ENOLCK, EINTR, ...) leaves us without the lock: never an unlocked lease.
            raise StateDirError(f"cannot lock {lock_path}: {exc.strerror or exc}") from None
        return fd

    def unheld(self, up_to: int | None = None) -> int:
        """Counted by the kernel's witnesses, as claims decide "held": a worker ID whose
        witness name is free has no live holder. (A claimer that tries a name in the instant
        this holds it passes over that worker ID once, as for any held one, and tries again.)"""
        free = 0
        for worker_id in range(self.layout.max_worker + 1):
            if up_to is not None and free >= up_to:
                break
            if worker_id in self.passed_over:
                continue
            witnesses = self._bind_witnesses(worker_id)
            if witnesses is not None:
                for witness in witnesses:
                    witness.close()
                free += 1
        return free

    def witness_names(self, worker_id: int, region: int | None = None) -> tuple[str, str]:
        """The abstract socket names a holder of ``worker_id`` binds: the state directory by
        its real path (a directory removed and made again at that path is still this store
        to a claimer), and by its device and inode (a bind mount, a symlink or a container's
        own mount of it is the same directory, whatever its path)."""
        try:
            st = os.stat(self.root)
        except OSError as exc:
            raise StateDirError(f"state directory {self.root} is not usable: {exc.strerror or exc}") from None
        where = f"{self.region if region is None else region}:{worker_id}"
        return f"\0{self._witness_prefix}:{where}", f"\0snowfence:dir-{st.st_dev:x}-{st.st_ino:x}:{where}"

    def _bind_witnesses(self, worker_id: int, region: int | None = None) -> tuple[socket.socket, ...] | None:
        """The kernel's witnesses that this process holds ``worker_id`` (of ``region``: this
        store's by default); None if a live process holds either name (then a name bound
        before it is let go at once)."""
        bound: list[socket.socket] = []
        try:
            for name in self.witness_names(worker_id, region):
                try:
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                except OSError as exc:  # out of descriptors, say
                    raise StateDirError(
                        f"cannot open the holder's witness socket for worker ID {worker_id}: {exc}"
                    ) from None
                try:
                    sock.bind(name)
                except OSError as exc:
                    sock.close()
                    if exc.errno == errno.EADDRINUSE:
                        for witness in bound:
                            witness.close()
                        return None
                    raise StateDirError(
                        f"cannot bind the holder's witness socket for worker ID {worker_id}: {exc}"
                    ) from None
                bound.append(sock)
        except BaseException:
            for witness in bound:
                witness.close()
            raise
        return tuple(bound)

    def try_claim(
        self, worker_id: int, holder: str, max_mark_ms: int | None, now_ms: int | None = None
    ) -> FileLease | None:
        witnesses = self._bind_witnesses(worker_id)
        if witnesses is None:
            self._seen_held.add(worker_id)
            return None  # a live process holds it, whatever the files say
        try:
            lease = self._claim(worker_id, holder, max_mark_ms, now_ms, witnesses)
        except BaseException:
            for witness in witnesses:
                witness.close()
            raise
        if lease is None:
            for witness in witnesses:
                witness.close()
        return lease

    def _unknown_floor(self, worker_id: int, now_ms: int | None, why: str) -> int:
        """The floor of a worker ID whose state is unknown: a quarantine from now."""
        now_ms = self._wall_ns() // 1_000_000 - self.layout.epoch_ms if now_ms is None else now_ms
        floor = now_ms + self.quarantine_ms()
        event(
            log,
            "worker_id_unknown",
            f"worker ID {worker_id}: {why}; its claim mints nothing for {self.quarantine_ms()} ms (quarantine)",
            level=logging.WARNING,
            worker_id=worker_id,
            quarantine_ms=self.quarantine_ms(),
        )
        return floor

    def _first_mark(self, worker_id: int, holder: str, now_ms: int | None) -> None:
        """Write the mark of a worker ID that has neither lock nor mark (under the region lock).

        Never used, if the genesis says so; then it is marked used first, so a
        crash before the mark is written leaves it unknown, never fresh.
        """
        _, mark_path = self.paths(worker_id)
        floor = self.recorded_tokens().get(worker_id, 0)
        if floor:
            raise WorkerIdUnusable(
                f"worker ID {worker_id} has neither lock nor mark, but token {floor} was recorded "
                "for it: its state was deleted"
            )
        used_before = []

        def mark_used(genesis: Genesis) -> Genesis:
            used_before.append(genesis.is_used(self.region, worker_id))
            return genesis.using(self.region, worker_id)

        genesis = self.genesis = self._amend_genesis(mark_used)
        known_ms = self.journal.floor_ms(self.region, worker_id)
        if used_before[0] or known_ms >= 0:
            witness = "genesis record says it was used" if used_before[0] else "journal saw it"
            why = f"its mark is gone, but the {witness}"
            mark_ms = max(known_ms, self._unknown_floor(worker_id, now_ms, why))
        elif worker_id in self._seen_held:
            # A live process held it and the store kept no record of it (wiped under its
            # holder): that holder let go since (its witness is free), so it minted at most
            # the logical clock's run-ahead above now, which may be past the new store's wait.
            now_ms = self._wall_ns() // 1_000_000 - self.layout.epoch_ms if now_ms is None else now_ms
            mark_ms = max(genesis.quarantine_until_ms, now_ms + self.run_ahead_ms())
            event(
                log,
                "worker_id_unknown",
                f"worker ID {worker_id}: a live process held it with no lock or mark left in the store; its claim "
                f"mints nothing for {self.run_ahead_ms()} ms (the logical clock's run-ahead)",
                level=logging.WARNING,
                worker_id=worker_id,
                quarantine_ms=self.run_ahead_ms(),
            )
        else:
            mark_ms = genesis.quarantine_until_ms
        # Its mark comes before its lock file, so a crash before the lock file exists
        # leaves a mark without a lock, which is usable.
        try:
            self.write_mark(worker_id, mark_ms, 0, holder)
        except OSError as exc:
            raise StateDirError(f"cannot write mark file {mark_path}: {exc.strerror or exc}") from None

    def _claim(
        self,
        worker_id: int,
        holder: str,
        max_mark_ms: int | None,
        now_ms: int | None,
        witnesses: tuple[socket.socket, ...],
    ) -> FileLease | None:
        lock_path, mark_path = self.paths(worker_id)
        with self.region_lock():
            try:
                fd = self._lock(lock_path, create=False)
            except FileNotFoundError:
                fd = None
                if self.mark(worker_id) is None:
                    self._first_mark(worker_id, holder, now_ms)
                # The mark exists (its lock file was deleted, or never created).
                fd = self._lock(lock_path, create=True)
            if fd is None:
                return None
            try:
                st, at_path = os.fstat(fd), os.stat(lock_path)
                if (st.st_dev, st.st_ino) != (at_path.st_dev, at_path.st_ino):
                    raise StateDirError(f"lock file {lock_path} was replaced while claiming")
                mark = self.mark(worker_id)
                if mark is None:
                    raise WorkerIdUnusable(
                        f"worker ID {worker_id} has a lock file without a mark: it was used, but "
                        "how far ahead is unknown"
                    )
                floor = self.recorded_tokens().get(worker_id, 0)
                if mark.token < floor:
                    raise WorkerIdUnusable(
                        f"mark of worker ID {worker_id} carries token {mark.token}, below token {floor} "
                        "recorded when it was claimed: the mark was rolled back"
                    )
                if mark.layout is not None and mark.layout != self.layout.digest():
                    raise WorkerIdUnusable(
                        f"mark of worker ID {worker_id} was written under another layout ({mark.layout}): "
                        "its milliseconds are not ours to compare"
                    )
                self.journal.check_mark(self.region, worker_id, mark.rev, mark.reserved_until_ms)
                if max_mark_ms is not None and mark.reserved_until_ms > max_mark_ms:
                    os.close(fd)
                    return None
                mark_ms = max(
                    mark.reserved_until_ms,
                    self.journal.floor_ms(self.region, worker_id),
                    self.genesis.quarantine_until_ms,
                )
                if mark.store is None and not self.genesis.legacy:
                    mark_ms = max(mark_ms, self._unknown_floor(worker_id, now_ms, "its mark has no store ID"))
                elif mark.store is not None and mark.store != self.genesis.store_id:
                    why = f"its mark belongs to store {mark.store or '(none)'}, not this one"
                    mark_ms = max(mark_ms, self._unknown_floor(worker_id, now_ms, why))
                token, rev = mark.token + 1, mark.rev + 1
                self.write_mark(worker_id, mark_ms, token, holder, rev=rev)  # rewritten with a checksum
                self.journal.note_mark(self.region, worker_id, rev, mark_ms)
                # A watermark already answered (read under the region lock, which every
                # watermark round takes after raising the record): the minter starts above it.
                watermark_ms = self._watermark_floor(worker_id)
                self.write_floor(worker_id, max(mark_ms + 1, watermark_ms), token)
            except OSError as exc:
                os.close(fd)
                raise StateDirError(f"cannot claim worker ID {worker_id}: {exc.strerror or exc}") from None
            except BaseException:
                os.close(fd)
                raise
        lease = FileLease(
            self, fd, (st.st_dev, st.st_ino), worker_id, token, mark_ms, holder, rev=rev, witnesses=witnesses
        )
        lease.watermark_ms = watermark_ms
        lease.floor_ms = max(lease.floor_ms, watermark_ms)
        return lease

    # -- the watermark (see watermark.py) ------------------------------------------------

    def _watermark_path(self) -> Path:
        return self.root / "watermark"

    def read_watermark(self) -> int:
        """The watermark record's millisecond (0: none). Raises WatermarkRecordUnreadable."""
        path = self._watermark_path()
        try:
            return watermark.decode(path.read_bytes())
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise StateDirError(f"cannot read {path}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise WatermarkRecordUnreadable(f"the watermark record {path} is unreadable ({exc})") from None

    def _watermark_floor(self, worker_id: int) -> int:
        """What a claim must not mint below for the watermark: the record's millisecond, or,
        for a record that is not ours to read, a quarantine from now (it may hide any
        watermark already answered)."""
        try:
            record = self.read_watermark()
        except WatermarkRecordUnreadable as exc:
            return self._unknown_floor(worker_id, None, str(exc))
        # The highest this node's journal saw or promised: a state directory wiped (its record
        # with it) is not a watermark forgotten.
        self.journal.note_watermark(record)
        return max(record, self.journal.watermark_ms)

    def _floor_path(self, worker_id: int, region_dir: Path | None = None) -> Path:
        return (self.dir if region_dir is None else region_dir) / f"worker-{worker_id}.floor"

    def write_floor(self, worker_id: int, floor_ms: int, token: int, *, released: bool = False) -> None:
        """What the holder of ``worker_id`` never mints below, or that it let go. Renamed into
        place but not fsynced: after a crash of the host no holder is left to keep it."""
        path = self._floor_path(worker_id)
        tmp = _tmp_name(path)
        tmp.write_bytes(orjson.dumps({"floor_ms": floor_ms, "token": token, "released": released}))
        os.replace(tmp, path)

    @staticmethod
    def _bound_names() -> set[str] | None:
        """Every snowfence witness name bound in this network namespace, read at once from
        the kernel's table of unix sockets; None where it cannot be read (then each name is
        tried by binding it). Reading the table costs a round one file, not two binds per
        worker ID (a round runs on the broker's process, beside its loop)."""
        try:
            text = Path("/proc/net/unix").read_text(errors="replace")
        except OSError:
            return None
        names = set()
        for line in text.splitlines()[1:]:
            parts = line.split(None, 7)
            if len(parts) == 8 and parts[7].startswith("@snowfence:"):
                names.add("\0" + parts[7][1:])
        return names

    def _region_floors(self, region: int, region_dir: Path) -> list[watermark.Floor]:
        """Every worker ID of a region as the watermark reads it (under the region's lock):
        held if the kernel's witness is taken; its reservation from its mark, its floor from
        its floor file (nothing known of either: none)."""
        floors = []
        bound = self._bound_names()
        try:
            present = {entry.name for entry in os.scandir(region_dir)}
        except OSError:
            present = None  # read each file, as it comes
        if self.layout.max_worker < WITNESS_PROBE_LIMIT:
            worker_ids = range(self.layout.max_worker + 1)  # every one: a holder's files may be gone
        else:  # too many to probe each second: those with files (a holder wiped out fences within a renewal)
            worker_ids = sorted(
                {int(p.stem.split("-")[1]) for p in region_dir.glob("worker-*.*") if p.stem[7:].isdigit()}
            )
        for worker_id in worker_ids:
            if bound is not None:
                held = not bound.isdisjoint(self.witness_names(worker_id, region))
            else:
                witnesses = self._bind_witnesses(worker_id, region)
                held = witnesses is None
                for witness in witnesses or ():
                    witness.close()
            mark_path = region_dir / f"worker-{worker_id}.mark"
            floor_path = self._floor_path(worker_id, region_dir)
            if present is not None and not held and mark_path.name not in present and floor_path.name not in present:
                continue  # never used here, or its state removed with no live holder
            try:
                reserved = orjson.loads(mark_path.read_bytes())["reserved_until_ms"]
                if type(reserved) is not int:
                    raise TypeError
                has_mark = True
            except FileNotFoundError:
                reserved, has_mark = -1, False
            except (OSError, ValueError, KeyError, TypeError):
                reserved, has_mark = self.layout.max_ms, True
            try:
                doc = orjson.loads(floor_path.read_bytes())
                floor_ms, released = doc["floor_ms"], doc.get("released") is True
                if type(floor_ms) is not int:
                    raise TypeError
            except FileNotFoundError:
                floor_ms, released = None, False
            except (OSError, ValueError, KeyError, TypeError):
                floor_ms, released = None, False
            if not held and not has_mark and floor_ms is None:
                continue  # never used here, or its state removed with no live holder
            floors.append(watermark.Floor(region, worker_id, floor_ms, reserved, held=held, released=released))
        return floors

    def _region_dirs(self) -> list[tuple[int, Path]]:
        out = []
        try:
            for path in (self.root / "regions").iterdir():
                if path.name.isdigit() and 0 <= int(path.name) <= self.layout.max_region:
                    out.append((int(path.name), path))
        except OSError:
            pass
        return sorted(out)

    def watermark_round(self, now_ms: int, promised: int) -> int:
        """One round (see watermark.py): read every worker ID's floor; raise the record to
        the lowest they allow (under the state directory's lock, durably); then read them
        again under each region's lock, which every claim takes to read the record. One host
        has one clock: no skew. Returns the highest millisecond now promised."""
        if not watermark.settled(self.read_genesis(), self.layout, now_ms, 0):
            return promised
        regions = self._region_dirs()
        floors = [f for region, path in regions for f in self._region_floors(region, path)]
        self.watermark_low = watermark.lowest(floors, now_ms, 0)
        wanted = watermark.candidate(floors, now_ms, 0)
        if wanted <= promised:
            return promised
        with self.root_lock():
            if self.read_watermark() < wanted:
                write_atomic(self._watermark_path(), watermark.encode(wanted))
        floors = []
        for region, path in self._region_dirs():
            with RegionLock(path):
                floors.extend(self._region_floors(region, path))
        self.watermark_low = watermark.lowest(floors, now_ms, 0)
        if not watermark.holds(wanted, floors, now_ms, 0):
            return promised
        self.journal.note_watermark(wanted)  # before it is answered: this node's claims never forget it
        return wanted

    def describe(self) -> dict:
        return {"store": "embedded", "state_dir": str(self.root)}
