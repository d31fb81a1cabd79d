"""The worker process: a DEALER socket to the broker, signals, and the loop.

A worker is started by the supervisor with a JSON spec on stdin. It connects a
DEALER socket to the broker's backend and runs one loop around its
:class:`~snowfence.workers.core.WorkerCore`, which makes every decision:

* each frame from the broker goes to :meth:`WorkerCore.handle` (a WORK frame is
  answered at once, from a minter);
* each frame, and each wait that ends without one, is a turn of the core
  (:meth:`WorkerCore.turn`): its timers run whenever it has a state change to
  report, and at most every ``TICK_NS`` while requests keep the loop busy; the
  core says how long the next wait may be (``IDLE_WAIT_MS``, or less while a
  claim falls due sooner);
* SIGTERM, SIGINT and SIGHUP ask it to stop, as do the broker's STOP frame and
  finding itself orphaned; it leaves rotation at once and goes on answering the
  requests the broker sent it until the core says it is done draining
  (:attr:`WorkerCore.finished`: the broker's STOP taken, or quiet, or a bound),
  then releases what it holds.

The loop never blocks longer than ``IDLE_WAIT_MS`` except inside one store call
(bounded by its deadline) while claiming.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import signal
import socket
import sys
import time

import orjson
import zmq
import zmq.backend

from ..clock import HostClock
from ..config import Config
from ..errors import ConfigError
from ..logs import event, set_process_title
from ..logs import setup as setup_logs
from ..store import open_store
from .core import IDLE_WAIT_MS, WorkerCore, boot_failed, preference_files
from .exits import Exit

log = logging.getLogger("snowfence.worker")

#: Set to 1 (tests only) to arm the fault hooks: SIGUSR1 hangs the minting loop.
FAULT_HOOKS_ENV = "SNOWFENCE_FAULT_HOOKS"

# Hot path: pyzmq's Cython socket methods, without the Python wrappers (see
# snowfence.broker.doors.zmq for the measured difference).
_send = zmq.backend.Socket.send
_recv = zmq.backend.Socket.recv


class Worker:
    """One worker process: the socket, the signals and the loop around its core.
    ``run()`` returns its exit status."""

    def __init__(self, config: Config, slot: int, backend: str, broker_pid: int) -> None:
        self.config = config
        self.slot = slot
        self.backend = backend
        self.broker_pid = broker_pid
        self.pid = os.getpid()
        self.core: WorkerCore | None = None
        self._signals: list[int] = []
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, f"w{slot}-{self.pid}".encode())
        self.sock.setsockopt(zmq.LINGER, 2000)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        # The loop blocks in recv (the GIL released) rather than poll, then drain
        # until EAGAIN: 0.3 us per message instead of a poll plus an exception.
        self.sock.setsockopt(zmq.RCVTIMEO, IDLE_WAIT_MS)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: a terminal that hung up
            if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                continue  # started under nohup, as its broker was
            signal.signal(sig, lambda signum, frame: self._signals.append(signum))
        if os.environ.get(FAULT_HOOKS_ENV) == "1":
            # Fault hook for tests: SIGUSR1 makes the minting loop hang for good
            # while the keep-alive threads run on (see docs/RELIABILITY.md).
            signal.signal(signal.SIGUSR1, lambda signum, frame: self._signals.append(signum))
        self.sock.connect(self.backend)
        config = self.config
        try:
            store = open_store(config)
        except ConfigError as exc:
            return boot_failed(exc)
        self.core = core = WorkerCore(
            config,
            slot=self.slot,
            pid=self.pid,
            holder=f"{socket.gethostname()}:{self.pid}:slot{self.slot}",
            store=store,
            preferences=preference_files(config, self.slot),
            send=functools.partial(_send, self.sock),
            host_clock=HostClock.watching(config, log),
            now_ns=time.monotonic_ns(),
            parent_alive=lambda: os.getppid() == self.broker_pid,
            before_tick=self.on_signals,
            queued=self.queued,
        )
        try:
            self.loop(core)
        finally:
            core.release_all()
            core.send_state()
            self.sock.close()
            store.close()
        return core.exit_code

    def loop(self, core: WorkerCore) -> None:
        """Each frame (or a wait that ended without one) to the core's :meth:`~WorkerCore.turn`,
        which also says how long the next wait for a frame may be, until the core is
        finished (stopping, and done draining)."""
        sock = self.sock
        turn = core.turn
        mono = time.monotonic_ns
        wait_ms = IDLE_WAIT_MS
        while not core.finished:
            try:
                frame = _recv(sock)  # waits at most RCVTIMEO
            except zmq.Again:
                frame = None
            wanted = turn(frame, mono())
            if wanted != wait_ms:
                sock.setsockopt(zmq.RCVTIMEO, wanted)
                wait_ms = wanted

    def queued(self) -> list[bytes]:
        """The frames waiting on the socket, read without waiting (taken in before a claim)."""
        frames = []
        while True:
            try:
                frames.append(_recv(self.sock, zmq.NOBLOCK))
            except zmq.Again:
                return frames

    def on_signals(self) -> None:
        """The signals queued since the last turn of the timers (handlers only enqueue)."""
        if self._signals:
            if signal.SIGUSR1 in self._signals:
                self._hang()
            self._signals.clear()
            self.core.stop("stopping", "signal received; draining")

    def _hang(self) -> None:
        event(log, "fault_hang", "fault hook: the minting loop hangs now", level=logging.WARNING)
        while True:
            time.sleep(3600)


def _prctl(option: int, arg: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, arg, 0, 0, 0)
    except (OSError, AttributeError):
        pass


PR_SET_PDEATHSIG = 1
PR_SET_TIMERSLACK = 29


def main() -> int:
    spec = orjson.loads(sys.stdin.buffer.read())
    config = Config(**spec["config"])
    setup_logs(config.log_level, config.log_format, role=f"worker{spec['slot']}")
    set_process_title(spec.get("title") or f"snowfence: worker {spec['slot']}", f"snowfence-w{spec['slot']}")
    # Die with the broker even if it is SIGKILLed; sleep to a millisecond boundary
    # with microsecond rather than the default 50 us timer slack.
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    _prctl(PR_SET_TIMERSLACK, 1)
    worker = Worker(config, spec["slot"], spec["backend"], spec["broker_pid"])
    try:
        return worker.run()
    except Exception:
        log.exception("worker crashed")
        return Exit.CRASHED


if __name__ == "__main__":
    sys.exit(main())
