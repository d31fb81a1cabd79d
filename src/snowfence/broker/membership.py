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
from ..errors import ConfigError, SnowfenceError
from ..ids import format_unix_ms
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


class NodeNameTaken(ConfigError):
    """Another live node of the cluster has this node's name."""


def holder_text(entry: dict | None) -> str:
    """The holder of a node name, in words: its endpoints, host process and start."""
    if not entry:
        return "an entry that cannot be read"
    eps = entry.get("endpoints") or []
    where = ", ".join(str(e) for e in eps) if isinstance(eps, list) and eps else "no endpoint advertised"
    started = entry.get("started_unix_ms")
    since = f", started {format_unix_ms(started)}" if isinstance(started, int) else ""
    return f"on {where}{since}"


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
        #: The revision this node's entry was created at while the name is this node's; None otherwise.
        self.created: int | None = None
        #: The entry of the node that holds this node's name, while another does.
        self.taken_by: dict | None = None
        self.error: str | None = None
        self._stopping = threading.Event()

    def publish(self, entry: dict) -> None:
        self.entry = entry

    def register(self, sleep=time.sleep, now=time.monotonic) -> None:
        """Take this node's name in the cluster before it says it serves.

        A name is one node's: the entry is written only where none has the name. If
        another entry has it, its holder is live when it rewrites the entry (every
        ``keepalive_interval_s``): this node refuses at once (:class:`NodeNameTaken`,
        naming the holder). An entry nobody rewrites is a dead node's, this one's own
        before a restart, say: it lapses with its lease (at most ``lease_ttl_s``), and
        this node waits for that, then takes the name. etcd not answering is left to
        the thread (the node starts; its entry is written once etcd answers).
        """
        cluster = self.cluster
        try:
            self.lease_id = cluster.grant_lease(self.config.lease_ttl_s)
            cluster.record_region(self.config.region, self.name)
            seen = cluster.claim_node(self.name, self.entry, self.lease_id)
            if seen.ours:
                self.created = seen.create_revision
                return
            remaining = cluster.lease_remaining_s(seen.lease_id)
            # etcd drops an expired lease's keys a little after its TTL: a second more than the longer of the two.
            deadline = now() + max(remaining or 0, self.config.lease_ttl_s) + 1.0
            if seen.create_revision:
                event(
                    log,
                    "node_name_waiting",
                    f"node name {self.name!r} is in use ({holder_text(seen.entry)}); waiting up to "
                    f"{deadline - now():.0f} s for its entry to lapse, as a stopped node's does",
                    node=self.name,
                )
            while True:
                last = seen
                sleep(min(0.2, self.interval_s / 4))
                if not cluster.refresh_lease(self.lease_id):  # this node's own, kept while it waits
                    self.lease_id = cluster.grant_lease(self.config.lease_ttl_s)
                seen = cluster.claim_node(self.name, self.entry, self.lease_id)
                if seen.ours:
                    self.created = seen.create_revision
                    return
                rewritten = seen.create_revision == last.create_revision and seen.mod_revision != last.mod_revision
                if rewritten or now() >= deadline:
                    raise NodeNameTaken(
                        f"node name {self.name!r} is held by a live node of cluster {self.config.cluster!r} "
                        f"({holder_text(seen.entry)}): give this node another --node-name, or stop that one"
                    )
        except SnowfenceError as exc:
            if isinstance(exc, NodeNameTaken):
                try:
                    cluster.revoke_lease(self.lease_id)
                except SnowfenceError:
                    pass
                self.lease_id = None
                raise
            event(log, "membership_failed", f"cannot reach etcd for membership: {exc}", level=logging.WARNING)
            self.error = str(exc)

    def step(self) -> None:
        """Renew (or take) the lease, write the entry, read everyone's."""
        cluster = self.cluster
        if self.lease_id is None or not cluster.refresh_lease(self.lease_id):
            if self.lease_id is not None:
                event(log, "membership_lapsed", "the node's membership lease lapsed; registering again")
            self.lease_id = cluster.grant_lease(self.config.lease_ttl_s)
            self.created = None
            cluster.record_region(self.config.region, self.name)
        if self.created is not None and not cluster.put_node(self.name, self.entry, self.lease_id, self.created):
            self.created = None  # the entry went (by hand, or with a lease that lapsed)
        if self.created is None:
            seen = cluster.claim_node(self.name, self.entry, self.lease_id)
            if seen.ours:
                self.created = seen.create_revision
                self.taken_by = None
            else:
                # Never write over another live node's entry: that would hide it from clients.
                if self.taken_by is None:
                    event(
                        log,
                        "node_name_taken",
                        f"node name {self.name!r} is now held by another node ({holder_text(seen.entry)}): this "
                        "node is left out of the cluster's membership until it is free; give one of them another "
                        "--node-name",
                        level=logging.ERROR,
                    )
                self.taken_by = seen.entry or {}
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
                if self.created is not None:  # under this node's live lease the entry is its own
                    self.cluster.remove_node(self.name, self.lease_id)
                else:  # the name is another node's (or was never written): its entry stays
                    self.cluster.revoke_lease(self.lease_id)
            except SnowfenceError:
                pass  # the entry lapses with the lease
        self.cluster.close()

    def view(self, own: dict) -> list[dict]:
        """The nodes to tell a client about: as read, with this node's entry as it is now."""
        nodes = [n for n in self.nodes if n.get("node") != self.name]
        return sorted([*nodes, own], key=lambda n: str(n.get("node")))
