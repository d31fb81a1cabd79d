"""A node's place in its cluster: who it is, how to reach it, and who else is there.

In etcd mode each node keeps an entry at ``/snowfence/<cluster>/nodes/<node>``
under a lease of its own (``lease_ttl_s``): its client endpoints and metrics
address, region, version, layout hash, start time, the worker IDs it holds,
whether it is in rotation and its clock offsets to its peers. A thread of the
broker renews the lease and rewrites the entry every ``keepalive_interval_s``
and reads everyone's entries back; a clean shutdown removes the entry, a dead
node's expires with its lease. The broker answers NODES requests from what it
read (clients never talk to etcd) and measures its clock against every node it
sees. In embedded mode a node is a cluster of one and answers with itself.

The thread only swaps whole objects (the entry it is given, the list it read),
so the broker's loop reads them without a lock.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
import time

import orjson

from .. import __version__
from ..config import Config
from ..errors import SnowfenceError
from ..logs import event

log = logging.getLogger("snowfence.broker")

#: Wildcard hosts a node can bind but nobody can connect to.
WILDCARD_HOSTS = ("*", "0.0.0.0", "::", "[::]", "[::0]")


def advertised_endpoints(config: Config, bound: str) -> list[str]:
    """The endpoints to tell others: ``advertise`` if set, else the bound one unless it is a wildcard."""
    if config.advertise:
        return list(config.advertise)
    scheme, _, address = bound.partition("://")
    if scheme == "tcp" and address.rpartition(":")[0] in WILDCARD_HOSTS:
        return []
    return [bound]


def node_name(config: Config, endpoints: list[str]) -> str:
    if config.node_name:
        return config.node_name
    if endpoints:
        return endpoints[0]
    return f"{socket.gethostname()}:{config.bind}"


def layout_hash(config: Config) -> str:
    return hashlib.sha256(orjson.dumps(config.layout.to_dict(), option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def base_entry(config: Config, name: str, endpoints: list[str], metrics: str | None) -> dict:
    """The parts of a node's entry that do not change while it runs."""
    return {
        "node": name,
        "cluster": None if config.embedded else config.cluster,
        "endpoints": endpoints,
        "metrics": metrics,
        "region": config.region,
        "version": __version__,
        "layout_hash": layout_hash(config),
        "started_unix_ms": time.time_ns() // 1_000_000,  # a timestamp to show, never a duration
        # The bounds a store's quarantines count on, to be set alike on every node: status
        # compares them across the cluster.
        "bounds": bounds_of(config),
    }


def bounds_of(config: Config) -> dict:
    return {
        "reservation_window_ms": int(config.reservation_window_s * 1000),
        "max_reservation_window_ms": int(config.max_reservation_window_s * 1000),
        "max_ahead_ms": config.max_ahead_ms,
        "max_clock_skew_ms": config.max_clock_skew_ms,
        "max_peer_offset_ms": config.peer_offset_bound_ms,
    }


#: The bounds that must be alike on every node of a cluster (each node's own window may differ).
SHARED_BOUNDS = ("max_reservation_window_ms", "max_ahead_ms", "max_clock_skew_ms", "max_peer_offset_ms")


def bounds_differ(members: list[dict]) -> list[str]:
    """What the cluster's nodes do not set alike, one line per bound (nodes of an older
    release, with no bounds in their entry, are left out)."""
    out = []
    for name in SHARED_BOUNDS:
        values: dict = {}
        for m in members:
            bounds = m.get("bounds")
            if isinstance(bounds, dict) and name in bounds:
                values.setdefault(bounds[name], []).append(str(m.get("node")))
        if len(values) > 1:
            shown = "; ".join(f"{v} on {', '.join(sorted(nodes))}" for v, nodes in sorted(values.items(), key=str))
            out.append(f"{name} is not set alike: {shown}")
    return out


class Membership(threading.Thread):
    """Keeps this node's entry in etcd and reads the cluster's, in the background."""

    def __init__(self, config: Config, name: str, entry: dict) -> None:
        super().__init__(name="membership", daemon=True)
        from ..etcd.cluster import Cluster

        self.config = config
        self.name = name
        self.cluster = Cluster(config)
        self.interval_s = config.keepalive_interval_s
        #: This node's entry as the broker last published it.
        self.entry = entry
        #: The cluster's live nodes as last read from etcd (this one included once registered).
        self.nodes: list[dict] = []
        #: When ``nodes`` was read (monotonic ns); None before the first read.
        self.read_ns: int | None = None
        self.lease_id: int | None = None
        self.error: str | None = None
        self._stopping = threading.Event()

    def publish(self, entry: dict) -> None:
        self.entry = entry

    def step(self) -> None:
        """Renew (or take) the lease, write the entry, read everyone's."""
        cluster = self.cluster
        if self.lease_id is None or not cluster.refresh_lease(self.lease_id):
            if self.lease_id is not None:
                event(log, "membership_lapsed", "the node's membership lease lapsed; registering again")
            self.lease_id = cluster.grant_lease(self.config.lease_ttl_s)
            cluster.record_region(self.config.region, self.name)
        cluster.put_node(self.name, self.entry, self.lease_id)
        self.nodes = cluster.nodes()
        self.read_ns = time.monotonic_ns()

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.step()
            except SnowfenceError as exc:
                if self.error is None:
                    event(log, "membership_failed", f"cannot reach etcd for membership: {exc}", level=logging.WARNING)
                self.error = str(exc)
            except Exception as exc:  # a bug must not end the node's membership silently: log, go on
                log.exception("membership step failed")
                self.error = repr(exc)
            else:
                if self.error is not None:
                    event(log, "membership_restored", "membership in etcd works again")
                self.error = None
            self._stopping.wait(self.interval_s)

    def stop(self) -> None:
        """Stop renewing and remove the entry (a clean shutdown: others stop using us at once)."""
        self._stopping.set()
        if self.is_alive():
            self.join(self.config.etcd_timeout_s * 3)
        if self.lease_id is not None:
            try:
                self.cluster.remove_node(self.name, self.lease_id)
            except SnowfenceError:
                pass  # the entry lapses with the lease
        self.cluster.close()

    def view(self, own: dict) -> list[dict]:
        """The nodes to tell a client about: as read, with this node's entry as it is now."""
        nodes = [n for n in self.nodes if n.get("node") != self.name]
        return sorted([*nodes, own], key=lambda n: str(n.get("node")))
