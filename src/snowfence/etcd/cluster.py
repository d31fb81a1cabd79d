"""The cluster's own records in etcd: its nodes and regions, and a census of its worker IDs.

A broker keeps its node's entry under ``nodes/<node>``, under a lease of its
own, and notes its region under ``regions/<region>`` (no lease: the record
stays); :mod:`snowfence.broker.membership` drives it, and ``snowfence status
--etcd`` reads it back. The census reads the worker IDs' claims and marks of
every region, for people: it writes nothing and claims nothing (that is the
lease store's, :mod:`.store`).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from ..errors import LayoutMismatch, SnowfenceError
from .client import Connection, etcd_call
from .keys import REGION_CLAIMS as CLAIMS_KEY
from .keys import mark_ms, place
from .keys import range_end as _range_end
from .regions import RegionClaims
from .regions import parse as parse_claims


@dataclass(frozen=True)
class NodeName:
    """Who has a node name: this node (``ours``), another (``entry``, its entry), or nobody
    (``create_revision`` 0). ``mod_revision`` moves each time a live holder rewrites its entry."""

    ours: bool
    create_revision: int
    mod_revision: int
    lease_id: int
    entry: dict | None


class Cluster(Connection):
    """The nodes, regions and worker IDs of the cluster ``config`` names."""

    def node_key(self, name: str) -> str:
        return self.keys.node(name)

    def grant_lease(self, ttl_s: int) -> int:
        return self.client.lease(ttl_s).id

    grant_lease = etcd_call(grant_lease)

    def refresh_lease(self, lease_id: int) -> bool:
        """Renew a lease; False if it has expired."""
        ttl = None
        for response in self.client.refresh_lease(lease_id):
            ttl = response.TTL
        return ttl is not None and ttl > 0

    refresh_lease = etcd_call(refresh_lease)

    def claim_node(self, name: str, entry: dict, lease_id: int) -> NodeName:
        """Write this node's entry under ``name`` only if no entry has the name (a live
        node's is kept under its lease); either way, who has the name now."""
        key = self.node_key(name)
        tx = self.client.transactions
        ok, responses = self.client.transaction(
            compare=[tx.create(key) == 0],
            success=[tx.put(key, orjson.dumps(entry), lease=lease_id), tx.get(key)],
            failure=[tx.get(key)],
        )
        found = responses[-1]
        if not found:  # gone again between the write and the read (deleted by hand): nobody's
            return NodeName(ours=False, create_revision=0, mod_revision=0, lease_id=0, entry=None)
        value, meta = found[0]
        try:
            held = orjson.loads(value)
        except orjson.JSONDecodeError:
            held = None
        return NodeName(
            ours=bool(ok),
            create_revision=meta.create_revision,
            mod_revision=meta.mod_revision,
            lease_id=meta.lease_id,
            entry=held if isinstance(held, dict) else None,
        )

    claim_node = etcd_call(claim_node)

    def lease_remaining_s(self, lease_id: int) -> int | None:
        """Seconds a lease has left; None if it is gone (or the key has no lease)."""
        if not lease_id:
            return None
        info = self.client.get_lease_info(lease_id)
        return info.TTL if info is not None and info.TTL >= 0 else None

    lease_remaining_s = etcd_call(lease_remaining_s)

    def put_node(self, name: str, entry: dict, lease_id: int, create_revision: int | None = None) -> bool:
        """Write a node's entry. With ``create_revision``, only while the name is still the
        entry's written then (this node's): False if it is not, and nothing is written."""
        key = self.node_key(name)
        if create_revision is None:
            self.client.put(key, orjson.dumps(entry), lease=lease_id)
            return True
        tx = self.client.transactions
        ok, _ = self.client.transaction(
            compare=[tx.create(key) == create_revision],
            success=[tx.put(key, orjson.dumps(entry), lease=lease_id)],
            failure=[],
        )
        return bool(ok)

    put_node = etcd_call(put_node)

    def remove_node(self, name: str, lease_id: int) -> None:
        self.client.delete(self.node_key(name))
        self.client.revoke_lease(lease_id)

    remove_node = etcd_call(remove_node)

    def revoke_lease(self, lease_id: int) -> None:
        self.client.revoke_lease(lease_id)

    revoke_lease = etcd_call(revoke_lease)

    def nodes(self) -> list[dict]:
        """The live nodes' entries (each under its node's lease), by name; unreadable ones left out."""
        out = []
        for value, _ in self.client.get_prefix(self.keys.nodes()):
            try:
                entry = orjson.loads(value)
            except orjson.JSONDecodeError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("node"), str):
                eps = entry.get("endpoints")
                if not isinstance(eps, list) or not all(isinstance(ep, str) for ep in eps):
                    entry["endpoints"] = []  # unusable: listed, but nobody connects to it
                out.append(entry)
        return sorted(out, key=lambda e: e["node"])

    nodes = etcd_call(nodes)

    def record_region(self, region: int, node: str) -> None:
        """Note that this cluster has nodes of ``region`` (no lease: the record stays)."""
        key = self.keys.region(region)
        tx = self.client.transactions
        self.client.transaction(
            compare=[tx.create(key) == 0], success=[tx.put(key, orjson.dumps({"first_node": node}))], failure=[]
        )

    record_region = etcd_call(record_region)

    def regions(self) -> list[int]:
        """The region numbers this cluster's nodes have used."""
        out = set()
        for _, meta in self.client.get_prefix(self.keys.regions(), keys_only=True):
            try:
                out.add(int(meta.key.decode().rsplit("/", 1)[1]))
            except ValueError:
                continue
        return sorted(out)

    regions = etcd_call(regions)

    def region_claims(self) -> RegionClaims:
        """The region claims of this etcd (see :mod:`.regions`); raises LayoutMismatch if unreadable."""
        return parse_claims(self._get(CLAIMS_KEY))

    region_claims = etcd_call(region_claims)

    def known(self) -> bool:
        """Whether the cluster's layout record exists: every cluster a node ever claimed in has one."""
        return self._get(self.keys.layout()) is not None

    known = etcd_call(known)

    def _get(self, key: str) -> bytes | None:
        tx = self.client.transactions
        _, responses = self.client.transaction(compare=[], success=[tx.get(key)], failure=[])
        return responses[0][0][0] if responses[0] else None

    def release_regions(self) -> list[int]:
        """Remove this cluster's region claims (a cluster retired for good), so another
        cluster of this etcd may claim its regions; refused while any worker ID of this
        cluster is held. Returns the regions released."""
        client = self.client
        tx = client.transactions
        for _ in range(5):
            _, (claims_kv, held) = client.transaction(
                compare=[],
                success=[tx.get(CLAIMS_KEY), tx.get(self.keys.claims(), _range_end(self.keys.claims()))],
                failure=[],
            )
            if held:
                raise SnowfenceError(
                    f"cluster {self.config.cluster!r} still holds {len(held)} worker IDs: stop its nodes (and let "
                    "their leases lapse) before releasing its regions"
                )
            value, meta = claims_kv[0] if claims_kv else (None, None)
            claims = parse_claims(value)
            mine = sorted(r for r, c in claims.regions.items() if c.cluster == self.config.cluster)
            if not mine:
                return []
            left = claims.released(self.config.cluster)
            ok, _ = client.transaction(
                compare=[tx.mod(CLAIMS_KEY) == meta.mod_revision],
                success=[tx.put(CLAIMS_KEY, left.to_bytes()) if left.regions else tx.delete(CLAIMS_KEY)],
                failure=[],
            )
            if ok:
                return mine
        raise LayoutMismatch(f"the region claims {CLAIMS_KEY} kept changing under this command")

    release_regions = etcd_call(release_regions)

    def census(self) -> list[dict]:
        """Every worker ID of the cluster that has a claim or a mark, in any region.

        A worker ID with a mark but no claim is retired: free to claim, but a new
        owner mints nothing until its clock has passed the mark (the mark makes the
        old idea of a tombstone quarantine exact). One whose mark cannot be read is
        ``unreadable`` (a claim passes it over), or held with no ``mark_ms``; keys
        that name no region and worker ID are left out.
        """
        client = self.client
        layout = self.config.layout
        entries: dict[tuple[int, int], dict] = {}
        for value, meta in client.get_prefix(self.keys.marks()):
            where = place(meta.key, self.keys.marks())
            if where is None:
                continue
            region, worker = where
            try:
                mark = orjson.loads(value)
                entry = {
                    "state": "retired",
                    "mark_ms": mark_ms(mark, layout),
                    "mark_token": mark.get("token"),
                    "last_holder": mark.get("holder"),
                }
            except (KeyError, TypeError, ValueError, AttributeError):  # orjson's errors are ValueErrors
                entry = {"state": "unreadable", "mark_ms": None}
            entries[where] = {"region": region, "worker_id": worker, **entry}
        for value, meta in client.get_prefix(self.keys.claims()):
            where = place(meta.key, self.keys.claims())
            if where is None:
                continue
            region, worker = where
            entry = entries.setdefault(where, {"region": region, "worker_id": worker, "mark_ms": None})
            try:
                holder = orjson.loads(value).get("holder")
            except (ValueError, AttributeError):
                holder = None
            info = client.get_lease_info(meta.lease_id) if meta.lease_id else None
            entry.update(
                {
                    "state": "held",
                    "holder": holder,
                    "token": meta.create_revision,
                    "lease_id": f"{meta.lease_id:x}",
                    "lease_remaining_s": info.TTL if info is not None else None,
                    "renewed_ago_s": (info.grantedTTL - info.TTL) if info is not None and info.TTL >= 0 else None,
                }
            )
        return [entries[k] for k in sorted(entries)]

    census = etcd_call(census)
