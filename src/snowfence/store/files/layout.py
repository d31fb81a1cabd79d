"""The file store's genesis record (``layout.json``): read, written by an exclusive create on
a new store, checked against this node's layout and journal, upgraded from an older
release's form (:class:`LayoutRecord`, a part of :class:`~.store.FileStore`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import orjson

from ...errors import LayoutMismatch, StateDirError, StoreWentBack
from ...ids import Layout
from ...logs import event
from ..durable import _fsync_dir, _tmp_name, _write_synced, write_atomic
from ..genesis import Genesis, legacy_genesis
from .locks import RegionLock
from .records import layout_path, read_genesis

log = logging.getLogger("snowfence.embedded")


class LayoutRecord:
    """The genesis record in layout.json, for :class:`~.store.FileStore`."""

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
