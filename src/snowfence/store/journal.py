"""The node's journal: what it saw its store hold, kept outside that store.

A store is its own only witness as long as it forgets nothing. An operator's
``etcdctl del --prefix``, an etcd restored from an older snapshot, a state
directory wiped or put back from a backup: each makes "no mark" or an old mark
look like "never used" or "used long ago". So every node keeps a second witness,
per store it uses (an etcd cluster's key prefix, or an embedded state
directory), in its own state directory::

    epochs   per identity of the store (genesis store ID, etcd cluster ID, the
             restore an operator last accepted): the highest etcd revision seen,
             and per worker ID the newest mark seen or written (its revision, etcd:
             the key's mod_revision, embedded: the mark's own ``rev``, and its
             millisecond), and its peak: the highest millisecond seen since this
             node last wrote it (a claim mints above it, whatever the store says)
    acks     the accepted restores (``snowfence accept-restore``) this node took
    window_ms the longest reservation window any genesis of this store recorded
    problem  what went back, once seen: claims are refused until a restore is
             accepted (a store that went back and then moved on must not pass)

Against it, every record read from the store is checked: a genesis gone while
the journal has history, another store ID or cluster ID, a revision below the
journal's, a mark whose revision is below the one the journal saw. Each is
refused by name (:class:`~snowfence.errors.StoreWentBack`), and stays refused
until an operator accepts the restore; then claims take the journal's
millisecond floors from before it.

A read is compared only with what the journal held before the read was sent
(:meth:`Journal.known`), never with what the node's other processes and threads
recorded while it was on its way: their later revisions are merged in
meanwhile, and a read sent before them may rightly return less. etcd's reads
are linearizable (the client never asks for serializable ones), so a read's
revision is at least every revision committed before it was sent, on whichever
member serves it: only a restore makes it lower than one known then.

One file, ``<journal_dir>/<name>.json`` (by default ``<state_dir>/journal/``;
better on another disk: a wiped or restored state directory then leaves it),
for all processes of the nodes that share it: each keeps the whole journal in memory and
writes it back merged with the file (read, merge, replace, fsync, under an
flock of ``<name>.lock``), so a journal removed under live processes comes back
at their next write.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path

import orjson

from ..errors import StateDirError, StoreWentBack, WorkerIdUnusable
from ..logs import event
from .durable import write_atomic
from .genesis import Genesis

log = logging.getLogger("snowfence.journal")

VERSION = 1


def epoch_key(store_id: str, cluster_id: int | None, restore_id: str | None) -> str:
    return f"{store_id}|{'' if cluster_id is None else cluster_id}|{restore_id or ''}"


def _mark_key(region: int, worker_id: int) -> str:
    return f"{region}/{worker_id}"


@dataclasses.dataclass(frozen=True)
class Known:
    """What a journal held at one moment (:meth:`Journal.known`): what a read sent after
    it may be compared with. A revision below one known then can only be a store that
    went back; one below a revision recorded since, by another process or thread of the
    node, is a read that was on its way while that was written."""

    #: epoch key -> the highest etcd revision known
    revisions: Mapping[str, int]
    #: epoch key -> mark key -> the newest mark revision known
    marks: Mapping[str, Mapping[str, int]]

    @property
    def has_history(self) -> bool:
        return bool(self.revisions)


class Journal:
    """One node's witness of one store. Thread-safe: the loop and the keepers share it."""

    def __init__(self, directory: str | os.PathLike, name: str, *, marks_store_wide: bool = False) -> None:
        self.path = Path(directory) / f"{name}.json"
        #: Whether a mark that went back means the whole store did (etcd: only a restore can
        #: give a key an older revision) or only that worker ID (a file put back).
        self.marks_store_wide = marks_store_wide
        self._lock = threading.Lock()
        #: epoch key -> {"revision": int, "marks": {"r/w": [rev, ms, peak_ms, own]}, "seq": int (order first seen)}
        self.epochs: dict[str, dict] = {}
        self.acks: set[str] = set()
        self.window_ms = 0
        #: The highest watermark record this node saw or promised (ms since the epoch): its
        #: claims start above it even when the store's record is gone (a wiped directory).
        self.watermark_ms = 0
        #: What went back, once seen; cleared only by accepting a restore.
        self.problem: str | None = None
        #: The latest epoch when the problem was seen: an epoch begun after it (a restore
        #: accepted, by this process or another that shares the file) clears it.
        self.problem_seq = 0
        #: The epoch the store is in now (set by :meth:`check_genesis`).
        self.current: str | None = None
        self._dirty = False
        #: Set when the file could not be read: it is left as it is.
        self._damaged: str | None = None
        self.load()

    # -- the file ------------------------------------------------------------------------

    def _read(self) -> dict | None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateDirError(
                f"the journal directory {self.path.parent} is not usable: cannot read {self.path.name}: "
                f"{exc.strerror or exc}"
            ) from None
        try:
            doc = orjson.loads(raw)
            if not isinstance(doc, dict) or doc.get("version") != VERSION:
                raise ValueError("not a journal of this version")
            epochs = doc["epochs"]
            if not isinstance(epochs, dict):
                raise ValueError("epochs is not an object")
            for key, epoch in epochs.items():
                revision, marks, seq = epoch["revision"], epoch["marks"], epoch["seq"]
                if type(revision) is not int or type(seq) is not int or not isinstance(marks, dict):
                    raise ValueError(f"epoch {key} is damaged")
                for mark in marks.values():
                    if not (isinstance(mark, list) and len(mark) == 4 and all(type(v) is int for v in mark)):
                        raise ValueError(f"a mark of epoch {key} is damaged")
            if not isinstance(doc["acks"], list) or not all(isinstance(a, str) for a in doc["acks"]):
                raise ValueError("acks is damaged")
            if type(doc["window_ms"]) is not int or not isinstance(doc["problem"], str | None):
                raise ValueError("window_ms or problem is damaged")
            if type(doc.get("problem_seq", 0)) is not int:
                raise ValueError("problem_seq is damaged")
            if type(doc.get("watermark_ms", 0)) is not int:
                raise ValueError("watermark_ms is damaged")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            # The witness is damaged: claims are refused (never read as "no history")
            # until an operator repairs or removes the file.
            raise StoreWentBack(
                f"the journal {self.path} is unreadable ({exc}): this node cannot tell what its store held; "
                "put a good copy back, or remove it to start without this node's witness"
            ) from None
        return doc

    def _merge(self, doc: dict) -> None:
        for key, theirs in doc["epochs"].items():
            ours = self.epochs.get(key)
            if ours is None:
                self.epochs[key] = {**theirs, "marks": dict(theirs["marks"])}
                continue
            ours["revision"] = max(ours["revision"], theirs["revision"])
            ours["seq"] = min(ours["seq"], theirs["seq"])
            for mkey, mark in theirs["marks"].items():
                mine = ours["marks"].get(mkey)
                if mine is None:
                    ours["marks"][mkey] = list(mark)
                    continue
                newer, older = (mark, mine) if mark[0] > mine[0] else (mine, mark)
                # A peak outlives newer sightings; only this node's own newer write resets it.
                peak = newer[2] if newer[3] and newer[0] > older[0] else max(newer[2], older[2])
                ours["marks"][mkey] = [newer[0], newer[1], peak, newer[3]]
        self.acks |= set(doc["acks"])
        self.window_ms = max(self.window_ms, doc["window_ms"])
        self.watermark_ms = max(self.watermark_ms, doc.get("watermark_ms", 0))
        if doc["problem"] and doc.get("problem_seq", 0) >= self.problem_seq:
            self.problem, self.problem_seq = doc["problem"], doc.get("problem_seq", 0)
        self._clear_accepted()

    def _latest_seq(self) -> int:
        return max((e["seq"] for e in self.epochs.values()), default=0)

    def _clear_accepted(self) -> None:
        """A problem seen before the latest epoch began was accepted: it no longer refuses."""
        if self.problem is not None and not self._damaged and self.problem_seq < self._latest_seq():
            self.problem = None

    def load(self) -> None:
        """Merge the file into memory. A damaged file refuses claims (never read as "no history"),
        and is never written over, until an operator repairs or removes it."""
        with self._lock:
            try:
                doc = self._read()
            except StoreWentBack as exc:
                self.problem = self._damaged = str(exc)
                event(log, "journal_unreadable", self.problem, level=logging.ERROR, journal=str(self.path))
                return
            if doc is not None:
                self._merge(doc)

    def _save(self) -> None:
        if self._damaged:
            raise StoreWentBack(self._damaged)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StateDirError(f"cannot write the journal {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            doc = self._read()
            if doc is not None:
                self._merge(doc)
            write_atomic(self.path, orjson.dumps(self._doc()))
            self._dirty = False
        except OSError as exc:
            raise StateDirError(f"cannot write the journal {self.path}: {exc.strerror or exc}") from None
        finally:
            os.close(fd)

    def _doc(self) -> dict:
        return {
            "version": VERSION,
            "epochs": self.epochs,
            "acks": sorted(self.acks),
            "window_ms": self.window_ms,
            "problem": self.problem,
            "problem_seq": self.problem_seq,
            "watermark_ms": self.watermark_ms,
        }

    def save_if_changed(self) -> None:
        with self._lock:
            if self._dirty:
                self._save()

    # -- what the node saw -----------------------------------------------------------------

    @property
    def has_history(self) -> bool:
        return bool(self.epochs)

    def known(self) -> Known:
        """What the journal holds now: take it before sending a read, and check the read
        against it (``known=``), not against what was merged in while it was on its way."""
        with self._lock:
            return self._known()

    def _known(self) -> Known:
        return Known(
            revisions={key: epoch["revision"] for key, epoch in self.epochs.items()},
            marks={key: {m: mark[0] for m, mark in epoch["marks"].items()} for key, epoch in self.epochs.items()},
        )

    def _went_back(self, what: str) -> StoreWentBack:
        """Record what went back (sticky, persisted) and the error that refuses claims."""
        if self.problem is None:
            self.problem, self.problem_seq = what, self._latest_seq()
            self._dirty = True
            event(log, "store_went_back", what, level=logging.ERROR, journal=str(self.path))
            with contextlib.suppress(StateDirError):
                self._save()
        return StoreWentBack(self.problem)

    def went_back(self, what: str) -> None:
        """Record evidence that the store went back (a holder found its own mark older)."""
        with self._lock:
            self._went_back(what)

    def check_genesis(
        self,
        genesis: Genesis | None,
        cluster_id: int | None = None,
        revision: int | None = None,
        known: Known | None = None,
    ) -> None:
        """Compare the store's genesis (None: it has none) with what this node saw.

        Accepts a restore an operator accepted since (a genesis whose ``restore``
        this node has not taken yet); raises StoreWentBack for anything that went
        back, and from then on until a restore is accepted.

        ``known``: what the journal held before the read was sent (:meth:`known`);
        the revision and a missing genesis are compared with it. None: the read
        was sent after everything the journal holds now (a file store reads under
        the locks that order it after every write the journal holds).
        """
        with self._lock:
            if known is None:
                known = self._known()
            if genesis is not None and genesis.store_id is not None:
                self.window_ms = max(self.window_ms, genesis.window_ms)
                restore_id = genesis.restore.id if genesis.restore else None
                key = epoch_key(genesis.store_id, cluster_id, restore_id)
                if key not in self.epochs and restore_id is not None and restore_id not in self.acks:
                    # An operator accepted the store as it is: start a new epoch of it.
                    self.acks.add(restore_id)
                    self._new_epoch(key, revision)
                    if self.problem is not None:
                        event(
                            log,
                            "restore_accepted",
                            f"restore {restore_id} accepted ({genesis.restore.reason or 'no reason given'}): "
                            f"claims take this node's floors and wait out the quarantine; it had refused: "
                            f"{self.problem}",
                            level=logging.WARNING,
                            restore=restore_id,
                        )
                    self.problem = None
                    self._save()
            if self.problem is not None:
                raise StoreWentBack(self.problem)
            if genesis is None or genesis.store_id is None:
                # Gone from a read sent after this node saw the store: deleted. A read sent
                # before another process of the node recorded it (a new store, created by
                # that process meanwhile) proves nothing.
                if known.has_history:
                    raise self._went_back(
                        f"the store's layout record is gone, but this node's journal {self.path} shows it held "
                        "worker IDs: its keys or files were deleted (or it is another, empty store); claims "
                        "are refused until an operator runs `snowfence accept-restore`"
                    )
                self.current = None
                return
            key = epoch_key(genesis.store_id, cluster_id, genesis.restore.id if genesis.restore else None)
            epoch = self.epochs.get(key)
            if epoch is None:
                if self.epochs:
                    known = self._latest()
                    raise self._went_back(
                        f"the store is not the one this node used: it is store {genesis.store_id}"
                        + (f" on etcd cluster {cluster_id:x}" if cluster_id is not None else "")
                        + f", where this node's journal {self.path} knew {_describe(known)}; it was replaced, "
                        "or restored from a backup; claims are refused until an operator runs "
                        "`snowfence accept-restore`"
                    )
                if genesis.restore is not None:
                    self.acks.add(genesis.restore.id)
                self._new_epoch(key, revision)
                self._save()
                return
            self.current = key
            if revision is not None:
                before = known.revisions.get(key)
                if before is not None and revision < before:
                    raise self._went_back(
                        f"etcd's revision went back from {before} (seen by this node) to {revision}: "
                        "etcd was restored from an older snapshot; claims are refused until an operator runs "
                        "`snowfence accept-restore`"
                    )
                if revision > epoch["revision"]:
                    epoch["revision"] = revision
                    self._dirty = True

    def _new_epoch(self, key: str, revision: int | None) -> None:
        seq = 1 + max((e["seq"] for e in self.epochs.values()), default=0)
        self.epochs[key] = {"revision": revision or 0, "marks": {}, "seq": seq}
        self.current = key
        self._dirty = True

    def _latest(self) -> str:
        return max(self.epochs, key=lambda k: self.epochs[k]["seq"])

    def check_mark(self, region: int, worker_id: int, rev: int, ms: int | None, known: Known | None = None) -> None:
        """Compare a worker ID's mark in the store with the journal's, and note it if it is newer.

        Raises StoreWentBack if it went back: a lower revision than the journal
        saw before the read was sent (``known``, as for :meth:`check_genesis`: a
        copy put back, a restored store), or a revision the journal saw with
        another millisecond (in any order: one revision holds one value). A mark
        that is gone, or set lower at a newer revision, is not refused: the
        journal's floor (:meth:`floor_ms`) stands in."""
        with self._lock:
            if self.problem is not None:
                raise StoreWentBack(self.problem)
            epoch = self.epochs.get(self.current) if self.current else None
            if epoch is None:
                return
            mkey = _mark_key(region, worker_id)
            seen = epoch["marks"].get(mkey)
            if known is None:
                before = seen[0] if seen is not None else None
            else:
                before = known.marks.get(self.current, {}).get(mkey)
            older = before is not None and rev < before
            if older or (seen is not None and rev == seen[0] and ms != seen[1]):
                saw_rev = before if older else seen[0]
                saw = f"revision {saw_rev}" + (f" at {seen[1]} ms" if seen is not None and seen[0] == saw_rev else "")
                what = (
                    f"the mark of worker ID {worker_id} (region {region}) went back: the store has revision {rev} "
                    f"at {ms} ms, this node's journal saw {saw}"
                )
                if not self.marks_store_wide:
                    raise WorkerIdUnusable(
                        f"{what}: an older copy was put back; it is passed over until an operator runs "
                        "`snowfence accept-restore`"
                    )
                raise self._went_back(
                    f"{what}: the store was restored from an older snapshot; claims are refused until an "
                    "operator runs `snowfence accept-restore`"
                )
            if ms is not None and (seen is None or rev > seen[0]):
                # Not ours: the peak keeps the highest millisecond seen, so a mark set
                # lower by anyone but this node (a release elsewhere, an operator's put)
                # never lowers the floor this node claims it with.
                epoch["marks"][mkey] = [rev, ms, max(ms, seen[2] if seen else ms), 0]
                self._dirty = True

    def note_mark(self, region: int, worker_id: int, rev: int, ms: int, revision: int | None = None) -> None:
        """Record a mark this node wrote; durable on return (its minter may use it only then)."""
        with self._lock:
            epoch = self.epochs.get(self.current) if self.current else None
            if epoch is None:
                return
            mkey = _mark_key(region, worker_id)
            seen = epoch["marks"].get(mkey)
            if seen is None or rev >= seen[0]:
                epoch["marks"][mkey] = [rev, ms, ms, 1]  # ours: we know what we may have minted
            if revision is not None and revision > epoch["revision"]:
                epoch["revision"] = revision
            self._save()

    def mark_revision(self, region: int, worker_id: int) -> int:
        """The revision of the worker ID's mark this journal saw last, in the current epoch (0: none)."""
        with self._lock:
            epoch = self.epochs.get(self.current) if self.current else None
            seen = epoch["marks"].get(_mark_key(region, worker_id)) if epoch is not None else None
            return seen[0] if seen else 0

    def note_watermark(self, ms: int) -> None:
        """Record a watermark this node promised, or a record it read; durable on return
        (a promise is answered only then). Its claims start above the highest."""
        with self._lock:
            if ms > self.watermark_ms:
                self.watermark_ms = ms
                self._save()

    def floor_ms(self, region: int, worker_id: int) -> int:
        """The highest millisecond of ``worker_id`` this journal knows may have been minted
        (-1: none), in any epoch: the peak of what it saw since it last wrote the mark
        itself. A claim mints above it whatever the store says now."""
        mkey = _mark_key(region, worker_id)
        with self._lock:
            return max((e["marks"][mkey][2] for e in self.epochs.values() if mkey in e["marks"]), default=-1)

    def describe(self) -> dict:
        with self._lock:
            return {
                "path": str(self.path),
                "epochs": len(self.epochs),
                "current": self.current,
                "problem": self.problem,
            }


def _describe(key: str) -> str:
    store_id, cluster_id, restore_id = key.split("|")
    text = f"store {store_id}"
    if cluster_id:
        text += f" on etcd cluster {int(cluster_id):x}"
    if restore_id:
        text += f" (since restore {restore_id})"
    return text
