"""A worker ID claimed in etcd (:class:`EtcdLease`): its lease renewed, its mark extended,
confirmed and released, every write a transaction guarded by the fencing token and the
mark's revision; a guard that fails says why, puts back what only its holder knows, and
fences.
"""

from __future__ import annotations

from ...errors import LayoutMismatch, LeaseLost
from ...etcd import regions
from ...etcd.client import Connection, etcd_call
from ...etcd.keys import REGION_CLAIMS
from ..base import Lease, Store


class EtcdLease(Lease):
    """A worker ID claimed in etcd, held by a lease with a TTL."""

    expires = True

    def __init__(
        self,
        store: Store,  # an EtcdStore (see .store, which builds its leases through .claims)
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
