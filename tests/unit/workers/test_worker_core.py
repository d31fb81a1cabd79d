"""The worker core on its own: frames in, frames out, a scripted store, a fake clock.

No socket, no thread: the keepers are never started (their state is set by hand),
and every frame the core sends is kept in a list.
"""

from __future__ import annotations

import random

import pytest
from fakeclock import FakeClock

from snowfence import protocol
from snowfence.clock import HostClock
from snowfence.config import Config
from snowfence.errors import ConfigError, LeaseLost, SnowfenceError, StateDirError
from snowfence.store.base import Lease, Store
from snowfence.workers.core import CLAIM_BACKOFF_MIN_S, DRAIN_QUIET_NS, Clocks, WorkerCore
from snowfence.workers.exits import Exit
from snowfence.workers.keeper import Keeper
from snowfence.workers.states import FENCED, READY, WAITING

NS = 1_000_000_000


class ScriptedLease(Lease):
    def __init__(self, worker_id: int, mark_ms: int) -> None:
        super().__init__(region=0, worker_id=worker_id, token=100 + worker_id, mark_ms=mark_ms)
        self.calls: list = []
        self.release_error: SnowfenceError | None = None

    def release(self, last_used_ms: int) -> None:
        self.calls.append(("release", last_used_ms))
        if self.release_error is not None:
            raise self.release_error
        self.released = True

    def abandon(self) -> None:
        self.calls.append(("abandon",))
        super().abandon()


class ScriptedStore(Store):
    """Answers claims from a script: a lease, None (all taken), or an error to raise."""

    def __init__(self, script: list) -> None:
        self.script = list(script)
        self.claims: list[int] = []
        self.layout_checks = 0

    def check_layout(self, layout) -> None:
        self.layout_checks += 1

    def claim(self, preferred, holder, now_ms, max_ahead_ms):
        self.claims.append(now_ms)
        outcome = self.script.pop(0) if self.script else None
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


class Preference:
    def __init__(self) -> None:
        self.written: list = []

    def read(self):
        return self.written[-1][0] if self.written else None

    def write(self, worker_id, token=None) -> None:
        self.written.append((worker_id, token))


class UnstartedKeeper(Keeper):
    """The real keeper, whose thread the test never runs: renewals are set by hand."""

    def start(self) -> None:
        self.started = True


def make_core(store: Store, clock: FakeClock, **config) -> tuple[WorkerCore, list[bytes]]:
    sent: list[bytes] = []
    cfg = Config(**{"ids_per_worker": 1, "lease_ttl_s": 10.0, **config})
    core = WorkerCore(
        cfg,
        slot=0,
        pid=4242,
        holder="test:4242:slot0",
        store=store,
        preferences=[Preference() for _ in range(cfg.ids_per_worker)],
        send=sent.append,
        host_clock=HostClock(
            forward_jump_ms=cfg.forward_jump_ms,
            refuse_forward_jumps=False,
            max_clock_error_ms=0,
            log=__import__("logging").getLogger("test"),
            wall_ns=clock.wall_ns,
            read_kernel=lambda: None,
        ),
        now_ns=clock.mono_ns(),
        clocks=Clocks(wall_ns=clock.wall_ns, mono_ns=clock.mono_ns, sleep=clock.sleep),
        rng=random.Random(7),
        make_keeper=UnstartedKeeper,
    )
    return core, sent


def now_ms(clock: FakeClock, core: WorkerCore) -> int:
    return clock.wall_ns() // 1_000_000 - core.layout.epoch_ms


def states(sent: list[bytes]) -> list[protocol.WorkerState]:
    return [protocol.decode_state(f) for f in sent if f[0] == protocol.STATE]


def renewed(core: WorkerCore, clock: FakeClock, until_ms: int) -> None:
    """What a keeper's successful renewal does to its minter (the store confirmed)."""
    for held in core.held:
        held.keeper.renewals += 1
        held.minter.fence_deadline_ns = clock.mono_ns() + 5 * NS
        held.minter.reserved_until_ms = until_ms


def ready_core(clock: FakeClock, ids: int = 1, **config) -> tuple[WorkerCore, list[bytes], list[ScriptedLease]]:
    leases = [ScriptedLease(i, mark_ms=0) for i in range(ids)]
    core, sent = make_core(ScriptedStore(leases), clock, ids_per_worker=ids, **config)
    for _ in range(ids):  # one claim a turn
        core.tick(clock.mono_ns())
    renewed(core, clock, now_ms(clock, core) + 5000)
    clock.advance_ms(20)
    core.tick(clock.mono_ns())
    assert [h.state for h in core.held] == [READY] * ids
    return core, sent, leases


def work(core: WorkerCore, clock: FakeClock, request_id: int, n: int, after: int | None = None) -> None:
    frame = protocol.encode_work(0, b"client", protocol.encode_reserve(request_id, n, after))
    core.handle(frame, clock.mono_ns())


def replies(sent: list[bytes]) -> list[protocol.Reply]:
    out = []
    for f in sent:
        if f[0] in (protocol.REPLY, protocol.REFUSED):
            _, _, rest = protocol.split_routed(f)
            out.append(protocol.decode_reply(protocol.split_refused(rest)[1] if f[0] == protocol.REFUSED else rest))
    return out


def test_failed_claims_back_off_doubling_with_jitter_up_to_half_the_lease_ttl():
    clock = FakeClock()
    store = ScriptedStore([None, None, SnowfenceError("etcd is away"), None, None, None, None])
    core, sent = make_core(store, clock, lease_ttl_s=6.0)
    for _ in range(400):
        core.heard = True  # the broker's heartbeats
        core.tick(clock.mono_ns())
        if len(store.claims) == 7:
            break
        clock.advance_ms(50)
    assert len(store.claims) == 7 and store.layout_checks == 1
    # 0.25, 0.5, 1, 2 s and then the cap (half the TTL: 3 s), each within +-20 %.
    expected = [CLAIM_BACKOFF_MIN_S * 2**i for i in range(4)] + [3.0, 3.0]
    waits = [(b - a) / 1e3 for a, b in zip(store.claims, store.claims[1:], strict=False)]
    for wait, want in zip(waits, expected, strict=True):
        assert 0.8 * want - 0.05 <= wait <= 1.2 * want + 0.05, (waits, expected)
    reason = states(sent)[-1].reason
    assert reason.startswith("cannot claim a worker ID:") and "retrying in 3.00 s" in reason


def test_a_claim_starts_its_keeper_remembers_the_worker_id_and_waits_for_a_renewal_and_the_mark():
    clock = FakeClock()
    mark = 0
    lease = ScriptedLease(5, mark_ms=mark)
    core, sent = make_core(ScriptedStore([lease]), clock)
    mark = lease.claimed_mark_ms = now_ms(clock, core) + 200  # the previous owner's mark is ahead of our clock
    core.tick(clock.mono_ns())
    [held] = core.held
    assert held.keeper.started and held.lease is lease and core.preferences[0].written == [(5, 105)]
    assert held.state == WAITING and not core.ready
    renewed(core, clock, mark + 5000)
    clock.advance_ms(20)
    core.tick(clock.mono_ns())
    assert held.state == WAITING  # the wall clock has not passed the mark
    clock.advance_ms(200)
    core.tick(clock.mono_ns())
    assert held.state == READY and core.ready == [held]
    state = states(sent)[-1]
    assert isinstance(state, protocol.WorkerState) and state.ready and state.ready_ids == 1
    assert state.held[0].worker_id == 5 and state.held[0].state == "ready" and state.held[0].token == 105


def test_requests_take_turns_across_ready_worker_ids_and_each_reply_is_a_block_of_the_asked_size():
    clock = FakeClock()
    core, sent, _ = ready_core(clock, ids=2)
    sent.clear()
    for i in range(4):
        work(core, clock, i, 3)
    got = replies(sent)
    assert [r.request_id for r in got] == [0, 1, 2, 3] and all(r.count == 3 for r in got)
    workers = [(r.first >> core.layout.worker_shift) & core.layout.max_worker for r in got]
    assert workers[0] != workers[1] and workers[0] == workers[2] and workers[1] == workers[3]
    assert core.counters["requests_ok"] == 4 and core.counters["ids"] == 12


def test_a_fenced_minter_leaves_rotation_at_once_and_the_broker_hears_it_once():
    clock = FakeClock()
    core, sent, _ = ready_core(clock)
    [held] = core.held
    held.minter.fence_deadline_ns = -1  # its renewals stopped succeeding
    sent.clear()
    for i in range(3):
        work(core, clock, i, 1)
    assert held.state == FENCED and not core.ready
    kinds = [f[0] for f in sent]
    assert kinds.count(protocol.STATE) == 1 and kinds.count(protocol.REFUSED) == 3
    assert kinds[0] == protocol.STATE  # out of rotation before the broker retries elsewhere
    assert [r.error.code for r in replies(sent)] == ["fenced"] * 3
    assert core.counters["refused_fenced"] == 3 and core.counters["fenced_events"] == 1


def test_a_lost_lease_is_dropped_abandoned_and_claimed_again_after_the_short_back_off():
    clock = FakeClock()
    core, sent, leases = ready_core(clock)
    [held] = core.held
    held.keeper.lost = LeaseLost("its claim is gone")
    core.store.script.append(ScriptedLease(9, mark_ms=0))
    core.tick(clock.mono_ns())
    assert core.held == [] and core.ready == [] and leases[0].calls == [("abandon",)]
    assert held.keeper._stopping.is_set() and core.counters["leases_lost"] == 1
    assert core.next_claim_ns - clock.mono_ns() == int(CLAIM_BACKOFF_MIN_S * NS)
    clock.advance_ms(CLAIM_BACKOFF_MIN_S * 1000)
    core.tick(clock.mono_ns())
    assert [h.lease.worker_id for h in core.held] == [9]


def test_the_release_plan_lowers_kept_marks_to_the_last_millisecond_used_and_abandons_the_rest():
    clock = FakeClock()
    core, _, leases = ready_core(clock, ids=3)
    for i in range(3):
        work(core, clock, i, 1)
    last = [h.minter.last_ms for h in core.held]
    core.held[1].keeper.lost = LeaseLost("gone")
    leases[2].release_error = SnowfenceError("etcd is away")
    core.release_all()
    assert leases[0].calls == [("release", last[0])]
    assert leases[1].calls == [("abandon",)]
    assert leases[2].calls == [("release", last[2]), ("abandon",)]
    assert core.held == [] and core.ready == []


def test_silence_from_the_broker_stops_the_worker_but_a_pause_of_its_own_does_not():
    clock = FakeClock()
    core, _, _ = ready_core(clock, heartbeat_timeout_s=3.0)
    clock.advance_ms(3500)  # the worker itself was paused: no tick in between
    core.tick(clock.mono_ns())
    assert not core.stopping
    for _ in range(40):
        clock.advance_ms(100)
        core.tick(clock.mono_ns())
    assert core.stopping and core.exit_code == Exit.OK


def test_the_brokers_silence_counts_from_the_first_state_it_could_answer():
    # The broker pings only workers it has heard a STATE from. A first claim that
    # blocks the loop for most of heartbeat_timeout_s (etcd timing out) sends the
    # first STATE late; the broker's first ping comes up to a heartbeat after it.
    # Silence counted from the process's start stopped such a worker as orphaned
    # (the simulator found it, seed 174); it counts from the first STATE.
    clock = FakeClock()

    class SlowStore(ScriptedStore):
        def claim(self, *args, **kwargs):
            clock.advance_ms(2900)
            return super().claim(*args, **kwargs)

    core, sent = make_core(SlowStore([ScriptedLease(0, mark_ms=0)]), clock, heartbeat_timeout_s=3.0)
    core.tick(clock.mono_ns())
    assert len(states(sent)) == 1
    for _ in range(4):  # no ping yet: the broker's heartbeat is up to 0.5 s away
        clock.advance_ms(100)
        core.tick(clock.mono_ns())
    assert not core.stopping
    clock.advance_ms(3000)  # still silent, a timeout after that first STATE: the broker is gone
    core.tick(clock.mono_ns())
    clock.advance_ms(100)
    core.tick(clock.mono_ns())
    assert core.stopping


def test_frames_heard_keep_the_worker_and_a_parent_gone_stops_it():
    clock = FakeClock()
    core, _, _ = ready_core(clock, heartbeat_timeout_s=3.0)
    for _ in range(40):
        clock.advance_ms(100)
        core.handle(protocol.PING_FRAME, clock.mono_ns())
        core.heard = True
        core.tick(clock.mono_ns())
    assert not core.stopping
    core.tick(clock.mono_ns(), parent_alive=False)
    assert core.stopping


@pytest.mark.parametrize(
    "error, code", [(ConfigError("layout differs"), Exit.CONFIG), (StateDirError("read-only"), Exit.CANTCREAT)]
)
def test_a_store_refusing_to_boot_stops_the_worker_with_the_status_that_halts_the_node(error, code):
    clock = FakeClock()
    core, sent = make_core(ScriptedStore([error]), clock)
    core.tick(clock.mono_ns())
    assert core.stopping and core.exit_code == code and core.boot_error is error
    assert core.reason == str(error)


def test_stop_from_the_broker_is_obeyed_and_describe_says_stopping():
    clock = FakeClock()
    core, _, _ = ready_core(clock)
    core.handle(protocol.STOP_FRAME, clock.mono_ns())
    state = core.describe(clock.mono_ns())
    assert core.stopping and state.state == "stopping" and state.ready is False


def work_frame(request_id: int, n: int = 1) -> bytes:
    return protocol.encode_work(0, b"client", protocol.encode_reserve(request_id, n))


def test_a_signal_stops_the_core_out_of_rotation_and_it_answers_what_still_comes_until_quiet():
    clock = FakeClock()
    core, sent, _ = ready_core(clock)
    sent.clear()
    core.stop("stopping", "signal received; draining")
    core.turn(None, clock.mono_ns())
    [state] = states(sent)  # at once: the broker sends nothing more here
    assert state.state == "stopping" and state.ready is False and not core.finished
    # Requests the broker sent before it read that STATE are still answered, with IDs.
    for rid in (1, 2, 3):
        clock.advance_ms(30)
        core.turn(work_frame(rid), clock.mono_ns())
        assert not core.finished
    assert [r.request_id for r in replies(sent)] == [1, 2, 3]
    assert all(r.type == protocol.BLOCK for r in replies(sent))
    clock.advance_ms(DRAIN_QUIET_NS // 1_000_000 - 10)
    core.turn(None, clock.mono_ns())
    assert not core.finished
    clock.advance_ms(10)  # quiet for DRAIN_QUIET_NS since the last request
    core.turn(None, clock.mono_ns())
    assert core.finished


def test_the_brokers_stop_ends_the_drain_once_everything_it_sent_before_it_was_answered():
    clock = FakeClock()
    core, sent, _ = ready_core(clock)
    sent.clear()
    core.stop("stopping", "signal received; draining")  # the signal is acted on first
    for rid in (1, 2):
        core.turn(work_frame(rid), clock.mono_ns())
    assert not core.finished
    core.turn(protocol.STOP_FRAME, clock.mono_ns())  # the broker sends nothing after it
    assert core.finished and [r.request_id for r in replies(sent)] == [1, 2]


def test_the_drain_is_bounded_when_frames_never_stop_coming():
    clock = FakeClock()
    core, _, _ = ready_core(clock, shutdown_timeout_s=1.0)
    core.stop("stopping", "signal received; draining")
    began = clock.mono_ns()
    while not core.finished:
        clock.advance_ms(20)
        core.turn(protocol.PING_FRAME, clock.mono_ns())
        assert clock.mono_ns() - began <= 10 * NS
    # Half the supervisor's grace (0.5 s here), so that the release fits in the rest of it.
    assert clock.mono_ns() - began == 500_000_000


def test_a_core_whose_broker_is_gone_drains_nothing():
    clock = FakeClock()
    core, _, _ = ready_core(clock)
    core.turn(None, clock.mono_ns())
    core.parent_alive = lambda: False
    clock.advance_ms(20)
    core.turn(None, clock.mono_ns())
    assert core.stopping and core.stop_name == "orphaned" and core.finished


def test_a_request_that_is_not_a_reserve_is_answered_bad_request_and_counted():
    clock = FakeClock()
    core, sent, _ = ready_core(clock)
    sent.clear()
    core.handle(protocol.encode_work(0, b"c", protocol.encode_status(7)), clock.mono_ns())
    [reply] = replies(sent)
    assert reply.request_id == 7 and reply.error.code == "bad_request" and core.counters["bad_request"] == 1


# -- causal tokens from another shard ----------------------------------------------------------

#: In region 0 with 2 shard bits, worker ID 0 is in shard 0 and worker ID 1 in shard 2.
SHARDED = {"shard_bits": 2, "time_bits": 39}


def token_in_shard(core: WorkerCore, clock: FakeClock, shard: int) -> int:
    """An ID of this millisecond in ``shard`` (another node's worker ID there: region 7, worker 99)."""
    layout = core.layout
    ms = now_ms(clock, core)
    return (shard << layout.shard_shift) | (ms << layout.time_shift) | (7 << layout.region_shift) | (99 << 12)


def test_a_token_above_one_worker_ids_shard_is_minted_by_the_next_ready_one_and_none_leaves_rotation():
    clock = FakeClock()
    core, sent, _ = ready_core(clock, ids=2, **SHARDED)
    layout = core.layout
    assert [layout.shard_of(0, h.lease.worker_id) for h in core.held] == [0, 2]
    token = token_in_shard(core, clock, 2)
    sent.clear()
    for i in range(6):  # round robin starts at either worker ID: each gets the token first in turn
        work(core, clock, i, 5, after=token)
    got = replies(sent)
    assert [r.error for r in got] == [None] * 6 and [r.request_id for r in got] == list(range(6))
    assert all(r.first > token and r.count == 5 for r in got)
    assert {layout.decompose(r.first).worker for r in got} == {1}  # only shard 2 sorts after it
    assert [h.state for h in core.held] == [READY, READY] and len(core.ready) == 2
    assert [f[0] for f in sent].count(protocol.STATE) == 0  # nothing changed the broker must hear of
    assert core.counters["requests_ok"] == 6 and core.counters["bad_request"] == 0


def test_a_token_no_ready_worker_id_here_can_honour_is_refused_for_another_worker_and_none_leaves_rotation():
    clock = FakeClock()
    core, sent, _ = ready_core(clock, ids=2, **SHARDED)
    token = token_in_shard(core, clock, 3)  # above both worker IDs' shards
    sent.clear()
    for i in range(4):
        work(core, clock, i, 1, after=token)
    assert [f[0] for f in sent] == [protocol.REFUSED] * 4  # the broker tries another worker; no STATE
    got = replies(sent)
    assert [(r.request_id, r.error.code, r.error.retriable) for r in got] == [
        (i, "bad_request", False) for i in range(4)
    ]
    assert "shard 3" in got[0].error.message
    assert [h.state for h in core.held] == [READY, READY] and len(core.ready) == 2
    assert core.counters["refused_bad_request"] == 4 and core.counters["requests_ok"] == 0
    # A token below every shard here: any worker ID sorts after it, at once.
    sent.clear()
    work(core, clock, 9, 1, after=token_in_shard(core, clock, 0) | (1 << 20))
    [ok] = replies(sent)
    assert ok.error is None and ok.first > token_in_shard(core, clock, 0)


def test_a_refusal_about_a_worker_id_that_could_honour_the_token_outranks_the_shard_refusal():
    clock = FakeClock()
    core, sent, _ = ready_core(clock, ids=2, **SHARDED)
    shard_two = core.held[1]
    shard_two.minter.fence_deadline_ns = -1  # the one worker ID that sorts after the token is fenced
    token = token_in_shard(core, clock, 2)
    sent.clear()
    work(core, clock, 1, 1, after=token)
    [got] = replies(sent)
    assert got.error.code == "fenced"  # the broker retries it (and counts it) as any refusal
    assert shard_two.state == FENCED and core.ready == [core.held[0]]
    sent.clear()
    work(core, clock, 2, 1, after=token)  # only the shard-0 worker ID is left
    [got] = replies(sent)
    assert got.error.code == "bad_request" and core.held[0].state == READY


def test_a_turn_claims_at_most_one_worker_id_so_a_slow_store_never_stalls_the_loop():
    # A worker of 16 worker IDs once claimed them all in one turn: under a slow etcd (a
    # fleet's cold start) the loop stood still for seconds, and the keepers of the worker
    # IDs it already held judged it stalled and gave them up.
    clock = FakeClock()

    class SlowStore(ScriptedStore):
        def claim(self, preferred, holder, now_ms, max_ahead_ms):
            clock.advance_ms(2000)  # each claim spends 2 s in the store
            return super().claim(preferred, holder, now_ms, max_ahead_ms)

    store = SlowStore([ScriptedLease(w, 0) for w in range(4)])
    core, _ = make_core(store, clock, ids_per_worker=4)
    core.clock_veto(None)
    turns = []
    for _ in range(12):
        core.heard = True  # the broker's pings
        wait_ms = core.turn(None, clock.mono_ns())
        turns.append(core.last_tick_ns)
        clock.advance_ms(wait_ms)
    assert [h.lease.worker_id for h in core.held] == [0, 1, 2, 3]
    gaps = [b - a for a, b in zip(turns, turns[1:], strict=False)]
    assert max(gaps) < 2.1 * NS  # the loop turned between any two claims
