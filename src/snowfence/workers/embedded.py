"""Embedded mode: worker IDs by file lock, the high-water mark in a file.

Layout of the state directory::

    layout.json                        the ID layout this directory serves
    regions/<r>/worker-<w>.lock        flock(2)ed by the worker holding worker ID w
    regions/<r>/worker-<w>.mark        {"reserved_until_ms": ..., "token": ...}

The kernel releases a flock when its process dies, so a crashed worker's ID
frees at once; its mark stays and makes the next owner wait until the wall
clock has passed it. Marks are written to a temporary file, fsynced, renamed
over the old one, and the directory fsynced, before the minter may use them.
Lock files are never deleted: a lock on an unlinked file would lock nothing.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import orjson

from ..errors import LayoutMismatch, StateDirError
from ..ids import Layout
from .lease import Lease, Store


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` durably: temp file, fsync, rename, fsync dir."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class FileLease(Lease):
    """A worker ID held by an flock on its lock file."""

    def __init__(self, store: FileStore, fd: int, worker_id: int, token: int, mark_ms: int, holder: str) -> None:
        super().__init__(store.region, worker_id, token, mark_ms)
        self._store = store
        self._fd = fd
        self.holder = holder

    def _write_mark(self, mark_ms: int) -> None:
        self._store.write_mark(self.worker_id, mark_ms, self.token, self.holder)

    def extend(self, until_ms: int) -> None:
        try:
            self._write_mark(until_ms)
        except OSError as exc:
            raise StateDirError(f"cannot persist the mark of worker ID {self.worker_id}: {exc}") from None
        self.reserved_until_ms = until_ms

    def release(self, last_used_ms: int) -> None:
        if self.released:
            return
        try:
            if last_used_ms < self.reserved_until_ms:
                self._write_mark(max(last_used_ms, self.claimed_mark_ms))
                self.reserved_until_ms = max(last_used_ms, self.claimed_mark_ms)
        finally:
            self.abandon()

    def abandon(self) -> None:
        if not self.released:
            self.released = True
            os.close(self._fd)  # closing the descriptor drops the flock

    def describe(self) -> dict:
        return {**super().describe(), "store": "embedded"}


class FileStore(Store):
    """Worker IDs of one region, leased by file locks under ``state_dir``."""

    def __init__(self, state_dir: str | os.PathLike, layout: Layout, region: int) -> None:
        self.root = Path(state_dir)
        self.layout = layout
        self.region = layout.check_region(region)
        self.dir = self.root / "regions" / str(region)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            probe = self.dir / f".writable.{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise StateDirError(f"state directory {self.root} is not usable: {exc.strerror or exc}") from None

    def check_layout(self, layout: Layout) -> None:
        path = self.root / "layout.json"
        try:
            recorded = Layout.from_dict(orjson.loads(path.read_bytes()))
        except FileNotFoundError:
            recorded = None
        except (OSError, orjson.JSONDecodeError, TypeError, ValueError) as exc:
            raise StateDirError(f"{path} is unreadable: {exc}") from None
        if recorded is None:
            # First start: record ours. Two workers may race here; both write the
            # same layout, and a different one is caught by the check below.
            write_atomic(path, orjson.dumps(layout.to_dict(), option=orjson.OPT_INDENT_2))
            recorded = Layout.from_dict(orjson.loads(path.read_bytes()))
        if recorded != layout:
            raise LayoutMismatch(
                f"state directory {self.root} was created for layout [{recorded.describe()}] "
                f"but this node is configured for [{layout.describe()}]; IDs from two layouts "
                "could collide, so this node will not start"
            )

    def candidates(self) -> Iterator[int]:
        return iter(range(self.layout.max_worker + 1))

    def _paths(self, worker_id: int) -> tuple[Path, Path]:
        return self.dir / f"worker-{worker_id}.lock", self.dir / f"worker-{worker_id}.mark"

    def read_mark(self, worker_id: int) -> tuple[int, int]:
        """``(reserved_until_ms, token)`` of a worker ID; ``(0, 0)`` if never used."""
        _, mark_path = self._paths(worker_id)
        try:
            data = orjson.loads(mark_path.read_bytes())
            return int(data["reserved_until_ms"]), int(data["token"])
        except FileNotFoundError:
            return 0, 0
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            # A mark we cannot read could hide a later timestamp; never guess.
            raise StateDirError(
                f"mark file {mark_path} is unreadable ({exc}); refusing to use worker ID {worker_id}"
            ) from None

    def write_mark(self, worker_id: int, mark_ms: int, token: int, holder: str) -> None:
        _, mark_path = self._paths(worker_id)
        doc = {
            "reserved_until_ms": mark_ms,
            "reserved_until_unix_ms": mark_ms + self.layout.epoch_ms,
            "token": token,
            "holder": holder,
        }
        write_atomic(mark_path, orjson.dumps(doc))

    def try_claim(self, worker_id: int, holder: str, max_mark_ms: int | None) -> FileLease | None:
        lock_path, _ = self._paths(worker_id)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            raise
        try:
            mark_ms, token = self.read_mark(worker_id)
            if max_mark_ms is not None and mark_ms > max_mark_ms:
                os.close(fd)
                return None
            token += 1
            self.write_mark(worker_id, mark_ms, token, holder)
        except BaseException:
            os.close(fd)
            raise
        return FileLease(self, fd, worker_id, token, mark_ms, holder)

    def describe(self) -> dict:
        return {"store": "embedded", "state_dir": str(self.root)}
