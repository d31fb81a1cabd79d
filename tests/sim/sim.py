"""A deterministic simulation of snowfence's uniqueness protocol.

One schedule is one small cluster run from empty state on simulated time, with
faults at moments chosen from the schedule's seed. What runs is the real code:

* the real :class:`~snowfence.workers.minter.Minter` of every held worker ID;
* the real state decision, :func:`~snowfence.workers.states.next_state`;
* the real :class:`~snowfence.workers.keeper.Keeper`: its ``step`` (one turn of
  the loop its thread runs: the stall check, a renewal, retry, back-off and
  lease-lost decisions, and the wait it asks for) is called by the simulator when
  that wait is over or when ``wake()`` is called;
* the real stores: :class:`~snowfence.store.etcd.EtcdStore` and ``EtcdLease``
  talking to a simulated etcd through a fake of the small client surface they use
  (``transaction`` with compares on ``create_revision``, lease grant, keep-alive,
  revoke, ``get_prefix``), built from the client library's own compare and
  operation objects; or the real :class:`~snowfence.store.files.FileStore`
  on a directory on tmpfs, where ``flock`` between two descriptors conflicts
  even inside one process, so several simulated processes have real lock
  semantics.

* the real worker core, :class:`~snowfence.workers.core.WorkerCore`, of each
  process: its rotation of held worker IDs, the work step, claims with back-off,
  dropping a lost worker ID, the release plan; ``workers/main.py`` adds only the
  socket, the signals and the loop, which the simulator stands in for (it hands
  the core its frames and runs its timers as that loop does);
* the real routing core of each host's broker,
  :class:`~snowfence.broker.routing.Routing`: clients' requests reach it, and it
  picks the worker, retries a refusal on another one, takes silent workers out of
  rotation, queues what finds no room and answers ``overloaded``; its two sockets
  are deliveries in order, after :data:`LINK_NS`;
* the real watermark of each host's broker,
  :class:`~snowfence.broker.watermark.Watermark`: its rounds (``step``, the
  store's ``watermark_round``) on a thread of the broker process, with its own
  store, every ``watermark_interval_s``; clients ask WATERMARK now and then and the
  routing core answers from the last promise. Its thread can be paused (also inside
  a round) and restarted, and its host's clock and network faults reach it;
* the real clock verdict of each host's broker in etcd mode,
  :class:`~snowfence.broker.peers.PeerClocks` and its
  :class:`~snowfence.broker.peers.ClockJudge`, over simulated peer sockets
  (:class:`PeerSocket`: a connection comes up a while after it is made, and a send
  before that is not made, as with ``ZMQ_IMMEDIATE``; the other brokers' routing
  cores answer TIME);
* the real broker's decisions, :class:`~snowfence.broker.nodecore.NodeCore`: its
  ``housekeeping`` is each broker loop's timers (the supervisor's, the routing
  core's, the membership's turn with its peer filter, the peers' and their verdict
  handed to the routing core and the own worker ID's store), and its stop and exit
  plans are the supervisor's callbacks, as in broker/main.py.

What is simulated is everything around them: the clients, the hosts' clocks,
the network to etcd, and the faults.

Time: one true clock (``World.T``, ns); each host has a monotonic clock running
at its own rate (drift up to 500 ppm) and a wall clock that can be stepped,
frozen or slewed. Anything that waits (an etcd call, the minter's sleep, a pause
injected inside a call) advances simulated time and lets every other thread run
meanwhile; a thread is one of a process's minting loop or its keepers, and a
paused process runs none of them.

Invariants, checked at every mint and after every step (see :class:`Checker`).
"""

from __future__ import annotations

import bisect
import collections
import functools
import heapq
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import orjson
import zmq

from snowfence import protocol
from snowfence.broker import own as own_mod
from snowfence.broker.main import HOUSEKEEPING_NS
from snowfence.broker.metrics import Metrics
from snowfence.broker.nodecore import PEER_INTERVAL_S, NodeCore
from snowfence.broker.peers import PeerClocks
from snowfence.broker.routing import Routing
from snowfence.broker.supervisor import Supervisor
from snowfence.broker.watermark import Watermark
from snowfence.clock import HostClock as ClockWatch
from snowfence.clock import pending_verdict
from snowfence.config import Config
from snowfence.errors import (
    BadRequest,
    LayoutMismatch,
    Overloaded,
    Refused,
    RegionHeld,
    SnowfenceError,
    StateDirError,
    TokenAhead,
)
from snowfence.store import home as home_mod
from snowfence.store import open_store
from snowfence.workers import core as core_mod
from snowfence.workers import keeper as lease_mod
from snowfence.workers.core import Clocks, WorkerCore, preference_files
from snowfence.workers.exits import HALT, Exit
from snowfence.workers.minter import NO_FLOOR, Minter

# The simulated etcd server, shared with the unit tests (run.py runs this file without pytest's path).
_HARNESS = str(Path(__file__).resolve().parent.parent / "harness")
if _HARNESS not in sys.path:
    sys.path.insert(0, _HARNESS)
from fake_etcd import NS, DirectClient, EtcdServer, RpcError  # noqa: E402

MS = 1_000_000


class Violation(BaseException):
    """An invariant broke; the schedule stops.

    A BaseException, so that no ``except Exception`` in the real code (the keeper
    logs and retries whatever else goes wrong) swallows it.
    """


class Died(BaseException):
    """The thread's process was killed while the thread was inside a call.

    A BaseException, so that no ``except Exception`` of the real code catches it:
    a killed process runs no more of its code.
    """


# -- time ------------------------------------------------------------------------------


class HostClock:
    """A host's monotonic and wall clocks, as functions of the true time."""

    __slots__ = ("w", "m0", "t0", "rate", "off", "frozen")

    def __init__(self, world: World, mono0_ns: int, wall_off_ns: int, ppm: float) -> None:
        self.w = world
        self.m0 = mono0_ns
        self.t0 = world.T
        self.rate = 1.0 + ppm * 1e-6
        self.off = wall_off_ns
        self.frozen: int | None = None

    def mono(self) -> int:
        return self.m0 + int((self.w.T - self.t0) * self.rate)

    def wall(self) -> int:
        frozen = self.frozen
        return frozen if frozen is not None else self.m0 + int((self.w.T - self.t0) * self.rate) + self.off

    def set_drift(self, ppm: float) -> None:
        self.m0 = self.mono()
        self.t0 = self.w.T
        self.rate = 1.0 + ppm * 1e-6


# -- threads, processes, nodes ----------------------------------------------------------


class Thread:
    """A thread of a simulated process: the minting loop, or one keeper."""

    __slots__ = ("proc", "inc", "busy", "deferred", "busy_since", "name")

    def __init__(self, proc: Proc, name: str) -> None:
        self.proc = proc
        self.inc = proc.inc
        self.busy = 0
        self.deferred: list = []
        self.busy_since = 0
        self.name = name

    @property
    def alive(self) -> bool:
        return self.inc == self.proc.inc and self.proc.up


class SimKeeper(lease_mod.Keeper):
    """The real keeper of one claim, its thread scheduled by the simulator.

    ``start`` hands :meth:`Keeper.run` (as a generator) to the event loop instead of
    a thread; ``stop`` is the real one. It also carries what the checker knows of
    its claim."""

    def __init__(self, world: World, proc: Proc, lease, minter, **kwargs) -> None:
        wake = SimWake(world, self)
        super().__init__(lease, minter, wake_event=wake, **kwargs)
        minter.sim_keeper = self
        self.world = world
        self.proc = proc
        self.thread = Thread(proc, f"keeper-{lease.worker_id}")
        self.sleep_id = 0
        #: Embedded: its lock file was removed underneath; checked: a keeper renewal succeeded since.
        self.doomed = False
        self.doomed_checked = False
        self.stopped = False
        #: The keeper's step said it is done (its worker ID lost or given up).
        self.done = False
        #: The request that last asked this worker ID to mint.
        self.asked_in = 0
        world.counts["claims"] += 1
        #: Which claim of the schedule this is: owners of a worker ID in the order they claimed it.
        self.owner = world.counts["claims"]

    def start(self) -> None:
        w = self.world
        w.at(w.T, self.thread, w.keeper_step, self.proc, self, 0)

    def stop(self, timeout_s: float | None = None) -> None:
        self.stopped = True
        super().stop(timeout_s)


class CheckedMinter(Minter):
    """The real minter, with the checker looking at every call: who may mint at the
    call's start, and what the call did."""

    __slots__ = ("sim_keeper",)

    def reserve(self, n: int, floor_ms: int = NO_FLOOR) -> tuple[int, int]:
        k = self.sim_keeper
        w = k.world
        checker = w.checker
        checker.asked(k)
        before = (self.last_ms, self.seq)
        stale = checker.stale(k, k.proc.node.clock.mono(), w.T)
        try:
            first, count = Minter.reserve(self, n, floor_ms)
        except (Refused, TokenAhead, BadRequest) as err:
            checker.refused(k, before, err)
            raise
        checker.clock_mint(k.proc)
        checker.mint(k.proc, k, stale, first, count)
        if k.proc.slot == own_mod.SLOT:
            w.counts["own_mints"] = w.counts.get("own_mints", 0) + 1
        w.note_minted(first)
        return first, count


class SimWake:
    """Stands in for the keeper's threading.Event: ``set`` resumes the keeper now."""

    __slots__ = ("world", "keeper")

    def __init__(self, world: World, keeper: SimKeeper) -> None:
        self.world = world
        self.keeper = keeper

    def set(self) -> None:
        k = self.keeper
        if not k.stopped and not k.done:
            self.world.wake_keeper(k)

    def clear(self) -> None:
        pass

    def wait(self, seconds) -> bool:
        return False  # the simulator does the waiting, at the yield that follows


class Node:
    """A host: its clocks, its processes, its view of the network."""

    def __init__(self, world: World, index: int, clock: HostClock) -> None:
        self.world = world
        self.index = index
        self.clock = clock
        self.procs: list[Proc] = []
        self.slow_until = 0
        self.commit_then_timeout = 0
        self.cut: set[int] = set()  # etcd members this node cannot reach
        #: Where its broker is reached (the peers' sockets connect here).
        self.endpoint = f"tcp://127.0.0.1:{7000 + index}"
        self.broker: Broker | None = None


class Proc:
    """One worker process (a slot of a node), across its restarts: a real worker core
    on the host's clocks, and the loop that feeds it."""

    def __init__(self, world: World, node: Node, slot: int, config: Config) -> None:
        self.world = world
        self.node = node
        self.slot = slot
        self.config = config
        self.inc = 0
        self.up = False
        self.paused_until = 0
        self.pause_in_call = 0
        #: The process's core, a new one at every start.
        self.core: WorkerCore | None = None
        self.loop: Thread | None = None
        self.holder = f"n{node.index}:s{slot}"
        #: A new process ID and socket identity at every start, as a real restart has.
        self.pid = 0
        self.ident = b""
        #: Frames its broker sent that the loop has not taken yet, oldest first, each with
        #: when it was sent (true ns).
        self.inbox: collections.deque[tuple[bytes, int]] = collections.deque()
        #: When the broker sent the request the process is answering, and when its core last
        #: decided to claim (true ns).
        self.work_sent = 0
        self.claim_decided = 0
        #: When a tick is due for the core's next claim (true time), if one is scheduled.
        #: Embedded: the leases its stores made, whose descriptors its exit closes.
        self.leases: list = []
        #: The exit status of its last process (what the supervisor reaps), and when (the host's
        #: monotonic ns) its current one started.
        self.exit_status: int | None = None
        self.started_mono = 0
        #: Which wait of the loop is current (a turn begins a new one; an older one's end is void).
        self.wait_id = 0
        #: The request the process is answering (its loop is busy until it has), and its causal token.
        self.request_id = 0
        self.asked_after: int | None = None
        #: The last claim this process tried: (incarnation, monotonic ns, failed).
        self.last_claim: tuple[int, int, bool] | None = None

    @property
    def held(self) -> list:
        return self.core.held if self.up and self.core is not None else []

    # The minter's and keeper's clocks: the host's, with a pause injectable inside a call.
    def wall_ns(self) -> int:
        if self.pause_in_call:
            self.world.pause_inside_call(self)
        return self.node.clock.wall()

    def mono_ns(self) -> int:
        return self.node.clock.mono()

    def sleep(self, seconds: float) -> None:
        w = self.world
        if self.slot == own_mod.SLOT and (w.current is None or w.current is not self.loop):
            w.checker.fail(
                "the broker's loop waited inside its own worker ID's minter (it must mint at once or decline)"
            )
        w.elapse(max(int(seconds * NS / self.node.clock.rate), 1000))

    def loop_ns(self) -> int:
        """When the minting loop last turned: now, unless it is inside a call."""
        loop = self.loop
        if loop is not None and loop.busy:
            return loop.busy_since
        return self.node.clock.mono()


class SimPopen:
    """A worker process as the real supervisor sees it (the part of ``subprocess.Popen``
    it uses): its exit status once that incarnation of the process is gone, and signals."""

    def __init__(self, world: World, p: Proc) -> None:
        self.world = world
        self.p = p
        self.inc = p.inc
        self.pid = p.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        p = self.p
        if self.returncode is None and (p.inc != self.inc or not p.up):
            self.returncode = p.exit_status
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            raise ProcessLookupError(self.pid)
        self.world.signal(self.p, sig)

    def wait(self) -> int | None:
        return self.poll()  # a SIGKILL takes effect at once here


class Broker:
    """A host's broker: the real routing core, its sockets and its loop simulated.

    Frames go both ways in order, each after :data:`LINK_NS` (the backend's ipc
    socket); a send to a process that has exited fails, as ROUTER_MANDATORY makes
    it. The loop ticks the core every :data:`BROKER_TICK_NS`, and a process gone
    is forgotten once its supervisor has reaped it. Clients are a few connections
    per host, each request one RESERVE; now and then one connection sends a burst
    beyond its in-flight limit.

    What the checker cannot see inside the routing core, it judges here, from the
    frames alone:

    * a request is answered at most once, on the connection that asked;
    * a retry never goes to a worker that refused the same request;
    * no WORK goes to a worker that has sent no STATE for longer than the broker's
      silence rule allows;
    * a worker never has more requests sent and unanswered than its credits;
    * ``overloaded`` only for a connection with its limit in flight, and always
      for what a burst sends beyond that limit.
    """

    def __init__(self, world: World, node: Node, config: Config) -> None:
        self.world = world
        self.node = node
        self.config = config
        self.procs: dict[bytes, Proc] = {}
        #: The worker slots the node's supervisor fills (a second cluster's process, started
        #: later on this host, is not one of them).
        self.supervised: list[Proc] = list(node.procs)
        self.boot()
        #: When a STATE from each worker last arrived (the host's monotonic ns).
        self.stated: dict[bytes, int] = {}
        #: Requests sent to each worker and not yet answered or handed back by it.
        self.owed: collections.Counter[bytes] = collections.Counter()
        #: Workers that handed each request back (request ID -> their sockets).
        self.refused_by: dict[int, set[bytes]] = {}
        #: Requests made and not yet answered: request ID -> (connection, causal token).
        self.pending: dict[int, tuple[bytes, int | None]] = {}
        #: Requests in flight on each connection, as its client counts them.
        self.in_flight: collections.Counter[bytes] = collections.Counter()
        self.overloaded = 0
        #: Answers other than overloaded, by connection.
        self.answered: collections.Counter[bytes] = collections.Counter()
        #: A STATE silent this long takes a worker out of rotation at the broker's next
        #: heartbeat (which comes once per interval, at a tick of its loop).
        self.silence_ns = int((config.heartbeat_timeout_s + config.heartbeat_interval_s) * NS) + 2 * BROKER_TICK_NS
        self.credits = config.worker_credits
        self.max_inflight = config.max_inflight_per_client
        #: The peers' clock verdicts: judged where the real broker judges (etcd mode).
        self.peer_bound_ns = config.peer_offset_bound_ms * MS if pending_verdict(config) else 0
        #: How many times the node started (a halt and an operator's start make a new broker
        #: process), and when it last did (true ns).
        self.boots = 0
        self.booted_at = 0
        #: When the node last stopped (true ns; None: it runs, or never ran).
        self.stopped_at: int | None = None
        #: The broker process, as far as its own worker ID's thread runs in it, and that
        #: worker ID (broker/own.py), when the settings have the broker mint small requests.
        self.proc: Proc | None = Proc(world, node, own_mod.SLOT, config) if config.broker_mint_max_ids else None
        self.own = None
        #: The broker process as far as its watermark thread runs in it, and the node's
        #: watermark (broker/watermark.py), a new one at every start of the broker.
        self.wm_proc = Proc(world, node, WATERMARK_SLOT, config)
        self.watermark = None

    # The parts the node's core is given as they start (broker/main.py's ``Node`` does the same).
    @property
    def own(self) -> own_mod.OwnWorkerId | None:
        return self.node_core.own

    @own.setter
    def own(self, own: own_mod.OwnWorkerId | None) -> None:
        self.node_core.own = own

    @property
    def watermark(self) -> Watermark | None:
        return self.node_core.watermark

    @watermark.setter
    def watermark(self, watermark: Watermark | None) -> None:
        self.node_core.watermark = watermark

    @property
    def peers(self) -> PeerClocks | None:
        return self.node_core.peers

    # -- the process side: the real supervisor, with a simulated spawner
    def boot(self) -> None:
        """The broker process starts: its routing core, its supervisor and the node's core
        over them (broker/main.py's wiring: the supervisor's live PIDs are the routing
        core's, its stop and exit callbacks the node core's). The worker processes start
        at the supervisor's ``start``."""
        node, config = self.node, self.config
        self.sup = Supervisor(config, self.spawn, slots=len(self.supervised), clock=node.clock.mono)
        #: PIDs of the host's worker processes that are running (the supervisor's view).
        self.live = self.sup.live_pids
        #: Whether it serves as a member of its cluster (a new broker process: from its first turn).
        self.serving = False
        #: Its membership (etcd mode, or peers named), once it serves.
        self.membership: SimMembership | None = None
        #: Stopped until then (true ns; a fault: SIGSTOP), and killed (SIGKILL) until it starts again.
        self.paused_until = 0
        self.dead = False
        #: When its loop first turned after its last pause (its monotonic ns).
        self.resumed_mono = 0
        self.resume_due = False
        self.core = Routing(
            config,
            self.to_client,
            self.to_worker,
            clock=node.clock.mono,
            wall_clock=node.clock.wall,
            live_pids=self.live,
        )
        #: The node's decisions (broker/nodecore.py): the loop's timers are its ``housekeeping``.
        #: Its peers (broker/peers.py's PeerClocks, over simulated sockets) and membership
        #: are given when the node starts serving; its own worker ID and watermark as they start.
        self.node_core = NodeCore(
            config,
            self.sup,
            self.core,
            Metrics(config),
            now_ns=node.clock.mono(),
            pid=100 + node.index,
            bind=node.endpoint,
            entry={"node": f"n{node.index}", "endpoints": [node.endpoint]},
            wall_ns=node.clock.wall,
        )
        self.running = True
        # A second cluster's process on this host is no worker of this node's supervisor: the
        # broker it talks to (this one, in the simulator) knows it as running all along.
        self.live.update(q.pid for q in self.procs.values() if q.up and q not in self.supervised)

    def spawn(self, slot: int) -> SimPopen:
        p = self.supervised[slot]
        if self.sup.procs[slot].last_exit in HALT:
            self.world.checker.fail(
                f"the supervisor restarted worker {p.holder}, which exited with {self.sup.procs[slot].last_exit} "
                "(it cannot boot: the node halts)"
            )
        self.world.start(p)
        return SimPopen(self.world, p)

    def started(self, p: Proc) -> None:
        self.live.add(p.pid)
        self.procs[p.ident] = p

    def exited(self, p: Proc) -> None:
        """The process is gone: SIGCHLD; the supervisor reaps it at its next tick."""
        if p in self.supervised:
            self.sup.enqueue(signal.SIGCHLD)
            return
        self.live.discard(p.pid)
        w = self.world
        w.at(w.T + w.rng.randrange(1, BROKER_TICK_NS), None, self.core.forget_pid, p.pid, "exited")

    def start_node(self, now: int) -> None:
        """The broker process begins serving (its first turn): it registers in the cluster's
        membership and starts measuring its peers' clocks, as broker/main.py's ``_run`` does."""
        w = self.world
        self.serving = True
        self.boots += 1
        self.booted_at = w.T
        self.stopped_at = None
        if self.config.embedded and not self.config.peers:
            return
        w.members.add(self.node)
        # No member is known until the membership is first read (the thread reads it as the
        # node starts; the core takes it in at its next membership turn, a second later).
        self.node_core.peers = PeerClocks(
            PeerContext(w, self),
            [],
            interval_s=PEER_INTERVAL_S,
            bound_ms=self.config.peer_offset_bound_ms,
            complete=False,
            wall_ns=self.node.clock.wall,
            mono_ns=self.node.clock.mono,
        )
        self.membership = self.node_core.membership = SimMembership(w, self)
        w.checker.clock_seen(self.node)

    def peer_request(self, sock: PeerSocket, body: bytes) -> None:
        """A peer's TIME request reaches this broker's frontend: the routing core answers it
        (a stopped broker, when it runs again)."""
        w = self.world
        if w.T <= self.paused_until:
            w.at(self.paused_until + 1, None, self.peer_request, sock, body)
        elif self.running and self.serving and sock.peer_boot == self.boots:
            self.core.request(0, sock.addr, body)

    def stop_node(self) -> None:
        """The broker process is gone: its peer sockets closed, its membership entry with it."""
        w = self.world
        if self.peers is not None:
            self.peers.close()
            self.node_core.peers = None
        w.members.discard(self.node)
        self.serving = False
        self.stopped_at = w.T

    def pause(self, until: int) -> None:
        """SIGSTOP of the broker process until ``until`` (true ns): its loop, its own worker
        ID's thread and its watermark's stop with it; what reaches its sockets waits there."""
        self.paused_until = max(self.paused_until, until)
        self.resume_due = True
        for p in (self.proc, self.wm_proc):
            if p is not None and p.up:
                p.paused_until = max(p.paused_until, until)

    def asleep(self) -> bool:
        return self.world.T <= self.paused_until

    def fell_silent_lately(self) -> bool:
        """Whether its workers may have heard nothing from it for their silence bound lately
        (it was stopped), so one that left it did so rightly."""
        config = self.config
        grace = int((config.heartbeat_timeout_s + config.heartbeat_interval_s) * NS) + NS
        return self.world.T <= self.paused_until + grace

    def kill(self, restart_at: int) -> None:
        """SIGKILL of the broker process: its threads die with it (its own worker ID not
        released), its membership entry and peer sockets go, and the kernel sends each worker
        SIGTERM (``PR_SET_PDEATHSIG``): they drain and release. The node starts again at
        ``restart_at`` or once its old workers are gone, whichever is later."""
        w = self.world
        self.running = False
        self.dead = True
        self.stop_node()
        w.counts["broker_kills"] = w.counts.get("broker_kills", 0) + 1
        if self.own is not None:
            w.stop_own(self, release=False)
        w.stop_watermark(self)
        for p in self.supervised:
            if p.up:
                w.at(w.T + LINK_NS, p.loop, w.sigterm, p)
        w.at(restart_at, None, self.restart_after_kill)

    def restart_after_kill(self) -> None:
        """systemd starts the unit again once its control group is empty."""
        if self.running:
            return
        if any(p.up for p in self.supervised):
            self.world.at(self.world.T + 100 * MS, None, self.restart_after_kill)
            return
        self.restart_node()

    def halted(self) -> None:
        """The supervisor stopped the node (a worker could not boot): the broker exits, its
        own worker ID let go; an operator starts the node again after a look."""
        w = self.world
        self.running = False
        self.stop_node()
        w.counts["node_halts"] = w.counts.get("node_halts", 0) + 1
        if self.own is not None:
            w.stop_own(self)
        w.stop_watermark(self)
        w.at(w.T + w.rng2.randrange(NS, 3 * NS), None, self.restart_node)

    def restart_node(self) -> None:
        if self.running:
            return  # started again already (a halt and a fault both asked)
        self.boot()
        self.sup.start()
        if self.proc is not None:
            self.world.start_own(self)
        self.world.start_watermark(self)

    # -- the loop
    def tick(self) -> None:
        w = self.world
        w.at(w.T + BROKER_TICK_NS, None, self.tick)
        if not self.running or w.T <= self.paused_until:
            return
        now = self.node.clock.mono()
        if self.resume_due:  # its first turn after a pause: no worker counts as silent from before
            self.resume_due = False
            self.resumed_mono = now
        if not self.serving:
            self.start_node(now)
        if self.peers is not None:
            w.checker.clock_seen(self.node)
        node_core = self.node_core
        was = node_core.verdict
        if not node_core.housekeeping(now):
            self.halted()
            return
        if node_core.verdict.refused and not was.refused:
            w.counts["clock_refused"] = w.counts.get("clock_refused", 0) + 1
        self.check_silence(now)

    def check_silence(self, now: int) -> None:
        """A worker whose STATE has not come for the supervisor's kill bound and the grace
        after it is gone (killed, or restarted) by now."""
        limit = int((self.config.worker_kill_after_s + self.config.shutdown_timeout_s) * NS) + 2 * BROKER_TICK_NS
        for p in self.supervised:
            silent = now - max(self.stated.get(p.ident, 0), p.started_mono, self.resumed_mono)
            if p.up and silent > limit:
                self.world.checker.fail(
                    f"worker {p.holder} silent for {silent / NS:.1f} s "
                    f"is still running (the supervisor kills one silent for {self.config.worker_kill_after_s:g} s)"
                )

    def client_request(self) -> None:
        """The host's clients send a request (or, now and then, a burst on one connection)."""
        w = self.world
        rng = w.rng
        w.at(w.T + int(rng.expovariate(len(self.node.procs) / w.request_gap_ns)) + 1, None, self.client_request)
        addr = CONNECTIONS[int(rng.random() * len(CONNECTIONS))]
        if rng.random() >= BURST_SHARE:
            self.send(addr)
            return
        burst = self.max_inflight + rng.randint(1, 3)
        overloaded, answered = self.overloaded, self.answered[addr]
        for _ in range(burst):
            self.send(addr)
        if self.dead or self.asleep():
            return  # answered once the broker runs again (or never: it was killed)
        # Answered at once otherwise (no worker in rotation, say): that much more room.
        room = self.max_inflight + self.answered[addr] - answered
        refused = self.overloaded - overloaded
        if refused < burst - room:
            w.checker.fail(
                f"a burst of {burst} requests on one connection (limit {self.max_inflight} in flight) got "
                f"{refused} overloaded answers"
            )

    def ask_watermark(self) -> None:
        """A client asks the node for its watermark (on a connection of its own), now and
        then (drawn from the watermark's own stream, so the rest of a schedule draws as it did)."""
        w = self.world
        w.at(w.T + int(w.rng3.expovariate(1 / WATERMARK_ASK_GAP_NS)) + 1, None, self.ask_watermark)
        if not self.running:
            return
        w.request_id += 1
        self.pending[w.request_id] = (WATERMARK_CONN, None)
        self.in_flight[WATERMARK_CONN] += 1
        self.take(WATERMARK_CONN, protocol.encode_watermark(w.request_id))

    def send(self, addr: bytes) -> None:
        w = self.world
        rng = w.rng
        n = COUNTS[int(rng.random() * len(COUNTS))]
        after = None
        if w.last_ids and rng.random() < 0.2:
            after = w.last_ids[int(rng.random() * len(w.last_ids))]
        w.request_id += 1
        if self.dead:
            return  # the connection is refused: the client tries again later
        self.pending[w.request_id] = (addr, after)
        self.in_flight[addr] += 1
        self.take(addr, protocol.encode_reserve(w.request_id, n, after), w.request_id)

    def take(self, addr: bytes, body: bytes, request_id: int | None = None) -> None:
        """A client's request reaches the routing core's intake (a stopped broker's, when it
        runs again; a killed one's, never)."""
        w = self.world
        if w.T <= self.paused_until:
            w.at(self.paused_until + 1, None, self.take, addr, body, request_id)
            return
        if self.dead:
            return
        if request_id is not None and self.proc is not None:
            self.proc.request_id = request_id  # the request the broker's own minter may answer
            self.proc.work_sent = w.T
        self.core.request(0, addr, body)

    # -- the core's two sockets
    def to_client(self, meta: int, addr: bytes, reply: bytes) -> None:
        w = self.world
        if addr[:4] == PEER_ADDR:  # a peer's TIME answered: back over the network
            sock = w.peer_sockets.get(addr)
            if sock is not None:
                w.at(w.T + PEER_LINK_NS, None, sock.arrive, reply)
            return
        request_id = protocol.request_id_of(reply)
        asked = self.pending.pop(request_id, None)
        if asked is None:
            w.checker.fail(f"request {request_id} was answered twice (or never made)")
        if asked[0] != addr:
            w.checker.fail(f"request {request_id} of connection {asked[0]!r} was answered on {addr!r}")
        in_flight = self.in_flight[addr]
        self.in_flight[addr] = in_flight - 1
        if reply[1] == protocol.WATERMARK_REPLY:
            w.checker.promised(self.node, protocol.decode_reply(reply).watermark[0])
        if reply[1] == protocol.ERROR:
            err = protocol.decode_reply(reply).error
            w.counts["answered_" + err.code] = w.counts.get("answered_" + err.code, 0) + 1
            if isinstance(err, Overloaded):
                self.overloaded += 1
                if in_flight <= self.max_inflight:
                    w.checker.fail(
                        f"connection {addr!r} was answered overloaded with {in_flight - 1} other requests in "
                        f"flight (limit {self.max_inflight})"
                    )
                w.checker.answered(asked[1], reply)
                return
        self.answered[addr] += 1
        w.checker.answered(asked[1], reply)

    def to_worker(self, ident: bytes, frame: bytes) -> bool:
        w = self.world
        p = self.procs.get(ident)
        if p is None or not p.up or p.ident != ident:
            return False  # its socket is gone
        if frame[0] == protocol.WORK:
            now = self.node.clock.mono()
            silent = now - self.stated.get(ident, now)
            if silent > self.silence_ns:
                w.checker.fail(
                    f"a request went to worker {ident!r}, silent for {silent / 1e6:.0f} ms (out of rotation after "
                    f"{self.silence_ns / 1e6:.0f} ms)"
                )
            request_id = protocol.request_id_of(protocol.split_routed(frame)[2])
            if ident in self.refused_by.get(request_id, ()):
                w.checker.fail(f"request {request_id} was retried at worker {ident!r}, which had refused it")
            self.owed[ident] += 1
            if self.owed[ident] > self.credits:
                w.checker.fail(
                    f"worker {ident!r} was sent {self.owed[ident]} requests unanswered (credits {self.credits})"
                )
        p.inbox.append((frame, w.T))
        w.at(w.T + LINK_NS, p.loop, w.deliver, p)
        return True

    def from_worker(self, ident: bytes, frame: bytes) -> None:
        """A frame from a worker reaches the backend (sent LINK_NS ago): taken at once, by a
        stopped broker when it runs again, by a killed one never."""
        w = self.world
        if w.T <= self.paused_until:
            w.at(self.paused_until + 1, None, self.from_worker, ident, frame)
            return
        if self.dead:
            return
        kind = frame[0]
        if kind == protocol.STATE:
            self.stated[ident] = self.node.clock.mono()
        elif kind in (protocol.REPLY, protocol.REFUSED):
            self.owed[ident] -= 1
            if kind == protocol.REFUSED:
                request = protocol.split_refused(protocol.split_routed(frame)[2])[0]
                self.refused_by.setdefault(protocol.request_id_of(request), set()).add(ident)
        self.core.on_worker(ident, frame)
        self.core.schedule()


# -- the membership and the peers' sockets -----------------------------------------------------


class SimMembership:
    """What the node's core reads of broker/membership.py's ``Membership``: the entries the
    registered nodes (brokers serving) last published, with this node's. Its thread reads
    them as the node starts, so the core's first membership turn finds none read yet; each
    later turn finds them as they are then (reads are not faulted here)."""

    def __init__(self, world: World, broker: Broker) -> None:
        self.world = world
        self.name = broker.node_core.entry["node"]
        #: This node's entry as last published (registered with the entry as of its start).
        self.entry = broker.node_core.own_entry()
        self.turns = 0

    def publish(self, entry: dict) -> None:
        self.entry = entry
        self.turns += 1

    @property
    def read_ns(self) -> int | None:
        return None if self.turns < 2 else 0

    @property
    def nodes(self) -> list[dict]:
        if self.turns < 2:
            return []
        w = self.world
        return [n.broker.membership.entry for n in w.nodes if n in w.members]

    def view(self, own: dict) -> list[dict]:
        return sorted([*(n for n in self.nodes if n.get("node") != self.name), own], key=lambda n: n["node"])


class PeerContext:
    """What :class:`~snowfence.broker.peers.PeerClocks` asks of its ZeroMQ context: DEALER
    sockets to the other brokers, simulated (:class:`PeerSocket`)."""

    def __init__(self, world: World, owner: Broker) -> None:
        self.world = world
        self.owner = owner

    def socket(self, kind: int) -> PeerSocket:
        return PeerSocket(self.world, self.owner)


class PeerSocket:
    """A DEALER with ``ZMQ_IMMEDIATE`` connected to another host's broker. Its connection
    comes up a while after it is made, or after the peer's broker (re)starts (drawn from the
    late host's stream): until then a send fails with ``zmq.Again``, as it does with no
    connection up, and the request is not sent. A request and its answer each cross the
    network in :data:`PEER_LINK_NS`; the peer's real routing core answers TIME with its
    host's wall clock. A broker that is not running answers nothing."""

    def __init__(self, world: World, owner: Broker) -> None:
        self.world = world
        self.owner = owner
        world.peer_count += 1
        #: How the peer's routing core names this connection.
        self.addr = PEER_ADDR + str(world.peer_count).encode()
        world.peer_sockets[self.addr] = self
        self.peer: Broker | None = None
        self.inbox: collections.deque[bytes] = collections.deque()
        #: Which start of the peer's broker the connection is up to, and from when (true ns).
        self.peer_boot = 0
        self.up_at = 0
        self.closed = False

    def setsockopt(self, option: int, value) -> None:
        pass

    def connect(self, endpoint: str) -> None:
        node = self.world.endpoints.get(endpoint)
        if node is None:
            raise zmq.ZMQError(zmq.EINVAL)
        self.peer = node.broker

    def link_up(self) -> bool:
        w, peer = self.world, self.peer
        if not (peer.running and peer.serving):
            return False
        if self.peer_boot != peer.boots:  # a new connection (a first one, or to a restarted broker)
            self.peer_boot = peer.boots
            rng5 = w.rng5
            self.up_at = w.T + rng5.choice([rng5.randrange(MS, 20 * MS), rng5.randrange(20 * MS, PEER_CONNECT_MAX_NS)])
        return w.T >= self.up_at

    def send(self, body: bytes, flags: int = 0) -> None:
        if self.closed or not self.link_up():
            raise zmq.Again()
        w = self.world
        w.at(w.T + PEER_LINK_NS, None, self.peer.peer_request, self, body)

    def arrive(self, reply: bytes) -> None:
        """An answer reaches the socket; the broker's loop reads it at once (its descriptor fires)."""
        if self.closed:
            return
        owner, w = self.owner, self.world
        if w.T <= owner.paused_until:  # read once its broker runs again
            w.at(owner.paused_until + 1, None, self.arrive, reply)
            return
        self.inbox.append(reply)
        peers = owner.peers
        if self.owner.running and peers is not None and self in peers.sockets:
            peers.on_readable(self)

    def recv(self, flags: int = 0) -> bytes:
        if not self.inbox:
            raise zmq.Again()
        return self.inbox.popleft()

    def close(self, linger: int | None = None) -> None:
        self.closed = True
        self.world.peer_sockets.pop(self.addr, None)


# -- the simulated etcd ---------------------------------------------------------------------


class FakeClient:
    """The surface of pyetcd's MultiEndpointEtcd3Client that snowfence/etcd uses.

    Every call goes to the member ``_current_endpoint_label`` names, through this
    node's network: a member that is down refuses at once, one cut off or without
    a quorum times out after the deadline, a slow network can make a call time
    out after it committed, or time out before it arrived.
    """

    def __init__(
        self, world: World, proc: Proc, labels: list[str], timeout_s: float, rng: random.Random | None = None
    ) -> None:
        from pyetcd.client import Transactions

        self.world = world
        self.proc = proc
        #: Where its latencies are drawn from (the watermark's client has a stream of its own).
        self.rng = rng = world.rng if rng is None else rng
        self.transactions = Transactions()
        self.endpoints = {label: SimpleNamespace(last_failed=0) for label in labels}
        self._labels = labels
        self._current_endpoint_label = labels[rng.randrange(len(labels))]
        self.timeout_ns = int(timeout_s * NS)

    def _call(self, fn, what: str):
        w = self.world
        node = self.proc.node
        server = w.etcd
        member = self._labels.index(self._current_endpoint_label)
        w.check_alive()
        if member in server.down:
            w.elapse(200_000)
            raise RpcError(f"UNAVAILABLE: {what}: connection refused by member {member}")
        if member in node.cut or not server.has_quorum():
            w.elapse(self.timeout_ns)
            raise RpcError(f"DEADLINE_EXCEEDED: {what}")
        rng = self.rng
        if w.T < node.slow_until:
            up, down = rng.randrange(int(self.timeout_ns * 1.2)), rng.randrange(int(self.timeout_ns * 0.8))
        else:
            up, down = rng.randrange(50_000, 1_500_000), rng.randrange(50_000, 1_500_000)
        if up >= self.timeout_ns:
            w.elapse(self.timeout_ns)
            raise RpcError(f"DEADLINE_EXCEEDED: {what}")
        w.elapse(up)
        if not server.has_quorum() or member in server.down:
            w.elapse(self.timeout_ns - up)
            raise RpcError(f"DEADLINE_EXCEEDED: {what}")
        result = fn()
        if node.commit_then_timeout and rng.random() < 0.5:
            node.commit_then_timeout -= 1
            w.counts["committed_then_timed_out"] += 1
            w.elapse(self.timeout_ns - up)
            raise RpcError(f"DEADLINE_EXCEEDED: {what} (it committed)")
        if up + down >= self.timeout_ns:
            w.elapse(self.timeout_ns - up)
            w.counts["committed_then_timed_out"] += 1
            raise RpcError(f"DEADLINE_EXCEEDED: {what} (it committed)")
        w.elapse(down)
        return result

    def transaction(self, compare, success=None, failure=None):
        return self._call(lambda: self.world.etcd.txn(compare, success or [], failure or []), "txn")

    def lease(self, ttl, lease_id=None):
        return self._call(lambda: self.world.etcd.grant(ttl), "lease_grant")

    def refresh_lease(self, lease_id):
        sent = self.proc.node.clock.mono()
        response = self._call(lambda: self.world.etcd.keepalive(lease_id), "keepalive")
        if response.TTL > 0:
            self.world.renewed[lease_id] = sent  # a success the caller is told of, sent at `sent`
        else:
            self.world.told_lost.add(lease_id)
        yield response

    def revoke_lease(self, lease_id):
        return self._call(lambda: self.world.etcd.revoke(lease_id), "lease_revoke")

    def get_prefix(self, prefix, keys_only=False, **kwargs):
        return self._call(lambda: self.world.etcd.get_prefix(prefix, keys_only), "range")

    def get_lease_info(self, lease_id):  # census only
        raise RpcError("UNIMPLEMENTED")

    def close(self):
        pass


class WatermarkClient(FakeClient):
    """The watermark thread's etcd client: a pause injected into the broker process
    (``pause_in_call``) stops the thread as its next raise of the record starts (the one
    transaction with a compare), between reading the marks and raising the record."""

    def transaction(self, compare, success=None, failure=None):
        if self.proc.pause_in_call and compare:
            self.world.pause_inside_call(self.proc)
        return super().transaction(compare, success, failure)


# -- the checker ------------------------------------------------------------------------------


class Checker:
    """The invariants.

    At every mint:

    * no ID is issued twice (every block against every block of its worker ID);
    * the IDs of a worker ID increase across owners: within one owner (fencing
      token) each block is above the last, and every ID of a lower token is below
      every ID of a higher one;
    * nothing is minted above the persisted mark (the store's, read directly);
    * nothing is minted by a fenced owner (etcd: no renewal that was reported a
      success to the owner was sent within ``fence_after_s`` of the call's start,
      on the host's monotonic clock), nor by a stale one (its etcd lease had
      expired in the store, or the store had told it the lease was lost, or, in
      embedded mode, a renewal had run since its lock file was removed);
    * a block decodes, first ID to last, to the worker ID and region that minted it.

    * the watermark (store/watermark.py): no holder of the cluster mints a millisecond
      below a watermark any node answered before (a WATERMARK reply's W, checked
      against every mint committed after the moment the reply was sent).

    * the clock verdict (broker/peers.py), judged on the true clocks: no claim on a host
      whose clock no majority of its cluster (the host and the registered members)
      could vouch for ever since its node started, nor one, nor a mint of a request sent,
      once it has been so for :data:`CLOCK_GRACE_NS` (the next round of offsets, and a
      member's joining, take that long to be seen).

    At every refusal: a refused call changes nothing (last millisecond and sequence).
    After every step: no mark in the store is below a millisecond already minted
    (a mark lowered too far lets the next owner repeat IDs).
    """

    def __init__(self, world: World) -> None:
        self.w = world
        self.blocks: dict[int, list[tuple[int, int]]] = {}
        self.by_token: dict[int, dict[int, list[int]]] = {}
        self.tokens: dict[int, list[int]] = {}
        self.max_ms: dict[int, int] = {}
        self.ids = 0
        self.mints = 0
        layout = world.layout
        self.time_shift = layout.time_shift
        self.max_ms_mask = layout.max_ms
        self.worker_shift = layout.worker_shift
        self.max_worker = layout.max_worker
        self.region_shift = layout.region_shift
        self.max_region = layout.max_region
        self.epoch_ms = layout.epoch_ms
        #: The highest watermark answered so far (ms since the epoch; -1: none yet), and
        #: which node answered it when (simulated s).
        self.watermark_ms = -1
        self.watermark_by: tuple[int, float] | None = None
        #: Watermark replies, how many raised the highest one answered, and each one's lag
        #: (the answering host's wall clock less W, ms).
        self.watermarks = 0
        self.watermark_advances = 0
        self.watermark_lags: list[int] = []
        #: Since when (true ns) no majority of its cluster can vouch for each host's clock.
        self.clock_since: dict[Node, int | None] = {}

    def fail(self, what: str) -> None:
        raise Violation(what)

    def clock_off(self, node: Node) -> bool:
        """Whether no majority of the host's cluster (itself and the members registered now)
        can vouch for its clock, by the true clocks: at least half of that cluster is clearly
        off from it (past the peers' bound by :data:`CLOCK_MARGIN_NS`, more than a round trip
        on these links). A member stopped lately counts as vouching (its last answers may
        still vote), and so does one whose broker is paused (it answers nothing: a node none
        of whose members answers is not judged)."""
        w = self.w
        bound = node.broker.peer_bound_ns + CLOCK_MARGIN_NS
        mine = node.clock.wall()
        cluster = 1
        off = 0
        for other in w.nodes:
            if other is node:
                continue
            if other in w.members and not other.broker.asleep():
                cluster += 1
                off += abs(other.clock.wall() - mine) > bound
            elif other in w.members:  # its broker is stopped: it answers no TIME (nobody can judge by it)
                cluster += 1
            elif other.broker.stopped_at is not None and w.T - other.broker.stopped_at < CLOCK_RECENT_NS:
                cluster += 1
        return off > 0 and off * 2 >= cluster

    def clock_seen(self, node: Node) -> int | None:
        """Since when (true ns) no majority can vouch for the host's clock, or None if one
        can; sampled at every turn of its broker, and at every claim and mint."""
        since = self.clock_since.get(node)
        if not self.clock_off(node):
            if since is not None:
                self.clock_since[node] = None
            return None
        if since is None:
            since = self.clock_since[node] = self.w.T
        return since

    def clock_claim(self, p: Proc) -> None:
        """A claim starts on ``p``'s host: never on a clock no majority could vouch for ever
        since the node started (a first verdict comes before the first claim), nor on one no
        majority has vouched for during the grace."""
        b = p.node.broker
        if not b.peer_bound_ns or p.config.cluster != self.w.config.cluster:
            return
        if b.dead:
            # A claim its worker decided before it took the kernel's SIGTERM for its killed
            # broker, on the last verdict that broker sent while the checks above held it.
            return
        since = self.clock_seen(p.node)
        if since is None:
            return
        T = p.claim_decided  # (a pause inside the claim may come between)
        if not b.serving or since <= b.booted_at:
            self.fail(
                f"process {p.holder} claimed a worker ID on a clock no majority of its cluster vouched for since its "
                f"node started {(self.w.T - b.booted_at) / NS:.3f} s ago ({self.clock_text(p.node)})"
            )
        if T - since >= CLOCK_GRACE_NS:
            self.fail(
                f"process {p.holder} claimed a worker ID on a clock no majority of its cluster has vouched for these "
                f"{(T - since) / NS:.3f} s ({self.clock_text(p.node)})"
            )

    def clock_mint(self, p: Proc) -> None:
        """A mint on ``p``'s host of a request its broker sent once no majority had vouched
        for the host's clock for the grace."""
        b = p.node.broker
        if not b.peer_bound_ns or p.config.cluster != self.w.config.cluster:
            return
        since = self.clock_seen(p.node)
        if since is not None and p.work_sent - since >= CLOCK_GRACE_NS:
            self.fail(
                f"process {p.holder} minted a request sent {(p.work_sent - since) / NS:.3f} s after no majority of its "
                f"cluster vouched for its clock any more ({self.clock_text(p.node)})"
            )

    def clock_text(self, node: Node) -> str:
        mine = node.clock.wall()
        members = [o for o in self.w.nodes if o in self.w.members and o is not node]
        offsets = ", ".join(f"n{o.index} {(o.clock.wall() - mine) / MS:+.0f} ms" for o in members)
        return f"offsets of the members: {offsets}; bound {node.broker.peer_bound_ns // MS} ms"

    def stale(self, h: SimKeeper, t0_mono: int, t0_true: int) -> tuple[str, str] | None:
        """Why an owner must not start a mint now (fenced, or known to be stale), or None.

        Judged when the call starts, which is when the minter checks its fence: a
        call that passed its checks may be paused inside (before its wall-clock
        read) while the keeper learns the lease is lost; what it then mints lies
        inside the reservation it had, which the next owner waits out. So the
        judgement is of the state at the call's start, for both stores.
        """
        w = self.w
        if w.kind == "etcd" and not h.proc.config.partition_minting:
            # Minting on without renewals, inside the reservation, is what partition minting is for.
            lid = h.lease.lease_id
            sent = w.renewed.get(lid)
            if sent is None or t0_mono > sent + w.fence_ns:
                return (
                    "fenced owner minted",
                    f"at mono {t0_mono} with the last renewal it was told succeeded sent at {sent} "
                    f"(fence {w.fence_ns} ns)",
                )
            lease = w.etcd.leases.get(lid)
            if (lease is None or lease[1] <= t0_true) and lid not in w.restored_leases:
                # (A lease a restore took away is gone without having expired: its holder
                # learns it at its next renewal, as a paused one does; the marks guard.)
                return "stale owner minted", "after its etcd lease expired"
        if w.kind == "etcd" and h.lease.lease_id in w.told_lost:
            return "stale owner minted", "after etcd said its lease is gone"
        if h.doomed_checked:
            return "stale owner minted", "after its lock file was removed and a renewal of its lease succeeded since"
        if h.lost is not None:
            return "stale owner minted", "after its keeper found it lost"
        return None

    def mint(self, p: Proc, h: SimKeeper, stale: tuple[str, str] | None, first: int, count: int) -> None:
        w = self.w
        wid = h.lease.worker_id
        token = h.lease.token
        last = first + count - 1
        self.mints += 1
        self.ids += count
        if count < 1:
            self.fail(f"worker ID {wid} minted an empty block")
        ms = (first >> self.time_shift) & self.max_ms_mask
        if (last >> self.time_shift) & self.max_ms_mask != ms:
            self.fail(f"worker ID {wid}: block {first}+{count} crosses a millisecond")
        got_wid = (first >> self.worker_shift) & self.max_worker
        got_region = (first >> self.region_shift) & self.max_region
        # Its last ID of the same worker ID and region too: a block that ran on into the
        # next worker ID's IDs would repeat them unseen (the blocks are kept per worker ID).
        if (last >> self.worker_shift) & self.max_worker != got_wid or (
            last >> self.region_shift
        ) & self.max_region != got_region:
            self.fail(f"worker ID {wid}: block {first}+{count} crosses a worker ID")
        if got_wid != wid or got_region != w.region:
            self.fail(f"worker ID {wid} minted ID {first} of worker ID {got_wid} region {got_region}")
        if stale is not None:
            self.fail(f"{stale[0]}: worker ID {wid} token {token} minted {stale[1]}")
        # Above the persisted mark? (The store's marks are the first cluster's: a second one,
        # in the same region, is held to every other check.)
        own = p.config.cluster == w.config.cluster
        persisted = w.persisted_mark(wid) if own else ms
        if ms > persisted:
            self.fail(f"worker ID {wid} token {token} minted millisecond {ms} above the persisted mark {persisted}")
        if own and ms < self.watermark_ms:
            node, at = self.watermark_by
            self.fail(
                f"worker ID {wid} token {token} minted millisecond {ms} below the watermark {self.watermark_ms} "
                f"node n{node} answered at {at:.3f} s ({self.watermark_ms - ms} ms below it)"
            )
        # Issued twice?
        blocks = self.blocks.setdefault(wid, [])
        i = bisect.bisect_left(blocks, (first, last))
        for j in (i - 1, i):
            if 0 <= j < len(blocks):
                a, b = blocks[j]
                if a <= last and first <= b:
                    self.fail(f"ID issued twice: worker ID {wid} block {first}..{last} overlaps {a}..{b}")
        blocks.insert(i, (first, last))
        # Increasing across owners, in the order they claimed (tokens are no order: a
        # restored etcd hands out revisions again, a wiped state directory tokens)?
        # Checked so far for every pair of owners, the ranges are ordered like their
        # claims: comparing with the neighbours in that order is comparing with all.
        owner = h.owner
        ranges = self.by_token.get(wid)
        if ranges is None:
            ranges = self.by_token[wid] = {}
            self.tokens[wid] = []
        order = self.tokens[wid]
        mine = ranges.get(owner)
        if mine is None:
            i = bisect.bisect_left(order, owner)
            order.insert(i, owner)
            mine = ranges[owner] = [first, first - 1]
        else:
            i = bisect.bisect_left(order, owner)
        if first <= mine[1]:
            self.fail(f"worker ID {wid} token {token}: block {first} is not above the owner's last ID {mine[1]}")
        if i > 0 and ranges[order[i - 1]][1] >= first:
            self.fail(
                f"worker ID {wid}: owner {owner} (token {token}) minted {first}, not above the previous owner "
                f"{order[i - 1]}'s ID {ranges[order[i - 1]][1]}"
            )
        if i + 1 < len(order) and ranges[order[i + 1]][0] <= last:
            self.fail(
                f"worker ID {wid}: owner {owner} (token {token}) minted {last}, not below the next owner "
                f"{order[i + 1]}'s ID {ranges[order[i + 1]][0]}"
            )
        mine[1] = last
        if own and ms > self.max_ms.get(wid, -1):
            self.max_ms[wid] = ms

    def promised(self, node: Node, unix_ms: int) -> None:
        """A node answered WATERMARK with ``unix_ms``: nothing below it is minted from now on."""
        ms = unix_ms - self.epoch_ms
        self.watermarks += 1
        self.watermark_lags.append(node.clock.wall() // MS - unix_ms)
        if ms > self.watermark_ms:
            if self.watermark_ms >= 0:
                self.watermark_advances += 1
            self.watermark_ms = ms
            self.watermark_by = (node.index, self.w.T / NS)

    def asked(self, k: SimKeeper) -> None:
        """The core asks a worker ID to mint: one it still holds, once per request."""
        if k.stopped:
            self.fail(
                f"worker ID {k.lease.worker_id} (token {k.lease.token}) was asked to mint after its process "
                "dropped or released it"
            )
        if k.asked_in == k.proc.request_id:
            self.fail(
                f"request {k.proc.request_id} asked worker ID {k.lease.worker_id} twice: a worker ID that refused "
                "stayed in rotation"
            )
        k.asked_in = k.proc.request_id

    def answered(self, after: int | None, reply: bytes) -> None:
        """A block minted for a causal token sorts after it."""
        if after is None or reply[1] != protocol.BLOCK:
            return
        _, first, count = protocol.unpack_block(reply)
        if first <= after:
            self.fail(
                f"a block {first}+{count} answered a request with causal token {after}: it does not sort after it"
            )

    def claim_tried(self, p: Proc, failed: bool) -> None:
        """A process that failed to claim asks its store again only after a back-off."""
        now = p.node.clock.mono()
        last = p.last_claim
        if last is not None and last[0] == p.inc and last[2] and now - last[1] < CLAIM_RETRY_MIN_NS:
            self.fail(
                f"process {p.holder} asked its store for a worker ID {(now - last[1]) / 1e6:.1f} ms after a "
                f"failed claim (the back-off is at least {CLAIM_RETRY_MIN_NS / 1e6:.0f} ms)"
            )
        p.last_claim = (p.inc, now, failed)

    def refused(self, h: SimKeeper, before: tuple[int, int], err: Exception) -> None:
        m = h.minter
        if (m.last_ms, m.seq) != before:
            self.fail(
                f"a refused call changed the minter: worker ID {h.lease.worker_id} {type(err).__name__} "
                f"({err}) moved (last_ms, seq) from {before} to {(m.last_ms, m.seq)}"
            )

    def step(self) -> None:
        w = self.w
        if not w.marks_dirty:
            return
        w._mark_cache.clear()
        for wid, ms in self.max_ms.items():
            persisted = w._mark_cache[wid] = w._read_mark(wid)
            if persisted < ms:
                self.fail(f"the mark of worker ID {wid} is {persisted}, below millisecond {ms} already minted")
        w.marks_dirty = False


# -- the world ---------------------------------------------------------------------------


class World:
    """One schedule: the cluster, its clocks, its faults, run from one seed."""

    def __init__(
        self,
        seed: int,
        shm: str | None = None,
        kind: str | None = None,
        policy: str | None = None,
        long: bool = False,
        broker_faults: bool = True,
    ) -> None:
        self.seed = seed
        #: Whether the broker processes themselves are paused and killed (not in mutant
        #: searches: their recorded seeds are schedules drawn without them).
        self.broker_faults = broker_faults
        self.rng = rng = random.Random(seed)
        #: Draws for what the heterogeneous cluster adds (mixed flags, the combined faults, a
        #: second cluster), apart from ``rng`` so the rest of a schedule draws as it did.
        self.rng2 = rng2 = random.Random(seed * 7919 + 1)
        #: Draws for the watermark (its rounds' interval and latencies, the clients' asks, its
        #: faults), apart from both, so the rest of a schedule draws as it did without it.
        self.rng3 = rng3 = random.Random(seed * 104729 + 3)
        #: A stream of its own for the second home (so the other streams draw as before it).
        self.rng4 = random.Random(seed * 15485863 + 4)
        #: And one for the late host with a wrong clock, and the peers' connections.
        self.rng5 = random.Random(seed * 32452843 + 5)
        #: And one for the broker processes' own faults (paused, killed).
        self.rng6 = random.Random(seed * 49979687 + 6)
        #: The nodes registered in the cluster's membership (etcd: brokers running), their
        #: endpoints, and the peers' sockets by the name their peer's routing core gives them.
        self.members: set[Node] = set()
        self.endpoints: dict[str, Node] = {}
        self.peer_sockets: dict[bytes, PeerSocket] = {}
        self.peer_count = 0
        self.T = 0
        self.heap: list = []
        self.seq = 0
        self.current: Thread | None = None
        self.marks_dirty = False
        self.counts: dict[str, int] = {"committed_then_timed_out": 0}
        self.faults: list[tuple[float, str]] = []
        self.kind = kind or ("embedded" if rng.random() < EMBEDDED_SHARE else "etcd")
        self.region = 1
        # A small layout: four worker IDs (so they change hands) and 64 IDs per ms.
        ttl = rng.choice([10, 10, 4])
        scale = ttl / 10
        keepalive = rng.choice([2.0, 2.0, 1.0]) * scale
        window = keepalive * rng.choice([2.5, 2.5, 1.5, 1.1])
        forced_policy = policy
        policy = rng.choice(["wait", "wait", "hlc"]) if policy is None else policy
        #: etcd: keep minting through a partition, bounded by the reservation alone (no fence).
        partition_minting = rng.random() < PARTITION_MINTING_SHARE
        self.config_kwargs = dict(
            partition_minting=partition_minting,
            region=self.region,
            time_bits=53,
            region_bits=2,
            worker_bits=2,
            sequence_bits=6,
            workers=1,
            ids_per_worker=rng.choice([1, 1, 2]),
            lease_ttl_s=ttl,
            keepalive_interval_s=keepalive,
            fence_after_s=5.0 * scale,
            reservation_window_s=window,
            # The longest window any node may use here: what a new store waits out.
            max_reservation_window_s=5.0 * scale,
            etcd_timeout_s=1.0 * scale,
            max_step_back_ms=10,
            clock_policy=policy,
            max_ahead_ms=min(1000, int(window * 1000) - 1),
            loop_stall_s=5.0 * scale,
            # The hosts' clocks start up to 1 s from the first host's (so up to 2 s apart), and
            # drift up to 500 ppm; the peers vouch for a clock within half of this (1,050 ms) of a
            # majority, and the clock faults take hosts beyond it.
            max_clock_skew_ms=2100,
            cluster="sim",
            # Small enough that the broker's limits bind: its queue, retries and overload.
            max_inflight_per_client=rng.choice([3, 8, 64]),
            worker_credits=rng.choice([2, 4, 32]),
            watermark_interval_s=rng3.choice(WATERMARK_INTERVALS_S),
        )
        #: Hosts (etcd) or processes (embedded) with flags of their own, as a fleet being
        #: upgraded or set by hand has: reservation windows, their bound, clock policies and
        #: partition minting. The run-ahead bound is set alike (below every window).
        self.mixed = rng2.random() < MIXED_SHARE
        if self.mixed:
            self.config_kwargs["max_ahead_ms"] = min(1000, int(keepalive * 1100) - 1)

        def flags() -> dict:
            if not self.mixed:
                return {}
            own = keepalive * rng2.choice([2.5, 1.5, 1.1])
            out = {
                "reservation_window_s": own,
                # "Set it alike on every node": some are not, and may say less than the others use.
                "max_reservation_window_s": rng2.choice([5.0 * scale, 5.0 * scale, own]),
            }
            if forced_policy is None:
                out["clock_policy"] = rng2.choice(["wait", "hlc"])
            if self.kind == "etcd":
                out["partition_minting"] = rng2.random() < 0.4
                if out["partition_minting"] and rng2.random() < 0.7:
                    # Minting through long partitions: a window beyond what the others may use.
                    out["reservation_window_s"] = out["max_reservation_window_s"] = keepalive * 6
            return out

        # Embedded: the state directory every process shares. etcd: each host's own (its journal).
        self.tmp: str | None = tempfile.mkdtemp(prefix="snowfence-sim-", dir=shm)
        self.config_kwargs["state_dir"] = self.tmp
        # The journal on another disk than the state directory: what a wipe or a restore of
        # the state directory leaves (one on the same disk goes with it: no witness is left,
        # the case RELIABILITY.md writes down).
        self.config_kwargs["journal_dir"] = self.tmp + "-journal"
        if self.kind == "etcd":
            self.config_kwargs["etcd"] = ("http://127.0.0.1:2379", "http://127.0.0.1:2380", "http://127.0.0.1:2381")
            self.etcd = EtcdServer(self)
            #: Copies of etcd taken now and then, for the snapshot-restore fault.
            self.snapshots: list = []
        else:
            self.etcd = None
            #: Earlier copies of mark files, for the rolled-back-mark fault: {worker ID: bytes}.
            self.old_marks: dict[int, bytes] = {}
        #: The highest mark each worker ID had before an operator's fault took it away: the
        #: checker's own memory, since the store's is what the faults attack.
        self.erased_high: dict[int, int] = {}
        #: Leases a restore of etcd took away: their holders learn it at their next renewal.
        self.restored_leases: set[int] = set()
        #: Until when (true time) the cluster is down for a restore.
        self.restoring_until = 0
        #: Workers that refused to boot on a store whose layout record is gone.
        self.boot_refusals: list[str] = []
        #: The process of a second cluster in this region, once the fault has started it.
        self.second: Proc | None = None
        self.config = Config(**self.config_kwargs)
        self.layout = self.config.layout
        self.fence_ns = int(self.config.fence_after_s * NS)
        self.renewed: dict[int, int] = {}
        self.told_lost: set[int] = set()
        self.checker = Checker(self)
        self._mark_cache: dict[int, int] = {}
        # Hosts: embedded mode is one host; etcd mode two or three, clocks apart by up to 2 s
        # (three more often: where two disagree, neither claims).
        epoch_ns = self.layout.epoch_ms * MS
        base_wall = epoch_ns + rng.randrange(10**6) * NS
        n_nodes = 1 if self.kind == "embedded" else rng.choice([2, 3, 3])
        self.nodes: list[Node] = []
        self.procs: list[Proc] = []
        for i in range(n_nodes):
            mono0 = rng.randrange(1, 10**6) * NS
            skew = 0 if i == 0 or rng.random() < 0.5 else rng.randrange(-1000, 1000) * MS
            clock = HostClock(self, mono0, base_wall + skew - mono0, rng.uniform(-500, 500))
            node = Node(self, i, clock)
            self.nodes.append(node)
            self.endpoints[node.endpoint] = node
            config = self.config
            if self.kind == "etcd":
                config = Config(
                    **{
                        **self.config_kwargs,
                        "state_dir": f"{self.tmp}/host{i}",
                        "journal_dir": f"{self.tmp}-journal/{i}",
                        **flags(),
                    }
                )
            for slot in range(rng.choice([1, 1, 2]) if self.kind == "etcd" else rng.choice([2, 3])):
                own = config if self.kind == "etcd" else Config(**{**self.config_kwargs, **flags()})
                proc = Proc(self, node, slot, own)
                node.procs.append(proc)
                self.procs.append(proc)
            node.broker = Broker(self, node, config)
        self.long = long
        self.horizon = int(rng.uniform(15, 40) * scale * NS * (LONG_FACTOR if long else 1))
        # Across the processes' own flags: the longest window any of them uses, and whether any
        # mints through partitions.
        holders = self.procs + [n.broker.proc for n in self.nodes if n.broker.proc is not None]
        self.window_ms = max(int(p.config.reservation_window_s * 1000) for p in holders)
        self.partition_minting = any(self.kind == "etcd" and p.config.partition_minting for p in self.procs)
        #: etcd: the last host may start late, its clock off past the peers' bound from every
        #: other's (drawn from rng5): in a cluster of two, two hosts whose clocks disagree.
        self.late: Node | None = None
        self.late_at = 0
        if self.kind == "etcd" and self.rng5.random() < LATE_HOST_SHARE:
            self.late = self.nodes[-1]
            self.late_at = self.rng5.randrange(self.horizon // 8, self.horizon // 2)

    # -- the event loop
    def at(self, t: int, thread: Thread | None, fn, *args) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, thread, thread.inc if thread is not None else 0, fn, args))

    def run_until(self, t_end: int) -> None:
        heap = self.heap
        pop = heapq.heappop
        step = self.checker.step
        while heap and heap[0][0] <= t_end:
            t, _, th, inc, fn, args = pop(heap)
            if t > self.T:
                self.T = t
            if th is not None:
                p = th.proc
                if inc != p.inc or not p.up:
                    continue
                if p.paused_until > self.T:
                    self.seq += 1
                    heapq.heappush(heap, (p.paused_until, self.seq, th, inc, fn, args))
                    continue
                if th.busy:
                    th.deferred.append((fn, args))
                    continue
            outer = self.current
            self.current = th
            try:
                fn(*args)
            except Died:
                pass
            finally:
                self.current = outer
            step()
        if t_end > self.T:
            self.T = t_end

    def elapse(self, dt: int) -> None:
        """The current thread waits ``dt`` ns (a call, a sleep); everything else runs meanwhile."""
        th = self.current
        if th is None:
            self.run_until(self.T + dt)
            return
        if th.busy == 0:
            th.busy_since = th.proc.node.clock.mono()
        th.busy += 1
        try:
            self.run_until(self.T + dt)
            p = th.proc
            while p.paused_until > self.T and th.inc == p.inc:
                self.run_until(p.paused_until)
        finally:
            th.busy -= 1
            self.current = th
        if not th.alive:
            raise Died()
        if th.busy == 0 and th.deferred:
            deferred, th.deferred = th.deferred, []
            for fn, args in deferred:
                self.at(self.T, th, fn, *args)

    def check_alive(self) -> None:
        th = self.current
        if th is not None and not th.alive:
            raise Died()

    def pause_inside_call(self, p: Proc) -> None:
        """A process paused in the middle of whatever its thread is doing (just before minting)."""
        dt, p.pause_in_call = p.pause_in_call, 0
        p.paused_until = max(p.paused_until, self.T + dt)
        self.elapse(dt)

    # -- marks as the store has them
    def persisted_mark(self, wid: int) -> int:
        if not self.marks_dirty:
            cached = self._mark_cache.get(wid)
            if cached is not None:
                return cached
        value = self._mark_cache[wid] = self._read_mark(wid)
        return value

    def _read_mark(self, wid: int) -> int:
        """The mark of ``wid`` as the store has it, or as it had it before an operator's fault."""
        return max(self._store_mark(wid), self.erased_high.get(wid, -1))

    def _store_mark(self, wid: int) -> int:
        try:
            if self.kind == "etcd":
                kv = self.etcd.kv.get(f"/snowfence/sim/marks/{self.region}/{wid}")
                raw = None if kv is None else kv.value
            else:
                with open(f"{self.tmp}/regions/{self.region}/worker-{wid}.mark", "rb") as f:
                    raw = f.read()
            return -1 if raw is None else orjson.loads(raw)["reserved_until_ms"]
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return -1  # gone, or damaged by a fault

    def forget(self, wids) -> None:
        """An operator's fault is about to take these marks away: remember how high they were."""
        for wid in wids:
            self.erased_high[wid] = self._read_mark(wid)

    # -- processes
    def start(self, p: Proc) -> None:
        p.inc += 1
        p.up = True
        p.paused_until = 0
        p.pause_in_call = 0
        p.loop = Thread(p, "loop")
        p.started_mono = p.node.clock.mono()
        p.pid = 1000 + (p.inc << 8) + (p.node.index << 4) + p.slot
        p.ident = f"w{p.slot}-{p.pid}".encode()
        p.inbox.clear()
        config = p.config
        clock = p.node.clock
        store = open_store(
            config,
            wall_ns=clock.wall,
            mono_ns=p.mono_ns,
            etcd_client=lambda: FakeClient(self, p, ETCD_LABELS, config.etcd_timeout_s),
        )
        store.claim = functools.partial(self.claim, p, store.claim)
        self.track_leases(p, store)
        p.core = WorkerCore(
            config,
            slot=p.slot,
            pid=p.pid,
            holder=p.holder,
            store=store,
            preferences=preference_files(config, p.slot),
            send=functools.partial(self.from_worker, p),
            host_clock=ClockWatch(
                forward_jump_ms=config.forward_jump_ms,
                refuse_forward_jumps=config.refuse_forward_jumps,
                max_clock_error_ms=config.max_clock_error_ms,
                log=SIM_LOG,
                wall_ns=clock.wall,
                read_kernel=lambda: None,
            ),
            now_ns=clock.mono(),
            clocks=Clocks(wall_ns=p.wall_ns, mono_ns=p.mono_ns, sleep=p.sleep),
            rng=self.rng,
            loop_ns=p.loop_ns,
            make_minter=CheckedMinter,
            make_keeper=functools.partial(SimKeeper, self, p),
            queued=functools.partial(self.queued, p),
        )
        self.watch_claims(p, p.core)
        p.node.broker.started(p)
        # The loop's first wait for a frame (workers/main.py sets RCVTIMEO before it).
        p.wait_id += 1
        self.at(self.T + core_mod.IDLE_WAIT_MS * MS, p.loop, self.timed_out, p, p.wait_id)

    def track_leases(self, p: Proc, store) -> None:
        """Embedded: every lease the process's store makes holds descriptors (the lock file,
        the witness sockets) that the kernel closes when the process dies, wherever it was;
        kept here so that its exit closes them all, not only those its core holds."""
        if self.kind != "embedded":
            return
        make = store._claim

        def _claim(*args, **kwargs):
            lease = make(*args, **kwargs)
            if lease is not None:
                p.leases.append(lease)
            return lease

        store._claim = _claim

    def close_descriptors(self, p: Proc) -> None:
        for lease in p.leases:
            lease.abandon()  # does nothing to one released already
        p.leases.clear()

    def crash(self, p: Proc) -> None:
        """SIGKILL: the kernel drops the file locks; the minters' memory is gone; etcd leases lapse."""
        if not p.up:
            return
        self.exit(p, -signal.SIGKILL)

    def signal(self, p: Proc, sig: int) -> None:
        """A signal from the supervisor: SIGTERM is acted on at the loop's next turn (the
        handler only queues it), SIGCONT resumes a stopped process, SIGKILL kills."""
        if sig == signal.SIGKILL:
            self.crash(p)
        elif sig == signal.SIGCONT:
            p.paused_until = min(p.paused_until, self.T)
        elif sig == signal.SIGTERM:
            self.at(self.T, p.loop, self.sigterm, p)

    def sigterm(self, p: Proc) -> None:
        """The handler's queued signal, acted on at a turn of the loop: the core stops and
        drains (its loop goes on until the core is finished)."""
        if p.up:
            p.core.stop("stopping", "signal received; draining")
            self.turn(p, None)

    def worker_ends(self, p: Proc) -> None:
        """The core is finished (stopping, and done draining): workers/main.py's loop ends,
        then it releases what it holds, sends its last STATE and exits with the core's status.
        A clean stop leaves no request of its broker's unanswered in its socket."""
        core = p.core
        if core.boot_error is not None:
            self.boot_failed(p)
            return
        if core.stop_name == "orphaned" and p.node.broker.running and not p.node.broker.fell_silent_lately():
            raise Violation(f"worker {p.holder} left its broker, which was running: {core.reason}")
        queued = sum(1 for frame, _ in p.inbox if frame[0] == protocol.WORK)
        if queued and core.stop_name != "orphaned":
            self.checker.fail(f"worker {p.holder} stopped with {queued} requests of its broker's queued, unanswered")
        self.run_on_loop(p, core.release_all)
        self.run_on_loop(p, core.send_state)
        self.exit(p, core.exit_code)
        if p not in p.node.broker.supervised:  # a second cluster's process: started again by hand
            self.at(self.T + self.rng2.randrange(NS, 3 * NS), None, self.restart, p)

    def exit(self, p: Proc, status: int = 0) -> None:
        """The process is gone: its keepers with it, and (embedded) the kernel drops its locks."""
        p.exit_status = status
        for h in p.held:
            h.keeper.stopped = True
        self.close_descriptors(p)
        p.up = False
        p.inc += 1
        p.inbox.clear()
        p.node.broker.exited(p)

    def clean_stop(self, p: Proc) -> None:
        """SIGTERM: the core's release plan (``WorkerCore.release_all``), then exit."""
        if not p.up:
            return
        if p.paused_until > self.T or p.loop.busy:
            # A stopped process, or one inside a call, would act on SIGTERM later; kill it now instead.
            self.crash(p)
            return
        self.run_on_loop(p, p.core.release_all)
        self.run_on_loop(p, p.core.send_state)  # as workers/main.py does last
        self.exit(p, 0)

    def run_on_loop(self, p: Proc, fn) -> None:
        """Run ``fn`` now on ``p``'s loop thread (as its signal handler's turn would)."""
        outer = self.current
        self.current = p.loop
        try:
            fn()
        except Died:
            pass
        finally:
            self.current = outer
        self.marks_dirty = True
        self.checker.step()

    # -- the worker loop: workers/main.py's, each frame and each time-out a turn of the core
    def deliver(self, p: Proc) -> None:
        """Frames from the broker reach the process: its loop takes them in order, each
        one a turn of the core (``WorkerCore.turn``), as workers/main.py's loop does."""
        inbox = p.inbox
        while inbox and p.up:
            frame, sent = inbox.popleft()
            self.taking(p, frame, sent)
            self.turn(p, frame)

    def taking(self, p: Proc, frame: bytes, sent: int) -> None:
        if frame[0] == protocol.WORK:
            # One request at a time per process: its loop is busy meanwhile.
            request = protocol.decode_request(protocol.split_routed(frame)[2])
            p.request_id, p.asked_after, p.work_sent = request.request_id, request.after, sent

    def queued(self, p: Proc):
        """The frames that reached the process's socket and wait there (workers/main.py's
        ``queued``: read without waiting, before a claim), taken in order as the core
        handles them."""
        inbox = p.inbox
        while inbox and p.up and inbox[0][1] + LINK_NS <= self.T:
            frame, sent = inbox.popleft()
            self.taking(p, frame, sent)
            yield frame

    def turn(self, p: Proc, frame: bytes | None) -> None:
        """One turn of the real core; its loop's next wait for a frame ends after the
        time the core asked for (the RCVTIMEO workers/main.py sets), unless a frame comes."""
        core = p.core
        before = core.counters["claims"], core.next_claim_ns, len(core.held)
        wait_ms = core.turn(frame, p.node.clock.mono())
        if (core.counters["claims"], core.next_claim_ns, len(core.held)) != before:
            self.marks_dirty = True  # a claim was tried (it may write marks), or a worker ID dropped
        if core.finished:
            self.worker_ends(p)
            return
        p.wait_id += 1
        self.at(self.T + max(int(wait_ms * MS / p.node.clock.rate), 1), p.loop, self.timed_out, p, p.wait_id)

    def timed_out(self, p: Proc, wait_id: int) -> None:
        """The loop's wait for a frame ends (a frame that came meanwhile is taken first)."""
        if wait_id != p.wait_id:
            return  # a frame ended that wait, and the turn after it began another
        if p.inbox:
            self.deliver(p)
        else:
            self.turn(p, None)

    def work_now(self, p: Proc, n: int = 1, after: int | None = None) -> None:
        """One WORK frame straight to the process, taken now (for scripted scenarios)."""
        self.request_id += 1
        p.inbox.append((protocol.encode_work(0, b"sim", protocol.encode_reserve(self.request_id, n, after)), self.T))
        self.deliver(p)

    def watch_claims(self, p: Proc, core: WorkerCore) -> None:
        """Note when the core decides to claim (``WorkerCore.claim`` begins): a process paused
        between that and its store call learns no verdict meanwhile, and is judged by then."""
        decide = core.claim

        def claim() -> bool:
            p.claim_decided = self.T
            return decide()

        core.claim = claim

    def claim(self, p: Proc, claim, *args, **kwargs):
        """The store's claim, as the core calls it; the checker sees each attempt."""
        self.checker.clock_claim(p)
        try:
            lease = claim(*args, **kwargs)
        except SnowfenceError:
            self.checker.claim_tried(p, failed=True)
            raise
        self.checker.claim_tried(p, failed=lease is None)
        return lease

    def from_worker(self, p: Proc, frame: bytes) -> None:
        """A frame the core sends to its broker: it arrives after LINK_NS."""
        kind = frame[0]
        if kind == protocol.REFUSED:
            self.counts["refused"] += 1
        elif kind == protocol.REPLY and protocol.split_routed(frame)[2][1] == protocol.ERROR:
            self.counts["refused"] += 1
        self.at(self.T + LINK_NS, None, p.node.broker.from_worker, p.ident, frame)

    def note_minted(self, first: int) -> None:
        """Keep some minted IDs, as causal tokens for later requests."""
        if len(self.last_ids) < 64:
            self.last_ids.append(first)
        else:
            self.last_ids[self.rng.randrange(64)] = first

    def boot_failed(self, p: Proc) -> None:
        """The core refused to go on (exit status 73 or 78): the process exits with it, and its
        supervisor halts the node (an operator starts it again after a look)."""
        core = p.core
        exc = core.boot_error
        if core.exit_code == Exit.OK or exc is None:
            raise Violation(f"a worker stopped with no reason given (exit {core.exit_code})")
        supervised = p in p.node.broker.supervised
        if isinstance(exc, LayoutMismatch) and "is claimed by cluster" in str(exc):
            # A region another cluster holds: refused by name, and again at each restart
            # (the operator is to fix the flag); nothing for accept-restore to do.
            self.counts["region_refused"] = self.counts.get("region_refused", 0) + 1
        elif isinstance(exc, (LayoutMismatch, StateDirError)) and "is missing" in str(exc):
            # The layout record was deleted while marks remain: refusing to boot is the design;
            # the operator is to act.
            self.boot_refusals.append(str(exc))
        else:
            raise Violation(f"a worker could not boot: {exc}")
        core.release_all()
        self.exit(p, core.exit_code)
        if not supervised:  # a second cluster's process: its own node, started again by hand
            self.at(self.T + self.rng2.randrange(NS, 3 * NS), None, self.restart, p)

    # -- the broker's own worker ID: broker/own.py's OwnWorkerId, its thread's steps simulated
    def start_own(self, b: Broker) -> None:
        """The broker opens its own worker ID's store (open_store, as every holder does) and
        its thread starts; its ``mint`` answers plain requests in the routing core."""
        p = b.proc
        p.inc += 1
        p.up = True
        p.paused_until = 0
        p.loop = Thread(p, "own")
        p.pid = 1000 + (p.inc << 8) + (p.node.index << 4) + 15
        config, clock = p.config, p.node.clock

        def open_own_store(cfg: Config):
            store = open_store(
                cfg,
                wall_ns=clock.wall,
                mono_ns=p.mono_ns,
                etcd_client=lambda: FakeClient(
                    self, p, [f"127.0.0.1:{2379 + i}" for i in range(3)], cfg.etcd_timeout_s
                ),
            )
            store.claim = functools.partial(self.claim, p, store.claim)
            self.track_leases(p, store)
            return store

        own = own_mod.OwnWorkerId(
            config,
            open_store=open_own_store,
            workers_settled=lambda: b.node_core.workers_settled(),
            loop_ns=lambda: b.node_core.loop_ns,
            pid=p.pid,
            clocks=Clocks(wall_ns=p.wall_ns, mono_ns=p.mono_ns, sleep=p.sleep),
            host_clock=ClockWatch(
                forward_jump_ms=config.forward_jump_ms,
                refuse_forward_jumps=config.refuse_forward_jumps,
                max_clock_error_ms=config.max_clock_error_ms,
                log=SIM_LOG,
                wall_ns=clock.wall,
                read_kernel=lambda: None,
            ),
            make_minter=CheckedMinter,
            make_keeper=functools.partial(SimKeeper, self, p),
            rng=self.rng,
        )
        if not own.open():
            return
        p.core = own.core
        self.watch_claims(p, own.core)
        b.own = own
        b.core.mint_own(own.mint, config.broker_mint_max_ids)
        self.at(self.T + int(own_mod.TICK_S * NS), p.loop, self.own_step, b)

    def stop_own(self, b: Broker, release: bool = True) -> None:
        """The broker exits: its own worker ID released (``OwnWorkerId.stop``'s plan), or
        just gone with the process."""
        p, own = b.proc, b.own
        if release and p.up:
            self.run_on_loop(p, own.core.release_all)
        for h in p.held:
            h.keeper.stopped = True
        self.close_descriptors(p)
        p.up = False
        p.inc += 1
        b.own = None

    def own_step(self, b: Broker) -> None:
        """One turn of the own worker ID's thread (``OwnWorkerId.step``), every TICK_S."""
        p, own = b.proc, b.own
        before = own.core.counters["claims"], len(own.core.held), own.gave_back
        counted = own._next_count_ns
        try:
            going = own.step()
        finally:
            if (own.core.counters["claims"], len(own.core.held), own.gave_back) != before:
                self.marks_dirty = True
        if own._next_count_ns != counted and own.free == 0 and own.core.held:
            self.checker.fail(
                "the broker kept its own worker ID after counting no other of the region free (workers come first)"
            )
        if going:
            self.at(self.T + int(own_mod.TICK_S * NS / p.node.clock.rate), p.loop, self.own_step, b)

    # -- the node's watermark: broker/watermark.py's Watermark, its thread's rounds simulated
    def start_watermark(self, b: Broker) -> None:
        """The broker starts its watermark: its own store (open_store, as broker/main.py opens
        it), a round every ``watermark_interval_s`` on a thread of the broker process, and
        WATERMARK answered by the routing core from its last promise."""
        if b.watermark is not None:
            self.stop_watermark(b)
        p = b.wm_proc
        p.inc += 1
        p.up = True
        p.paused_until = 0
        p.pause_in_call = 0
        p.loop = Thread(p, "watermark")
        p.pid = 1000 + (p.inc << 8) + (p.node.index << 4) + 14
        clock = p.node.clock

        def open_watermark_store(cfg: Config, journal: bool = True):
            return open_store(
                cfg,
                journal=journal,
                wall_ns=clock.wall,
                mono_ns=p.mono_ns,
                etcd_client=lambda: WatermarkClient(self, p, ETCD_LABELS, cfg.etcd_timeout_s, self.rng3),
            )

        # (A pause inside a round: etcd, as it raises the record; embedded, whose round is
        # one step here, as it reads the clock.)
        wm = Watermark(
            b.config,
            open_store=open_watermark_store,
            wall_ns=p.wall_ns if self.kind == "embedded" else clock.wall,
            mono_ns=p.mono_ns,
        )
        if wm.interval_s <= 0 or not wm.open():
            self.counts["watermark_disabled"] = self.counts.get("watermark_disabled", 0) + 1
            return
        b.watermark = b.core.watermark = wm
        self.at(self.T + max(int(wm.interval_s * NS / clock.rate), 1), p.loop, self.watermark_step, b, wm)

    def stop_watermark(self, b: Broker) -> None:
        """The broker exits: its watermark thread with it (the next one starts from no promise)."""
        wm, b.watermark = b.watermark, None
        if wm is None:
            return
        if b.core.watermark is wm:
            b.core.watermark = None
        p = b.wm_proc
        p.up = False
        p.inc += 1
        if wm.store is not None:
            wm.store.close()

    def watermark_step(self, b: Broker, wm: Watermark) -> None:
        """One round (``Watermark.step``), and the next after the interval, on its host's clock."""
        if b.watermark is not wm:
            return
        wm.step()
        rate = b.wm_proc.node.clock.rate
        self.at(self.T + max(int(wm.interval_s * NS / rate), 1), b.wm_proc.loop, self.watermark_step, b, wm)

    def watermark_fault(self, kind: str) -> None:
        """A fault of one node's watermark thread (drawn from rng3): the broker process
        stopped (SIGSTOP, a VM freeze), stopped inside a round, or restarted."""
        rng3 = self.rng3
        T = self.T
        b = rng3.choice(self.nodes).broker
        if not b.running or b.watermark is None:
            return
        p = b.wm_proc
        length = rng3.choice([rng3.randrange(1, NS), rng3.randrange(NS, 30 * NS)])
        if kind == "watermark_pause":
            p.paused_until = max(p.paused_until, T + length)
        elif kind == "watermark_pause_in_round":
            p.pause_in_call = length
        elif kind == "watermark_restart":
            self.stop_watermark(b)
            self.at(T + rng3.randrange(1, NS), None, self.restart_watermark, b)
        else:  # pragma: no cover
            raise AssertionError(kind)
        self.faults.append((T / NS, kind))

    def broker_fault(self, kind: str) -> None:
        """A fault of one node's broker process (drawn from rng6): stopped (SIGSTOP, a VM
        freeze of it alone) with its threads, for up to 30 s; or killed (SIGKILL, the OOM
        killer), its workers told by the kernel (``PR_SET_PDEATHSIG``), and the node started
        again once they are gone."""
        rng6 = self.rng6
        b = rng6.choice(self.nodes).broker
        if not b.running or not b.serving:
            return  # not started yet, or down already: not counted
        if kind == "broker_pause":
            b.pause(self.T + rng6.choice([rng6.randrange(1, NS), rng6.randrange(NS, 30 * NS)]))
        elif kind == "broker_kill":
            b.kill(self.T + rng6.randrange(NS // 2, 3 * NS))
        else:  # pragma: no cover
            raise AssertionError(kind)
        self.faults.append((self.T / NS, kind))

    def restart_watermark(self, b: Broker) -> None:
        if b.running and b.watermark is None:
            self.start_watermark(b)

    # -- the keepers
    def keeper_step(self, p: Proc, k: SimKeeper, sleep_id: int) -> None:
        """One turn of the real keeper (``Keeper.step``), and its next turn scheduled
        after the wait it asked for, on its host's clock (or sooner, when woken)."""
        if k.stopped or k.done or sleep_id != k.sleep_id:
            return
        # A lock file removed before this step began, and a renewal that succeeds
        # in it: the check missed the removal. (One removed while the renewal
        # runs, after its check, is found by the next.)
        doomed, renewals = k.doomed, k.renewals
        try:
            delay = k.step()
        finally:
            self.marks_dirty = True
            if doomed and k.renewals > renewals:
                k.doomed_checked = True
        if delay is None:
            k.done = True  # the loop notices keeper.lost at its next turn
            return
        k.sleep_id += 1
        self.at(self.T + max(int(delay * NS / p.node.clock.rate), 1), k.thread, self.keeper_step, p, k, k.sleep_id)

    def wake_keeper(self, k: SimKeeper) -> None:
        k.sleep_id += 1
        self.at(self.T, k.thread, self.keeper_step, k.thread.proc, k, k.sleep_id)

    # -- faults
    def schedule_faults(self) -> None:
        rng = self.rng
        n = rng.randint(FAULTS_MIN, FAULTS_MAX) * (LONG_FACTOR if self.long else 1)
        kinds = FAULT_KINDS[self.kind]
        for _ in range(n):
            t = rng.randrange(self.horizon)
            kind = rng.choice(kinds)
            self.at(t, None, self.fault, kind)
        # The store forgetting (an operator's mistake, a restore) is rarer: a few a schedule,
        # and an operator who notices the nodes refusing and accepts the store as it is.
        # Some schedules lose journals instead (a host replaced, a pod's volume gone): the
        # store then is the only witness, so it forgets nothing it cannot prove in them.
        # Both lost together is what RELIABILITY.md writes down as undetectable.
        journals_lost = rng.random() < JOURNAL_LOSS_SHARE
        store_kinds = [k for k in STORE_FAULT_KINDS[self.kind] if not journals_lost or k in STORE_FAULTS_PROVABLE]
        for _ in range(rng.randint(0, STORE_FAULTS_MAX) * (LONG_FACTOR if self.long else 1)):
            self.at(rng.randrange(self.horizon), None, self.fault, rng.choice(store_kinds))
        if journals_lost:
            for _ in range(rng.randint(1, STORE_FAULTS_MAX) * (LONG_FACTOR if self.long else 1)):
                self.at(rng.randrange(self.horizon), None, self.fault, "journal_lost")
        # What the heterogeneous cluster meets (drawn from rng2): an hlc host killed while
        # its logical clock ran ahead, its state directory and journal wiped, restarted at
        # once; the keys deleted while a host (one minting through partitions, if any) is cut
        # off; a second cluster, one letter off, started in the same region of the same etcd.
        rng2 = self.rng2
        times = LONG_FACTOR if self.long else 1
        if self.kind == "embedded":
            # (Not where journals are lost too: a wipe that keeps the journal, and a journal
            # lost later, is every witness gone, which RELIABILITY.md writes down.)
            for _ in range(rng2.randint(0, 1) * times * (not journals_lost)):
                self.at(rng2.randrange(self.horizon), None, self.fault, "crash_and_wipe")
            if self.rng4.random() < SECOND_HOME_SHARE:
                self.at(self.rng4.randrange(self.horizon // 3), None, self.fault, "second_home")
        else:
            if not journals_lost and rng2.random() < 0.6:
                for _ in range(times):
                    # (in the first half, so that what follows is seen)
                    self.at(rng2.randrange(self.horizon // 2), None, self.fault, "delete_prefix_under_cut")
            if rng2.random() < SECOND_CLUSTER_SHARE:
                self.at(rng2.randrange(self.horizon // 2), None, self.fault, "second_cluster")
        self.at(rng.randrange(NS), None, self.backup)
        self.at(rng.randrange(NS), None, self.operator)
        rng3 = self.rng3
        for _ in range(rng3.randint(WATERMARK_FAULTS_MIN, WATERMARK_FAULTS_MAX) * times):
            self.at(rng3.randrange(self.horizon), None, self.watermark_fault, rng3.choice(WATERMARK_FAULTS))
        # The broker process itself stopped or killed, in some schedules (drawn from rng6).
        rng6 = self.rng6
        if rng6.random() < BROKER_FAULT_SHARE and self.broker_faults:
            for _ in range(rng6.randint(1, BROKER_FAULTS_MAX) * times):
                self.at(rng6.randrange(self.horizon), None, self.broker_fault, rng6.choice(BROKER_FAULTS))

    # -- the store forgetting, and the operator
    def backup(self) -> None:
        """Now and then, a copy: etcd's snapshot, or the state directory's mark files."""
        self.at(self.T + self.rng.randrange(NS, 4 * NS), None, self.backup)
        if self.kind == "etcd":
            self.snapshots.append(self.etcd.snapshot())
            del self.snapshots[:-8]
        else:
            region = Path(self.tmp) / "regions" / str(self.region)
            for mark in region.glob("worker-*.mark"):
                try:
                    self.old_marks[int(mark.name[7:-5])] = mark.read_bytes()
                except (OSError, ValueError):
                    continue

    def problems(self) -> list[str]:
        """What the nodes' journals say went back, and the worker IDs they pass over for it."""
        out = []
        for q in self.procs:
            store = q.core.store if q.up else None
            journal = getattr(store, "journal", None)
            if journal is not None and journal.problem:
                out.append(journal.problem)
            if store is not None:
                out += [why for why in store.passed_over.values() if "accept-restore" in why]
        out += self.boot_refusals
        return out

    def operator(self) -> None:
        """Someone watching `snowfence status`: the nodes refuse because the store went back;
        after a while the operator accepts the store as it is (`snowfence accept-restore`)."""
        self.at(self.T + self.rng.randrange(NS, 3 * NS), None, self.operator)
        if not self.problems():
            return
        config = self.procs[0].config
        wall = self.nodes[0].clock.wall
        # As `snowfence accept-restore` opens it (see cli.py).
        store = open_store(config, journal=config.embedded, wall_ns=wall, etcd_client=lambda: DirectClient(self.etcd))
        try:
            store.accept_restore("the simulator's operator")
        except (SnowfenceError, OSError):
            return  # tried again at the next look
        self.marks_dirty = True
        self.boot_refusals.clear()
        self.counts["restores_accepted"] = self.counts.get("restores_accepted", 0) + 1

    def fault(self, kind: str) -> None:
        rng = self.rng
        T = self.T
        self.marks_dirty = True
        if kind in COMBINED_FAULTS:
            if self.combined_fault(kind) is not False:
                self.faults.append((T / NS, kind))
            return
        up = [q for q in self.procs if q.up]
        p = rng.choice(up) if up else None
        node = rng.choice(self.nodes)
        if p is None and kind in PROCESS_FAULTS:
            return  # nothing to apply it to: not counted
        if self.fault_on(kind, p, node) is not False:
            self.faults.append((T / NS, kind))

    def fault_on(self, kind: str, p: Proc, node: Node) -> None:
        """Apply one fault to process ``p`` or host ``node`` (each kind uses one of them)."""
        rng = self.rng
        T = self.T
        procs = self.procs
        clock = node.clock
        if kind == "crash":
            self.crash(p)
            self.at(T + rng.randrange(1, 3 * NS), None, self.restart, p)
        elif kind == "restart":
            self.clean_stop(p)
            self.at(T + rng.randrange(1, NS), None, self.restart, p)
        elif kind == "pause":
            length = rng.choice([rng.randrange(1, NS), rng.randrange(NS, 30 * NS)])
            p.paused_until = max(p.paused_until, T + length)
        elif kind == "pause_in_call":
            p.pause_in_call = rng.choice([rng.randrange(1, NS), rng.randrange(NS, 30 * NS)])
        elif kind == "step_back":
            back = rng.choice([rng.randrange(1, 11), rng.randrange(11, 200), rng.randrange(200, 5000)]) * MS
            clock.off -= back
            self.resync(clock, back)
        elif kind == "step_forward":
            ahead = rng.choice([rng.randrange(1, 200), rng.randrange(200, 5000)]) * MS
            clock.off += ahead
            if rng.random() < 0.5:
                back = rng.randrange(1, 5000) * MS
                self.at(T + rng.randrange(1, 3 * NS), None, self._step, clock, -back)
            else:
                self.resync(clock, -ahead)
        elif kind == "freeze":
            clock.frozen = clock.wall()
            self.at(T + rng.randrange(1, 3 * NS), None, self._thaw, clock, rng.random() < 0.5)
        elif kind == "drift":
            clock.set_drift(rng.uniform(-500, 500))
        elif kind == "member_down":
            m = rng.randrange(EtcdServer.MEMBERS)
            self.etcd.member_down(m)
            self.at(T + rng.randrange(1, 8 * NS), None, self._member_up, m)
        elif kind == "member_unreachable":
            m = rng.randrange(EtcdServer.MEMBERS)
            node.cut.add(m)
            self.at(T + rng.randrange(1, 8 * NS), None, node.cut.discard, m)
        elif kind == "partition":
            node.cut.update(range(EtcdServer.MEMBERS))
            self.at(T + rng.randrange(1, 15 * NS), None, node.cut.clear)
        elif kind == "outage":
            for m in range(EtcdServer.MEMBERS):
                self.etcd.member_down(m)
            self.at(T + rng.randrange(1, 8 * NS), None, self._all_up)
        elif kind == "slow_network":
            node.slow_until = max(node.slow_until, T + rng.randrange(1, 10 * NS))
        elif kind == "commit_then_timeout":
            node.commit_then_timeout += rng.randint(1, 4)
        elif kind == "delete_claim":
            # An operator deletes a held worker ID's claim, and sometimes restarts its holder soon after.
            held = [(q, h) for q in procs for h in q.held]
            if not held:
                return False
            q, h = held[rng.randrange(len(held))]
            self.etcd.delete_key(f"/snowfence/sim/workers/{self.region}/{h.lease.worker_id}")
            if rng.random() < 0.5:
                self.at(T + rng.randrange(1, 3 * NS), None, self.fault_on, "restart", q, q.node)
        elif kind in STORE_FAULT_KINDS[self.kind]:
            return self.store_fault(kind)
        elif kind == "journal_lost":
            # The host's processes die with its disk; they come back on an empty journal.
            for q in node.procs:
                self.crash(q)
                self.at(T + rng.randrange(1, 3 * NS), None, self.restart, q)
            shutil.rmtree(node.procs[0].config.journal_path, ignore_errors=True)
        elif kind == "remove_lock":
            wid = rng.randrange(self.layout.max_worker + 1)
            lock = Path(self.tmp) / "regions" / str(self.region) / f"worker-{wid}.lock"
            try:
                os.unlink(lock)
            except FileNotFoundError:
                return False
            for q in self.procs:
                for h in q.held:
                    if h.lease.worker_id == wid:
                        h.keeper.doomed = True
        else:  # pragma: no cover
            raise AssertionError(kind)

    def store_fault(self, kind: str) -> bool | None:
        """The store forgets or goes back (False: nothing to apply it to)."""
        rng = self.rng
        wids = range(self.layout.max_worker + 1)
        if self.kind == "etcd":
            etcd = self.etcd
            prefix = "/snowfence/sim/"
            if kind == "delete_prefix":  # etcdctl del --prefix /snowfence/sim/
                self.forget(wids)
                etcd.delete_prefix(prefix)
            elif kind == "snapshot_restore":  # etcdutl snapshot restore, and etcd restarted
                if not self.snapshots:
                    return False
                # etcdutl restores stopped members' data directories: the cluster is down from
                # the first member stopped to the restored one started, at least the reservation
                # window and the skew bound (the guard RELIABILITY.md names for a restore).
                if self.T < self.restoring_until:
                    return False  # one restore at a time
                for m in range(EtcdServer.MEMBERS):
                    etcd.member_down(m)
                down = self.window_ms * MS + self.config.max_clock_skew_ms * MS + rng.randrange(1, 3 * NS)
                self.restoring_until = self.T + down + 1
                self.at(self.T + down, None, self._restored, rng.choice(self.snapshots), rng.choice([0, 0, 1000]))
            elif kind == "delete_layout":
                return etcd.delete_key(prefix + "layout") or False
            else:
                key = f"{prefix}marks/{self.region}/{rng.choice(wids)}"
                if key not in etcd.kv:
                    return False
                if kind == "delete_mark":  # etcdctl del of one mark
                    self.forget([int(key.rsplit("/", 1)[1])])
                    return etcd.delete_key(key) or False
                if kind == "mark_corrupt":
                    value = b'{"reserved_until_ms": "soon"'
                else:  # mark_rollback: an older value of it put back (etcdctl put)
                    older = [snap[1][key].value for snap in self.snapshots if key in snap[1]]
                    if not older:
                        return False
                    value = rng.choice(older)
                self.forget([int(key.rsplit("/", 1)[1])])
                etcd.put_key(key, value)
            return None
        root = Path(self.tmp)
        region = root / "regions" / str(self.region)
        if kind == "wipe_state_dir":
            self.forget(wids)
            for entry in root.iterdir():
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        elif kind == "delete_layout":
            try:
                self.saved_layout = (root / "layout.json").read_bytes()
                (root / "layout.json").unlink()
            except FileNotFoundError:
                return False
        else:
            wid = rng.choice(wids)
            mark = region / f"worker-{wid}.mark"
            if kind == "delete_mark":  # rm of one mark file
                if not mark.exists():
                    return False
                self.forget([wid])
                mark.unlink()
                return None
            if kind == "mark_corrupt":
                if not mark.exists():
                    return False
                value = b'{"reserved_until_ms": 1, "checksum": "crc32:00000000"}'
            else:  # mark_rollback: an older copy of it put back
                if wid not in self.old_marks or not mark.exists():
                    return False
                value = self.old_marks[wid]
            self.forget([wid])
            mark.write_bytes(value)
        return None

    def combined_fault(self, kind: str) -> bool | None:
        """The heterogeneous cluster's faults (False: nothing to apply it to); draws from rng2."""
        rng2 = self.rng2
        T = self.T
        wids = range(self.layout.max_worker + 1)
        if kind == "crash_and_wipe":
            # SIGKILL of the host's processes, `rm -rf` of the state directory (its journal
            # inside it, as by default), and a restart at once.
            if not any(q.up for q in self.procs):
                return False
            # Every witness wiped with the clock stepped back behind what was minted, or
            # behind a watermark answered (beyond the logical clock's run-ahead, which a new
            # store waits out) is the case RELIABILITY.md writes down as undetectable: then
            # the journal, kept on another disk as it recommends, stays.
            minted = max(max(self.checker.max_ms.values(), default=-1), self.checker.watermark_ms)
            now_ms = self.nodes[0].clock.wall() // MS - self.layout.epoch_ms
            wipe_journal = now_ms + self.config.max_ahead_ms > minted
            self.forget(wids)
            for q in self.procs:
                self.crash(q)
            for node in self.nodes:  # the whole node: its broker (and own worker ID) too
                if node.broker.own is not None:
                    self.stop_own(node.broker, release=False)
                self.stop_watermark(node.broker)
                node.broker.running = False
            for entry in Path(self.tmp).iterdir():
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
            if wipe_journal:
                shutil.rmtree(self.tmp + "-journal", ignore_errors=True)
            self.counts["wiped_with_journal"] = self.counts.get("wiped_with_journal", 0) + wipe_journal
            # The nodes start again at once (systemd, not the supervisor's back-off): no
            # clock fault comes in between.
            for node in self.nodes:
                self.at(T + rng2.randrange(1, 1000), None, node.broker.restart_node)
            for q in self.procs:
                if q not in q.node.broker.supervised:
                    self.at(T + rng2.randrange(1, 1000), None, self.restart, q)
            return None
        if kind == "delete_prefix_under_cut":
            holders = [q for q in self.procs if q.held and q.config.cluster == self.config.cluster]
            if not holders:
                if T + NS < self.horizon:  # nobody holds a worker ID yet: a little later
                    self.at(T + rng2.randrange(NS // 10, NS), None, self.fault, kind)
                return False
            minting_on = [q for q in holders if q.config.partition_minting]
            node = rng2.choice(minting_on or holders).node
            node.cut.update(range(EtcdServer.MEMBERS))
            self.at(T + rng2.randrange(NS, 15 * NS), None, node.cut.clear)
            # Sometimes another host is new to the cluster as the keys go (a replaced host, its
            # journal empty): it knows nothing of the store but what etcd still holds.
            others = [n for n in self.nodes if n is not node]
            fresh = rng2.choice(others) if others and rng2.random() < 0.8 else None
            self.at(T + rng2.randrange(10 * MS, NS), None, self._delete_prefix, fresh)
            return None
        if kind == "second_home":
            # Another state directory in the same region on this host (another user's
            # `snowfence serve`, a template unit's own directory): its node starts while this
            # one serves, and is refused by the region's home on the host (store/home.py's
            # decision, on the homes the kernel would list).
            if self.second is not None:
                return False
            node = self.nodes[0]
            if not node.broker.running:
                # Between a stop of this node and its start again (a second or so): the other
                # home would take the region then, and this node's start be refused, which the
                # simulator does not model; the operator's mistake comes a little later instead.
                if self.T + NS < self.horizon:
                    self.at(self.T + self.rng4.randrange(NS // 10, NS), None, self.fault, kind)
                return False
            directory = self.tmp + "-second-home"
            os.makedirs(directory, exist_ok=True)
            config = Config(**{**self.config_kwargs, "state_dir": directory, "journal_dir": directory + "-journal"})
            live = [home_mod.for_config(n.broker.config, pid=100 + n.index) for n in self.nodes if n.broker.running]
            try:
                home_mod.admit(home_mod.for_config(config, pid=900), live)
            except RegionHeld:
                self.counts["home_refused"] = self.counts.get("home_refused", 0) + 1
                return None
            p = self.second = Proc(self, node, 9, config)
            node.procs.append(p)
            self.procs.append(p)
            self.start(p)
            return None
        if kind == "second_cluster":
            if self.second is not None:
                return False
            node = rng2.choice(self.nodes)
            if not node.broker.serving:  # the late host, not started yet: a host that runs
                node = self.nodes[0]
            config = Config(
                **{
                    **self.config_kwargs,
                    "cluster": SECOND_CLUSTER,
                    "state_dir": f"{self.tmp}/host{node.index}-{SECOND_CLUSTER}",
                    "journal_dir": f"{self.tmp}-journal/{node.index}-{SECOND_CLUSTER}",
                }
            )
            p = self.second = Proc(self, node, 9, config)
            node.procs.append(p)
            self.procs.append(p)
            self.start(p)
            return None
        raise AssertionError(kind)  # pragma: no cover

    def late_host(self) -> None:
        """The late host starts (a host added, or one replaced): its clock off past the peers'
        bound from every other's, by up to a second past it or by up to 10 s; most often NTP
        sets it right a few seconds later. Until then no majority of its cluster vouches for
        it, so it claims nothing (nor, in a cluster of two, does the other host)."""
        node, rng5 = self.late, self.rng5
        walls = sorted(n.clock.wall() for n in self.nodes if n is not node)
        away = node.broker.peer_bound_ns + rng5.choice([rng5.randrange(100, 1000), rng5.randrange(1000, 10_000)]) * MS
        target = walls[-1] + away if rng5.random() < 0.5 else walls[0] - away
        node.clock.off += target - node.clock.wall()
        self.faults.append((self.T / NS, LATE_HOST))
        if rng5.random() < LATE_CLOCK_FIXED_SHARE:
            self.at(self.T + rng5.randrange(2 * NS, 10 * NS), None, self._late_clock_fixed, node)

    def _late_clock_fixed(self, node: Node) -> None:
        """NTP sets the late host's clock to the middle of the others'."""
        walls = sorted(n.clock.wall() for n in self.nodes if n is not node)
        node.clock.off += walls[len(walls) // 2] - node.clock.wall()

    def _delete_prefix(self, fresh: Node | None) -> None:
        """etcdctl del --prefix of the cluster's keys (the region's claim, outside it, stays);
        ``fresh``: a host replaced at the same time, which starts on an empty journal."""
        self.marks_dirty = True
        self.forget(range(self.layout.max_worker + 1))
        self.etcd.delete_prefix(f"/snowfence/{self.config.cluster}/")
        if fresh is not None:
            for q in fresh.procs:
                if q.config.cluster == self.config.cluster:
                    self.crash(q)
                    shutil.rmtree(q.config.journal_path, ignore_errors=True)
                    self.at(self.T + self.rng2.randrange(1, NS), None, self.restart, q)

    def _restored(self, snapshot, bump: int) -> None:
        """The restored cluster starts."""
        self.forget(range(self.layout.max_worker + 1))
        self.restored_leases |= self.etcd.restore(snapshot, bump=bump)
        self.restoring_until = self.T
        self._all_up()

    def _step(self, clock: HostClock, dt: int) -> None:
        clock.off += dt

    def resync(self, clock: HostClock, undo: int) -> None:
        """Now and then NTP sets a stepped clock right again, a few seconds later (drawn from
        rng2): without it a schedule's clocks only ever drift apart, and every host's claims
        wait for a majority that never comes."""
        rng2 = self.rng2
        if rng2.random() < RESYNC_SHARE:
            self.at(self.T + rng2.randrange(NS // 2, 5 * NS), None, self._step, clock, undo)

    def _thaw(self, clock: HostClock, resume_behind: bool) -> None:
        frozen, clock.frozen = clock.frozen, None
        if frozen is None:
            return
        if resume_behind:  # it resumes from where it stopped, not where it should be
            behind = clock.wall() - frozen
            clock.off -= behind
            self.resync(clock, behind)

    def _member_up(self, m: int) -> None:
        if self.T >= self.restoring_until:  # a member being restored stays down until its restore is done
            self.etcd.member_up(m)

    def _all_up(self) -> None:
        for m in range(EtcdServer.MEMBERS):
            self._member_up(m)

    def restart(self, p: Proc) -> None:
        """A process a fault stopped starts again: a node's worker when its supervisor says
        (after its back-off), a second cluster's process here."""
        if not p.up and p not in p.node.broker.supervised:
            self.start(p)

    # -- a whole schedule
    def run(self) -> None:
        rng = self.rng
        self.request_gap_ns = int(rng.choice(REQUEST_GAPS_MS) * MS)
        self.last_ids: list[int] = []
        self.request_id = 0
        for c in ("refused", "claims"):
            self.counts[c] = 0
        late = {self.late: self.late_at}
        try:
            for node in self.nodes:
                self.at(late.get(node, 0) + rng.randrange(NS // 10), None, node.broker.sup.start)
            for node in self.nodes:
                at = late.get(node, 0)
                if node.broker.proc is not None:
                    self.at(at + rng.randrange(NS // 10), None, self.start_own, node.broker)
                self.at(at + rng.randrange(BROKER_TICK_NS), None, node.broker.tick)
                self.at(at + rng.randrange(1, 50 * MS), None, node.broker.client_request)
            for node in self.nodes:
                at = late.get(node, 0)
                self.at(at + self.rng3.randrange(NS // 10), None, self.start_watermark, node.broker)
                self.at(at + self.rng3.randrange(1, WATERMARK_ASK_GAP_NS), None, node.broker.ask_watermark)
            if self.late is not None:
                self.at(self.late_at - 1, None, self.late_host)
            self.schedule_faults()
            self.run_until(self.horizon)
        finally:
            self.close()

    def close(self) -> None:
        for p in self.procs:
            if p.up:
                self.exit(p)
        for node in self.nodes:
            if node.broker.own is not None:
                self.stop_own(node.broker, release=False)
            self.stop_watermark(node.broker)
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            shutil.rmtree(self.tmp + "-journal", ignore_errors=True)
            shutil.rmtree(self.tmp + "-second-home", ignore_errors=True)
            shutil.rmtree(self.tmp + "-second-home-journal", ignore_errors=True)
            self.tmp = None


#: A process that failed to claim waits at least this long before it asks again (the least of
#: WorkerCore's back-off, with its jitter): its store is not hammered through an outage.
CLAIM_RETRY_MIN_NS = int(core_mod.CLAIM_BACKOFF_MIN_S * 0.8 * NS)

#: The cores' log lines (run.py silences logging; under pytest they are captured).
SIM_LOG = logging.getLogger("snowfence.sim")

#: One schedule in five runs the embedded store (its files cost more than the simulated etcd).
EMBEDDED_SHARE = 0.2
#: The share of schedules whose hosts (or processes) have flags of their own.
MIXED_SHARE = 0.5
#: The share of clock steps that NTP undoes a few seconds later.
RESYNC_SHARE = 0.8
#: The share of etcd schedules in which a second cluster starts in the same region.
SECOND_CLUSTER_SHARE = 0.3
SECOND_CLUSTER = "sim2"
#: Faults drawn and applied with the heterogeneous cluster's own random stream.
#: The share of embedded schedules in which a node of another state directory starts in the region.
SECOND_HOME_SHARE = 0.3
COMBINED_FAULTS = {"crash_and_wipe", "delete_prefix_under_cut", "second_cluster", "second_home"}
#: The share of etcd schedules whose last host starts late with its clock off past the
#: peers' bound, and the share of those in which NTP sets it right a few seconds later.
LATE_HOST = "late_host"
LATE_HOST_SHARE = 0.3
LATE_CLOCK_FIXED_SHARE = 0.8
#: Schedules that mint through partitions (no fence; the mark is the only guard).
PARTITION_MINTING_SHARE = 0.15
FAULTS_MIN, FAULTS_MAX = 50, 150
#: How many IDs a request asks for (a block is cut at the end of a millisecond).
COUNTS = (1, 1, 3, 17, 64, 100, 4096)
#: Mean gap between requests, per worker process of a host, per schedule.
REQUEST_GAPS_MS = (15, 50, 200)
#: The clients' connections to each host's broker.
CONNECTIONS = (b"c0", b"c1", b"c2")
#: The share of client sends that are a burst on one connection beyond its in-flight limit.
BURST_SHARE = 0.02
#: A frame between broker and worker (the backend's ipc socket) arrives this much later.
LINK_NS = 50_000
#: The peers' sockets: how the routing core names a peer's connection, a request's (and an
#: answer's) time across the network, and the longest a new connection takes to come up.
PEER_ADDR = b"peer"
PEER_LINK_NS = 200_000
PEER_CONNECT_MAX_NS = 500 * MS
#: The simulated etcd's members, as the stores' clients name them.
ETCD_LABELS = [f"127.0.0.1:{2379 + i}" for i in range(3)]
#: The broker's timers run this often (broker/main.py's HOUSEKEEPING_NS, their period under load;
#: an idle loop waits up to LOOP_TICK_S for an event first).
BROKER_TICK_NS = HOUSEKEEPING_NS
PEER_INTERVAL_NS = int(PEER_INTERVAL_S * NS)
#: A worker's loop wakes at least this often without a frame (workers/main.py's RCVTIMEO).
#: The long profile's schedules last this many times longer, with as many more faults.
LONG_FACTOR = 5

#: Faults of the store itself (what an operator or a restore does), a few a schedule.
STORE_FAULTS_MAX = 3
STORE_FAULT_KINDS = {
    "etcd": ["delete_prefix", "snapshot_restore", "delete_layout", "delete_mark", "mark_rollback", "mark_corrupt"],
    "embedded": ["wipe_state_dir", "delete_layout", "delete_mark", "mark_rollback", "mark_corrupt"],
}

#: The store's faults it can prove without any journal (a damaged mark is passed over; a
#: layout record gone is refused; a mark gone of a worker ID the genesis knows was used
#: waits out the quarantine): the only ones in schedules that lose journals.
STORE_FAULTS_PROVABLE = {"mark_corrupt", "delete_layout", "delete_mark"}
#: The share of schedules that lose journals.
JOURNAL_LOSS_SHARE = 0.3

PROCESS_FAULTS = {"crash", "restart", "pause", "pause_in_call"}

#: The clock verdict's invariant: a host clearly off is off past the peers' bound by this
#: much (more than any round trip on the peers' links); a member stopped this long ago no
#: longer votes; and a host clearly off for this long claims and is sent nothing (a round
#: of offsets every PEER_INTERVAL_S, a member that joined is seen at the next read of the
#: membership, a second later, and its connection takes up to PEER_CONNECT_MAX_NS).
CLOCK_MARGIN_NS = 20 * MS
CLOCK_RECENT_NS = 4 * NS
CLOCK_GRACE_NS = 2 * PEER_INTERVAL_NS + PEER_CONNECT_MAX_NS + 100 * MS

#: The watermark (broker/watermark.py): seconds between a node's rounds (drawn per schedule;
#: the service's default is 1 s), the mean gap between a node's clients' WATERMARK requests
#: (on a connection of their own), the broker process's watermark thread (a slot of no
#: supervisor), and the faults of that thread (a few a schedule, from rng3).
WATERMARK_INTERVALS_S = (0.2, 0.5, 1.0)
WATERMARK_ASK_GAP_NS = 400 * MS
WATERMARK_CONN = b"cw"
WATERMARK_SLOT = -2
WATERMARK_FAULTS = ("watermark_pause", "watermark_pause_in_round", "watermark_restart")
WATERMARK_FAULTS_MIN, WATERMARK_FAULTS_MAX = 2, 8
#: The broker process's own faults: the share of schedules that have them, and how many.
BROKER_FAULTS = ("broker_pause", "broker_kill")
BROKER_FAULT_SHARE = 0.3
BROKER_FAULTS_MAX = 3
_COMMON = ["crash", "restart", "pause", "pause_in_call", "step_back", "step_forward", "freeze", "drift"]
FAULT_KINDS = {
    "etcd": _COMMON
    + [
        "member_down",
        "member_unreachable",
        "partition",
        "outage",
        "slow_network",
        "commit_then_timeout",
        "delete_claim",
    ],
    "embedded": _COMMON + ["remove_lock"],
}


def run_schedule(
    seed: int,
    shm: str | None = None,
    kind: str | None = None,
    policy: str | None = None,
    long: bool = False,
    broker_faults: bool = True,
) -> dict:
    """Run one schedule; a dict of what happened (``violation`` None if clean)."""
    world = World(seed, shm, kind, policy, long, broker_faults)
    violation = None
    try:
        world.run()
    except Violation as exc:
        violation = str(exc)
    return {
        "seed": seed,
        "kind": world.kind,
        "partition_minting": world.partition_minting,
        "mixed": world.mixed,
        "region_refused": world.counts.get("region_refused", 0),
        # The broker's own worker ID's mints, and how often a broker's clock verdict refused claims.
        "own_mints": world.counts.get("own_mints", 0),
        "clock_refused": world.counts.get("clock_refused", 0),
        "node_halts": world.counts.get("node_halts", 0),
        "home_refused": world.counts.get("home_refused", 0),
        "violation": violation,
        "faults": len(world.faults),
        "fault_log": world.faults,
        "mints": world.checker.mints,
        "ids": world.checker.ids,
        "refused": world.counts.get("refused", 0),
        "claims": world.counts.get("claims", 0),
        "sim_s": world.T / NS,
        # The watermark: replies answered, how often the highest one rose, each one's lag (ms).
        "watermarks": world.checker.watermarks,
        "watermark_advances": world.checker.watermark_advances,
        "watermark_lags_ms": world.checker.watermark_lags,
        # What the brokers' routing cores counted (requests, retried, overloaded, ...).
        "broker": dict(sum((collections.Counter(n.broker.core.counters) for n in world.nodes), collections.Counter())),
    }
