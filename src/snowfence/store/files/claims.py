"""Marks and claims in the state directory (:class:`Claims`, a part of :class:`~.store.FileStore`):
a mark read and checked, written under the region's lock, a worker ID's lock file taken, and
a claim's floor (the mark, the journal, the genesis, a quarantine for a worker ID of unknown state).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import orjson

from ...errors import StateDirError, WorkerIdUnusable
from ...logs import event
from ..durable import write_atomic
from ..genesis import Genesis
from ..preference import PreferenceFile, embedded_namespace
from .lease import FileLease
from .locks import RegionLock
from .records import _MARK_FIELDS, _MARK_FIELDS_V2, Mark, mark_checksum

log = logging.getLogger("snowfence.embedded")


class Claims:
    """The marks, the lock files and claims, for :class:`~.store.FileStore`."""

    def candidates(self) -> Iterator[int]:
        self._refresh_genesis()
        return iter(range(self.layout.max_worker + 1))

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
