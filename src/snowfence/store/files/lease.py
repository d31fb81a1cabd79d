"""A worker ID held by a file lock (:class:`FileLease`): before every mark write and on the
keeper's timer, the holder checks that its lock file and its mark are still its own.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import threading
from pathlib import Path

from ...errors import LeaseLost, StateDirError, WorkerIdUnusable
from ..base import Lease, Store, exclusivity_lost


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


class FileLease(Lease):
    """A worker ID held by an flock on its lock file."""

    def __init__(
        self,
        store: Store,  # a FileStore (see .store, which builds its leases through .claims)
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
