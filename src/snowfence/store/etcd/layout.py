"""The etcd store's layout record (its genesis) and its region's claim: read, written on a new
store, checked against this node's layout and journal, upgraded from an older release's
form (:class:`LayoutRecord`, a part of :class:`~.store.EtcdStore`).
"""

from __future__ import annotations

import dataclasses
import logging

import orjson

from ...errors import ClockUnsafe, EtcdUnavailable, LayoutMismatch, StoreWentBack
from ...etcd import keys, regions
from ...etcd.client import etcd_call
from ...etcd.keys import REGION_CLAIMS
from ...ids import Layout
from ...logs import event
from ..genesis import Genesis, legacy_genesis
from ..journal import Known

log = logging.getLogger("snowfence.etcd")


class LayoutRecord:
    """The genesis record and the region's claim, for :class:`~.store.EtcdStore`."""

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
