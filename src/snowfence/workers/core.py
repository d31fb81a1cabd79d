"""The worker's core: what a worker process decides, with no socket, signal or clock of its own.

:class:`WorkerCore` holds the worker IDs of one process and answers the broker's
frames from their minters. Everything it touches from outside comes in through
its constructor: the lease store, the preference files, the function that sends
a frame to the broker, the wall clock (for claims), a random source (for the
claim back-off), the clocks its minters and keepers run on, and how to make a
minter and a keeper. The process (``workers/main.py``) gives it a DEALER
socket's send, the host's clocks and real keeper threads; the deterministic
simulator (``tests/sim``) gives it simulated ones. Both run this code.

The entry points, each taking the monotonic time it is called at:

* :meth:`WorkerCore.handle` -- one frame from the broker (WORK, PING, STOP); a
  WORK frame is answered at once (the hot path, one direct call);
* :meth:`WorkerCore.tick` -- the timers: leave when the broker fell silent or
  went away, the host clock's policies, each held worker ID's state, claims
  with back-off, and the heartbeat STATE;
* :meth:`WorkerCore.turn` -- one turn of the process's loop: a frame (or none),
  then the timers when due; the loop goes on until :attr:`WorkerCore.finished`;
* :meth:`WorkerCore.release_all` -- on the way out;
* :meth:`WorkerCore.describe` -- the typed :class:`~snowfence.protocol.WorkerState`.

Stopping drains: a core asked to stop (a signal, the broker's STOP) leaves rotation
at once (a STATE that says so) and goes on answering the requests that reach it,
until the broker's STOP frame has been taken (the broker sends no request after
it, and frames come in order: every request sent before it has been answered), or
nothing came for ``DRAIN_QUIET_NS`` (a signal from anyone else), or the drain's
bound passed; only then is it :attr:`~WorkerCore.finished` and the process
releases what it holds. A core that finds its broker gone drains nothing (there
is no one to answer).

A held worker ID moves through the states of :mod:`snowfence.workers.states`::

      claiming -> waiting -> ready <-> fenced | clock_unsafe | reserving
                      ^                  |
                      +---- lease lost --+
"""

from __future__ import annotations

import collections
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from .. import latency, protocol
from ..clock import PENDING_VERDICT, HostClock, pending_verdict
from ..config import Config
from ..errors import (
    BadRequest,
    ConfigError,
    Refused,
    SnowfenceError,
    StateDirError,
    TokenAhead,
)
from ..logs import event
from ..refusals import refusal_for
from ..store.base import Lease, Store
from ..store.preference import PreferenceFile, embedded_namespace, node_key
from .exits import Exit
from .keeper import Keeper
from .minter import Minter
from .states import CLOCK_UNSAFE, FENCED, READY, RESERVING, WAITING, State, next_state, process_state
from .states import state_after_refusal as _state_after_refusal

log = logging.getLogger("snowfence.worker")

#: Timers run at most this often while requests keep the loop busy. The minter
#: enforces every guard on each call regardless; timers only move rotation.
TICK_NS = 10_000_000
#: The longest the loop waits for a frame before it turns anyway (its timers run then).
IDLE_WAIT_MS = 50
#: The claim back-off: the first retry after this long, doubling up to the cap.
CLAIM_BACKOFF_MIN_S = 0.25
#: While the clock is not vouched for, how often a worker looks again (a verdict that
#: lifts the veto starts a claim at once: this only bounds a verdict never told).
VETOED_CLAIM_RECHECK_S = 1.0
CLAIM_BACKOFF_MAX_S = 10.0
#: While a stopping core drains: it is done once no frame came for this long (a stop
#: the broker did not send: the broker's STOP frame ends the drain at once) ...
DRAIN_QUIET_NS = 100_000_000
#: ... or after this long at most (and at most half of ``shutdown_timeout_s``, so that the
#: release that follows fits in the supervisor's grace before SIGKILL).
DRAIN_MAX_NS = 1_000_000_000
#: How long the loop waits for a frame while it drains.
DRAIN_WAIT_MS = 10

# Hot path: module-level names, read once.
_WORK = protocol.WORK
_split_routed = protocol.split_routed
_plain_reserve = protocol.plain_reserve
_encode_reply = protocol.encode_reply
_encode_block = protocol.encode_block
#: What every lease describes; the rest of its description is its store's own (STATE's ``extra``).
_LEASE_FIELDS = frozenset(("worker_id", "token", "reserved_until_ms"))


@dataclass(frozen=True)
class Clocks:
    """What a held worker ID's minter and keeper read time from, and how the minter sleeps."""

    wall_ns: Callable[[], int] = time.time_ns
    mono_ns: Callable[[], int] = time.monotonic_ns
    sleep: Callable[[float], None] = time.sleep


class Held:
    """One worker ID this process holds: its lease, keeper, minter and state."""

    __slots__ = ("lease", "keeper", "minter", "state")

    def __init__(self, lease: Lease, keeper: Keeper, minter: Minter) -> None:
        self.lease = lease
        self.keeper = keeper
        self.minter = minter
        self.state: State = WAITING

    @classmethod
    def start(
        cls,
        lease: Lease,
        config: Config,
        clocks: Clocks,
        *,
        on_step_back: Callable[[int, bool], None] | None = None,
        waits: dict | None = None,
        on_event: Callable[[str, dict], None] | None = None,
        loop_ns: Callable[[], int] | None = None,
        make_minter: Callable[..., Minter] = Minter,
        make_keeper: Callable[..., Keeper] = Keeper,
    ) -> Held:
        """A freshly claimed lease with its minter (minting only above the previous
        owner's mark) and its keeper (not started: the caller starts it)."""
        minter = make_minter(
            config.layout,
            config.region,
            lease.worker_id,
            wall_ns=clocks.wall_ns,
            mono_ns=clocks.mono_ns,
            sleep=clocks.sleep,
            max_step_back_ms=config.max_step_back_ms,
            on_step_back=on_step_back,
            waits=waits,
            clock_policy=config.clock_policy,
            max_ahead_ms=config.max_ahead_ms,
        )
        # Above the previous owner's mark, and never below a watermark already answered.
        minter.start_after(max(lease.claimed_mark_ms, lease.watermark_ms - 1))
        keeper = make_keeper(
            lease,
            minter,
            interval_s=config.keepalive_interval_s,
            fence_after_s=config.fence_after_s,
            window_ms=int(config.reservation_window_s * 1000),
            fence=not config.partition_minting,
            mono_ns=clocks.mono_ns,
            on_event=on_event,
            loop_ns=loop_ns,
            stall_s=config.loop_stall_s,
        )
        return cls(lease, keeper, minter)

    def describe(self, mono_ns: int) -> protocol.HeldState:
        minter, keeper, lease = self.minter, self.keeper, self.lease
        return protocol.HeldState(
            worker_id=lease.worker_id,
            state=self.state,
            token=lease.token,
            last_ms=minter.last_ms,
            reserved_until_ms=minter.reserved_until_ms,
            reservation_headroom_ms=minter.reserved_until_ms - minter.now_ms(),
            fence_in_s=None if not lease.expires else round((minter.fence_deadline_ns - mono_ns) / 1e9, 3),
            lease_remaining_s=lease.remaining_s(),
            renewal_failures=keeper.failures,
            renewed_ago_s=None
            if keeper.last_renewal_ns is None
            else round((mono_ns - keeper.last_renewal_ns) / 1e9, 3),
            last_renewal_latency_s=keeper.last_renewal_latency_s,
            extra={k: v for k, v in lease.describe().items() if k not in _LEASE_FIELDS},
        )


def _preference_namespace(config: Config) -> str:
    namespace = embedded_namespace(config.region) if config.embedded else f"etcd-{config.cluster}-r{config.region}"
    return namespace + "/" + node_key(config.bind)  # never shared by two nodes on one state directory


def preference_files(config: Config, slot: int) -> list[PreferenceFile]:
    """The files that remember which worker ID each of a slot's leases claimed last."""
    namespace = _preference_namespace(config)
    return [
        PreferenceFile(config.state_dir, namespace, f"slot-{slot}" + (f"-{i}" if i else ""))
        for i in range(config.ids_per_worker)
    ]


def broker_preference_file(config: Config) -> PreferenceFile:
    """The file that remembers which worker ID the broker's own lease claimed last."""
    return PreferenceFile(config.state_dir, _preference_namespace(config), "broker")


def boot_failed(exc: ConfigError) -> Exit:
    """Log a reason to stop that a restart will not fix; the exit status that tells the
    supervisor to halt the node (a state directory it cannot use, or a bad configuration)."""
    event(log, "boot_failed", str(exc), level=logging.ERROR)
    return Exit.CANTCREAT if isinstance(exc, StateDirError) else Exit.CONFIG


def _emit(name: str, fields: dict) -> None:
    event(log, name, level=logging.WARNING, **fields)


#: At most one line of each of these keeper events every this many seconds for all of a
#: process's worker IDs: an etcd outage is one line a kind, not one per worker ID a renewal.
KEEPER_LINE_EVERY_S = 30.0


class KeeperLines:
    """The keepers' renewal_failed, renewed and lease_lost events as sentences that say where
    the lease is kept (etcd's endpoints, or the state directory), each kind logged at most
    once every :data:`KEEPER_LINE_EVERY_S` for all the worker IDs of one process; the lines
    held back meanwhile are counted in the next one (``held_back``, with their worker IDs).
    Other events pass as they are. Keepers call it from their own threads; ``mono_ns`` is
    the worker core's clock."""

    KINDS = ("renewal_failed", "renewed", "lease_lost")

    def __init__(self, config: Config, mono_ns: Callable[[], int]) -> None:
        import threading

        self.where = f"etcd at {', '.join(config.etcd)}" if config.etcd else f"the state directory {config.state_dir}"
        self.fence_after_s = config.fence_after_s
        self._mono_ns = mono_ns
        self._lock = threading.Lock()
        #: kind -> when its last line was logged
        self._last_ns: dict[str, int] = {}
        #: kind -> the worker IDs of the lines held back since, and how many
        self._held: dict[str, tuple[int, set[int]]] = {}

    def __call__(self, name: str, fields: dict) -> None:
        if name not in self.KINDS:
            _emit(name, fields)
            return
        now_ns = self._mono_ns()
        with self._lock:
            last_ns = self._last_ns.get(name)
            count, ids = self._held.get(name, (0, set()))
            if last_ns is not None and now_ns - last_ns < KEEPER_LINE_EVERY_S * 1e9:
                self._held[name] = (count + 1, ids | {fields.get("worker_id")})
                return
            self._last_ns[name] = now_ns
            self._held.pop(name, None)
        message = self.sentence(name, fields)
        if count:
            shown = ", ".join(str(i) for i in sorted(ids, key=str)[:8]) + (", ..." if len(ids) > 8 else "")
            message += (
                f" ({count} more like it, for worker ID{'s' if len(ids) > 1 else ''} {shown}, "
                f"in the {(now_ns - last_ns) / 1e9:.0f} s since the last)"
            )
        event(log, name, message, level=logging.WARNING, **fields, held_back=count)

    def sentence(self, name: str, fields: dict) -> str:
        worker = f"worker ID {fields.get('worker_id')}"
        if name == "renewal_failed":
            failures = fields.get("failures", 1)
            return (
                f"{worker} could not renew its lease with {self.where} ({failures} failure"
                f"{'s' if failures != 1 else ''} in a row; it refuses to mint {self.fence_after_s:g} s after its "
                f"last renewal): {fields.get('reason')}"
            )
        if name == "renewed":
            failures = fields.get("after_failures", 0)
            return f"{worker} renewed its lease with {self.where} again, after {failures} failed renewals"
        return f"{worker} lost its lease with {self.where} and mints no more with it: {fields.get('reason')}"


class WorkerCore:
    """The decisions of one worker process. See the module's docstring for its entry points."""

    def __init__(
        self,
        config: Config,
        *,
        slot: int,
        pid: int,
        holder: str,
        store: Store,
        preferences: list[PreferenceFile],
        send: Callable[[bytes], object],
        host_clock: HostClock,
        now_ns: int,
        clocks: Clocks = Clocks(),
        rng: random.Random | None = None,
        loop_ns: Callable[[], int] | None = None,
        make_minter: Callable[..., Minter] = Minter,
        make_keeper: Callable[..., Keeper] = Keeper,
        parent_alive: Callable[[], bool] = lambda: True,
        before_tick: Callable[[], None] = lambda: None,
        queued: Callable[[], list[bytes]] = list,
    ) -> None:
        self.config = config
        self.slot = slot
        #: Whether the broker process is still this one's parent (asked when the timers run).
        self.parent_alive = parent_alive
        #: What the loop does before the timers run (the worker process: the signals it queued).
        self.before_tick = before_tick
        #: The frames the broker sent that wait to be read (the worker process: its socket's,
        #: without waiting): taken in before each claim, so that no claim follows a verdict
        #: the broker sent and logged.
        self.queued = queued
        self.pid = pid
        self.holder = holder
        self.store = store
        if store is not None:
            # Until the broker says its clock agrees with its peers' (a CLOCK frame).
            store.claim_veto = pending_verdict(config)
        self.preferences = preferences
        self.send = send
        self.host_clock = host_clock
        self.clocks = clocks
        self.rng = rng or random.Random()
        self.make_minter = make_minter
        self.make_keeper = make_keeper
        #: When the loop last turned, as the keepers see it (a stalled loop lets its worker IDs go).
        self.loop_ns = loop_ns or (lambda: self.last_tick_ns)
        self.ids_wanted = config.ids_per_worker
        #: How a failed claim is logged (the broker's own worker ID expects them).
        self.claim_failed_level = logging.WARNING
        self.layout = config.layout
        self.window_ms = int(config.reservation_window_s * 1000)
        self._heartbeat_ns = int(config.heartbeat_interval_s * 1e9)
        self._silence_ns = int(config.heartbeat_timeout_s * 1e9)
        self.held: list[Held] = []
        #: The held worker IDs in the READY state, in rotation for requests.
        self.ready: list[Held] = []
        self._rr = 0
        self.layout_checked = False
        self.exit_code = Exit.OK
        #: Why the core refused to go on, if it did (the exit status says which kind).
        self.boot_error: ConfigError | None = None
        self.stopping = False
        #: Why it is leaving, by the event's name ("stopping", "orphaned", ...), once it is.
        self.stop_name: str | None = None
        #: Stopping, and done draining: the loop ends, the process releases and exits.
        self.finished = False
        #: The broker's STOP frame was taken: every request it sent before it was answered.
        self.told_to_stop = False
        #: When the drain ends at the latest, and when the last frame came (monotonic ns).
        self.drain_until_ns = 0
        self.last_frame_ns = now_ns
        self.reason = "claiming a worker ID"
        self.next_claim_ns = 0
        #: The earliest a claim may ask the store again after a failed one (its back-off).
        self.claim_retry_ns = 0
        self.claim_backoff_s = CLAIM_BACKOFF_MIN_S
        self.state_dirty = True
        self.next_heartbeat_ns = 0
        self.next_tick_ns = 0
        #: When the loop must turn next even without a frame (the timers, a claim due), and
        #: how long its wait for a frame may be: see :meth:`turn`.
        self.next_turn_ns = 0
        self.wait_ms = IDLE_WAIT_MS
        self.broker_seen_ns = now_ns
        self.last_tick_ns = now_ns
        #: Whether a STATE went out yet (before it, the broker cannot know this worker).
        self.announced = False
        #: Set by the loop when a frame came in since the last tick.
        self.heard = False
        #: Monotonic counts since this process started; the broker turns them into
        #: Prometheus counters that survive worker restarts.
        self.counters: collections.Counter = collections.Counter()
        #: Waits by cause, shared by this process's minters.
        self.waits = {"step_back": 0, "sequence": 0}
        #: How long requests took here, by kind (index: has a causal token); in STATE.
        self.mint_ns = latency.by_kind()
        self._mono = clocks.mono_ns
        #: What the keepers' events become in the log: sentences, a line a kind at most every 30 s.
        self.keeper_lines = KeeperLines(config, clocks.mono_ns)

    # -- frames from the broker --------------------------------------------------------

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
            self.stop("stopping", "broker asked to stop; draining")
            self.told_to_stop = True
        elif kind == protocol.CLOCK:
            self.clock_veto(protocol.decode_clock(frame))
        # PING only proves the broker is alive; unknown kinds are ignored.
        return start_ns

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
                self.send(protocol.encode_reply(meta, addr, reply))
                return start_ns  # not a request of any kind
            plain = request.request_id, request.count
        request_id, n = plain
        try:
            minted = self.mint(n, after)
        except TokenAhead as err:
            # A token too far ahead: every worker here shares this clock, no point trying another.
            self.counters[err.code] += 1
            self.send(protocol.encode_reply(meta, addr, protocol.encode_error(request_id, err)))
            return self._timed(after is not None, start_ns)
        if minted.__class__ is tuple:
            first, count = minted
            self.send(_encode_reply(meta, addr, _encode_block(request_id, first, count)))
            done_ns = self._mono()  # what _timed does, without a call on the hot path
            self.mint_ns[after is not None].observe(done_ns - start_ns)
            return done_ns
        error = minted if minted is not None else self.not_ready_error()
        self.counters["refused_" + error.code] += 1
        if self.state_dirty:
            self.send_state()  # leave rotation before the broker retries elsewhere (once: not per refusal)
        self.send(protocol.encode_refused(meta, addr, body, protocol.encode_error(request_id, error)))
        return self._timed(after is not None, start_ns)

    def mint(self, n: int, after: int | None = None) -> tuple[int, int] | SnowfenceError | None:
        """The mint step, for a worker's requests and the broker's own worker ID alike: the
        next ready worker ID (round robin) mints ``n`` IDs (above the causal token
        ``after``); one that refuses leaves rotation (:meth:`on_refused`) and the next
        tries. Returns ``(first, count)``, or the last refusal, or None if none was ready.

        A token in a shard above a worker ID's (no ID it mints can sort after it) is
        passed to the next ready worker ID, and that worker ID stays in rotation: the
        token is the request's, not the worker ID's fault. If no ready worker ID here
        can honour it, the ``BadRequest`` is returned like a refusal (one about a worker
        ID that could have honoured it outranks it), and the broker tries another
        worker. A token too far ahead raises ``TokenAhead``, as does a minter that may
        not wait (``WouldWait``): the caller answers or declines."""
        error: SnowfenceError | None = None
        below: list[Held] = []  # ready worker IDs whose shard is below the token's
        while len(self.ready) > len(below):  # every refusal takes a worker ID out of self.ready
            ready = self.ready
            self._rr = (self._rr + 1) % len(ready)
            held = ready[self._rr]
            if below and held in below:
                continue
            try:
                if after is None:
                    first, count = held.minter.reserve(n)
                else:
                    first, count = held.minter.reserve(n, held.minter.floor_after(after))
            except Refused as err:
                error = err
                self.on_refused(held, err)
                continue
            except BadRequest as err:  # floor_after: the token's shard is above this worker ID's
                below.append(held)
                if error is None:
                    error = err
                continue
            counters = self.counters
            counters["requests_ok"] += 1
            counters["ids"] += count
            return first, count
        return error

    def _timed(self, has_token: bool, start_ns: int) -> int:
        """Record the minting time of a request answered (or handed back) just now; returns now."""
        done_ns = self._mono()
        self.mint_ns[has_token].observe(done_ns - start_ns)
        return done_ns

    def not_ready_error(self) -> SnowfenceError:
        return refusal_for((h.state for h in self.held), (self.reason,))

    def on_refused(self, held: Held, err: Refused) -> None:
        state = _state_after_refusal(err)
        if state is RESERVING:
            held.keeper.wake()  # a forward clock jump outran the window: extend now
        if state is not None:
            self.set_state(held, state, str(err))

    # -- states -------------------------------------------------------------------------

    def set_state(self, held: Held, state: State, reason: str = "") -> None:
        if held.state == state:
            return
        old, held.state = held.state, state
        alarm = state in (FENCED, CLOCK_UNSAFE)
        if alarm:
            self.counters[f"{state}_events"] += 1
        name = {FENCED: "fenced", CLOCK_UNSAFE: "clock_unsafe", RESERVING: "reservation_expired"}.get(state)
        if name is None:
            name = "rejoined" if state == READY and old != WAITING else f"state_{state}"
        event(
            log,
            name,
            reason or f"worker ID {held.lease.worker_id}: {old} -> {state}",
            level=logging.WARNING if alarm else logging.INFO,
            worker_id=held.lease.worker_id,
            old=str(old),
            new=str(state),
        )
        self.ready = [h for h in self.held if h.state == READY]
        self.state_dirty = True

    def turn(self, frame: bytes | None, now_ns: int) -> int:
        """One turn of the worker's loop at monotonic ``now_ns``: the frame its wait
        ended with (None: it timed out), then the timers when a state change is to be
        reported or they are due. Returns how long, in ms, the loop may wait for the
        next frame before it must turn again (the idle bound, or less when a claim
        falls due sooner). The worker process and the simulator run this same step."""
        if frame is not None:
            self.heard = True
            self.last_frame_ns = now_ns
            # The reading that ends a request's minting time also times the loop.
            now_ns = self.handle(frame, now_ns)
        if self.state_dirty or now_ns >= self.next_turn_ns:
            self.before_tick()
            self.tick(now_ns, parent_alive=self.parent_alive())
            self._plan_wait(now_ns)
        if self.stopping:
            self.finished = self.drained(now_ns)
        return self.wait_ms

    def drained(self, now_ns: int) -> bool:
        """Whether a stopping core is done answering what reaches it (see the module's
        docstring): the broker's STOP taken, its broker gone, a boot error, quiet for
        ``DRAIN_QUIET_NS`` or the drain's bound passed."""
        return (
            self.told_to_stop
            or self.stop_name == "orphaned"
            or self.boot_error is not None
            or now_ns >= self.drain_until_ns
            or now_ns - self.last_frame_ns >= DRAIN_QUIET_NS
        )

    def _plan_wait(self, now_ns: int) -> None:
        if self.stopping:
            self.next_turn_ns = self.next_tick_ns
            self.wait_ms = DRAIN_WAIT_MS
            return
        next_ns = self.next_tick_ns
        if len(self.held) < self.ids_wanted and not self.stopping:
            next_ns = min(next_ns, max(self.next_claim_ns, now_ns))
        self.next_turn_ns = next_ns
        wait_ns = self.next_claim_ns - now_ns if next_ns < self.next_tick_ns else IDLE_WAIT_MS * 1_000_000
        self.wait_ms = max(1, min(IDLE_WAIT_MS, -(-wait_ns // 1_000_000)))

    def tick(self, now_ns: int, *, parent_alive: bool = True) -> None:
        """The timers, at monotonic ``now_ns``. ``parent_alive``: the broker process is still our parent."""
        self.next_tick_ns = now_ns + TICK_NS
        if self.heard:
            self.heard = False
            self.broker_seen_ns = now_ns
        if now_ns - self.last_tick_ns > self._silence_ns:
            # We were paused ourselves (SIGSTOP, a VM freeze); so, probably, was the
            # broker. Silence we slept through is no evidence it died.
            self.broker_seen_ns = now_ns
        self.last_tick_ns = now_ns
        if not parent_alive:
            self.stop("orphaned", "the broker is gone; releasing and exiting")
        elif now_ns - self.broker_seen_ns > self._silence_ns:
            self.stop("orphaned", "no word from the broker; releasing and exiting")
        if self.stopping:
            if self.state_dirty:
                self.send_state()  # out of rotation: the broker sends nothing more here
            return
        self.check_clock(now_ns)
        veto = self.store.claim_veto if self.store is not None else None
        if self.held and veto and veto != PENDING_VERDICT:
            self.let_go(veto)
        for held in list(self.held):
            self.advance(held, now_ns)
        if len(self.held) < self.ids_wanted and now_ns >= self.next_claim_ns and not self.stopping:
            # One claim a turn: a claim may spend a while in the store (a fleet's cold start),
            # and the loop turns between two (requests answered, keepers seeing it alive);
            # a claim made leaves the state dirty, so the next turn claims the next at once.
            self.claim()
            now_ns = self._mono()
        if self.state_dirty or now_ns >= self.next_heartbeat_ns:
            self.send_state()

    def stop(self, name: str, why: str) -> None:
        """Leave: out of rotation at once, drain what reaches it (see :meth:`drained`), then
        the process releases and exits (logged once)."""
        if not self.stopping:
            event(log, name, why, level=logging.WARNING if name == "orphaned" else logging.INFO)
            self.stop_name = name
            self.stopping = True
            self.state_dirty = True
            now_ns = self._mono()
            self.drain_until_ns = now_ns + min(DRAIN_MAX_NS, int(self.config.shutdown_timeout_s * 1e9) // 2)
            # Quiet counts from the stop: what the broker sent meanwhile is answered.
            self.last_frame_ns = max(self.last_frame_ns, now_ns)

    def advance(self, held: Held, now_ns: int) -> None:
        """Move a held worker ID to the state its lease, clock and mark call for."""
        minter = held.minter
        if held.keeper.lost is not None:
            if held.keeper.stalled:
                self.counters["loop_stalls"] += 1
            self.drop(held, f"lease lost: {held.keeper.lost}")
            return
        if minter.clock_unsafe:
            minter.clock_recovered()  # clears the flag once the clock has passed last_ms
        minter.raise_floor()
        state, reason = next_state(
            worker_id=held.lease.worker_id,
            renewals=held.keeper.renewals,
            mono_ns=now_ns,
            fence_deadline_ns=minter.fence_deadline_ns,
            clock_veto=self.host_clock.veto,
            clock_unsafe=minter.clock_unsafe,
            now_ms=minter.now_ms(),
            mark_ms=held.lease.claimed_mark_ms,
            reserved_until_ms=minter.reserved_until_ms,
        )
        self.set_state(held, state, reason)

    def check_clock(self, now_ns: int) -> None:
        """Host-clock policies beyond the minter: forward jumps, the kernel's error bound."""
        jumped, changed = self.host_clock.check(now_ns)
        if jumped:
            self.counters["forward_jumps"] += 1
        if changed:
            if self.host_clock.veto:
                self.reason = self.host_clock.veto
            elif self.held:
                self.reason = self._holding()
            self.state_dirty = True

    def _holding(self) -> str:
        return f"holding worker ID {', '.join(str(h.lease.worker_id) for h in self.held)}"

    def send_state(self) -> None:
        now_ns = self._mono()
        if not self.announced:
            # The broker pings only workers it has heard from: its silence counts from
            # the first STATE, not from a start whose first claim may block for seconds.
            self.announced = True
            self.broker_seen_ns = now_ns
        self.next_heartbeat_ns = now_ns + self._heartbeat_ns
        self.state_dirty = False
        self.send(protocol.encode_state(self.describe(now_ns)))

    def describe(self, now_ns: int) -> protocol.WorkerState:
        host_clock = self.host_clock
        store = self.store
        journal = getattr(store, "journal", None)
        return protocol.WorkerState(
            slot=self.slot,
            pid=self.pid,
            state=process_state(self.stopping, bool(self.ready), [h.state for h in self.held]),
            ready=bool(self.ready) and not self.stopping,
            ready_ids=len(self.ready),
            credits=self.config.worker_credits,
            reason=self.reason,
            held=tuple(h.describe(now_ns) for h in self.held),
            counters={**self.counters, **{f"waits_{k}": v for k, v in self.waits.items()}},
            step_back_ms=host_clock.step_backs.to_dict(),
            kernel_clock=host_clock.kernel_clock.to_dict() if host_clock.kernel_clock else None,
            clock_ahead_ms=host_clock.ahead_ms,
            passed_over=[
                {"worker_id": w, "reason": why}
                for w, why in sorted((store.passed_over if store is not None else {}).items())
            ],
            store_problem=journal.problem if journal is not None else None,
            mint_ns=latency.report(self.mint_ns),
        )

    def clock_veto(self, why: str | None) -> None:
        """The broker's verdict on this node's clock against its peers': while no majority
        vouches for it, no worker ID is claimed (see ``Store.claim_veto``); once one does,
        the next claim is tried at once."""
        if self.store is None or self.store.claim_veto == why:
            return
        was, self.store.claim_veto = self.store.claim_veto, why
        if why:
            if why != PENDING_VERDICT and was in (None, PENDING_VERDICT):  # once, not per offset measured
                event(
                    log,
                    "claims_vetoed",
                    f"claiming no worker ID while the clock is not vouched for: {why}",
                    level=logging.WARNING,
                )
        self.state_dirty = True  # the timers run at once: what is held is let go (see tick)
        if len(self.held) < self.ids_wanted:  # the next tick claims (after a failure's back-off), or says why not
            self.next_claim_ns = max(self._mono(), self.claim_retry_ns)

    def let_go(self, why: str) -> None:
        """The clock is refused (no majority of the cluster vouches for it): release every
        worker ID held, so that the node mints nothing stamped with that clock, holds no
        mark back from the watermark and leaves the worker IDs to nodes whose clocks are
        vouched for. It claims again once its clock is."""
        worker_ids = ", ".join(str(h.lease.worker_id) for h in self.held)
        self.release_all()
        self.counters["clock_releases"] += 1
        self.reason = f"let worker ID {worker_ids} go: the clock is not vouched for: {why}"
        event(log, "clock_let_go", self.reason, level=logging.WARNING, worker_id=worker_ids)
        self.state_dirty = True

    # -- leases -------------------------------------------------------------------------

    def boot_failed(self, exc: ConfigError) -> None:
        """A reason to stop that a restart will not fix: the supervisor halts the node."""
        self.exit_code = boot_failed(exc)
        self.boot_error = exc
        self.reason = str(exc)
        self.stopping = True
        self.finished = True  # nothing to drain: it never served

    def claim(self) -> bool:
        """Try to claim one more worker ID; False (and a back-off) if none could be."""
        for frame in self.queued():  # a verdict the broker already sent counts for this claim
            self.heard = True  # word from the broker, as a frame the loop reads is
            self.handle(frame, self._mono())
        if self.stopping:
            return False
        index = len(self.held)
        veto = self.store.claim_veto
        if veto:
            # The store would refuse too; this waits for the verdict (``clock_veto``) quietly.
            reason = f"claiming no worker ID until the clock is vouched for: {veto}"
            self.state_dirty |= reason != self.reason
            self.reason = reason
            self.next_claim_ns = max(self._mono() + int(VETOED_CLAIM_RECHECK_S * 1e9), self.claim_retry_ns)
            return False
        now_ms = self.clocks.wall_ns() // 1_000_000 - self.layout.epoch_ms
        try:
            if not self.layout_checked:
                self.store.check_layout(self.layout)
                self.layout_checked = True
            preferred = self.preferences[index].read()
            lease = self.store.claim(preferred, self.holder, now_ms, max_ahead_ms=self.window_ms + 2000)
        except ConfigError as exc:
            self.boot_failed(exc)
            return False
        except SnowfenceError as exc:
            lease, why = None, str(exc)
        else:
            why = f"every worker ID of region {self.config.region} is taken"
        if lease is None:
            self.reason = f"cannot claim a worker ID: {why}; retrying in {self.claim_backoff_s:.2f} s"
            event(log, "claim_failed", self.reason, level=self.claim_failed_level, region=self.config.region)
            delay = self.claim_backoff_s * self.rng.uniform(0.8, 1.2)
            self.next_claim_ns = self.claim_retry_ns = self._mono() + int(delay * 1e9)
            # Capped well below the lease TTL, so a standby takes over a dead node's
            # worker IDs soon after their leases lapse.
            cap = min(CLAIM_BACKOFF_MAX_S, self.config.lease_ttl_s / 2)
            self.claim_backoff_s = min(self.claim_backoff_s * 2, cap)
            self.state_dirty = True
            return False
        self.claim_backoff_s = CLAIM_BACKOFF_MIN_S
        self.counters["claims"] += 1
        held = Held.start(
            lease,
            self.config,
            self.clocks,
            on_step_back=self.host_clock.on_step_back,
            waits=self.waits,
            on_event=self.keeper_lines,
            loop_ns=self.loop_ns,
            make_minter=self.make_minter,
            make_keeper=self.make_keeper,
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
        if ahead_ms > self.window_ms + 1000:
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
        self.state_dirty = True
        return True

    def drop(self, held: Held, why: str) -> None:
        """Forget a lost lease: no release (it is not ours), then claim again."""
        held.keeper.stop(timeout_s=self.config.etcd_timeout_s * 2)
        held.lease.abandon()
        self.counters["leases_lost"] += 1
        self.held.remove(held)
        self.ready = [h for h in self.held if h.state == READY]
        self.reason = why
        event(
            log,
            "reclaiming",
            f"{why}; claiming a worker ID again",
            level=logging.WARNING,
            worker_id=held.lease.worker_id,
        )
        self.next_claim_ns = self._mono() + int(CLAIM_BACKOFF_MIN_S * 1e9)
        self.state_dirty = True

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
