"""The broker process: its sockets, its threads and its one loop.

:class:`Node` owns everything with a file descriptor: the ZeroMQ context, the
run directory, the doors (``broker/doors/``: the ZeroMQ front's two sockets, the
fast port, the HTTP door), the CURVE server half, the health server, the
peer-clock sockets and the signal wake-up socket pair. It builds the routing core
and the doors around it; its loop polls them, hands what arrived to the doors
(or the peers), and every ``HOUSEKEEPING_NS`` gives the timers their turn: one
step of :class:`~snowfence.broker.nodecore.NodeCore` (``housekeeping``). The
decisions live in that core and the parts it is given; this module only binds,
starts threads and worker processes, and wires them together.
"""

from __future__ import annotations

import functools
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import orjson
import zmq
import zmq.backend

from ..config import Config
from ..errors import ConfigError
from ..logs import event, set_process_title
from ..store import home
from . import preflight, rundir
from .auth import CurveServer
from .doors.addresses import Doors
from .doors.fast import FastPort, fast_address
from .doors.http import HttpDoor, http_address
from .doors.tcp import TcpDoor
from .doors.zmq import ZmqFront
from .membership import Membership, advertised_endpoints, base_entry, node_name
from .metrics import HealthServer, Metrics
from .nodecore import PEER_INTERVAL_S, NodeCore
from .notify import Notifier
from .peers import PeerClocks
from .routing import Routing
from .supervisor import SIGNALS, Supervisor

if TYPE_CHECKING:
    from .own import OwnWorkerId
    from .watermark import Watermark

log = logging.getLogger("snowfence.broker")

LOOP_TICK_S = 0.05
HOUSEKEEPING_NS = 10_000_000


# Read on the loop's every look at its ZeroMQ sockets: the Cython method, and ints (the
# enums' & costs microseconds).
_get = zmq.backend.Socket.get
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


class Readiness:
    """The loop's descriptors in one epoll set: plain sockets (the fast port's and the
    HTTP door's, the wake-up pair) by their own descriptors, ZeroMQ sockets by their
    ``ZMQ_FD``. It is the doors' watcher (``doors/tcp.py``, ``Watcher``): each plain
    descriptor a door watches names the door as its owner, whose ``on_event`` gets
    its events.

    A ZeroMQ socket's descriptor only says "read ZMQ_EVENTS": it is edge-triggered,
    and a send or receive on the socket may use up its edge. So the loop reads the
    EVENTS of its ZeroMQ sockets whenever one's descriptor fired or anything may have
    been sent or received on one since it last read them, and only then. A turn that
    touched none (a fast port's request that the broker minted itself) costs one
    ``epoll_wait``, where ``zmq.Poller`` would also poll each ZeroMQ socket's
    mailbox twice and read its pid twice on every turn."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        #: The ZeroMQ sockets by their descriptors.
        self.zmq_fds: dict[int, zmq.Socket] = {}
        #: The plain descriptors' owners: what their events are handed to.
        self.owners: dict[int, TcpDoor] = {}

    def add_zmq(self, sock: zmq.Socket) -> None:
        fd = sock.getsockopt(zmq.FD)
        self.zmq_fds[fd] = sock
        self._epoll.register(fd, select.EPOLLIN)

    def remove_zmq(self, sock: zmq.Socket) -> None:
        for fd, known in list(self.zmq_fds.items()):
            if known is sock:
                del self.zmq_fds[fd]
                self.unwatch(fd)

    def watch(self, fd: int, mask: int, owner: TcpDoor | None = None) -> None:
        """Watch a plain descriptor for exactly ``mask`` (0: only hang-ups and errors);
        its events go to ``owner.on_event``, if it has one."""
        try:
            self._epoll.modify(fd, mask)
        except FileNotFoundError:
            self._epoll.register(fd, mask)
        if owner is not None:
            self.owners[fd] = owner

    def unwatch(self, fd: int) -> None:
        self._epoll.unregister(fd)
        self.owners.pop(fd, None)

    def poll(self, timeout_s: float) -> list[tuple[int, int]]:
        return self._epoll.poll(timeout_s)

    def close(self) -> None:
        self._epoll.close()


def spawn_worker(config: Config, slot: int, backend: str, node: str = "") -> subprocess.Popen:
    """Start the worker process for ``slot``, its spec on stdin; ``node``, the endpoint the
    broker bound, names the worker in its process title."""
    spec = {
        "config": config.to_dict(),
        "slot": slot,
        "backend": backend,
        "broker_pid": os.getpid(),
        "title": f"snowfence: worker {slot} of {node or config.bind}",
    }
    popen = subprocess.Popen([sys.executable, "-m", "snowfence.workers.main"], stdin=subprocess.PIPE, close_fds=True)
    try:
        popen.stdin.write(orjson.dumps(spec))
        popen.stdin.close()
    except BrokenPipeError:
        pass
    return popen


class Node:
    """One broker process: the doors, the routing core, the supervisor and what they talk through."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.rundir = ""
        #: Said "serving": from then on a stop leaves the state directory in place.
        self.announced = False
        self.metrics = Metrics(config)
        #: The routing core (``broker/routing.py``), and the doors it is fed by and answers
        #: through: the ZeroMQ front, and the fast port and the HTTP door if the node has them.
        self.routing: Routing | None = None
        self.front: ZmqFront | None = None
        self.fast: FastPort | None = None
        self.http: HttpDoor | None = None
        self.curve: CurveServer | None = None
        self.health: HealthServer | None = None
        self.peers: PeerClocks | None = None
        self.membership: Membership | None = None
        #: The node's decisions (made once the doors are bound): see broker/nodecore.py.
        self.core: NodeCore | None = None
        self.notifier: Notifier | None = None
        #: The broker's own worker ID, for small requests (``broker_mint_max_ids``).
        self.own: OwnWorkerId | None = None
        #: The node's watermark rounds (``watermark_interval_s``; None: it answers no WATERMARK).
        self.watermark: Watermark | None = None
        #: This node's name for its region's home on this host (see store/home.py).
        self.home: home.HomeHold | None = None
        # Its stop and exit callbacks are the core's (set when the core is made).
        self.supervisor = Supervisor(config, self._spawn)

    @property
    def backend(self) -> str:
        return f"ipc://{self.rundir}/backend"

    def _spawn(self, slot: int) -> subprocess.Popen:
        return spawn_worker(self.config, slot, self.backend, self.front.endpoint() if self.front else "")

    def _stopping(self, reason: str) -> None:
        """systemd is told the node stops (the core's ``stopping``)."""
        if self.notifier is not None:
            self.notifier.notify(STOPPING="1", STATUS=f"stopping: {reason}")

    def run(self) -> int:
        """Serve until stopped; a start that fails before it says it serves leaves nothing behind:
        the directories it made (state, journal, run base) are removed if they are still empty."""
        config = self.config
        bases = [base for base, _ in rundir.candidates(config.state_dir)]
        made = _absent([config.state_dir, config.journal_path, *bases])
        try:
            return self._run()
        finally:
            if not self.announced:
                for path in made:  # deepest first; only empty ones, so nothing another made or wrote goes
                    try:
                        os.rmdir(path)
                    except OSError:
                        pass

    def _run(self) -> int:
        sup = self.supervisor
        preflight.check(self.config)
        # Held before anything is bound or spawned, and let go after every worker is gone:
        # while any process of this node may mint, no other home may serve its region here.
        self.home = home.HomeHold(home.for_config(self.config))
        if self.home.hold() is None:
            event(
                log,
                "region_home_unchecked",
                "cannot read /proc/net/unix: another state directory serving this region on this host would "
                "not be seen (this node's own name is held, so a later one sees it)",
                level=logging.WARNING,
            )
        for name, message in preflight.warnings(self.config):
            event(log, name, message, level=logging.WARNING)
        # Read (and taken out of the environment) before any worker is spawned.
        self.notifier = Notifier()
        # A node started under nohup was asked to outlive its terminal: SIGHUP stays ignored.
        handled = [s for s in SIGNALS if not (s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN)]
        self.rundir = rundir.create(self.config.state_dir)
        ctx = zmq.Context()
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        try:
            self.curve = CurveServer(ctx, self.config, self.metrics.curve_denials)
            self.open_doors(ctx)
            self.curve.watch(self.front.frontend)
            set_process_title(f"snowfence: broker {self.front.endpoint()}", "snowfence")
            self.metrics.fast = self.fast
            if self.config.metrics_bind:
                try:
                    self.health = HealthServer(self.config.metrics_bind, self.metrics)
                except OSError as exc:
                    raise ConfigError(f"cannot serve metrics on {self.config.metrics_bind}: {exc.strerror}") from None
                self.health.start()
                event(
                    log,
                    "metrics",
                    f"metrics and health on http://{self.health.address}/metrics",
                    address=self.health.address,
                )
            endpoints = advertised_endpoints(self.config, self.front.endpoint())
            name = node_name(self.config, endpoints)
            core = self.core = NodeCore(
                self.config,
                sup,
                self.routing,
                self.metrics,
                now_ns=time.monotonic_ns(),
                pid=os.getpid(),
                bind=self.front.endpoint(),
                entry=base_entry(self.config, name, endpoints, self.health.address if self.health else None),
                fast_port=self.fast.port if self.fast is not None else None,
                http_port=self.http.port if self.http is not None else None,
                timers=[self.http.tick] if self.http is not None else [],
                door_status=self.door_status,
                snapshot_metrics=self.health is not None,
                stopping=self._stopping,
            )
            self.routing.describe_nodes = core.nodes
            signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
            for sig in handled:
                signal.signal(sig, sup.enqueue)
            if not self.config.embedded:
                self.membership = core.membership = Membership(self.config, name, core.own_entry())
                # The node's name is taken before it says it serves: one held by a live node is refused.
                self.membership.register()
            if self.config.peers or self.membership is not None:
                self.peers = PeerClocks(
                    ctx,
                    list(self.config.peers),
                    interval_s=PEER_INTERVAL_S,
                    bound_ms=self.config.peer_offset_bound_ms,
                    curve=self.curve.for_peers(),
                    # The membership's members are known once it was read.
                    complete=self.membership is None,
                )
                self.metrics.peers = core.peers = self.peers
            mode = "embedded" if self.config.embedded else f"etcd cluster {self.config.cluster!r}"
            n = len(sup.procs)
            self.announced = True
            event(
                log,
                "serving",
                f"snowfence serving on {self.front.endpoint()} ({mode}, region "
                f"{self.config.region}, {n} worker{'' if n == 1 else 's'})",
                bind=self.front.endpoint(),
                workers=n,
                mode="embedded" if self.config.embedded else "etcd",
            )
            sup.start()
            if self.config.broker_mint_max_ids:
                self.start_own()
            self.start_watermark()
            if self.membership is not None:
                self.membership.start()
            # Bound and supervising: alive, whether or not a worker ID can be had yet
            # (a standby node, or one waiting out a mark, must not be killed for it).
            self.notifier.notify(READY="1", STATUS=f"serving on {self.front.endpoint()} ({mode})")
            self.loop(wake_r)
        finally:
            signal.set_wakeup_fd(-1)
            for sig in handled:
                signal.signal(sig, signal.SIG_DFL)
            if self.own is not None:
                self.own.stop()
            if self.watermark is not None:
                self.watermark.stop()
            sup.kill_all(signal.SIGKILL)
            if self.membership is not None:
                self.membership.stop()
            if self.health is not None:
                self.health.close()
            if self.peers is not None:
                self.peers.close()
            if self.curve is not None:
                self.curve.close()
            for door in (self.fast, self.http, self.front):
                if door is not None:
                    door.close()
            # Closed sockets keep their own linger; one still open here (a failed
            # start) must not keep the context, and the process, waiting forever.
            ctx.destroy(linger=0)
            wake_r.close()
            wake_w.close()
            rundir.remove(self.rundir)
            self.home.close()
        event(log, "stopped", f"snowfence stopped (exit status {sup.exit_code})", exit_status=sup.exit_code)
        return sup.exit_code

    def open_doors(self, ctx: zmq.Context) -> None:
        """The routing core and the doors around it (:func:`open_doors`)."""
        try:
            self.routing, self.front, self.fast, self.http = open_doors(
                ctx,
                self.config,
                self.backend,
                curve=self.curve,
                describe_broker=self.describe,
                live_pids=self.supervisor.live_pids,
                metrics=self.metrics,
            )
        except zmq.ZMQError as exc:  # the backend's ipc:// endpoint in the run directory
            raise ConfigError(f"cannot bind the worker endpoint: {zmq.strerror(exc.errno)}") from None

    def loop(self, wake: socket.socket) -> None:
        front, sup, peers = self.front, self.supervisor, self.peers
        ready = Readiness()
        backend, frontend, wake_fd = front.backend, front.frontend, wake.fileno()
        ready.add_zmq(backend)
        ready.add_zmq(frontend)
        if peers is not None:
            for sock in peers.sockets:
                ready.add_zmq(sock)
        ready.watch(wake_fd, select.EPOLLIN)
        self.core.rewire_peers = functools.partial(_rewire_peers, ready, peers)
        tcp_doors = [door for door in (self.fast, self.http) if door is not None]
        for door in tcp_doors:
            door.attach(ready)
        owners, zmq_fds = ready.owners, ready.zmq_fds
        next_housekeeping_ns = 0
        # Whether a ZeroMQ socket may have messages its descriptor did not announce (see
        # Readiness): true after any send or receive on one, and once its descriptor fires.
        stale = True
        try:
            while True:
                timeout_s = LOOP_TICK_S
                if stale:
                    stale = False
                    if _get(backend, _EVENTS) & _POLLIN:
                        front.on_backend()
                        stale = True
                    if _get(frontend, _EVENTS) & _POLLIN:
                        front.on_frontend()
                        stale = True
                    if peers is not None:
                        for sock in list(peers.sockets):
                            if _get(sock, _EVENTS) & _POLLIN:
                                peers.on_readable(sock)
                                stale = True
                    if stale:
                        timeout_s = 0  # the other descriptors' turn, then look again
                for fd, events in ready.poll(timeout_s):
                    door = owners.get(fd)
                    if door is not None:
                        door.on_event(fd, events)
                    elif fd in zmq_fds:
                        stale = True
                    elif fd == wake_fd:
                        try:
                            while wake.recv(512):
                                pass
                        except BlockingIOError:
                            pass
                if front.zmq_used:  # a fast port's request went to a worker, say
                    front.zmq_used = False
                    stale = True
                if sup.signals:
                    sup.dispatch()
                    stale = True
                # Timers, at most every HOUSEKEEPING_NS: under load the loop above turns
                # thousands of times a second and must not pay for them each time.
                now_ns = time.monotonic_ns()
                if now_ns < next_housekeeping_ns:
                    continue
                next_housekeeping_ns = now_ns + HOUSEKEEPING_NS
                stale = True  # the timers below send on ZeroMQ sockets
                if not self.core.housekeeping(now_ns):
                    return
        finally:
            for door in tcp_doors:
                door.detach()  # closed after this set is gone (Node.run)
            ready.close()

    def start_own(self) -> None:
        """The broker's own worker ID: claimed on a thread of its own once every worker
        holds its own; from then on, plain requests of up to ``broker_mint_max_ids``
        IDs are minted on this loop when they can be without waiting."""
        from ..store import open_store
        from .own import OwnWorkerId

        own = OwnWorkerId(
            self.config,
            open_store=open_store,
            workers_settled=self.core.workers_settled,
            loop_ns=lambda: self.core.loop_ns,
            pid=os.getpid(),
        )
        if own.start():
            self.own = self.core.own = own
            self.routing.mint_own(own.mint, self.config.broker_mint_max_ids)

    def start_watermark(self) -> None:
        """The node's watermark: rounds on a thread of their own, answered from the loop."""
        from ..store import open_store
        from .watermark import Watermark

        watermark = Watermark(self.config, open_store=open_store)
        if watermark.start():
            self.watermark = self.core.watermark = watermark
            self.routing.watermark = watermark

    def door_status(self) -> dict:
        """The doors' parts of STATUS."""
        return {
            "fast_port": self.fast.describe() if self.fast is not None else None,
            "http_port": self.http.describe() if self.http is not None else None,
        }

    def describe(self) -> dict:
        """The broker's part of STATUS (the core's)."""
        return self.core.describe()


def _rewire_peers(ready: Readiness, peers: PeerClocks | None, change) -> None:
    """Change the peer set with every peer socket out of the epoll set: ``set_peers`` closes
    the sockets of peers that left, and a descriptor a closed one gave up may come back as
    a new one's."""
    if peers is None:
        change()
        return
    for sock in peers.sockets:
        ready.remove_zmq(sock)
    change()
    for sock in peers.sockets:
        ready.add_zmq(sock)


def open_doors(
    ctx: zmq.Context,
    config: Config,
    backend: str,
    *,
    curve: CurveServer | None = None,
    describe_broker: Callable[[], dict] | None = None,
    live_pids: set[int] | None = None,
    metrics: Metrics | None = None,
) -> tuple[Routing, ZmqFront, FastPort | None, HttpDoor | None]:
    """A node's routing core and its doors: the ZeroMQ front (the frontend and backend ROUTER
    sockets, the backend on ``backend``), and the fast port and the HTTP door where the
    settings have them. Each door hands what it reads to the core's one intake
    (``Routing.requests``); the core's replies leave by the door of their address
    (``doors/addresses.py``). A door that cannot be opened closes those opened before it."""
    front = ZmqFront(ctx, config, backend, curve=curve)
    fast = http = None
    try:
        doors = Doors(front.to_client)
        routing = Routing(
            config,
            doors.to_client,
            front.to_worker,
            describe_broker=describe_broker,
            live_pids=live_pids,
            metrics=metrics,
        )
        if curve is not None and curve.gatekeeper is not None:
            routing.gate.allow_list = curve.gatekeeper  # keys taken off the list: their requests dropped
        front.serve(routing)
        bind, with_curve = front.endpoint(), bool(config.curve_secret_key)
        where = fast_address(config.fast_bind, bind, with_curve)
        if where is not None:
            fast = FastPort(*where, requests=routing.requests, bad_request=routing.bad_request)
            doors.add(fast=fast.send)
        where = http_address(config.http_bind, bind, with_curve)
        if where is not None:
            http = HttpDoor(*where, config, requests=routing.requests)
            doors.add(http=http.send)
    except BaseException:
        for door in (fast, front):
            if door is not None:
                door.close()
        raise
    return routing, front, fast, http


def _absent(paths: list[str]) -> list[str]:
    """The directories among ``paths``, and their parents, that do not exist yet (deepest first)."""
    missing = set()
    for path in paths:
        path = os.path.abspath(path)
        while not os.path.lexists(path) and os.path.dirname(path) != path:
            missing.add(path)
            path = os.path.dirname(path)
    return sorted(missing, key=lambda p: p.count(os.sep), reverse=True)


def serve(config: Config) -> int:
    """Run a node until SIGTERM/SIGINT; the exit status of the broker."""
    return Node(config).run()
