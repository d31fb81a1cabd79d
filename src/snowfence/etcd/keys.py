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

The claims, marks and layout record are the lease store's (:mod:`.store`); the
nodes and regions are the cluster's (:mod:`.cluster`), which also reads the
claims and marks for its census.
"""

from __future__ import annotations

from ..ids import Layout


def prefix(cluster: str) -> str:
    """Where the keys of ``cluster`` live."""
    return f"/snowfence/{cluster}/"


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
