"""The file store (:class:`FileStore`): worker IDs of one region, leased by file locks under a
state directory, assembled from its parts by job: the genesis record (:mod:`.layout`), restore
(:mod:`.restore`), marks and claims (:mod:`.claims`), the kernel's witnesses (:mod:`.witnesses`)
and the watermark round (:mod:`.watermark_round`); here, what they share: the directory, its
filesystem, the quarantine.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ...errors import ConfigError, StateDirError
from ...ids import Layout
from ...logs import event
from .. import filesystems
from ..base import Store
from ..genesis import Genesis
from ..journal import Journal
from .claims import Claims
from .layout import LayoutRecord
from .restore import Restore
from .watermark_round import WatermarkRound
from .witnesses import Witnesses

log = logging.getLogger("snowfence.embedded")


class FileStore(LayoutRecord, Restore, Claims, Witnesses, WatermarkRound, Store):
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

    def describe(self) -> dict:
        return {"store": "embedded", "state_dir": str(self.root)}
