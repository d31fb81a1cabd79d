"""A worker's leases on worker IDs in etcd, and the time high-water mark next to them.

The keys are in :mod:`.keys`: a claim per worker ID under ``workers/``, held
by a lease, and its mark under ``marks/``, which outlives owners.

A claim reads the genesis and the region's claims and marks in one
transaction, then claims in a second one, guarded on what it read:
``create_revision(claim) == 0, mod_revision(mark) == seen, create_revision(genesis)
== seen, create_revision(region claims) == seen, [version(used) == 0 on a first use]
-> put(claim, lease), put(mark), [put(used) on a first use]``. A first use is
recorded in the worker ID's own ``used`` key, so the first claims of a fleet's
cold start contend for nothing but the worker IDs themselves. So the
claim writes the worker ID's mark (with the store's ID and the layout's
digest) itself: a worker ID that was claimed always has a mark. The claim key's
``create_revision`` is the fencing token; every later write (extending or
lowering the mark, releasing) is a transaction guarded by ``create_revision(claim)
== token`` and ``mod_revision(mark) ==`` the revision of the holder's own last
write, so an owner that lost its lease, even one that was paused and does not
know it yet, can write nothing, and a holder whose mark was deleted, changed or
restored learns it at its next renewal: it fences at once, puts back what only
it knows, and lets go.

Every etcd call has a deadline (``etcd_timeout_s``) and every error of the
client library becomes :class:`EtcdUnavailable` at the connection's one
boundary (:mod:`.client`); what etcd's answers mean becomes :class:`LeaseLost`
here. The client is created inside the worker process and rebuilt after
repeated failures.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator

import orjson

from ..config import Config
from ..errors import (
    ClockUnsafe,
    ConfigError,
    EtcdUnavailable,
    LayoutMismatch,
    LeaseLost,
    SnowfenceError,
    StoreWentBack,
    WatermarkRecordUnreadable,
    WorkerIdUnusable,
)
from ..etcd import keys, regions
from ..etcd.client import Connection, etcd_call
from ..etcd.keys import REGION_CLAIMS
from ..ids import Layout
from ..logs import event
from . import watermark
from .base import Lease, Store, exclusivity_lost
from .genesis import Genesis, legacy_genesis, restore_base
from .journal import Journal, Known

log = logging.getLogger("snowfence.etcd")


def parse_genesis(value: bytes, cluster: str) -> Genesis:
    """The genesis record of ``cluster`` as its layout record holds it; LayoutMismatch if unreadable."""
    try:
        return Genesis.from_dict(orjson.loads(value))
    except (orjson.JSONDecodeError, TypeError, ValueError, SnowfenceError) as exc:
        raise LayoutMismatch(f"the layout recorded for cluster {cluster!r} is unreadable: {exc}") from None


def read_genesis(config: Config, build_client: Callable[[], object] | None = None) -> Genesis | None:
    """The genesis record of the cluster ``config`` names, read without writing anything;
    None if there is none yet. EtcdUnavailable if etcd does not answer, or if no client can
    be built here (TLS files unreadable, say); LayoutMismatch if the record is unreadable."""
    try:
        connection = Connection(config, build_client)
        try:
            value = _layout_record(connection)
        finally:
            connection.close()
    except ConfigError as exc:
        raise EtcdUnavailable(f"no etcd client can be built here: {exc}") from None
    return None if value is None else parse_genesis(value, config.cluster)


def _layout_record(connection: Connection) -> bytes | None:
    value, _ = connection.client.get(connection.keys.layout())
    return value


_layout_record = etcd_call(_layout_record)


class EtcdLease(Lease):
    """A worker ID claimed in etcd, held by a lease with a TTL."""

    expires = True

    def __init__(
        self,
        store: EtcdStore,
        lease_id: int,
        worker_id: int,
        token: int,
        mark_ms: int,
        ttl_s: int,
        holder: str,
        mark_rev: int = 0,
        mark_version: int = 0,
    ) -> None:
        super().__init__(store.region, worker_id, token, mark_ms)
        self._store = store
        self.lease_id = lease_id
        self.holder = holder
        self.claim_key = store.claim_key(worker_id)
        self.mark_key = store.mark_key(worker_id)
        #: The mod_revision of the mark as we wrote it last: the mark must still be that one.
        self.mark_rev = mark_rev
        #: The version etcd gave the mark with our last write: the next one names version + 1.
        self.mark_version = mark_version
        self.ttl_s = ttl_s
        self._ttl_at_ns = store.mono_ns()

    @property
    def connection(self) -> Connection:
        """Whose client the lease's calls use (and whose failures they count): its store's."""
        return self._store.connection

    def _guard(self) -> list:
        tx = self._store.client.transactions
        return [tx.create(self.claim_key) == self.token, tx.mod(self.mark_key) == self.mark_rev]

    def _mark_value(self, mark_ms: int, version: int | None = None, released: bool = False) -> bytes:
        """The mark's next value: guarded on its mod_revision, so etcd gives it the next version.
        It carries the holder's floor (for the watermark), and whether the holder let go."""
        version = self.mark_version + 1 if version is None else version
        return self._store.mark_value(
            mark_ms, self.holder, self.token, version, floor_ms=self.floor_ms, released=released
        )

    def refresh(self) -> None:
        ttl = None
        for response in self._store.client.refresh_lease(self.lease_id):
            ttl = response.TTL
        if ttl is None or ttl <= 0:
            raise LeaseLost(f"lease {self.lease_id:x} of worker ID {self.worker_id} has expired")
        self.ttl_s = ttl
        self._ttl_at_ns = self._store.mono_ns()

    refresh = etcd_call(refresh)

    def _write(self, until_ms: int | None) -> None:
        """One guarded transaction: put the mark at ``until_ms`` (None: write nothing, confirm)."""
        tx = self._store.client.transactions
        success = [] if until_ms is None else [tx.put(self.mark_key, self._mark_value(until_ms)), tx.get(self.mark_key)]
        ok, responses = self._store.client.transaction(
            compare=self._guard(),
            success=[*success, tx.get(REGION_CLAIMS)],
            failure=[tx.get(self.claim_key), tx.get(self.mark_key)],
        )
        if not ok:
            self._lost(responses)
        self._check_region(responses[-1])
        if until_ms is not None:
            _, meta = responses[1][0]
            # The journal is written before the minter may use the new mark: it is never behind it.
            self._store.note_mark(self.worker_id, meta.mod_revision, until_ms, meta)
            self.mark_rev, self.mark_version = meta.mod_revision, meta.version
            self.reserved_until_ms = until_ms

    def _check_region(self, claims_kv) -> None:
        """The region must still be this cluster's: a claim deleted by hand, or given to
        another cluster after that, fences the holder (whose next claim claims it again, or
        refuses by name)."""
        store = self._store
        try:
            claims = regions.parse(claims_kv[0][0] if claims_kv else None)
        except LayoutMismatch as exc:
            raise store.exclusivity_lost(self, str(exc)) from None
        claim = claims.holder(self.region)
        if claim is None or claim.cluster != store.config.cluster:
            who = "nobody" if claim is None else f"cluster {claim.cluster!r}"
            raise store.exclusivity_lost(
                self,
                f"region {self.region} is claimed by {who} in {REGION_CLAIMS}, not by cluster {store.config.cluster!r}",
            )

    def _lost(self, responses) -> None:
        """The guard failed: say why, put back what only we know, and raise LeaseLost."""
        claim, mark = responses[0], responses[1]
        if not claim or claim[0][1].create_revision != self.token:
            why = "its claim is gone" if not claim else f"its claim carries token {claim[0][1].create_revision}"
            raise self._store.exclusivity_lost(self, f"{why}, not ours ({self.token})")
        # The claim is still ours, so nobody else can have written the mark since:
        # an operator or a restore did. Put ours back before letting go, so the next
        # owner waits for every millisecond we may have used.
        version = mark[0][1].version if mark else 0
        if not mark:
            why = "its mark was deleted"
        else:
            rev = mark[0][1].mod_revision
            why = f"its mark is not the one it wrote (revision {rev}, ours is {self.mark_rev})"
            if rev < self.mark_rev:
                self._store.went_back(
                    f"the mark of worker ID {self.worker_id} went back under its holder to revision {rev} "
                    f"(it wrote revision {self.mark_rev}): etcd was restored from an older snapshot"
                )
        tx = self._store.client.transactions
        ok, _ = self._store.client.transaction(
            compare=[tx.create(self.claim_key) == self.token, tx.version(self.mark_key) == version],
            success=[tx.put(self.mark_key, self._mark_value(self.reserved_until_ms, version + 1))],
            failure=[],
        )
        why += f"; {'restored' if ok else 'could not restore'} it to {self.reserved_until_ms} ms"
        raise self._store.exclusivity_lost(self, why)

    def extend(self, until_ms: int) -> None:
        self._write(until_ms)

    extend = etcd_call(extend)

    def confirm(self) -> None:
        self._write(None)

    confirm = etcd_call(confirm)

    def release(self, last_used_ms: int) -> None:
        if self.released:
            return
        try:
            self._release(max(last_used_ms, self.claimed_mark_ms))
        finally:
            self.released = True

    def _release(self, mark_ms: int) -> None:
        client = self._store.client
        tx = client.transactions
        # The mark is written at every release, lowered or not: it says the holder let go,
        # so the watermark stops waiting for its floor.
        mark_ms = min(mark_ms, self.reserved_until_ms)
        success = [
            tx.put(self.mark_key, self._mark_value(mark_ms, released=True)),
            tx.get(self.mark_key),
            tx.delete(self.claim_key),
        ]
        ok, responses = client.transaction(compare=self._guard(), success=success, failure=[])
        if ok:
            _, meta = responses[1][0]
            self._store.note_mark(self.worker_id, meta.mod_revision, mark_ms, meta)
            self.mark_rev, self.mark_version = meta.mod_revision, meta.version
            self.reserved_until_ms = mark_ms
        client.revoke_lease(self.lease_id)

    _release = etcd_call(_release)

    def abandon(self) -> None:
        # Nothing to close locally; the lease lapses in etcd on its own.
        self.released = True

    def remaining_s(self) -> float | None:
        return round(self.ttl_s - (self._store.mono_ns() - self._ttl_at_ns) / 1e9, 3)

    def describe(self) -> dict:
        return {**super().describe(), "store": "etcd", "lease_id": f"{self.lease_id:x}", "lease_ttl_s": self.ttl_s}


class EtcdStore(Store):
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

    def check_layout(self, layout: Layout) -> None:
        """Read the genesis record, or write it on a new store; check the layout and the journal.

        A layout record that is gone while marks or claims remain is never taken
        for a new store (the node will not start); nor one that is gone while the
        journal shows this node used the store (claims are refused). A new store
        cannot prove that nothing was minted under its prefix before (an
        ``etcdctl del --prefix`` leaves it just as empty), so its claims wait out
        one quarantine from its creation.
        """
        client = self.client
        tx = client.transactions
        key = self.layout_key()
        # In one transaction: whether a claim or a mark exists is known as of the same
        # revision as the layout record's absence (another node may record it meanwhile).
        marks, claims, used = self.keys.marks(), self.keys.claims(), self.keys.uses()
        known = self._known()  # what every read below is compared with (see journal.py)
        _, (layout_kv, mark_kvs, claim_kvs, used_kvs) = client.transaction(
            compare=[],
            success=[
                tx.get(key),
                tx.get(marks, keys.range_end(marks)),
                tx.get(claims, keys.range_end(claims)),
                tx.get(used, keys.range_end(used)),
            ],
            failure=[],
        )
        value, meta = layout_kv[0] if layout_kv else (None, None)
        if value is None:
            left = [name for name, kvs in (("marks", mark_kvs), ("workers", claim_kvs), ("used", used_kvs)) if kvs]
            if left:
                raise LayoutMismatch(
                    f"the layout record {key} of cluster {self.config.cluster!r} is missing, but "
                    f"{' and '.join(left)} remain under {self.prefix}: the layout those IDs "
                    "were minted with is unknown, so this node will not start; put the layout record back"
                )
            if self.journal is not None and self.journal.has_history:
                self.journal.check_genesis(None, known=known)  # raises: the store forgot what the journal saw
            if self.claim_veto:
                raise ClockUnsafe(
                    f"the store of cluster {self.config.cluster!r} looks new, and its quarantine would be counted "
                    f"on this node's clock, which is not vouched for ({self.claim_veto}): not created "
                    "until it is"
                )
            for _ in range(5):
                # The region is claimed in the transaction that records the genesis, and a
                # region another cluster holds is refused before anything is written.
                claims = self._read_claims()
                quarantine = self.quarantine_ms()  # counts the longest window the region's claim recorded
                now_unix_ms = self._wall_ns() // 1_000_000
                genesis = Genesis.create(
                    layout,
                    now_unix_ms=now_unix_ms,
                    window_ms=self.window_ms,
                    quarantine_until_ms=self._now_ms() + quarantine,
                    used_keys=True,
                )
                claimed = claims.claimed(
                    self.region, self.config.cluster, layout, window_ms=self.window_ms, now_unix_ms=now_unix_ms
                )
                ok, responses = client.transaction(
                    compare=[tx.create(key) == 0, tx.mod(REGION_CLAIMS) == self._claims_revs[1]],
                    success=[tx.put(key, orjson.dumps(genesis.to_dict())), tx.put(REGION_CLAIMS, claimed.to_bytes())],
                    failure=[tx.get(key)],
                )
                if ok:
                    event(
                        log,
                        "store_created",
                        f"recorded layout for cluster {self.config.cluster}: {layout.describe()}, and its claim of "
                        f"region {self.region}; new store {genesis.store_id}: its first claims mint nothing for "
                        f"{quarantine} ms, because a new store cannot prove that no earlier one under the same "
                        "prefix minted (the longest reservation window any node may use, plus the clock-skew bound)",
                        level=logging.WARNING,
                        store=genesis.store_id,
                        quarantine_ms=quarantine,
                    )
                    break
                if responses[0]:
                    break  # another node recorded the layout first: read it back
            value, meta = self._get(key)
            if value is None:
                raise EtcdUnavailable(f"the layout record {key} vanished right after it was recorded")
        recorded = self._parse_genesis(value)
        if recorded.layout != layout:
            raise LayoutMismatch(
                f"cluster {self.config.cluster!r} uses layout [{recorded.layout.describe()}] but this node is "
                f"configured for [{layout.describe()}]; IDs from two layouts could collide, so this node "
                "will not start"
            )
        self._adopt(recorded, meta, known)
        if not recorded.upgraded or recorded.window_ms < self.window_ms or not recorded.used_keys:
            self._amend_genesis(lambda g: g)
        self._claim_region()

    check_layout = etcd_call(check_layout)

    # -- the region's claim (see regions.py) ----------------------------------------------

    def _take_claims(self, value: bytes | None, meta) -> regions.RegionClaims:
        """Parse the region claims read with ``meta``; raise LayoutMismatch, by name, if this
        cluster may not mint in its region."""
        claims = regions.parse(value)
        claims.check(self.region, self.config.cluster, self.layout)
        self.region_claims = claims
        self._claims_revs = (meta.create_revision, meta.mod_revision) if meta is not None else (0, 0)
        return claims

    def _read_claims(self) -> regions.RegionClaims:
        return self._take_claims(*self._get(REGION_CLAIMS))

    def _claim_region(self) -> None:
        """Claim this node's region for its cluster (or raise the claim's window to ours):
        a compare-and-swap on the claims key, retried a few times."""
        client = self.client
        tx = client.transactions
        for _ in range(5):
            claims = self._read_claims()
            wanted = claims.claimed(
                self.region,
                self.config.cluster,
                self.layout,
                window_ms=self.window_ms,
                now_unix_ms=self._wall_ns() // 1_000_000,
            )
            if wanted == claims:
                return
            ok, responses = client.transaction(
                compare=[tx.mod(REGION_CLAIMS) == self._claims_revs[1]],
                success=[tx.put(REGION_CLAIMS, wanted.to_bytes()), tx.get(REGION_CLAIMS)],
                failure=[],
            )
            if ok:
                if claims.holder(self.region) is None:
                    event(
                        log,
                        "region_claimed",
                        f"claimed region {self.region} of this etcd for cluster {self.config.cluster} "
                        f"(in {REGION_CLAIMS}): no other cluster of this etcd can start in it",
                        region=self.region,
                    )
                self._take_claims(*responses[1][0])
                return
        raise EtcdUnavailable(f"the region claims {REGION_CLAIMS} kept changing under this node")

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

    def _adopt(self, genesis: Genesis, meta, known: Known | None) -> None:
        """Take ``genesis`` (read with ``meta``, sent after the journal held ``known``) as the
        store's, after the journal agrees."""
        header = getattr(meta, "response_header", None)
        if self.journal is not None and genesis.upgraded:
            self.journal.check_genesis(
                genesis,
                cluster_id=getattr(header, "cluster_id", None),
                revision=getattr(header, "revision", None),
                known=known,
            )
        self.genesis = genesis
        self._genesis_revs = (meta.create_revision, meta.mod_revision)

    def _amend_genesis(self, change) -> Genesis:
        """Upgrade an older release's record, raise the window to ours, apply ``change``: a
        compare-and-swap on the record's mod_revision, retried a few times."""
        client = self.client
        tx = client.transactions
        key = self.layout_key()
        for _ in range(5):
            known = self._known()
            value, meta = self._get(key)
            if value is None:
                raise StoreWentBack(f"the layout record {key} was deleted while this node used it")
            genesis = before = self._parse_genesis(value)
            if not genesis.upgraded:
                used: dict[int, set[int]] = {}
                for _, mark_meta in client.get_prefix(self.keys.marks(), keys_only=True):
                    place = keys.place(mark_meta.key, self.keys.marks())
                    if place is not None:
                        used.setdefault(place[0], set()).add(place[1])
                genesis = legacy_genesis(genesis.layout, self._wall_ns() // 1_000_000, used)
            if genesis.window_ms < self.window_ms:
                genesis = dataclasses.replace(genesis, window_ms=self.window_ms)
            # First claims from now on are recorded in used/ keys (see genesis.py); ``used``
            # keeps what was recorded before.
            genesis = dataclasses.replace(genesis, used_keys=True)
            genesis = change(genesis)
            if genesis == before:
                self._adopt(genesis, meta, known)
                return genesis
            ok, responses = client.transaction(
                compare=[tx.mod(key) == meta.mod_revision],
                success=[tx.put(key, orjson.dumps(genesis.to_dict())), tx.get(key)],
                failure=[],
            )
            if ok:
                if not before.upgraded:
                    event(
                        log,
                        "store_upgraded",
                        f"upgraded the layout record of cluster {self.config.cluster} to a genesis record (store "
                        f"{genesis.store_id}); nodes of older releases can no longer start on it",
                        level=logging.WARNING,
                        store=genesis.store_id,
                    )
                elif not before.used_keys:
                    event(
                        log,
                        "store_upgraded",
                        f"the store of cluster {self.config.cluster} now records each worker ID's first claim in a "
                        "key of its own (used/); nodes of older releases can no longer start or claim on it",
                        level=logging.WARNING,
                        store=genesis.store_id,
                    )
                self._adopt(genesis, responses[1][0][1], known)
                return genesis
        raise EtcdUnavailable(f"the layout record {key} kept changing under this node")

    def accept_restore(self, reason: str, *, dry_run: bool = False) -> Genesis:
        """An operator's acknowledgement that this store went back (restored from a snapshot,
        its keys deleted) on purpose: a new restore record in the genesis (written anew, with
        this layout, if it is gone), and a quarantine every claim of it waits out. Nodes that
        refused take it at their next claim, with their journal's floors; it is accepted once.
        With ``dry_run``, the genesis it would write, nothing written; ``found_genesis`` says
        whether a layout record was there."""
        client = self.client
        tx = client.transactions
        key = self.layout_key()
        marks_prefix = self.keys.marks()
        now_unix_ms = self._wall_ns() // 1_000_000
        for _ in range(5):
            _, (layout_kv, mark_kvs) = client.transaction(
                compare=[], success=[tx.get(key), tx.get(marks_prefix, keys.range_end(marks_prefix))], failure=[]
            )
            marks = []
            for value, meta in mark_kvs:
                place = keys.place(meta.key, marks_prefix)
                if place is None:
                    continue
                try:
                    digest = orjson.loads(value).get("layout")
                except (ValueError, AttributeError):
                    digest = None
                marks.append((place[0], place[1], digest, f"the mark {meta.key.decode()}"))
            recorded = self._parse_genesis(layout_kv[0][0]) if layout_kv else None
            self.found_genesis = recorded is not None
            compare = [tx.mod(key) == layout_kv[0][1].mod_revision] if layout_kv else [tx.create(key) == 0]
            genesis, used = restore_base(
                recorded,
                marks,
                self.layout,
                now_unix_ms=now_unix_ms,
                window_ms=self.window_ms,
                where=f"cluster {self.config.cluster!r}",
            )
            genesis = dataclasses.replace(genesis, used_keys=True)  # the used/ keys stay: still read
            self.genesis = genesis  # quarantine_ms() counts its window
            self._read_claims()  # and the region claim's, which outlives the cluster's keys
            genesis = genesis.restored(
                reason,
                now_unix_ms=now_unix_ms,
                window_ms=self.window_ms,
                used=used,
                quarantine_until_ms=self._now_ms() + self.quarantine_ms(),
            )
            if dry_run:
                return genesis
            ok, _ = client.transaction(
                compare=compare, success=[tx.put(key, orjson.dumps(genesis.to_dict()))], failure=[]
            )
            if ok:
                self.genesis = genesis
                return genesis
        raise EtcdUnavailable(f"the layout record {key} kept changing under this command")

    accept_restore = etcd_call(accept_restore)

    def mark_value(
        self,
        mark_ms: int,
        holder: str,
        token: int | None,
        version: int,
        *,
        floor_ms: int | None = None,
        released: bool = False,
    ) -> bytes:
        """A mark as snowfence writes it. ``version``: the version etcd gives the key with this
        write (every write is guarded on the one before it), so a value put back by hand,
        an older one say, names a version the key no longer has (see :meth:`_floor`).
        ``floor_ms``: what its holder never mints below; ``released``: it let go (both for
        the watermark)."""
        return orjson.dumps(
            {
                "reserved_until_ms": mark_ms,
                "reserved_until_unix_ms": mark_ms + self.layout.epoch_ms,
                "token": token,
                "holder": holder,
                "store": self.genesis.store_id if self.genesis is not None else None,
                "layout": self.layout.digest(),
                "version": version,
                "floor_ms": floor_ms,
                "released": released,
            }
        )

    def note_mark(self, worker_id: int, rev: int, ms: int, meta) -> None:
        if self.journal is not None:
            header = getattr(meta, "response_header", None)
            self.journal.note_mark(self.region, worker_id, rev, ms, revision=getattr(header, "revision", None))

    def went_back(self, what: str) -> None:
        if self.journal is not None:
            self.journal.went_back(what)

    def exclusivity_lost(self, lease: EtcdLease, why: str) -> LeaseLost:
        return exclusivity_lost(lease, why)

    def _read_region(self) -> set[int]:
        """One transaction: the genesis, and this region's claims and marks. Checks the
        genesis and every mark against the journal; keeps the marks for the claims that
        follow; returns the worker IDs claimed now."""
        client = self.client
        tx = client.transactions
        claims, marks, used = self.keys.claims(self.region), self.keys.marks(self.region), self.keys.uses(self.region)
        known = self._known()
        _, (genesis_kv, claim_kvs, mark_kvs, claims_kv, used_kvs) = client.transaction(
            compare=[],
            success=[
                tx.get(self.layout_key()),
                tx.get(claims, keys.range_end(claims)),
                tx.get(marks, keys.range_end(marks)),
                tx.get(REGION_CLAIMS),
                tx.get(used, keys.range_end(used)),
            ],
            failure=[],
        )
        region_claims = self._take_claims(*(claims_kv[0] if claims_kv else (None, None)))
        claim = region_claims.holder(self.region)
        if claim is None or claim.window_ms < self.window_ms:
            # Gone (deleted by hand: its holders fenced), or never written by an older release.
            self._claim_region()
        if not genesis_kv:
            if self.journal is not None:
                self.journal.check_genesis(None, known=known)
            raise StoreWentBack(
                f"the layout record {self.layout_key()} was deleted while this node used cluster "
                f"{self.config.cluster!r}; claims are refused until an operator runs `snowfence accept-restore`"
            )
        value, meta = genesis_kv[0]
        self._read_revision = getattr(getattr(meta, "response_header", None), "revision", None)
        genesis = self._parse_genesis(value)
        if genesis.layout != self.layout:
            raise StoreWentBack(f"the layout record of cluster {self.config.cluster!r} now names another layout")
        if not genesis.upgraded or not genesis.used_keys:
            # Put back in an older release's form (or upgraded by one running beside: refused).
            genesis = self._amend_genesis(lambda g: g)
        else:
            self._adopt(genesis, meta, known)
        self._used = set()
        for _, used_meta in used_kvs:
            place = keys.place(used_meta.key, self.keys.uses())
            if place is not None and place[0] == self.region:
                self._used.add(place[1])
        self._marks = {}
        for value, mark_meta in mark_kvs:
            place = keys.place(mark_meta.key, self.keys.marks())
            if place is None or place[0] != self.region:
                continue
            self._marks[place[1]] = (value, mark_meta.mod_revision, mark_meta.version)
            if self.journal is not None:
                try:
                    ms = keys.mark_ms(orjson.loads(value), self.layout)
                except (KeyError, TypeError, ValueError):
                    ms = None
                self.journal.check_mark(self.region, place[1], mark_meta.mod_revision, ms, known=known)
        if self.journal is not None:
            self.journal.save_if_changed()
        taken = set()
        for _, claim_meta in claim_kvs:
            place = keys.place(claim_meta.key, self.keys.claims())
            if place is not None and place[0] == self.region:
                taken.add(place[1])
        return taken

    _read_region = etcd_call(_read_region)

    def taken(self) -> set[int]:
        return self._read_region()

    def unheld(self, up_to: int | None = None) -> int:
        held = set()
        for _, meta in self.client.get_prefix(self.keys.claims(self.region), keys_only=True):
            place = keys.place(meta.key, self.keys.claims())
            if place is not None and place[0] == self.region and 0 <= place[1] <= self.layout.max_worker:
                held.add(place[1])
        return self.layout.max_worker + 1 - len(held.union(self.passed_over))

    unheld = etcd_call(unheld)

    def candidates(self) -> Iterator[int]:
        taken = self.taken()
        return iter([w for w in range(self.layout.max_worker + 1) if w not in taken])

    def claim(self, preferred: int | None, holder: str, now_ms: int, max_ahead_ms: int) -> EtcdLease | None:
        self.refuse_if_vetoed()  # before a lease is granted
        # One lease serves all the claim attempts of this call; if none succeeds
        # it is revoked (or lapses by itself within its TTL).
        self._claim_lease = self._grant()
        lease = None
        try:
            lease = super().claim(preferred, holder, now_ms, max_ahead_ms)
        finally:
            lease_id, _ = self._claim_lease
            self._claim_lease = None
            if lease is None:
                self._revoke_quietly(lease_id)
        return lease

    def _grant(self) -> tuple[int, int]:
        lease = self.client.lease(self.config.lease_ttl_s)
        return lease.id, lease.ttl

    _grant = etcd_call(_grant)

    def _revoke_quietly(self, lease_id: int) -> None:
        try:
            self._revoke(lease_id)
        except EtcdUnavailable:
            pass  # it lapses by itself within the TTL

    def _revoke(self, lease_id: int) -> None:
        self.client.revoke_lease(lease_id)

    _revoke = etcd_call(_revoke)

    def _floor(self, worker_id: int, now_ms: int | None) -> int:
        """The millisecond a claim of ``worker_id`` must mint above: the highest of its mark,
        the journal's floor, the store's quarantine, and for a worker ID of unknown state a
        quarantine from now. Raises WorkerIdUnusable for a mark that is not ours to read."""
        genesis = self.genesis
        value, _, version = self._marks.get(worker_id, (None, 0, 0))
        now_ms = self._now_ms() if now_ms is None else now_ms
        floors = [genesis.quarantine_until_ms]
        if self.journal is not None:
            floors.append(self.journal.floor_ms(self.region, worker_id))
        unknown = None
        if value is None:
            if self._is_used(worker_id) or (self.journal is not None and floors[-1] >= 0):
                unknown = "it has no mark, but it was used"
        else:
            try:
                mark = orjson.loads(value)
                floors.append(keys.mark_ms(mark, self.layout))
            except (KeyError, TypeError, ValueError):  # orjson's errors are ValueErrors
                # A mark we cannot read could hide a later timestamp: pass over it.
                raise WorkerIdUnusable(f"the mark of worker ID {worker_id} is unreadable") from None
            layout = mark.get("layout")
            if layout is not None and layout != self.layout.digest():
                raise WorkerIdUnusable(
                    f"the mark of worker ID {worker_id} was written under another layout ({layout}): "
                    "its milliseconds are not ours to compare"
                )
            named = mark.get("version")
            if named is not None and named != version:
                # Every write of a mark is guarded on the one before and names the version it
                # makes: a value whose version is not the key's was put there by hand (an
                # older one, say), and a later mark may have stood there, out of sight.
                raise WorkerIdUnusable(
                    f"the mark of worker ID {worker_id} names version {named!r}, but etcd holds version "
                    f"{version} of it: it was put there by hand, not written by snowfence (an older "
                    "value put back?); delete the mark to let its worker ID wait out the quarantine"
                )
            store = mark.get("store")
            if store is None and not genesis.legacy:
                unknown = "its mark has no store ID"
            elif store is not None and store != genesis.store_id:
                unknown = f"its mark belongs to store {store}, not this one"
        if unknown is not None:
            quarantine = self.quarantine_ms()
            floors.append(now_ms + quarantine)
            event(
                log,
                "worker_id_unknown",
                f"worker ID {worker_id}: {unknown}; its claim mints nothing for {quarantine} ms (quarantine)",
                level=logging.WARNING,
                worker_id=worker_id,
                quarantine_ms=quarantine,
            )
        return max(floors)

    def _marked_since_read(self, worker_id: int) -> bool:
        """Whether this node's journal saw a mark of ``worker_id`` written after the region was
        read (its workers share the journal): that read is behind, not the mark gone."""
        if self.journal is None or self._read_revision is None:
            return False
        return self.journal.mark_revision(self.region, worker_id) > self._read_revision

    def _is_used(self, worker_id: int) -> bool:
        """Whether ``worker_id`` was ever claimed, as the last read of the region saw it."""
        return worker_id in self._used or self.genesis.is_used(self.region, worker_id)

    def try_claim(
        self, worker_id: int, holder: str, max_mark_ms: int | None, now_ms: int | None = None
    ) -> EtcdLease | None:
        lease_id, ttl = self._claim_lease
        client = self.client
        tx = client.transactions
        claim_key, mark_key, genesis_key = self.claim_key(worker_id), self.mark_key(worker_id), self.layout_key()
        if worker_id not in self._marks and self._marked_since_read(worker_id):
            return None  # claimed by another process of this node since our read: taken (another pass reads again)
        floor = self._floor(worker_id, now_ms)
        if max_mark_ms is not None and floor > max_mark_ms:
            return None
        _, mark_rev, mark_version = self._marks.get(worker_id, (None, 0, 0))
        mark_value = self.mark_value(floor, holder, None, mark_version + 1, floor_ms=floor + 1)
        first_use = not self._is_used(worker_id)
        compare = [
            tx.create(claim_key) == 0,
            tx.mod(mark_key) == mark_rev,
            tx.create(genesis_key) == self._genesis_revs[0],
            # The region's claim read in this pass still stands (not deleted and made anew).
            tx.create(REGION_CLAIMS) == self._claims_revs[0],
        ]
        success = [tx.put(claim_key, orjson.dumps({"holder": holder}), lease_id), tx.put(mark_key, mark_value)]
        if first_use:
            # Its first claim: recorded in its own key, in the same transaction (see genesis.py).
            used_key = self.used_key(worker_id)
            compare.append(tx.version(used_key) == 0)
            success.append(tx.put(used_key, orjson.dumps({"store": self.genesis.store_id, "holder": holder})))
        ok, responses = client.transaction(
            compare=compare,
            # The watermark record as of this claim: its minter starts at or above it.
            success=[*success, tx.get(self.watermark_key()), tx.get(claim_key), tx.get(mark_key)],
            failure=[],
        )
        if not ok:
            return None  # claimed, used or changed since we read it: another pass reads again
        claim_meta, mark_meta = responses[-2][0][1], responses[-1][0][1]
        if first_use:
            self._used.add(worker_id)
        self._marks[worker_id] = (mark_value, mark_meta.mod_revision, mark_meta.version)
        token = claim_meta.create_revision
        self.note_mark(worker_id, mark_meta.mod_revision, floor, mark_meta)
        lease = EtcdLease(
            self,
            lease_id,
            worker_id,
            token,
            floor,
            ttl,
            holder,
            mark_rev=mark_meta.mod_revision,
            mark_version=mark_meta.version,
        )
        lease.watermark_ms = self._watermark_floor(responses[-3])
        return lease

    try_claim = etcd_call(try_claim)

    # -- the watermark (see watermark.py) ------------------------------------------------

    def watermark_key(self) -> str:
        return self.keys.watermark()

    def _watermark_floor(self, record_kv) -> int:
        """The millisecond a claim that read ``record_kv`` must not mint below: the record's,
        or the highest this node's journal saw or promised (a record deleted or restored
        older is not a watermark forgotten); for a record that is not ours to read, a
        quarantine from now (it may hide any watermark already answered)."""
        try:
            record = watermark.decode(record_kv[0][0] if record_kv else None)
        except ValueError as exc:
            quarantine = self.quarantine_ms()
            event(
                log,
                "watermark_record_unreadable",
                f"the watermark record {self.watermark_key()} is unreadable ({exc}); this claim mints nothing "
                f"for {quarantine} ms (quarantine)",
                level=logging.WARNING,
            )
            return self._now_ms() + quarantine
        if self.journal is None:
            return record
        self.journal.note_watermark(record)
        return max(record, self.journal.watermark_ms)

    def _floors(self, mark_kvs, claim_kvs, record_rev: int) -> list[watermark.Floor]:
        """Every mark of the cluster (all regions), as the watermark reads it. A mark that
        cannot be read has no floor (nothing is known of it)."""
        claims = {}
        for _, meta in claim_kvs:
            place = keys.place(meta.key, self.keys.claims())
            if place is not None:
                claims[place] = meta.create_revision
        floors = []
        for value, meta in mark_kvs:
            place = keys.place(meta.key, self.keys.marks())
            if place is None:
                continue
            claimed = claims.get(place)
            try:
                mark = orjson.loads(value)
                reserved = keys.mark_ms(mark, self.layout)
                floor_ms, released = mark.get("floor_ms"), mark.get("released") is True
                if floor_ms is not None and (type(floor_ms) is not int or floor_ms < 0):
                    floor_ms = None
            except (KeyError, TypeError, ValueError, AttributeError):
                reserved, floor_ms, released = self.layout.max_ms, None, False
            floors.append(
                watermark.Floor(
                    place[0],
                    place[1],
                    floor_ms,
                    reserved,
                    held=claimed is not None,
                    released=released,
                    saw_record=claimed is not None and claimed > record_rev,
                )
            )
        marked = {(f.region, f.worker_id) for f in floors}
        for place in claims:
            if place not in marked:
                # A claim without a mark (deleted by hand): its holder fences at its next
                # renewal; until then nothing is known of it.
                floors.append(watermark.Floor(place[0], place[1], None, self.layout.max_ms, held=True))
        return floors

    def watermark_round(self, now_ms: int, promised: int) -> int:
        """One round (see watermark.py): read every mark; raise the record to the lowest
        floor they allow; read them again in the same transaction as the raise. Returns
        the highest millisecond now promised (``promised`` when this round earned no more)."""
        client = self.client
        tx = client.transactions
        key = self.watermark_key()
        marks, claims = self.keys.marks(), self.keys.claims()
        reads = [tx.get(marks, keys.range_end(marks)), tx.get(claims, keys.range_end(claims))]
        _, (genesis_kv, mark_kvs, claim_kvs) = client.transaction(
            compare=[], success=[tx.get(self.layout_key()), *reads], failure=[]
        )
        skew = self.config.max_clock_skew_ms
        genesis = self._parse_genesis(genesis_kv[0][0]) if genesis_kv else None
        if not watermark.settled(genesis, self.layout, now_ms, skew):
            return promised
        floors = self._floors(mark_kvs, claim_kvs, 0)
        self.watermark_low = watermark.lowest(floors, now_ms, skew)
        wanted = watermark.candidate(floors, now_ms, skew)
        if wanted <= promised:
            return promised
        value = watermark.encode(wanted)
        ok, responses = client.transaction(
            compare=[tx.value(key) < value],
            success=[tx.put(key, value), tx.get(key), *reads],
            failure=[tx.get(key), *reads],
        )
        record = responses[1] if ok else responses[0]
        if not ok and not record:  # no record yet: create it
            ok, responses = client.transaction(
                compare=[tx.version(key) == 0],
                success=[tx.put(key, value), tx.get(key), *reads],
                failure=[tx.get(key), *reads],
            )
            record = responses[1] if ok else responses[0]
        if not record:
            return promised  # deleted in between: the next round writes it again
        record_value, record_meta = record[0]
        try:
            at = watermark.decode(record_value)
        except ValueError as exc:
            raise WatermarkRecordUnreadable(f"the watermark record {key} is unreadable ({exc})") from None
        if at < wanted:
            return promised
        mark_kvs, claim_kvs = responses[-2], responses[-1]
        floors = self._floors(mark_kvs, claim_kvs, record_meta.mod_revision)
        self.watermark_low = watermark.lowest(floors, now_ms, skew)
        if not watermark.holds(wanted, floors, now_ms, skew):
            return promised
        if self.journal is not None:
            self.journal.note_watermark(wanted)  # before it is answered: this node's claims never forget it
        return wanted

    watermark_round = etcd_call(watermark_round)

    def describe(self) -> dict:
        return {"store": "etcd", "cluster": self.config.cluster, "endpoints": list(self.config.etcd)}
