"""The region directory's flock (:class:`RegionLock`), held around every read-compare-write
of a mark, and how long a claim or an extension waits for it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

from ...errors import StateDirBusy, StateDirError

#: How long a claim or an extension waits for another process's mark write.
REGION_LOCK_WAIT_S = 0.5


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
