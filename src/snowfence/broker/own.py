"""The broker's own worker ID: small requests answered on the broker's loop, in one hop.

A request that goes to a worker crosses two ZeroMQ hops (client to broker,
broker to worker, and back); on this design's machines one hop alone costs what
a whole Redis round trip does. So the broker answers plain requests of up to
``broker_mint_max_ids`` IDs itself, from a worker ID it holds exactly as a
worker holds one: the same :class:`~snowfence.workers.core.WorkerCore` (its
claim, lease, keeper, fence, mark, journal and states), asked for one worker ID.
Two things differ, both because the broker's loop must never wait:

* the core's timers and claims (store calls that may take seconds) run on a
  thread of their own, ``snowfence-own``, under a lock; the loop mints only
  if it can take that lock at once, and otherwise the request goes to a worker;
* its minter may not wait (:class:`~snowfence.workers.minter.WouldWait`): where
  a worker's would sleep (a millisecond used up, a clock a few ms behind), it
  declines, changing nothing, and the request goes to a worker.

Every guard is the minter's, as in a worker: a request minted here passed the
fence, the clock rules and the reservation on this call. A refusal moves the
worker ID's state as in a worker; the request then goes to a worker.

Workers come first. It claims only once every worker of the node reports all
of its own worker IDs held (``workers_settled``), and only while the region has
more than ``SPARE`` worker IDs no one holds; and it gives its own back (lowering
its mark to the last millisecond used, so the next owner waits for nothing) as
soon as none is left, so that a worker anywhere in the region (one restarted
while its old lease lingers, one of a node that joined) finds one within
``SPARE_CHECK_S`` or so. It counts the region's unheld worker IDs
(:meth:`~snowfence.store.base.Store.unheld`) every ``SPARE_CHECK_S``,
jittered so that the brokers of a cluster do not count in step, off the lock the
loop mints under. A region sized for the workers alone leaves it without one:
every request then goes to a worker, as with ``broker_mint_max_ids`` 0.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import random
import socket
import threading
import time
from collections.abc import Callable

from ..clock import HostClock
from ..config import Config
from ..errors import ConfigError, SnowfenceError
from ..logs import event
from ..protocol import WorkerState
from ..workers.core import Clocks, WorkerCore, broker_preference_file
from ..workers.keeper import Keeper
from ..workers.minter import Minter, WouldWait

log = logging.getLogger("snowfence.broker")

_mono = time.monotonic_ns

#: The slot the broker's own worker ID reports under (workers have 0..workers-1).
SLOT = -1
#: Worker IDs of the region the broker leaves free for workers: it claims only while more
#: than this many are unheld, and gives its own back when none is.
SPARE = 1
#: How often it counts the region's unheld worker IDs (jittered by a quarter either way).
SPARE_CHECK_S = 2.0
#: How often its core's timers run. Not a worker's 10 ms: its minter checks every guard on
#: each call whatever the timers say (they only move it in and out of rotation), and each
#: wake-up of an idle thread costs tens of microseconds of CPU on a virtual machine, taken
#: from the broker's loop (the GIL) as often as not.
TICK_S = 0.05

KEEP, GIVE_BACK, CLAIM, WAIT = "keep", "give_back", "claim", "wait"


def workers_settled(links, workers: int, ids_per_worker: int) -> bool:
    """Every one of a node's ``workers`` is connected and holds all its worker IDs, as the
    routing core's ``links`` (their last STATE) say: before that the broker claims nothing."""
    links = list(links)
    return len(links) >= workers and sum(len(link.status.held) for link in links) >= workers * ids_per_worker


def spare_rule(holding: bool, free: int | None, settled: bool) -> str:
    """What the broker's own worker ID does once it has counted ``free`` unheld worker IDs in
    its region (None: the count failed, and nothing is known): keep the one it holds, give
    it back, claim one, or wait. ``settled``: every worker of the node holds its own."""
    if holding:
        return GIVE_BACK if free == 0 else KEEP
    return CLAIM if settled and free is not None and free > SPARE else WAIT


class OwnWorkerId:
    """The broker's own worker ID (see the module's docstring).

    ``mint(n)`` is for the broker's loop; ``start()``, ``stop()`` and
    ``describe()`` for the broker. ``workers_settled()`` says whether every
    worker holds its own worker IDs; ``loop_ns()`` when the broker's loop last
    turned (a stalled loop lets the worker ID go, as a worker's does).
    """

    def __init__(
        self,
        config: Config,
        *,
        open_store: Callable[[Config], object],
        workers_settled: Callable[[], bool],
        loop_ns: Callable[[], int],
        pid: int,
        clocks: Clocks | None = None,
        host_clock: HostClock | None = None,
        make_minter: Callable[..., Minter] = Minter,
        make_keeper: Callable[..., Keeper] = Keeper,
        rng: random.Random | None = None,
    ) -> None:
        self.config = dataclasses.replace(config, ids_per_worker=1)
        #: What its core is given (the simulator gives simulated ones).
        self._clocks = clocks or Clocks()
        self._host_clock = host_clock
        self._make_minter = functools.partial(make_minter, may_wait=False)
        self._make_keeper = make_keeper
        self.max_ids = config.broker_mint_max_ids
        self._open_store = open_store
        self._workers_settled = workers_settled
        self._loop_ns = loop_ns
        self._pid = pid
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.core: WorkerCore | None = None
        self.store = None
        self.last_state: WorkerState | None = None
        #: Requests handed to a worker instead, by why (the core's lock was taken,
        #: the minter would have waited, it refused, nothing is held).
        self.declined: collections.Counter = collections.Counter()
        #: The region's unheld worker IDs at the last count (None: not counted yet, or
        #: the count failed), when to count next, and how often it gave its own back.
        self.free: int | None = None
        self._next_count_ns = 0
        self.gave_back = 0
        self._settled = False
        #: Whether its state changed, or a heartbeat's worth of time went by, since the
        #: broker's loop last took a snapshot (as often as a worker sends its STATE).
        self.state_due = True
        self._rng = rng or random.Random()

    # -- the broker ---------------------------------------------------------------------

    def start(self) -> bool:
        """Open the store and start the core's thread; False (logged) if the store cannot be opened."""
        if not self.open():
            return False
        self._thread = threading.Thread(target=self._run, name="snowfence-own", daemon=True)
        self._thread.start()
        return True

    def open(self) -> bool:
        """Open the store and make the core; False (logged) if the store cannot be opened.
        Its thread then calls :meth:`step` (the simulator calls it on its own schedule)."""
        config = self.config
        try:
            self.store = store = self._open_store(config)
        except ConfigError as exc:
            event(
                log,
                "own_worker_id_disabled",
                f"the broker mints no requests itself: {exc}",
                level=logging.WARNING,
            )
            return False
        core = WorkerCore(
            config,
            slot=SLOT,
            pid=self._pid,
            holder=f"{socket.gethostname()}:{self._pid}:broker",
            store=store,
            preferences=[broker_preference_file(config)],
            send=self._stated,  # its state is read with snapshot(), not sent
            host_clock=self._host_clock or HostClock.watching(config, log),
            now_ns=self._clocks.mono_ns(),
            clocks=self._clocks,
            rng=self._rng,
            loop_ns=self._loop_ns,
            make_minter=self._make_minter,
            make_keeper=self._make_keeper,
        )
        # Its claims fail for as long as its workers hold the region's every worker
        # ID: that is the expected case, not a warning.
        core.claim_failed_level = logging.DEBUG
        core.ids_wanted = 0
        self.core = core
        return True

    def stop(self) -> None:
        """Stop the core's thread, then release the worker ID (lowering its mark to the
        last millisecond used). Blocks for at most the store's deadline or so."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.config.etcd_timeout_s * 2 + 1)
        with self._lock:
            if self.core is not None:
                self.core.release_all()
                self.core.stopping = True
            if self.store is not None:
                self.store.close()

    def _stated(self, frame: bytes) -> None:
        """Where a worker's core would send its STATE (on a change, and every heartbeat):
        the broker's loop takes a snapshot at its next turn (``state_due``)."""
        self.state_due = True

    def snapshot(self, now_ns: int) -> WorkerState | None:
        """Its state as of now (the same type a worker sends), for the metrics and STATUS;
        None while its thread holds the core (a claim in progress): the loop never waits."""
        core = self.core
        if core is None or not self._lock.acquire(False):
            return None
        try:
            self.last_state = state = core.describe(now_ns)
            self.state_due = False
        finally:
            self._lock.release()
        return state

    def describe(self) -> dict | None:
        """For STATUS: its last state (the fields of a worker's), its limit and what it
        handed to workers; None if it never started."""
        if self.last_state is None:
            return None
        return {
            **self.last_state.to_dict(),
            "max_ids": self.max_ids,
            "declined": dict(self.declined),
            "region_unheld": self.free,
            "gave_back": self.gave_back,
        }

    def worker_ids(self) -> list[int]:
        state = self.last_state
        return [] if state is None else [h.worker_id for h in state.held]

    # -- the broker's loop: the hot path -------------------------------------------------

    def mint(self, n: int) -> tuple[int, int] | None:
        """``(first, count)`` minted here now, or None: the request goes to a worker.
        Never waits."""
        start_ns = _mono()
        if not self._lock.acquire(False):
            self.declined["busy"] += 1
            return None
        try:
            core = self.core
            if not core.ready:
                self.declined["not_ready"] += 1
                return None
            try:
                minted = core.mint(n)  # the workers' mint step (a refusal leaves rotation there)
            except WouldWait:
                self.declined["would_wait"] += 1
                return None
            except SnowfenceError:
                self.declined["refused"] += 1
                return None
            if minted.__class__ is not tuple:
                self.declined["refused"] += 1
                return None
            core.mint_ns[0].observe(_mono() - start_ns)
            return minted
        finally:
            self._lock.release()

    # -- the core's thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.wait(TICK_S):
                if not self.step():
                    return
        except Exception:
            log.exception("the broker's own worker ID failed; requests all go to workers")
            self.failed()

    def step(self) -> bool:
        """One turn of its thread: count the region's unheld worker IDs when due (off the
        lock: a store call), follow the spare rule and run the core's timers (under it).
        False once it is done: stopped, or its core refused a configuration it cannot use."""
        core = self.core
        mono = self._clocks.mono_ns
        settled = self._workers_settled()
        if settled and not self._settled:
            self._next_count_ns = 0  # the node's workers hold theirs now: count at once
        self._settled = settled
        counted = self._count(mono())
        with self._lock:
            if self._stop.is_set():
                return False
            # The broker is this process: it never falls silent to its own core.
            core.heard = True
            if counted:
                self._follow_rule(settled)
            core.tick(mono())
            if core.stopping:
                # A configuration it cannot use (a layout mismatch, a state
                # directory refused): the workers say so too; it mints nothing.
                event(
                    log,
                    "own_worker_id_disabled",
                    f"the broker mints no requests itself: {core.reason}",
                    level=logging.WARNING,
                )
                return False
        return True

    def failed(self) -> None:
        """A bug in a step: no more minting here, and the worker ID let go (nothing would
        give it back to workers any more)."""
        core = self.core
        with self._lock:
            core.ready = []
            core.stopping = True
            self.state_due = True
            try:
                core.release_all()
            except Exception:
                log.exception("the broker's own worker ID could not be released")

    def _count(self, now_ns: int) -> bool:
        """Count the region's unheld worker IDs, when it is time to; whether it counted."""
        if now_ns < self._next_count_ns:
            return False
        self._next_count_ns = now_ns + int(SPARE_CHECK_S * 1e9 * self._rng.uniform(0.75, 1.25))
        store = self.store
        try:
            if store.genesis is None:
                store.check_layout(self.config.layout)  # as a claim would first
            self.free = store.unheld(up_to=SPARE + 1)
        except SnowfenceError:  # etcd away, a layout it cannot use: its own claims will say
            self.free = None
        except Exception:  # nothing is known: keep what it holds, claim nothing (the rule's None)
            log.exception("could not count the region's unheld worker IDs")
            self.free = None
        return True

    def _follow_rule(self, settled: bool) -> None:
        """After a count (under the lock): keep, give back, claim or wait (:func:`spare_rule`)."""
        core = self.core
        action = spare_rule(bool(core.held), self.free, settled)
        if action == GIVE_BACK:
            worker_ids = ", ".join(str(h.lease.worker_id) for h in core.held)
            core.release_all()
            core.state_dirty = True  # STATUS and NODES stop listing it at the next turn
            self.gave_back += 1
            event(
                log,
                "own_worker_id_gave_back",
                f"the broker gave its own worker ID {worker_ids} back: no other worker ID of region "
                f"{self.config.region} is free, and workers come first",
                level=logging.WARNING,
                worker_id=worker_ids,
            )
        core.ids_wanted = 1 if action in (CLAIM, KEEP) else 0
