"""Claims of worker IDs in etcd (:class:`Claims`, a part of :class:`~.store.EtcdStore`): the
region read in one transaction (the genesis, the claims, the marks, the used keys), a claim's
floor, and the claim's transaction guarded on what was read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import orjson

from ...errors import EtcdUnavailable, LeaseLost, StoreWentBack, WorkerIdUnusable
from ...etcd import keys
from ...etcd.client import etcd_call
from ...etcd.keys import REGION_CLAIMS
from ...logs import event
from ..base import exclusivity_lost
from .lease import EtcdLease

log = logging.getLogger("snowfence.etcd")


class Claims:
    """Reading the region and claiming in it, for :class:`~.store.EtcdStore`."""

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
