"""The etcd store (:class:`EtcdStore`): leases on the worker IDs of one region of one cluster,
assembled from its parts by job: the layout record and region claim (:mod:`.layout`), restore
(:mod:`.restore`), claims (:mod:`.claims`) and the watermark round (:mod:`.watermark_round`);
here, what they share: the connection, the keys, the quarantine and the journal's reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ...config import Config
from ...etcd import regions
from ...etcd.client import Connection
from ..base import Store
from ..genesis import Genesis
from ..journal import Journal, Known
from .claims import Claims
from .layout import LayoutRecord
from .records import parse_genesis
from .restore import Restore
from .watermark_round import WatermarkRound


class EtcdStore(LayoutRecord, Restore, Claims, WatermarkRound, Store):
    """Leases on the worker IDs of one region of one cluster, through its :class:`Connection`."""

    skips_far_marks = True

    def __init__(
        self,
        config: Config,
        mono_ns: Callable[[], int] = time.monotonic_ns,
        journal: Journal | None = None,
        wall_ns: Callable[[], int] = time.time_ns,
        build_client: Callable[[], object] | None = None,
    ) -> None:
        #: The etcd cluster, as this process talks to it (every call goes through ``etcd_call``).
        self.connection = Connection(config, build_client)
        self.config = config
        #: The cluster's keys (see :mod:`snowfence.etcd.keys`), every one under ``prefix``.
        self.keys = self.connection.keys
        self.prefix = self.keys.prefix
        #: The wall clock a genesis is stamped with and a quarantine counted from (the minter's).
        self._wall_ns = wall_ns
        #: The node's witness of this store (workers pass theirs; accept-restore reads without one).
        self.journal = journal
        #: The longest reservation window any node of this store may use (every node checks its
        #: own against it at start), recorded in the genesis and the region's claim if it is the longest.
        self.window_ms = config.store_window_ms
        #: The region claims of this etcd as last read (see :mod:`.regions`), and the claims
        #: key's (create_revision, mod_revision) then ((0, 0): none): claims are guarded on them.
        self.region_claims = regions.RegionClaims()
        self._claims_revs = (0, 0)
        #: The genesis record as last read, and its key's (create_revision, mod_revision).
        self.genesis: Genesis | None = None
        self._genesis_revs = (0, 0)
        #: What the claim's first transaction read: {worker ID: (mark value or None, mod_revision,
        #: version)}.
        self._marks: dict[int, tuple[bytes | None, int, int]] = {}
        #: The worker IDs of the region whose first use that transaction saw recorded in a key.
        self._used: set[int] = set()
        #: The etcd revision that transaction read at (None: not known).
        self._read_revision: int | None = None
        #: The monotonic clock a lease's remaining TTL is counted on (tests pass a fake one).
        self.mono_ns = mono_ns
        self.layout = config.layout
        self.region = self.layout.check_region(config.region)
        self._claim_lease: tuple[int, int] | None = None

    @property
    def client(self):
        """The etcd client library's client (built on first use, rebuilt after failures)."""
        return self.connection.client

    def close(self) -> None:
        self.connection.close()

    # -- keys ----------------------------------------------------------------------------

    def claim_key(self, worker_id: int) -> str:
        return self.keys.claim(self.region, worker_id)

    def mark_key(self, worker_id: int) -> str:
        return self.keys.mark(self.region, worker_id)

    def used_key(self, worker_id: int) -> str:
        return self.keys.used(self.region, worker_id)

    # -- Store ---------------------------------------------------------------------------

    def layout_key(self) -> str:
        return self.keys.layout()

    def _parse_genesis(self, value: bytes) -> Genesis:
        return parse_genesis(value, self.config.cluster)

    def quarantine_ms(self) -> int:
        """How far past the moment it is seen a worker ID of unknown state stays unused: the
        longest reservation window any node of this store used, plus the clock-skew bound."""
        windows = [self.window_ms]
        if self.genesis is not None:
            windows.append(self.genesis.window_ms)
        if self.journal is not None:
            windows.append(self.journal.window_ms)
        claim = self.region_claims.holder(self.region)
        if claim is not None:
            windows.append(claim.window_ms)  # outlives the cluster's own keys
        return max(windows) + self.config.max_clock_skew_ms

    def _now_ms(self) -> int:
        return self._wall_ns() // 1_000_000 - self.layout.epoch_ms

    def _get(self, key: str) -> tuple[bytes | None, object]:
        tx = self.client.transactions
        _, responses = self.client.transaction(compare=[], success=[tx.get(key)], failure=[])
        return responses[0][0] if responses[0] else (None, None)

    def _known(self) -> Known | None:
        """What the journal holds now: taken before a read is sent, and the read checked
        against it, never against what the node's other processes and threads recorded
        while the read was on its way (etcd's reads are linearizable: a read's revision is
        at least every revision committed before it was sent)."""
        return self.journal.known() if self.journal is not None else None

    def describe(self) -> dict:
        return {"store": "etcd", "cluster": self.config.cluster, "endpoints": list(self.config.etcd)}
