"""The broker's decisions, with no socket, thread or clock of its own.

:class:`NodeCore` is what a broker process decides between its parts: when each
timer gets its turn (:meth:`NodeCore.housekeeping`, one step of the loop's timers
on a ``now_ns`` it is given), what the peers' clock verdict is handed to (the
routing core, and the broker's own worker ID's store), the node's membership entry
and which registered nodes' clocks it measures (etcd contents are input), which
store its worker IDs come from, its part of STATUS and NODES, and what a stop does.

Its parts are given: the supervisor, the routing core, the metrics, and as they
start the peer clocks, the membership view, the broker's own worker ID and the
watermark. What needs a socket is a callback: the doors' timers and STATUS parts,
``rewire_peers`` (the loop's epoll set lets go of the peers' sockets around a
change of the peer set) and ``stopping`` (systemd is told). broker/main.py's
``Node`` is the adapter around it (descriptors, threads, the loop); the simulator
(tests/sim) builds and calls the same core with simulated parts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from .. import protocol
from ..config import Config
from ..logs import event
from ..store import home
from .metrics import Metrics
from .own import workers_settled
from .peers import ALONE, PENDING, VOUCHED, Verdict

if TYPE_CHECKING:
    from .own import OwnWorkerId
    from .peers import PeerClocks
    from .routing import Routing
    from .supervisor import Supervisor
    from .watermark import Watermark

log = logging.getLogger("snowfence.broker")

#: How often the node publishes its membership entry and takes in the cluster's (and
#: how often the peers' clocks are measured).
PEER_INTERVAL_S = 1.0
PEER_INTERVAL_NS = int(PEER_INTERVAL_S * 1e9)


class MembershipView(Protocol):
    """What the core asks of the membership (broker/membership.py's ``Membership``)."""

    #: This node's name in the cluster.
    name: str
    #: The cluster's nodes as last read (this one's entry among them once registered).
    nodes: list[dict]
    #: When ``nodes`` was read (monotonic ns); None before the first read.
    read_ns: int | None

    def publish(self, entry: dict) -> None: ...

    def view(self, own: dict) -> list[dict]: ...


def peer_endpoints(nodes: Iterable, own_name: str) -> list[str]:
    """The endpoints whose clocks this node measures: each other registered node's first
    advertised endpoint. The entries come from etcd, which anyone with its credentials
    writes: an entry that is no dict, names no endpoint list, or whose endpoint is no
    valid ZeroMQ endpoint is left out rather than connected to."""
    out = []
    for n in nodes:
        if not isinstance(n, dict) or n.get("node") == own_name:
            continue
        endpoints = n.get("endpoints")
        if not isinstance(endpoints, list) or not endpoints or not isinstance(endpoints[0], str):
            continue
        if protocol.endpoint_problem(endpoints[0]) is None:
            out.append(endpoints[0])
    return out


def _no_change(change: Callable[[], None]) -> None:
    change()


def _nothing(*_args) -> None:
    pass


class NodeCore:
    """One broker process's decisions. Its step is :meth:`housekeeping`; the supervisor's
    stop and exit callbacks are :meth:`on_stop` and :meth:`on_exit` (set here)."""

    def __init__(
        self,
        config: Config,
        supervisor: Supervisor,
        routing: Routing,
        metrics: Metrics,
        *,
        now_ns: int,
        pid: int,
        bind: str,
        entry: dict | None = None,
        fast_port: int | None = None,
        http_port: int | None = None,
        timers: Iterable[Callable[[int], None]] = (),
        door_status: Callable[[], dict] = dict,
        snapshot_metrics: bool = False,
        rewire_peers: Callable[[Callable[[], None]], None] = _no_change,
        stopping: Callable[[str], None] = _nothing,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.config = config
        self.supervisor = supervisor
        self.routing = routing
        self.metrics = metrics
        self.pid = pid
        #: The endpoint the node's ZeroMQ frontend bound.
        self.bind = bind
        #: This node's membership entry: what does not change while it runs.
        self.entry = dict(entry or {})
        self.fast_port = fast_port
        self.http_port = http_port
        #: The doors' timers, each given ``now_ns`` after the routing core's.
        self.timers = list(timers)
        #: The doors' parts of STATUS ({"fast_port": ..., "http_port": ...}).
        self.door_status = door_status
        #: Whether the metrics snapshot is built (someone serves it: the health server).
        self.snapshot_metrics = snapshot_metrics
        #: Called around a change of the peer set with the change to make: the adapter's
        #: epoll set lets go of every peer socket first (a closed one's descriptor may come
        #: back as a new one's) and watches the new set after.
        self.rewire_peers = rewire_peers
        #: Called once as the node begins to stop, with why (before the workers are told).
        self.stopping = stopping
        self._wall_ns = wall_ns
        #: The parts that start after the core: the peers' clocks, the membership (etcd
        #: mode), the broker's own worker ID and the watermark (each None until it runs).
        self.peers: PeerClocks | None = None
        self.membership: MembershipView | None = None
        self.own: OwnWorkerId | None = None
        self.watermark: Watermark | None = None
        #: The peers' last verdict on this node's clock acted on (see :meth:`follow_verdict`).
        self.verdict = Verdict(PENDING, None, None, "not judged yet")
        #: When the timers last had their turn (monotonic ns; ``now_ns`` at first): the
        #: broker's own worker ID lets its worker ID go when the loop stalls.
        self.loop_ns = now_ns
        self._next_membership_ns = 0
        self._store_id: str | None = None
        supervisor.on_stop = self.on_stop
        supervisor.on_exit = self.on_exit

    # -- the step
    def housekeeping(self, now_ns: int) -> bool:
        """The timers, in order: the own worker ID's state into the metrics (when it has a
        new one), the supervisor's, the routing core's, the doors', the membership's turn
        every PEER_INTERVAL_S, the peers' with their verdict acted on, the metrics snapshot.
        False once the supervisor says the node has stopped."""
        sup, routing = self.supervisor, self.routing
        self.loop_ns = now_ns
        own = self.own
        if own is not None and own.state_due:
            # As often as a worker sends its STATE (on a change, every heartbeat), not every
            # turn: describing it and adding it up costs the loop ~0.1-0.2 ms, which a
            # single-ID client whose request arrives meanwhile waits for.
            state = own.snapshot(now_ns)
            if state is not None:
                self.metrics.observe(b"own", state)
                self.metrics.own = state
        if not sup.tick(now_ns, routing.heard):
            return False
        routing.tick(now_ns)
        for tick in self.timers:
            tick(now_ns)
        if now_ns >= self._next_membership_ns:
            self._next_membership_ns = now_ns + PEER_INTERVAL_NS
            self.follow_membership()
        peers = self.peers
        if peers is not None:
            peers.tick(now_ns)
            if peers.verdict is not self.verdict:
                self.follow_verdict(peers.verdict)
        if self.snapshot_metrics:  # the snapshot is the HTTP thread's; building one costs ~1 ms
            self.metrics.maybe_snapshot(now_ns, routing, sup.restarts, sup.kills)
        return True

    def follow_membership(self) -> None:
        """Publish this node's entry; measure clocks against every other registered node
        (:func:`peer_endpoints`) and the configured peers."""
        membership, peers = self.membership, self.peers
        if membership is None or peers is None:
            return
        membership.publish(self.own_entry())
        wanted = [*self.config.peers, *peer_endpoints(membership.nodes, membership.name)]
        complete = membership.read_ns is not None
        self.rewire_peers(lambda: peers.set_peers(wanted, complete=complete))

    def follow_verdict(self, verdict: Verdict) -> None:
        """Act on the peers' verdict on this node's clock: the workers and the broker's own
        worker ID are told first (no claim once it is refused), then it is logged on a change
        of state. Refused (vetoed, or unvouched after the wait): out of rotation, no claims,
        and the worker IDs held let go (the workers do that when told)."""
        was, self.verdict = self.verdict, verdict
        routing = self.routing
        routing.clock_verdict = verdict.claims  # tells the workers of a change
        own = self.own.store if self.own is not None else None
        if own is not None and own.claim_veto != verdict.claims:
            own.claim_veto = verdict.claims  # and the broker's own worker ID
        routing.veto = verdict.claims if verdict.refused else verdict.rotation
        if (was.state, bool(was.rotation)) == (verdict.state, bool(verdict.rotation)):
            return  # logged when it changes, not per offset measured
        if verdict.refused:
            name = "clock_veto" if verdict.rotation else "claims_vetoed"
            event(
                log,
                name,
                f"leaving rotation, claiming no worker ID and letting those held go: {verdict.claims}",
                level=logging.ERROR,
                verdict=verdict.state,
            )
        elif verdict.state == ALONE:
            event(
                log,
                "clock_alone",
                f"{verdict.reason}: claims count on this clock unchecked",
                level=logging.WARNING,
                verdict=verdict.state,
            )
        elif verdict.state == VOUCHED:
            if was.refused and was.rotation:
                event(log, "rejoined", "clock agrees with the cluster again", verdict=verdict.state)
            elif was.refused:
                event(log, "claims_allowed", "a majority of the cluster vouches for the clock again")
            else:
                event(log, "clock_vouched", f"clock vouched for ({verdict.reason}): claiming", verdict=verdict.state)

    # -- the stop plan (the supervisor's callbacks)
    def on_stop(self) -> None:
        """The node begins to stop: said (``stopping``), then no new request is taken and
        every worker is sent STOP (it drains what reached it, then releases)."""
        self.stopping(self.supervisor.stop_reason)
        self.routing.stop_accepting()
        self.routing.broadcast(protocol.STOP_FRAME)

    def on_exit(self, pid: int) -> None:
        """A worker process was reaped: the routing core forgets it (no request goes there)."""
        self.routing.forget_pid(pid, "process exited")

    # -- what the node says of itself
    def workers_settled(self) -> bool:
        """Every worker process of this node is connected and holds all its worker IDs.
        Read from the broker's own worker ID's thread: a snapshot of the links (taken
        under the GIL), never a lock the loop would wait for."""
        return workers_settled(self.routing.links.values(), len(self.supervisor.procs), self.config.ids_per_worker)

    def own_entry(self) -> dict:
        """This node's membership entry as of now."""
        routing = self.routing
        worker_ids = sorted(
            {h.worker_id for link in routing.links.values() for h in link.status.held if h.worker_id is not None}
            | set(self.own.worker_ids() if self.own is not None else ())
        )
        return {
            **self.entry,
            "store_id": self.store_id(),
            "fast_port": self.fast_port,
            "http_port": self.http_port,
            "worker_ids": worker_ids,
            "in_rotation": bool(routing.rotation) and routing.veto is None,
            "clock_offsets_ms": {
                ep: round(o["offset_s"] * 1000, 3) for ep, o in (self.peers.describe() if self.peers else {}).items()
            },
            # Why this node refuses claims, if it does (the store went back): `accept-restore`
            # reads it here, from etcd, where it cannot ask a node that takes only CURVE clients.
            "store_problem": next(
                (link.status.store_problem for link in routing.links.values() if link.status.store_problem), None
            ),
        }

    def store_id(self) -> str | None:
        """The identity of the store this node's worker IDs come from (its genesis record's,
        made with the store), once this node has read it; None before. Two nodes that answer
        for one region with different ones are two homes of that region (see store/home.py)."""
        if self._store_id is None:
            for part in (self.own, self.watermark):
                genesis = getattr(getattr(part, "store", None), "genesis", None)
                if genesis is not None and genesis.store_id:
                    self._store_id = genesis.store_id
                    break
            else:
                if self.config.embedded:
                    self._store_id = home.embedded_store_id(self.config.state_dir)
        return self._store_id

    def nodes(self) -> dict:
        """The answer to NODES: the cluster's live nodes as this node last read them."""
        own = self.own_entry()
        # The answering node's own ports: a client reaches them at the host it reached this node on.
        if self.membership is None:
            return {"cluster": None, "nodes": [own], "fast_port": self.fast_port, "http_port": self.http_port}
        return {
            "cluster": self.config.cluster,
            "nodes": self.membership.view(own),
            "fast_port": self.fast_port,
            "http_port": self.http_port,
        }

    def describe(self) -> dict:
        """The broker's part of STATUS."""
        config = self.config
        doors = self.door_status()
        return {
            "pid": self.pid,
            "bind": self.bind,
            "mode": "embedded" if config.embedded else "etcd",
            "cluster": None if config.embedded else config.cluster,
            "store_id": self.store_id(),
            **self.supervisor.describe(),
            "mints_up_to": config.broker_mint_max_ids if self.own is not None else 0,
            "max_inflight_per_client": config.max_inflight_per_client,
            "fast_port": doors.get("fast_port"),
            "http_port": doors.get("http_port"),
            "own_worker_id": self.own.describe() if self.own is not None else None,
            # The peers' verdict on this node's clock (None: nobody judges it).
            "clock": self.peers.verdict.to_dict() if self.peers is not None else None,
            "watermark": (
                self.watermark.describe(self._wall_ns() // 1_000_000 - config.layout.epoch_ms)
                if self.watermark is not None
                else None
            ),
        }
