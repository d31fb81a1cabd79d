"""The supervisor: spawns worker processes, reaps them, restarts them, halts, stops.

It owns the broker process's one loop. Signal handlers only enqueue the signal
number (and wake the loop through ``signal.set_wakeup_fd``); the loop
dispatches to ``handle_<signal>``. A worker that exits with a boot error a
restart cannot fix (see :mod:`snowfence.workers.exits`) halts the node; any
other exit is restarted with exponential back-off, reset once a worker has
run for a while. All timing is monotonic.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time

import orjson
import zmq
import zmq.auth

from .. import protocol
from ..clients.security import Curve
from ..config import Config
from ..errors import ConfigError
from ..logs import event
from ..workers.exits import HALT, Exit
from . import rundir
from .auth import Gatekeeper, HandshakeWatch
from .metrics import HealthServer, Metrics
from .peers import PeerClocks
from .router import Router

log = logging.getLogger("snowfence.broker")

RESTART_BACKOFF_MIN_S = 0.1
RESTART_BACKOFF_MAX_S = 30.0
#: A worker that ran this long before dying starts its back-off from the bottom.
STABLE_AFTER_S = 10.0
LOOP_TICK_MS = 50
HOUSEKEEPING_NS = 10_000_000
PEER_INTERVAL_S = 1.0


class Proc:
    """One worker slot and the process currently filling it."""

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.popen: subprocess.Popen | None = None
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


class Supervisor:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.procs = [Proc(slot) for slot in range(config.worker_count)]
        self.signals: list[int] = []
        self.stopping = False
        self.kill_at_ns: int | None = None
        self.exit_code = 0
        self.started_ns = time.monotonic_ns()
        self.rundir = ""
        self.router: Router | None = None
        self.live_pids: set[int] = set()
        #: Last word (monotonic ns) from each worker process, kept by the router.
        self.heard: dict[int, int] = {}
        self._last_housekeeping_ns = 0
        self.metrics = Metrics()
        self.health: HealthServer | None = None
        self.auth = None
        self.handshakes: HandshakeWatch | None = None
        self.peers: PeerClocks | None = None

    # -- signals ----------------------------------------------------------------------

    def _enqueue(self, signum: int, frame) -> None:
        self.signals.append(signum)

    def handle_sigterm(self) -> None:
        self.begin_stop("SIGTERM")

    def handle_sigint(self) -> None:
        self.begin_stop("SIGINT")

    def handle_sigchld(self) -> None:
        self.reap()

    # -- lifecycle --------------------------------------------------------------------

    def run(self) -> int:
        self.rundir = rundir.create(self.config.state_dir)
        ctx = zmq.Context()
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        try:
            if self.config.curve_allow:
                # ZAP handler: only clients whose public keys are in the directory get in.
                if not os.path.isdir(self.config.curve_allow):
                    raise ConfigError(f"curve_allow {self.config.curve_allow} is not a directory")
                self.auth = Gatekeeper(ctx, self.config.curve_allow, self.metrics.curve_denials)
                self.auth.start()
            try:
                self.router = Router(
                    ctx,
                    self.config,
                    f"ipc://{self.rundir}/backend",
                    self.describe,
                    self.live_pids,
                    self.metrics,
                    self.heard,
                )
            except zmq.ZMQError as exc:  # the backend's ipc:// endpoint in the run directory
                raise ConfigError(f"cannot bind the worker endpoint: {zmq.strerror(exc.errno)}") from None
            if self.config.curve_secret_key:
                self.handshakes = HandshakeWatch(ctx, self.router.frontend, self.metrics.curve_denials)
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
            signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
                signal.signal(sig, self._enqueue)
            if self.config.peers:
                curve = None
                if self.config.curve_secret_key:  # nodes of a cluster share the server key pair
                    public, secret = zmq.auth.load_certificate(self.config.curve_secret_key)
                    curve = Curve(public, public, secret)
                self.peers = PeerClocks(
                    ctx,
                    list(self.config.peers),
                    interval_s=PEER_INTERVAL_S,
                    bound_ms=self.config.max_peer_offset_ms,
                    curve=curve,
                )
                self.metrics.peers = self.peers
            mode = "embedded" if self.config.embedded else f"etcd cluster {self.config.cluster!r}"
            event(
                log,
                "serving",
                f"snowfence serving on {self.router.endpoint()} ({mode}, region "
                f"{self.config.region}, {len(self.procs)} worker{'' if len(self.procs) == 1 else 's'})",
                bind=self.router.endpoint(),
                workers=len(self.procs),
                mode="embedded" if self.config.embedded else "etcd",
            )
            for proc in self.procs:
                self.spawn(proc)
            self.loop(wake_r)
        finally:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            self.kill_all(signal.SIGKILL)
            if self.health is not None:
                self.health.close()
            if self.peers is not None:
                self.peers.close()
            if self.auth is not None:
                self.auth.stop()
            if self.handshakes is not None:
                self.handshakes.close()
            if self.router is not None:
                self.router.close()
            # Closed sockets keep their own linger; one still open here (a failed
            # start) must not keep the context, and the process, waiting forever.
            ctx.destroy(linger=0)
            wake_r.close()
            wake_w.close()
            rundir.remove(self.rundir)
        event(log, "stopped", f"snowfence stopped (exit status {self.exit_code})", exit_status=self.exit_code)
        return self.exit_code

    def loop(self, wake: socket.socket) -> None:
        router = self.router
        poller = zmq.Poller()
        poller.register(router.backend, zmq.POLLIN)
        poller.register(router.frontend, zmq.POLLIN)
        poller.register(wake, zmq.POLLIN)
        backend, frontend, wake_fd = router.backend, router.frontend, wake.fileno()
        peers = self.peers
        if peers is not None:
            for sock in peers.sockets:
                poller.register(sock, zmq.POLLIN)
        next_housekeeping_ns = next_reap_ns = 0
        while True:
            for sock, _ in poller.poll(LOOP_TICK_MS):
                if sock is backend:
                    router.on_backend()
                elif sock is frontend:
                    router.on_frontend()
                elif peers is not None and sock in peers.sockets:
                    peers.on_readable(sock)
                elif sock is wake or sock == wake_fd:
                    try:
                        while wake.recv(512):
                            pass
                    except BlockingIOError:
                        pass
            while self.signals:
                signum = self.signals.pop(0)
                getattr(self, f"handle_{signal.Signals(signum).name.lower()}")()
            # Timers, at most every HOUSEKEEPING_NS: under load the loop above turns
            # thousands of times a second and must not pay for them each time.
            now_ns = time.monotonic_ns()
            if now_ns < next_housekeeping_ns:
                continue
            next_housekeeping_ns = now_ns + HOUSEKEEPING_NS
            self.watch_silence(now_ns)
            router.tick(now_ns)
            if peers is not None:
                peers.tick(now_ns)
                if peers.veto != router.veto:
                    if peers.veto:
                        event(log, "clock_veto", f"leaving rotation: {peers.veto}", level=logging.ERROR)
                    else:
                        event(log, "rejoined", "clock agrees with the cluster again")
                    router.veto = peers.veto
            self.metrics.maybe_snapshot(
                now_ns, router, sum(p.restarts for p in self.procs), sum(p.kills for p in self.procs)
            )
            if now_ns >= next_reap_ns:
                next_reap_ns = now_ns + int(self.config.heartbeat_interval_s * 1e9)
                self.reap()
            if not self.stopping:
                self.restart_due(now_ns)
            elif not any(p.popen is not None for p in self.procs):
                return
            elif self.kill_at_ns is not None and now_ns >= self.kill_at_ns:
                event(log, "kill", "workers did not stop in time; killing them", level=logging.WARNING)
                self.kill_all(signal.SIGKILL)
                self.kill_at_ns = None

    def begin_stop(self, why: str, exit_code: int | None = None) -> None:
        if exit_code is not None and not self.exit_code:
            self.exit_code = exit_code
        if self.stopping:
            if why.startswith("SIG"):  # a second signal: stop waiting
                event(log, "kill", f"{why} again: killing workers now", level=logging.WARNING)
                self.kill_all(signal.SIGKILL)
            return
        self.stopping = True
        event(log, "stopping", f"{why}: stopping; workers drain and release their worker IDs")
        self.router.stop_accepting()
        self.router.broadcast(protocol.STOP_FRAME)
        self.kill_all(signal.SIGTERM)
        self.kill_at_ns = time.monotonic_ns() + int(self.config.shutdown_timeout_s * 1e9)

    def watch_silence(self, now_ns: int) -> None:
        """Kill a worker silent for ``worker_kill_after_s`` (stopped, hung): SIGTERM,
        then SIGKILL after ``shutdown_timeout_s``. Its slot restarts with the usual
        back-off; its worker IDs free as after any crash."""
        if self._last_housekeeping_ns and now_ns - self._last_housekeeping_ns > self.config.heartbeat_timeout_s * 1e9:
            # The broker itself was paused: the silence it slept through is its own.
            for pid in self.heard:
                self.heard[pid] = now_ns
            for proc in self.procs:
                proc.started_ns = max(proc.started_ns, now_ns - int(self.config.heartbeat_interval_s * 1e9))
        self._last_housekeeping_ns = now_ns
        if self.stopping:
            return
        limit_ns = int(self.config.worker_kill_after_s * 1e9)
        for proc in self.procs:
            popen = proc.popen
            if popen is None or popen.returncode is not None:
                continue
            if proc.kill_at_ns is not None:
                if now_ns >= proc.kill_at_ns:
                    self._signal(popen, signal.SIGKILL)
                    proc.kill_at_ns = None
                continue
            heard_ns = max(self.heard.get(popen.pid, 0), proc.started_ns)
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
    def _signal(popen: subprocess.Popen, sig: int) -> None:
        try:
            popen.send_signal(sig)
        except ProcessLookupError:
            pass

    def kill_all(self, sig: int) -> None:
        for proc in self.procs:
            if proc.popen is not None and proc.popen.returncode is None:
                try:
                    proc.popen.send_signal(sig)
                except ProcessLookupError:
                    pass
        if sig == signal.SIGKILL:
            for proc in self.procs:
                if proc.popen is not None:
                    proc.popen.wait()
                    self._forget(proc)

    # -- workers ----------------------------------------------------------------------

    def spawn(self, proc: Proc) -> None:
        spec = {
            "config": self.config.to_dict(),
            "slot": proc.slot,
            "backend": f"ipc://{self.rundir}/backend",
            "broker_pid": os.getpid(),
        }
        popen = subprocess.Popen(
            [sys.executable, "-m", "snowfence.workers.main"],
            stdin=subprocess.PIPE,
            close_fds=True,
        )
        try:
            popen.stdin.write(orjson.dumps(spec))
            popen.stdin.close()
        except BrokenPipeError:
            pass
        proc.popen = popen
        self.live_pids.add(popen.pid)
        proc.started_ns = time.monotonic_ns()
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
            ran_s = (time.monotonic_ns() - proc.started_ns) / 1e9
            if ran_s >= STABLE_AFTER_S:
                proc.failures = 0
            proc.failures += 1
            delay = min(RESTART_BACKOFF_MIN_S * 2 ** (proc.failures - 1), RESTART_BACKOFF_MAX_S)
            proc.restart_at_ns = time.monotonic_ns() + int(delay * 1e9)
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
            self.live_pids.discard(proc.popen.pid)
            self.heard.pop(proc.popen.pid, None)
            proc.kill_at_ns = None
            if self.router is not None:
                self.router.forget_pid(proc.popen.pid, "process exited")
        proc.popen = None

    def restart_due(self, now_ns: int) -> None:
        for proc in self.procs:
            if proc.popen is None and proc.restart_at_ns is not None and now_ns >= proc.restart_at_ns:
                self.spawn(proc)

    def describe(self) -> dict:
        return {
            "pid": os.getpid(),
            "bind": self.router.endpoint() if self.router else self.config.bind,
            "mode": "embedded" if self.config.embedded else "etcd",
            "cluster": None if self.config.embedded else self.config.cluster,
            "state": "stopping" if self.stopping else "serving",
            "uptime_s": round((time.monotonic_ns() - self.started_ns) / 1e9, 3),
            "slots": [
                {
                    "slot": p.slot,
                    "pid": p.pid,
                    "restarts": p.restarts,
                    "kills": p.kills,
                    "last_exit": p.last_exit,
                    "restart_in_s": None
                    if p.restart_at_ns is None or p.popen is not None
                    else round(max(0, p.restart_at_ns - time.monotonic_ns()) / 1e9, 3),
                }
                for p in self.procs
            ],
        }


def serve(config: Config) -> int:
    """Run a node until SIGTERM/SIGINT; the exit status of the broker."""
    return Supervisor(config).run()
