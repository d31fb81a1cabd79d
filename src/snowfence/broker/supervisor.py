"""The supervisor: spawns worker processes, reaps them, restarts them, halts, stops.

It holds no sockets and reads no clock of its own accord: the broker's loop
(:mod:`snowfence.broker.main`) calls :meth:`Supervisor.tick` with the monotonic
time, and the supervisor starts processes through an injected *spawner* and
acts on them only through the handle it returns (``pid``, ``poll()``,
``returncode``, ``send_signal()``, ``wait()``: what :class:`subprocess.Popen`
has). So back-off, halt, kill and signals can be driven by a test with a fake
spawner and a fake clock.

Signal handlers only enqueue the signal number (:meth:`Supervisor.enqueue`);
:meth:`Supervisor.dispatch` calls ``handle_<signal>`` from the loop. A worker
that exits with a boot error a restart cannot fix (see
:mod:`snowfence.workers.exits`) halts the node; any other exit is restarted with
exponential back-off, reset once a worker has run for a while. A worker silent
for ``worker_kill_after_s`` is killed and its slot restarted: when each worker
was last heard from comes with every tick (the routing core keeps it, see
:attr:`snowfence.broker.routing.Routing.heard`); the supervisor only reads it.
"""

from __future__ import annotations

import logging
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Protocol

from ..config import Config
from ..logs import event
from ..workers.exits import HALT, Exit

log = logging.getLogger("snowfence.broker")

RESTART_BACKOFF_MIN_S = 0.1
RESTART_BACKOFF_MAX_S = 30.0
#: A worker that ran this long before dying starts its back-off from the bottom.
STABLE_AFTER_S = 10.0
#: The signals the supervisor handles (the broker's loop installs :meth:`Supervisor.enqueue` for them).
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)
#: Signals kept for the loop at most, as gunicorn's arbiter keeps 5: a flood of them
#: between two turns of the loop must not grow memory. Beyond it they are dropped
#: (counted), and a SIGCHLD already waiting stands for any that follow it (a reap
#: collects every exit), so a burst of exits cannot crowd out a stop signal.
MAX_PENDING_SIGNALS = 5


#: ``Proc.kill_at_ns`` once SIGKILL has gone out: never again.
SIGKILL_SENT = 1 << 62


class Process(Protocol):
    """What the supervisor needs of a worker process (a subset of ``subprocess.Popen``)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...

    def wait(self) -> int: ...


#: Starts the worker process for a slot.
Spawner = Callable[[int], Process]


class Proc:
    """One worker slot and the process currently filling it."""

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.popen: Process | None = None
        self.started_ns = 0
        self.failures = 0
        self.restarts = 0
        self.restart_at_ns: int | None = 0
        self.last_exit: int | None = None
        #: Times this slot's worker was killed for silence.
        self.kills = 0
        #: Set once a silent worker was sent SIGTERM: when to SIGKILL it.
        self.kill_at_ns: int | None = None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None


def _no_op(*_args) -> None:
    pass


class Supervisor:
    """The worker slots of one node and what happens to their processes.

    ``on_stop()`` is called once when the node begins to stop (the router stops
    accepting and tells the workers); ``on_exit(pid)`` when a worker process is
    gone (the router forgets it). ``live_pids`` is kept here, for the router.
    """

    def __init__(
        self,
        config: Config,
        spawner: Spawner,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
        on_stop: Callable[[], None] = _no_op,
        on_exit: Callable[[int], None] = _no_op,
        slots: int | None = None,
    ) -> None:
        self.config = config
        self.spawner = spawner
        self.clock = clock
        #: ``slots``: how many worker slots, if not the configuration's worker count (the
        #: simulator runs more processes than a region has worker IDs, which no node may).
        self.procs = [Proc(slot) for slot in range(config.worker_count if slots is None else slots)]
        #: Signals received and not yet dispatched, oldest first (at most MAX_PENDING_SIGNALS).
        self.signals: deque[int] = deque()
        #: Signals dropped because MAX_PENDING_SIGNALS were waiting; logged at the next dispatch.
        self.dropped_signals = 0
        self._dropped_logged = 0
        self.stopping = False
        #: Why the node is stopping (a signal's name, or why it halts), once it is.
        self.stop_reason = ""
        self.kill_at_ns: int | None = None
        self.exit_code = 0
        self.started_ns = clock()
        self.live_pids: set[int] = set()
        self.on_stop = on_stop
        self.on_exit = on_exit
        self._last_tick_ns = 0
        #: When the broker last woke from a pause: no worker counts as silent from before.
        self._resumed_ns = 0
        self._next_reap_ns = 0

    @property
    def restarts(self) -> int:
        return sum(p.restarts for p in self.procs)

    @property
    def kills(self) -> int:
        return sum(p.kills for p in self.procs)

    # -- signals ----------------------------------------------------------------------

    def enqueue(self, signum: int, frame=None) -> None:
        """The signal handler: only remembers the signal (see :data:`MAX_PENDING_SIGNALS`)."""
        if signum == signal.SIGCHLD and signal.SIGCHLD in self.signals:
            return
        if len(self.signals) >= MAX_PENDING_SIGNALS:
            self.dropped_signals += 1
            return
        self.signals.append(signum)

    def dispatch(self) -> None:
        """Act on the signals received since the last call, in order."""
        while self.signals:
            signum = self.signals.popleft()
            getattr(self, f"handle_{signal.Signals(signum).name.lower()}")()
        if self.dropped_signals > self._dropped_logged:
            dropped, self._dropped_logged = self.dropped_signals - self._dropped_logged, self.dropped_signals
            event(
                log,
                "signals_dropped",
                f"{dropped} signals arrived while {MAX_PENDING_SIGNALS} were waiting, and were dropped",
                level=logging.WARNING,
                dropped=dropped,
            )

    def handle_sigterm(self) -> None:
        self.begin_stop("SIGTERM")

    def handle_sigint(self) -> None:
        self.begin_stop("SIGINT")

    def handle_sighup(self) -> None:
        # A stop, as SIGTERM: there is nothing a reload could change in place (the
        # endpoints are bound, the layout is the cluster's), and a terminal that hangs
        # up on a node run by hand must not leave its worker IDs held.
        self.begin_stop("SIGHUP")

    def handle_sigchld(self) -> None:
        self.reap()

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        for proc in self.procs:
            self.spawn(proc)

    def tick(self, now_ns: int, heard: Mapping[int, int]) -> bool:
        """Signals, silent workers, exits, restarts and the stop deadline at ``now_ns``.

        ``heard``: when each worker process (pid) was last heard from (monotonic
        ns), as the routing core saw it; read, never written. Returns False once
        the node has stopped (stopping, and no worker left)."""
        self.dispatch()
        self.watch_silence(now_ns, heard)
        if now_ns >= self._next_reap_ns:  # SIGCHLD is the fast path; this, the safety net
            self._next_reap_ns = now_ns + int(self.config.heartbeat_interval_s * 1e9)
            self.reap()
        if not self.stopping:
            self.restart_due(now_ns)
        elif not any(p.popen is not None for p in self.procs):
            return False
        elif self.kill_at_ns is not None and now_ns >= self.kill_at_ns:
            event(log, "kill", "workers did not stop in time; killing them", level=logging.WARNING)
            self.kill_all(signal.SIGKILL)
            self.kill_at_ns = None
        return True

    def begin_stop(self, why: str, exit_code: int | None = None) -> None:
        if exit_code is not None and not self.exit_code:
            self.exit_code = exit_code
        if self.stopping:
            if why.startswith("SIG"):  # a second signal: stop waiting
                event(log, "kill", f"{why} again: killing workers now", level=logging.WARNING)
                self.kill_all(signal.SIGKILL)
            return
        self.stopping = True
        self.stop_reason = why
        event(log, "stopping", f"{why}: stopping; workers drain and release their worker IDs")
        self.on_stop()
        self.kill_all(signal.SIGTERM)
        self.kill_at_ns = self.clock() + int(self.config.shutdown_timeout_s * 1e9)

    def watch_silence(self, now_ns: int, heard: Mapping[int, int]) -> None:
        """Kill a worker silent for ``worker_kill_after_s`` (stopped, hung): SIGTERM,
        then SIGKILL after ``shutdown_timeout_s``. Its slot restarts with the usual
        back-off; its worker IDs free as after any crash. Silence counts from the
        last word in ``heard``, from its start for a worker never heard from."""
        if self._last_tick_ns and now_ns - self._last_tick_ns > self.config.heartbeat_timeout_s * 1e9:
            # The broker itself was paused: the silence it slept through is its own.
            self._resumed_ns = now_ns
            for proc in self.procs:
                proc.started_ns = max(proc.started_ns, now_ns - int(self.config.heartbeat_interval_s * 1e9))
        self._last_tick_ns = now_ns
        limit_ns = int(self.config.worker_kill_after_s * 1e9)
        for proc in self.procs:
            popen = proc.popen
            if popen is None or popen.returncode is not None:
                continue
            if proc.kill_at_ns is not None:
                # A kill under way ends on time, whether or not the node began to stop since
                # (its own deadline may come later).
                if now_ns >= proc.kill_at_ns:
                    self._signal(popen, signal.SIGKILL)
                    # Sent: one kill, however long the kernel takes to carry it out
                    # (a process in uninterruptible I/O); reaping clears it.
                    proc.kill_at_ns = SIGKILL_SENT
                continue
            if self.stopping:
                continue  # every worker was sent SIGTERM; the node's deadline covers them
            heard_ns = max(heard.get(popen.pid, 0), self._resumed_ns, proc.started_ns)
            silent_s = (now_ns - heard_ns) / 1e9
            if now_ns - heard_ns <= limit_ns:
                continue
            proc.kills += 1
            event(
                log,
                "worker_killed",
                f"worker slot {proc.slot} pid {popen.pid} silent for {silent_s:.1f} s; killing it",
                level=logging.ERROR,
                slot=proc.slot,
                pid=popen.pid,
                silent_s=round(silent_s, 3),
                kills=proc.kills,
            )
            # SIGCONT lets a stopped worker act on SIGTERM (drain, release); one that
            # is hung gets SIGKILL when the grace is over.
            self._signal(popen, signal.SIGTERM)
            self._signal(popen, signal.SIGCONT)
            proc.kill_at_ns = now_ns + int(self.config.shutdown_timeout_s * 1e9)

    @staticmethod
    def _signal(popen: Process, sig: int) -> None:
        try:
            popen.send_signal(sig)
        except ProcessLookupError:
            pass

    def kill_all(self, sig: int) -> None:
        for proc in self.procs:
            if proc.popen is not None and proc.popen.returncode is None:
                self._signal(proc.popen, sig)
        if sig == signal.SIGKILL:
            for proc in self.procs:
                if proc.popen is not None:
                    proc.popen.wait()
                    self._forget(proc)

    # -- workers ----------------------------------------------------------------------

    def spawn(self, proc: Proc) -> None:
        popen = self.spawner(proc.slot)
        proc.popen = popen
        self.live_pids.add(popen.pid)
        proc.started_ns = self.clock()
        proc.restart_at_ns = None
        proc.kill_at_ns = None
        if proc.restarts:
            event(
                log,
                "restarted",
                f"worker slot {proc.slot} restarted as pid {popen.pid}",
                slot=proc.slot,
                pid=popen.pid,
                restarts=proc.restarts,
            )
        else:
            event(
                log,
                "spawned",
                f"worker slot {proc.slot} started as pid {popen.pid}",
                level=logging.DEBUG,
                slot=proc.slot,
                pid=popen.pid,
            )

    def reap(self) -> None:
        for proc in self.procs:
            popen = proc.popen
            if popen is None or popen.poll() is None:
                continue
            status, pid = popen.returncode, popen.pid
            self._forget(proc)
            proc.last_exit = status
            if self.stopping:
                continue
            if status in HALT:
                self.begin_stop(
                    f"worker slot {proc.slot} cannot boot ({Exit(status).name}, see its log above); halting",
                    exit_code=status,
                )
                continue
            now_ns = self.clock()
            ran_s = (now_ns - proc.started_ns) / 1e9
            if ran_s >= STABLE_AFTER_S:
                proc.failures = 0
            proc.failures += 1
            delay = min(RESTART_BACKOFF_MIN_S * 2 ** (proc.failures - 1), RESTART_BACKOFF_MAX_S)
            proc.restart_at_ns = now_ns + int(delay * 1e9)
            proc.restarts += 1
            how = f"signal {signal.Signals(-status).name}" if status < 0 else f"status {status}"
            event(
                log,
                "worker_exited",
                f"worker slot {proc.slot} exited with {how} after {ran_s:.1f} s; restarting in {delay:.2f} s",
                level=logging.WARNING,
                slot=proc.slot,
                pid=pid,
                exit_status=status,
                restart_in_s=delay,
            )

    def _forget(self, proc: Proc) -> None:
        if proc.popen is not None:
            pid = proc.popen.pid
            self.live_pids.discard(pid)
            proc.kill_at_ns = None
            self.on_exit(pid)
        proc.popen = None

    def restart_due(self, now_ns: int) -> None:
        for proc in self.procs:
            if proc.popen is None and proc.restart_at_ns is not None and now_ns >= proc.restart_at_ns:
                self.spawn(proc)

    def describe(self) -> dict:
        """The slots and the node's state, for STATUS."""
        now_ns = self.clock()
        return {
            "state": "stopping" if self.stopping else "serving",
            "uptime_s": round((now_ns - self.started_ns) / 1e9, 3),
            "slots": [
                {
                    "slot": p.slot,
                    "pid": p.pid,
                    "restarts": p.restarts,
                    "kills": p.kills,
                    "last_exit": p.last_exit,
                    "restart_in_s": None
                    if p.restart_at_ns is None or p.popen is not None
                    else round(max(0, p.restart_at_ns - now_ns) / 1e9, 3),
                }
                for p in self.procs
            ],
        }
