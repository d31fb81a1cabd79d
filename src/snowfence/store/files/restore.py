"""An operator's acceptance of a state directory that went back (:class:`Restore`, a part of
:class:`~.store.FileStore`): a new restore record in the genesis, and a quarantine.
"""

from __future__ import annotations

from ...errors import StateDirError, WorkerIdUnusable
from ..genesis import Genesis, restore_base
from .records import _mark_layout


class Restore:
    """``accept-restore`` on the file store, for :class:`~.store.FileStore`."""

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
