"""A worker's leases on worker IDs in etcd, and the time high-water mark next to them.

The keys are in :mod:`snowfence.etcd.keys`: a claim per worker ID under ``workers/``, held
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

The store is split by job: :mod:`.records` (the genesis record read without a store),
:mod:`.lease` (``EtcdLease``), and ``EtcdStore`` (:mod:`.store`), assembled from
:mod:`.layout` (the layout record and the region's claim), :mod:`.restore`
(``accept-restore``), :mod:`.claims` and :mod:`.watermark_round`.
"""

from __future__ import annotations

from .lease import EtcdLease
from .records import parse_genesis, read_genesis, read_region_claims
from .store import EtcdStore

__all__ = ["EtcdLease", "EtcdStore", "parse_genesis", "read_genesis", "read_region_claims"]
