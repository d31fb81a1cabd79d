"""The keys of one snowfence cluster in etcd, and how to read what they hold.

Keys, under ``/snowfence/<cluster>/``::

    layout                        the cluster's ID layout and the store's genesis (see workers/genesis.py)
    nodes/<node>                  a live node's entry (endpoints, region, worker IDs...), under its own lease
    regions/<region>              a region number this cluster's nodes use (no lease: it stays)
    workers/<region>/<worker>     the claim: holder (JSON), attached to a 10 s lease
    marks/<region>/<worker>       {"reserved_until_ms", "token", "holder", "store", "layout"}: no lease,
                                  it outlives owners
    used/<region>/<worker>        {"store", "holder"}: written by the worker ID's first claim, in its
                                  transaction; with no mark beside it, the worker ID's state is unknown

One key outside every cluster's prefix, ``/snowfence/region-claims``, records
which cluster of the etcd mints in which region (:mod:`.regions`).

The claims, marks, used keys, layout record and watermark record are the lease
store's (:mod:`snowfence.store.etcd`); the nodes and regions are the cluster's
(:mod:`.cluster`), which also reads the claims and marks for its census.

Every key is built here (:data:`REGION_CLAIMS`, :class:`ClusterKeys`), and
nowhere else: tests/unit/test_layers.py fails on a key spelled outside this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from ..ids import Layout

#: Which cluster of the etcd mints in which region (see :mod:`.regions`): outside every
#: cluster's prefix (a prefix ends in ``/`` after the cluster's name, and a name has none).
REGION_CLAIMS = "/snowfence/region-claims"


def prefix(cluster: str) -> str:
    """Where the keys of ``cluster`` live."""
    return f"/snowfence/{cluster}/"


@dataclass(frozen=True)
class ClusterKeys:
    """The keys of one cluster, under :attr:`prefix`. A method named for a family of keys
    with no worker ID gives the family's prefix (all regions', or one region's)."""

    cluster: str

    @property
    def prefix(self) -> str:
        return prefix(self.cluster)

    def layout(self) -> str:
        """The layout record: the cluster's layout and its store's genesis."""
        return self.prefix + "layout"

    def watermark(self) -> str:
        """The watermark record (see ``store/watermark.py``)."""
        return self.prefix + "watermark"

    def node(self, name: str) -> str:
        """A live node's entry (its name quoted: any string is one key)."""
        return self.nodes() + quote(name, safe="")

    def nodes(self) -> str:
        return self.prefix + "nodes/"

    def region(self, region: int) -> str:
        """The note that this cluster's nodes use ``region``."""
        return f"{self.regions()}{region}"

    def regions(self) -> str:
        return self.prefix + "regions/"

    def claim(self, region: int, worker_id: int) -> str:
        """A worker ID's claim, under its holder's lease (its create_revision: the fencing token)."""
        return f"{self.claims(region)}{worker_id}"

    def claims(self, region: int | None = None) -> str:
        return _family(self.prefix + "workers/", region)

    def mark(self, region: int, worker_id: int) -> str:
        """A worker ID's mark: no lease, it outlives owners."""
        return f"{self.marks(region)}{worker_id}"

    def marks(self, region: int | None = None) -> str:
        return _family(self.prefix + "marks/", region)

    def used(self, region: int, worker_id: int) -> str:
        """A worker ID's record of its first claim."""
        return f"{self.uses(region)}{worker_id}"

    def uses(self, region: int | None = None) -> str:
        return _family(self.prefix + "used/", region)


def _family(family: str, region: int | None) -> str:
    return family if region is None else f"{family}{region}/"


def range_end(prefix: str) -> str:
    """The end of the key range of ``prefix`` (its last character plus one)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def place(key: bytes, prefix: str) -> tuple[int, int] | None:
    """The region and worker ID of ``<prefix><region>/<worker>``; None for any other key."""
    try:
        rest = key.decode()
    except UnicodeDecodeError:
        return None
    parts = rest[len(prefix) :].split("/") if rest.startswith(prefix) else []
    if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def mark_ms(mark: dict, layout: Layout) -> int:
    """A mark's ``reserved_until_ms``, if it is one a node of ``layout`` could have written.

    Raises ValueError (or KeyError, TypeError) for anything else."""
    ms = mark["reserved_until_ms"]
    if type(ms) is not int or not 0 <= ms <= layout.max_ms:
        raise ValueError(f"reserved_until_ms is {ms!r}")
    return ms
