"""Which cluster of an etcd mints in which region: claimed, not assumed.

Two clusters' IDs are disjoint only if their region numbers differ and their
layouts put the region in the same bits. Each cluster's keys live under its own
prefix (``/snowfence/<cluster>/``), where a second cluster never looks, so a
typo in ``--cluster`` used to give two clusters one region, silently. One key
outside every cluster's prefix records the claims of the whole etcd::

    /snowfence/region-claims
    {"version": 1,
     "widths": {"shard_bits": 0, "time_bits": 41, "region_bits": 3, "worker_bits": 7, "sequence_bits": 12},
     "regions": {"<region>": {"cluster": "<name>", "since_unix_ms": ..., "window_ms": ...}}}

(No cluster's prefix holds it: a prefix ends in ``/`` after the cluster's name,
and a name cannot contain one.)

* A cluster's first start claims its region in the transaction that writes its
  genesis; a node of a cluster that predates the key claims it at its start.
  Every claim of a worker ID reads it; every renewal of a holder reads it too,
  and a holder whose region is no longer its cluster's fences at once.
* A region claimed by another cluster, or a layout of other widths than the
  claims', is refused by name: the node does not start.
* ``window_ms`` is the longest reservation window any node of the region's
  cluster was allowed (``max_reservation_window_s``), only ever raised: a store
  of that region that looks new (its keys deleted) waits it out even though the
  cluster's own records went with the keys.

The epoch may differ between clusters: with the same widths, distinct region
numbers keep their IDs apart whatever their millisecond counts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import orjson

from ..errors import LayoutMismatch
from ..ids import Layout
from .keys import REGION_CLAIMS

VERSION = 1
WIDTHS = ("shard_bits", "time_bits", "region_bits", "worker_bits", "sequence_bits")


def widths(layout: Layout) -> dict[str, int]:
    return {name: getattr(layout, name) for name in WIDTHS}


@dataclass(frozen=True)
class RegionClaim:
    cluster: str
    since_unix_ms: int
    window_ms: int

    def to_dict(self) -> dict:
        return {"cluster": self.cluster, "since_unix_ms": self.since_unix_ms, "window_ms": self.window_ms}


@dataclass(frozen=True)
class RegionClaims:
    """The region claims of one etcd (empty: the key does not exist)."""

    widths: dict[str, int] | None = None
    regions: dict[int, RegionClaim] = field(default_factory=dict)

    def holder(self, region: int) -> RegionClaim | None:
        return self.regions.get(region)

    def check(self, region: int, cluster: str, layout: Layout) -> None:
        """Raise LayoutMismatch, naming who holds what, unless ``cluster`` may mint in
        ``region`` with ``layout``: the claims' widths are the layout's, and the region is
        unclaimed or this cluster's."""
        if self.widths is not None and self.widths != widths(layout):
            mine = ", ".join(f"{k} {v}" for k, v in widths(layout).items())
            theirs = ", ".join(f"{k} {v}" for k, v in self.widths.items())
            users = sorted({c.cluster for c in self.regions.values()})
            raise LayoutMismatch(
                f"the regions of this etcd are claimed by clusters of another layout ({theirs}; clusters "
                f"{', '.join(users) or '-'}), and cluster {cluster!r} is configured with {mine}: IDs of two "
                "layouts can be the same 64 bits whatever their regions, so this node will not start; use "
                "the same widths, or another etcd"
            )
        claim = self.regions.get(region)
        if claim is not None and claim.cluster != cluster:
            raise LayoutMismatch(
                f"region {region} of this etcd is claimed by cluster {claim.cluster!r}, not {cluster!r}: two "
                "clusters minting in one region issue the same IDs, so this node will not start; give it "
                "the region its cluster claimed (is --cluster mistyped?), or another region; a retired "
                f"cluster's claim is removed with `snowfence release-region --cluster {claim.cluster}`"
            )

    def claimed(self, region: int, cluster: str, layout: Layout, *, window_ms: int, now_unix_ms: int) -> RegionClaims:
        """These claims with ``region`` claimed by ``cluster`` and its window at least
        ``window_ms`` (raises as :meth:`check` does)."""
        self.check(region, cluster, layout)
        regions = dict(self.regions)
        claim = regions.get(region)
        if claim is None:
            regions[region] = RegionClaim(cluster, now_unix_ms, window_ms)
        elif claim.window_ms < window_ms:
            regions[region] = dataclasses.replace(claim, window_ms=window_ms)
        return RegionClaims(widths(layout), regions)

    def released(self, cluster: str) -> RegionClaims:
        """These claims without any of ``cluster``'s."""
        regions = {r: c for r, c in self.regions.items() if c.cluster != cluster}
        return RegionClaims(self.widths if regions else None, regions)

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {
                "version": VERSION,
                "widths": self.widths,
                "regions": {str(r): c.to_dict() for r, c in sorted(self.regions.items())},
            }
        )


def parse(value: bytes | None) -> RegionClaims:
    """The claims ``value`` holds (None: no key, no claims). Raises LayoutMismatch for a
    value snowfence could not have written: nothing can be concluded from it."""
    if value is None:
        return RegionClaims()
    try:
        doc = orjson.loads(value)
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            raise ValueError(f"not region claims of version {VERSION}")
        raw_widths, raw_regions = doc["widths"], doc["regions"]
        if raw_widths is not None and not (
            isinstance(raw_widths, dict)
            and set(raw_widths) == set(WIDTHS)
            and all(type(v) is int and v >= 0 for v in raw_widths.values())
        ):
            raise ValueError("widths are damaged")
        if not isinstance(raw_regions, dict):
            raise ValueError("regions is not an object")
        regions = {}
        for region, claim in raw_regions.items():
            if not (isinstance(region, str) and region.isascii() and region.isdigit()):
                raise ValueError(f"region {region!r} is not a number")
            if not (
                isinstance(claim, dict)
                and set(claim) == {"cluster", "since_unix_ms", "window_ms"}
                and isinstance(claim["cluster"], str)
                and claim["cluster"]
                and all(type(claim[k]) is int and claim[k] >= 0 for k in ("since_unix_ms", "window_ms"))
            ):
                raise ValueError(f"the claim of region {region} is damaged")
            regions[int(region)] = RegionClaim(claim["cluster"], claim["since_unix_ms"], claim["window_ms"])
        if regions and raw_widths is None:
            raise ValueError("regions are claimed without widths")
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise LayoutMismatch(
            f"the region claims {REGION_CLAIMS} are unreadable ({exc}): which cluster mints in which region is "
            "unknown, so no worker ID is claimed; put a good copy back, or delete the key to let every cluster's "
            "nodes claim their regions again"
        ) from None
    return RegionClaims(dict(raw_widths) if raw_widths is not None else None, regions)
