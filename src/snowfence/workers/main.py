"""The worker process: claim worker IDs, keep them, mint on request, release on exit.

A worker is started by the supervisor with a JSON spec on stdin. It connects a
DEALER socket to the broker's backend and runs one poll loop:

* WORK frames are answered at once from a minter (round robin over the worker
  IDs this process holds that are ready);
* a STATE frame goes to the broker every heartbeat and on every state change, so
  the broker knows whether to route to this worker;
* timers move each held worker ID through its states::

      claiming -> waiting -> ready <-> fenced | clock_unsafe
                      ^                  |
                      +---- lease lost --+

The loop never blocks longer than a heartbeat except inside one etcd call
(bounded by its deadline) while claiming. It exits when the broker says STOP,
on SIGTERM/SIGINT, or when it finds itself orphaned; in every case it releases
what it holds first.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Callable

import orjson
import zmq
import zmq.backend

from .. import latency, protocol
from ..clock import HostClock
from ..config import Config
from ..errors import (
    BadRequest,
    ClockUnsafe,
    ConfigError,
    Fenced,
    Refused,
    ReservationExpired,
    SnowfenceError,
    StateDirError,
    TokenAhead,
)
from ..logs import event
from ..logs import setup as setup_logs
from .exits import Exit
from .lease import Keeper, Lease, PreferenceFile, Store, embedded_namespace, node_key
from .minter import Minter
from .states import next_state, refusal_for

log = logging.getLogger("snowfence.worker")

#: Longest poll wait, so state changes (fence, clock) are noticed promptly.
TICK_S = 0.05
#: Timers run at most this often while requests keep the loop busy. The minter
#: enforces every guard on each call regardless; timers only move rotation.
TICK_NS = 10_000_000

# Hot path: pyzmq's Cython socket methods, without the Python wrappers (see
# snowfence.broker.router for the measured difference).
_send = zmq.backend.Socket.send
_recv = zmq.backend.Socket.recv
_WORK = protocol.WORK
_split_routed = protocol.split_routed
_plain_reserve = protocol.plain_reserve
_encode_reply = protocol.encode_reply
_encode_block = protocol.encode_block
_mono = time.monotonic_ns
CLAIM_BACKOFF_MIN_S = 0.25
#: Set to 1 (tests only) to arm the fault hooks: SIGUSR1 hangs the minting loop.
FAULT_HOOKS_ENV = "SNOWFENCE_FAULT_HOOKS"
CLAIM_BACKOFF_MAX_S = 10.0


def open_store(config: Config) -> Store:
    """The lease store the configuration names, with this node's journal of it."""
    from .journal import Journal

    window_ms = int(config.reservation_window_s * 1000)
    if config.embedded:
        from .embedded import FileStore

        return FileStore(
            config.state_dir,
            config.layout,
            config.region,
            allow_unsafe_filesystem=config.allow_unsafe_filesystem,
            window_ms=window_ms,
            journal=Journal(config.journal_path, "embedded"),
        )
    from ..etcd.store import EtcdStore

    journal = Journal(config.journal_path, journal_name(config), marks_store_wide=True)
    return EtcdStore(config, journal=journal)


def journal_name(config: Config) -> str:
    """The journal file of an etcd cluster, in the node's state directory."""
    return f"etcd-{config.cluster}"


class Held:
    """One worker ID this process holds: its lease, keeper, minter and state."""

    __slots__ = ("lease", "keeper", "minter", "state", "since_ns")

    def __init__(self, lease: Lease, keeper: Keeper, minter: Minter) -> None:
        self.lease = lease
        self.keeper = keeper
        self.minter = minter
        self.state = "waiting"
        self.since_ns = time.monotonic_ns()

    @classmethod
    def start(
        cls,
        lease: Lease,
        config: Config,
        *,
        on_step_back: Callable[[int, bool], None] | None = None,
        waits: dict | None = None,
        on_event: Callable[[str, dict], None] | None = None,
        loop_ns: Callable[[], int] | None = None,
    ) -> Held:
        """A freshly claimed lease with its minter (minting only above the previous
        owner's mark) and its keeper (not started: the caller starts it)."""
        minter = Minter(
            config.layout,
            config.region,
            lease.worker_id,
            max_step_back_ms=config.max_step_back_ms,
            on_step_back=on_step_back,
            waits=waits,
            clock_policy=config.clock_policy,
            max_ahead_ms=config.max_ahead_ms,
        )
        minter.start_after(lease.claimed_mark_ms)
        keeper = Keeper(
            lease,
            minter,
            interval_s=config.keepalive_interval_s,
            fence_after_s=config.fence_after_s,
            window_ms=int(config.reservation_window_s * 1000),
            fence=not config.partition_minting,
            on_event=on_event,
            loop_ns=loop_ns,
            stall_s=config.loop_stall_s,
        )
        return cls(lease, keeper, minter)

    def describe(self, mono_ns: int) -> dict:
        deadline = self.minter.fence_deadline_ns
        return {
            **self.lease.describe(),
            "state": self.state,
            "last_ms": self.minter.last_ms,
            "reserved_until_ms": self.minter.reserved_until_ms,
            "reservation_headroom_ms": self.minter.reserved_until_ms - self.minter.now_ms(),
            "fence_in_s": None if not self.lease.expires else round((deadline - mono_ns) / 1e9, 3),
            "lease_remaining_s": self.lease.remaining_s(),
            "renewal_failures": self.keeper.failures,
            "renewed_ago_s": None
            if self.keeper.last_renewal_ns is None
            else round((mono_ns - self.keeper.last_renewal_ns) / 1e9, 3),
            "last_renewal_latency_s": self.keeper.last_renewal_latency_s,
        }


class Worker:
    """One worker process. ``run()`` returns its exit status."""

    def __init__(self, config: Config, slot: int, backend: str, broker_pid: int) -> None:
        self.config = config
        self.slot = slot
        self.backend = backend
        self.broker_pid = broker_pid
        self.ids_wanted = config.ids_per_worker
        self.layout = config.layout
        self.pid = os.getpid()
        self.holder = f"{socket.gethostname()}:{self.pid}:slot{slot}"
        self.held: list[Held] = []
        self.ready: list[Held] = []
        self._rr = 0
        self.store: Store | None = None
        self.layout_checked = False
        self.exit_code = Exit.OK
        self.stopping = False
        self.reason = "starting"
        self._signals: list[int] = []
        self._next_claim_ns = 0
        self._claim_backoff_s = CLAIM_BACKOFF_MIN_S
        self._state_dirty = True
        self._next_heartbeat_ns = 0
        self._broker_seen_ns = time.monotonic_ns()
        self._last_tick_ns = self._broker_seen_ns
        self._next_tick_ns = 0
        self._heard = False
        #: Monotonic counts since this process started; the broker turns them into
        #: Prometheus counters that survive worker restarts.
        self.counters: collections.Counter = collections.Counter()
        #: Waits by cause, shared by this process's minters.
        self.waits = {"step_back": 0, "sequence": 0}
        #: How long requests took here, by kind (index: has a causal token); in STATE.
        self.mint_ns = latency.by_kind()
        #: Forward jumps, the kernel's error bound, the step-back histogram.
        self.host_clock = HostClock(
            forward_jump_ms=config.forward_jump_ms,
            refuse_forward_jumps=config.refuse_forward_jumps,
            max_clock_error_ms=config.max_clock_error_ms,
            log=log,
        )
        namespace = embedded_namespace(config.region) if config.embedded else f"etcd-{config.cluster}-r{config.region}"
        namespace += "/" + node_key(config.bind)  # never shared by two nodes on one state directory
        self.preferences = [
            PreferenceFile(config.state_dir, namespace, f"slot-{slot}" + (f"-{i}" if i else ""))
            for i in range(self.ids_wanted)
        ]
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, f"w{slot}-{self.pid}".encode())
        self.sock.setsockopt(zmq.LINGER, 2000)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        # The loop blocks in recv (the GIL released) rather than poll, then drain
        # until EAGAIN: 0.3 us per message instead of a poll plus an exception.
        self.sock.setsockopt(zmq.RCVTIMEO, int(TICK_S * 1000))

    # -- lifecycle --------------------------------------------------------------------

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
        try:
            self.store = open_store(self.config)
        except ConfigError as exc:
            self.boot_failed(exc)
            return self.exit_code
        self.reason = "claiming a worker ID"
        try:
            self.loop()
        finally:
            self.release_all()
            self._send_state()
            self.sock.close()
            if self.store is not None:
                self.store.close()
        return self.exit_code

    def boot_failed(self, exc: ConfigError) -> None:
        """A reason to stop that a restart will not fix: the supervisor halts the node."""
        event(log, "boot_failed", str(exc), level=logging.ERROR)
        self.exit_code = Exit.CANTCREAT if isinstance(exc, StateDirError) else Exit.CONFIG
        self.stopping = True

    def loop(self) -> None:
        sock = self.sock
        handle = self.handle
        mono = time.monotonic_ns
        while not self.stopping:
            try:
                frame = _recv(sock)  # waits at most RCVTIMEO
            except zmq.Again:
                now_ns = mono()
            else:
                self._heard = True
                # The reading that ends a request's minting time also times the loop.
                now_ns = handle(frame, mono())
            if self._state_dirty or now_ns >= self._next_tick_ns:
                self.tick()
        self.drain()

    def drain(self) -> None:
        """Answer what the broker already queued here, then stop (bounded in time)."""
        deadline = time.monotonic() + min(1.0, self.config.shutdown_timeout_s / 2)
        while time.monotonic() < deadline:
            try:
                frame = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                if not self.sock.poll(20, zmq.POLLIN):
                    break
                continue
            self._broker_seen_ns = time.monotonic_ns()
            self.handle(frame, self._broker_seen_ns)

    def handle(self, frame: bytes, start_ns: int) -> int:
        """Act on one frame from the broker, taken off the socket at ``start_ns``
        (monotonic); returns the monotonic time it was done (``start_ns`` for
        frames not timed)."""
        if not frame:
            return start_ns
        kind = frame[0]
        if kind == _WORK:
            return self.work(frame, start_ns)
        if kind == protocol.STOP:
            if not self.stopping:
                event(log, "stopping", "broker asked to stop; draining")
            self.stopping = True
        # PING only proves the broker is alive; unknown kinds are ignored.
        return start_ns

    # -- minting ----------------------------------------------------------------------

    def work(self, frame: bytes, start_ns: int) -> int:
        """Answer one RESERVE; record how long it took (by kind) and return when it was done."""
        meta, addr, body = _split_routed(frame)
        plain = _plain_reserve(body)
        after = None
        if plain is None:
            try:
                request = protocol.decode_request(body)
                if request.type != protocol.RESERVE:
                    raise BadRequest("only RESERVE requests reach workers")
                after = request.after
                if after is not None and not 0 <= after < (1 << 63):
                    raise BadRequest(f"causal token {after} is not a snowfence ID")
            except BadRequest as err:
                self.counters["bad_request"] += 1
                reply = protocol.encode_error(
                    protocol.request_id_of(body) if err.request_id is None else err.request_id, err
                )
                _send(self.sock, protocol.encode_reply(meta, addr, reply))
                return start_ns  # not a request of any kind
            plain = request.request_id, request.count
        request_id, n = plain
        error: SnowfenceError | None = None
        while self.ready:  # every refusal takes a worker ID out of self.ready
            ready = self.ready
            self._rr = (self._rr + 1) % len(ready)
            held = ready[self._rr]
            try:
                if after is None:
                    first, count = held.minter.reserve(n)
                else:
                    first, count = held.minter.reserve(n, held.minter.floor_after(after))
            except Refused as err:
                error = err
                self.on_refused(held, err)
                continue
            except (TokenAhead, BadRequest) as err:
                # A token too far ahead (every worker here shares this clock: no point
                # trying another), or one this worker ID's shard cannot sort after.
                self.counters[err.code] += 1
                _send(self.sock, protocol.encode_reply(meta, addr, protocol.encode_error(request_id, err)))
                return self._timed(after is not None, start_ns)
            counters = self.counters
            counters["requests_ok"] += 1
            counters["ids"] += count
            _send(self.sock, _encode_reply(meta, addr, _encode_block(request_id, first, count)))
            done_ns = _mono()  # what _timed does, without a call on the hot path
            self.mint_ns[after is not None].observe(done_ns - start_ns)
            return done_ns
        if error is None:
            error = self.not_ready_error()
        self.counters["refused_" + error.code] += 1
        self._send_state()  # leave rotation before the broker retries elsewhere
        _send(self.sock, protocol.encode_refused(meta, addr, body, protocol.encode_error(request_id, error)))
        return self._timed(after is not None, start_ns)

    def _timed(self, has_token: bool, start_ns: int) -> int:
        """Record the minting time of a request answered (or handed back) just now; returns now."""
        done_ns = _mono()
        self.mint_ns[has_token].observe(done_ns - start_ns)
        return done_ns

    def not_ready_error(self) -> SnowfenceError:
        return refusal_for((h.state for h in self.held), (self.reason,))

    def on_refused(self, held: Held, err: Refused) -> None:
        if isinstance(err, ReservationExpired):
            held.keeper.wake()  # a forward clock jump outran the window: extend now
            self._set_state(held, "reserving", str(err))
        elif isinstance(err, Fenced):
            self._set_state(held, "fenced", str(err))
        elif isinstance(err, ClockUnsafe):
            self._set_state(held, "clock_unsafe", str(err))

    # -- states -------------------------------------------------------------------------

    def _set_state(self, held: Held, state: str, reason: str = "") -> None:
        if held.state == state:
            return
        old, held.state = held.state, state
        held.since_ns = time.monotonic_ns()
        if state in ("fenced", "clock_unsafe"):
            self.counters[f"{state}_events"] += 1
        level = logging.WARNING if state in ("fenced", "clock_unsafe") else logging.INFO
        name = {"fenced": "fenced", "clock_unsafe": "clock_unsafe", "reserving": "reservation_expired"}.get(state)
        if name is None:
            name = "rejoined" if state == "ready" and old != "waiting" else f"state_{state}"
        event(
            log,
            name,
            reason or f"worker ID {held.lease.worker_id}: {old} -> {state}",
            level=level,
            worker_id=held.lease.worker_id,
            old=old,
            new=state,
        )
        self.ready = [h for h in self.held if h.state == "ready"]
        self._state_dirty = True

    def tick(self) -> None:
        now_ns = time.monotonic_ns()
        self._next_tick_ns = now_ns + TICK_NS
        if self._heard:
            self._heard = False
            self._broker_seen_ns = now_ns
        if self._signals:
            if signal.SIGUSR1 in self._signals:
                self._hang()
            self._signals.clear()
            if not self.stopping:
                event(log, "stopping", "signal received; draining")
            self.stopping = True
        if now_ns - self._last_tick_ns > self.config.heartbeat_timeout_s * 1e9:
            # We were paused ourselves (SIGSTOP, a VM freeze); so, probably, was the
            # broker. Silence we slept through is no evidence it died.
            self._broker_seen_ns = now_ns
        self._last_tick_ns = now_ns
        if os.getppid() != self.broker_pid:
            event(log, "orphaned", "the broker is gone; releasing and exiting", level=logging.WARNING)
            self.stopping = True
        elif now_ns - self._broker_seen_ns > self.config.heartbeat_timeout_s * 1e9:
            event(log, "orphaned", "no word from the broker; releasing and exiting", level=logging.WARNING)
            self.stopping = True
        if self.stopping:
            return
        self.check_clock(now_ns)
        for held in list(self.held):
            self._advance(held, now_ns)
        while len(self.held) < self.ids_wanted and now_ns >= self._next_claim_ns and not self.stopping:
            if not self.claim():
                break
        if self._state_dirty or now_ns >= self._next_heartbeat_ns:
            self._send_state()

    def _hang(self) -> None:
        event(log, "fault_hang", "fault hook: the minting loop hangs now", level=logging.WARNING)
        while True:
            time.sleep(3600)

    def _advance(self, held: Held, now_ns: int) -> None:
        """Move a held worker ID to the state its lease, clock and mark call for."""
        minter = held.minter
        if held.keeper.lost is not None:
            if held.keeper.stalled:
                self.counters["loop_stalls"] += 1
            self._drop(held, f"lease lost: {held.keeper.lost}")
            return
        if minter.clock_unsafe:
            minter.clock_recovered()  # clears the flag once the clock has passed last_ms
        state, reason = next_state(
            worker_id=held.lease.worker_id,
            renewals=held.keeper.renewals,
            mono_ns=now_ns,
            fence_deadline_ns=minter.fence_deadline_ns,
            clock_veto=self.clock_veto,
            clock_unsafe=minter.clock_unsafe,
            now_ms=minter.now_ms(),
            mark_ms=held.lease.claimed_mark_ms,
            reserved_until_ms=minter.reserved_until_ms,
        )
        self._set_state(held, state, reason)

    @property
    def clock_veto(self) -> str | None:
        """Set while a host-clock policy (kernel error bound, forward jump) forbids minting."""
        return self.host_clock.veto

    def check_clock(self, now_ns: int) -> None:
        """Host-clock policies beyond the minter: forward jumps, the kernel's error bound."""
        jumped, changed = self.host_clock.check(now_ns)
        if jumped:
            self.counters["forward_jumps"] += 1
        if changed:
            if self.host_clock.veto:
                self.reason = self.host_clock.veto
            elif self.held:
                self.reason = f"holding worker ID {', '.join(str(h.lease.worker_id) for h in self.held)}"
            self._state_dirty = True

    def _send_state(self) -> None:
        now_ns = time.monotonic_ns()
        self._next_heartbeat_ns = now_ns + int(self.config.heartbeat_interval_s * 1e9)
        self._state_dirty = False
        self.sock.send(protocol.encode_state(self.describe(now_ns)))

    def describe(self, now_ns: int | None = None) -> dict:
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        if self.stopping:
            state = "stopping"
        elif self.ready:
            state = "ready"
        elif self.held:
            state = self.held[0].state
        else:
            state = "claiming"
        return {
            "slot": self.slot,
            "pid": self.pid,
            "state": state,
            "ready": bool(self.ready) and not self.stopping,
            "ready_ids": len(self.ready),
            "credits": self.config.worker_credits,
            "reason": self.reason,
            "held": [h.describe(now_ns) for h in self.held],
            "counters": {**self.counters, **{f"waits_{k}": v for k, v in self.waits.items()}},
            "step_back_ms": self.host_clock.step_backs.to_dict(),
            "kernel_clock": self.host_clock.kernel_clock.to_dict() if self.host_clock.kernel_clock else None,
            "clock_ahead_ms": self.host_clock.ahead_ms,
            "passed_over": [{"worker_id": w, "reason": why} for w, why in sorted(self._passed_over().items())],
            "store_problem": self._store_problem(),
            "mint_ns": latency.report(self.mint_ns),
        }

    def _store_problem(self) -> str | None:
        journal = getattr(self.store, "journal", None)
        return journal.problem if journal is not None else None

    def _passed_over(self) -> dict[int, str]:
        return self.store.passed_over if self.store is not None else {}

    # -- leases -------------------------------------------------------------------------

    def claim(self) -> bool:
        """Try to claim one more worker ID; False (and a back-off) if none could be."""
        index = len(self.held)
        now_ms = time.time_ns() // 1_000_000 - self.layout.epoch_ms
        window_ms = int(self.config.reservation_window_s * 1000)
        try:
            if not self.layout_checked:
                self.store.check_layout(self.layout)
                self.layout_checked = True
            lease = self.store.claim(self.preferences[index].read(), self.holder, now_ms, max_ahead_ms=window_ms + 2000)
        except ConfigError as exc:
            self.boot_failed(exc)
            return False
        except SnowfenceError as exc:
            lease, why = None, str(exc)
        else:
            why = f"every worker ID of region {self.config.region} is taken"
        if lease is None:
            self.reason = f"cannot claim a worker ID: {why}; retrying in {self._claim_backoff_s:.2f} s"
            event(log, "claim_failed", self.reason, level=logging.WARNING, region=self.config.region)
            delay = self._claim_backoff_s * random.uniform(0.8, 1.2)
            self._next_claim_ns = time.monotonic_ns() + int(delay * 1e9)
            # Capped well below the lease TTL, so a standby takes over a dead node's
            # worker IDs soon after their leases lapse.
            cap = min(CLAIM_BACKOFF_MAX_S, self.config.lease_ttl_s / 2)
            self._claim_backoff_s = min(self._claim_backoff_s * 2, cap)
            self._state_dirty = True
            return False
        self._claim_backoff_s = CLAIM_BACKOFF_MIN_S
        self.counters["claims"] += 1
        held = Held.start(
            lease,
            self.config,
            on_step_back=self.host_clock.on_step_back,
            waits=self.waits,
            on_event=lambda name, fields: event(log, name, level=logging.WARNING, **fields),
            loop_ns=lambda: self._last_tick_ns,
        )
        self.held.append(held)
        self.preferences[index].write(lease.worker_id, lease.token)
        ahead_ms = lease.claimed_mark_ms - now_ms
        self.reason = f"holding worker ID {lease.worker_id}"
        event(
            log,
            "claimed",
            f"claimed worker ID {lease.worker_id} (token {lease.token})",
            worker_id=lease.worker_id,
            token=lease.token,
            mark_ahead_ms=max(ahead_ms, 0),
        )
        if ahead_ms > window_ms + 1000:
            event(
                log,
                "clock_behind_mark",
                f"wall clock is {ahead_ms} ms behind the high-water mark of worker ID {lease.worker_id}; "
                "waiting for it to pass (was the clock set back?)",
                level=logging.WARNING,
                worker_id=lease.worker_id,
                behind_ms=ahead_ms,
            )
        held.keeper.start()
        self._state_dirty = True
        return True

    def _drop(self, held: Held, why: str) -> None:
        """Forget a lost lease: no release (it is not ours), then claim again."""
        held.keeper.stop(timeout_s=self.config.etcd_timeout_s * 2)
        held.lease.abandon()
        self.counters["leases_lost"] += 1
        self.held.remove(held)
        self.ready = [h for h in self.held if h.state == "ready"]
        self.reason = why
        event(
            log,
            "reclaiming",
            f"{why}; claiming a worker ID again",
            level=logging.WARNING,
            worker_id=held.lease.worker_id,
        )
        self._next_claim_ns = time.monotonic_ns() + int(CLAIM_BACKOFF_MIN_S * 1e9)
        self._state_dirty = True

    def release_all(self) -> None:
        """Stop keepers, lower marks to the last millisecond used, free worker IDs."""
        for held in self.held:
            held.keeper.stop(timeout_s=self.config.etcd_timeout_s * 2)
        for held in self.held:
            try:
                if held.keeper.lost is None:
                    held.lease.release(held.minter.last_ms)
                    event(
                        log,
                        "released",
                        f"released worker ID {held.lease.worker_id}",
                        worker_id=held.lease.worker_id,
                        mark_ms=held.lease.reserved_until_ms,
                    )
                else:
                    held.lease.abandon()
            except SnowfenceError as exc:
                event(
                    log,
                    "release_failed",
                    f"could not release worker ID {held.lease.worker_id}: {exc}",
                    level=logging.WARNING,
                    worker_id=held.lease.worker_id,
                )
                held.lease.abandon()
        self.held = []
        self.ready = []


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
