"""The supervisor on a fake clock with a fake spawner: no process is started; each
test says when a fake worker exits and turns the supervisor's crank (tick) itself."""

from __future__ import annotations

import itertools
import signal
from types import MappingProxyType

import pytest

from snowfence.broker.supervisor import RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_MIN_S, STABLE_AFTER_S, Supervisor
from snowfence.config import Config
from snowfence.workers.exits import HALT, Exit

S = 1_000_000_000


class FakeProc:
    """A worker process as the supervisor sees it. SIGKILL ends it; SIGTERM only
    when it was told to obey; ``exit`` ends it from the inside. Its end raises
    SIGCHLD, as the kernel does: ``on_death`` enqueues it."""

    def __init__(self, pid: int, slot: int, obeys_sigterm: bool, on_death) -> None:
        self.pid = pid
        self.slot = slot
        self.returncode: int | None = None
        self.signals: list[int] = []
        self.obeys_sigterm = obeys_sigterm
        self.on_death = on_death
        #: In uninterruptible I/O: even SIGKILL takes effect only later.
        self.stuck_in_the_kernel = False

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is not None:
            raise ProcessLookupError(self.pid)
        self.signals.append(sig)
        if (sig == signal.SIGKILL and not self.stuck_in_the_kernel) or (sig == signal.SIGTERM and self.obeys_sigterm):
            self.exit(-sig)

    def wait(self) -> int:
        assert self.returncode is not None, "wait() on a live process would block forever"
        return self.returncode

    def exit(self, status: int, sigchld: bool = True) -> None:
        self.returncode = status
        if sigchld:
            self.on_death(signal.SIGCHLD)


class Rig:
    def __init__(self, obeys_sigterm: bool = True, **settings) -> None:
        settings.setdefault("workers", 2)
        self.config = Config(**settings)
        self.now_ns = 1000 * S
        self.pids = itertools.count(100)
        self.spawned: list[FakeProc] = []
        self.stops = 0
        self.exited: list[int] = []
        self.obeys_sigterm = obeys_sigterm
        #: When each worker was last heard from, as the routing core tells each tick:
        #: the supervisor gets a read-only view (it only reads it).
        self.heard: dict[int, int] = {}
        self.heard_view = MappingProxyType(self.heard)
        self.sup = Supervisor(
            self.config,
            self.spawn,
            clock=lambda: self.now_ns,
            on_stop=self.on_stop,
            on_exit=self.exited.append,
        )
        self.sup.start()

    def spawn(self, slot: int) -> FakeProc:
        proc = FakeProc(next(self.pids), slot, self.obeys_sigterm, self.sup_enqueue)
        self.spawned.append(proc)
        return proc

    def sup_enqueue(self, signum: int) -> None:
        self.sup.enqueue(signum)

    def on_stop(self) -> None:
        self.stops += 1

    def proc(self, slot: int) -> FakeProc:
        return self.sup.procs[slot].popen

    def run_for(self, seconds: float, step_s: float = 0.01) -> bool:
        """Tick every ``step_s`` for ``seconds``; False as soon as the supervisor is done."""
        for _ in range(round(seconds / step_s)):
            self.now_ns += int(step_s * S)
            if not self.sup.tick(self.now_ns, self.heard_view):
                return False
        return True

    def heard_all(self) -> None:
        for proc in self.sup.procs:
            if proc.popen is not None:
                self.heard[proc.popen.pid] = self.now_ns

    def respawn_delay_s(self, slot: int, limit_s: float = 60.0, step_s: float = 0.01) -> float:
        """How long the slot stays empty after its worker exits (it has just exited)."""
        before = len(self.spawned)
        waited = 0.0
        while len(self.spawned) == before:
            assert waited < limit_s, "never respawned"
            self.now_ns += int(step_s * S)
            waited += step_s
            self.heard_all()
            self.sup.tick(self.now_ns, self.heard_view)
        assert self.proc(slot) is self.spawned[-1]
        return waited


@pytest.fixture
def rig():
    return Rig


def test_every_slot_gets_a_worker_at_start(rig):
    r = rig(workers=3)
    assert [p.slot for p in r.spawned] == [0, 1, 2]
    assert r.sup.live_pids == {p.pid for p in r.spawned}


def test_a_crashing_worker_is_restarted_with_doubling_back_off_up_to_the_cap(rig):
    r = rig(workers=1, worker_kill_after_s=1e6)
    delays = []
    for _ in range(12):
        r.proc(0).exit(Exit.CRASHED)
        delays.append(r.respawn_delay_s(0))
    expected = [min(RESTART_BACKOFF_MIN_S * 2**i, RESTART_BACKOFF_MAX_S) for i in range(12)]
    # The reap that sees the exit comes within one tick (0.01 s); the restart on the tick after the delay.
    for got, want in zip(delays, expected, strict=True):
        assert want <= got <= want + 0.03, (delays, expected)
    assert r.sup.procs[0].restarts == 12
    assert r.sup.procs[0].last_exit == Exit.CRASHED


def test_a_worker_that_ran_a_while_before_dying_starts_its_back_off_from_the_bottom(rig):
    r = rig(workers=1, worker_kill_after_s=1e6)
    for _ in range(4):
        r.proc(0).exit(1)
        r.respawn_delay_s(0)
    r.heard_all()
    assert r.run_for(STABLE_AFTER_S + 0.5, step_s=0.1)
    r.proc(0).exit(1)
    assert r.respawn_delay_s(0) <= RESTART_BACKOFF_MIN_S + 0.03


def test_a_worker_killed_by_a_signal_is_restarted_and_its_pid_forgotten(rig):
    r = rig()
    old = r.proc(1)
    r.heard[old.pid] = r.now_ns
    old.exit(-signal.SIGKILL)
    r.respawn_delay_s(1)
    assert r.exited == [old.pid]
    assert old.pid not in r.sup.live_pids
    assert r.proc(1).pid in r.sup.live_pids
    assert r.stops == 0 and not r.sup.stopping


@pytest.mark.parametrize("status", sorted(HALT))
def test_a_boot_error_halts_the_node_with_its_status_instead_of_restarting(rig, status):
    r = rig(workers=3)
    r.proc(1).exit(status)
    r.run_for(0.02)
    assert r.sup.stopping and r.stops == 1
    assert r.sup.exit_code == status
    for slot in (0, 2):
        assert r.proc(slot) is None  # asked to stop, and they did
    assert not r.run_for(1.0)
    assert len(r.spawned) == 3  # nothing restarted


def test_a_second_boot_error_keeps_the_first_status(rig):
    r = rig(obeys_sigterm=False)
    r.proc(0).exit(Exit.CONFIG)
    r.proc(1).exit(Exit.CANTCREAT)
    r.run_for(0.02)
    assert r.sup.exit_code == Exit.CONFIG


def test_a_crash_exit_status_is_not_a_halt(rig):
    r = rig()
    r.proc(0).exit(Exit.CRASHED)
    r.run_for(0.02)
    assert not r.sup.stopping and r.sup.exit_code == 0


def test_a_worker_silent_past_the_limit_gets_sigterm_and_sigcont_then_sigkill_after_the_grace(rig):
    r = rig(obeys_sigterm=False, worker_kill_after_s=5.0, shutdown_timeout_s=2.0, heartbeat_timeout_s=3.0)
    quiet, talker = r.proc(0), r.proc(1)

    def keep_talking():
        r.heard[talker.pid] = r.now_ns

    for _ in range(480):  # 4.8 s: still within the limit
        keep_talking()
        r.run_for(0.01)
    assert quiet.signals == [] and r.sup.procs[0].kills == 0
    for _ in range(30):
        keep_talking()
        r.run_for(0.01)
    assert quiet.signals == [signal.SIGTERM, signal.SIGCONT]
    assert r.sup.procs[0].kills == 1
    for _ in range(190):  # the grace is not over yet
        keep_talking()
        r.run_for(0.01)
    assert quiet.signals == [signal.SIGTERM, signal.SIGCONT]
    for _ in range(20):
        keep_talking()
        r.run_for(0.01)
    assert quiet.signals == [signal.SIGTERM, signal.SIGCONT, signal.SIGKILL]
    assert talker.signals == []
    # Its slot is restarted like any crash, and the new worker starts with a clean slate.
    for _ in range(20):
        keep_talking()
        r.run_for(0.01)
    assert r.proc(0) is not quiet and r.proc(0).signals == []
    assert r.sup.procs[0].kills == 1 and r.sup.procs[0].restarts == 1
    assert r.sup.kills == 1


def test_a_silent_workers_kill_ends_on_time_when_the_node_begins_to_stop_meanwhile(rig):
    # Found by the simulator: a node halting (another worker could not boot) after a silent
    # worker was sent SIGTERM left that worker running until the node's own, later deadline.
    r = rig(obeys_sigterm=False, worker_kill_after_s=5.0, shutdown_timeout_s=2.0, heartbeat_timeout_s=3.0)
    quiet, talker = r.proc(0), r.proc(1)
    for _ in range(510):
        r.heard[talker.pid] = r.now_ns
        r.run_for(0.01)
    assert quiet.signals == [signal.SIGTERM, signal.SIGCONT]
    r.run_for(1.0)
    r.sup.begin_stop("worker slot 1 cannot boot")  # its deadline: 2 s from now
    for _ in range(110):  # the silent worker's grace ends 1 s into the node's
        r.run_for(0.01)
    assert quiet.signals[-1] == signal.SIGKILL, quiet.signals


def test_a_worker_that_stops_at_sigterm_is_not_sent_sigkill(rig):
    r = rig(workers=1, worker_kill_after_s=5.0, shutdown_timeout_s=2.0)
    quiet = r.proc(0)
    r.run_for(5.1)
    assert quiet.signals == [signal.SIGTERM]  # it died at once: SIGCONT found nothing to wake
    r.run_for(3.0)
    assert signal.SIGKILL not in quiet.signals


def test_silence_counts_from_the_start_of_a_worker_that_never_spoke(rig):
    r = rig(workers=1, worker_kill_after_s=5.0)
    r.run_for(4.9)
    assert r.proc(0).signals == []
    r.run_for(0.2)
    assert r.sup.procs[0].kills == 1


def test_silence_the_broker_slept_through_is_its_own(rig):
    r = rig(workers=1, worker_kill_after_s=5.0, heartbeat_timeout_s=3.0)
    worker = r.proc(0)
    r.heard[worker.pid] = r.now_ns
    r.run_for(0.1)
    r.now_ns += 60 * S  # the whole broker was stopped for a minute
    r.sup.tick(r.now_ns, r.heard_view)
    assert worker.signals == [] and r.sup.procs[0].kills == 0
    r.run_for(5.2)  # but silence after the pause counts
    assert r.sup.procs[0].kills == 1


def test_signals_only_queue_until_the_loop_dispatches_them(rig):
    r = rig()
    r.sup.enqueue(signal.SIGTERM, None)
    assert not r.sup.stopping and r.stops == 0 and all(p.signals == [] for p in r.spawned)
    r.sup.dispatch()
    assert r.sup.stopping and r.stops == 1
    assert all(p.signals == [signal.SIGTERM] for p in r.spawned)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_drains_the_workers_and_ends_with_status_zero(rig, sig):
    r = rig(obeys_sigterm=False, shutdown_timeout_s=4.0)
    r.sup.enqueue(sig)
    assert r.run_for(1.0)  # the workers are draining
    for p in r.spawned:
        p.exit(0)
    assert not r.run_for(0.1)
    assert r.sup.exit_code == 0 and r.stops == 1
    assert all(p.signals == [signal.SIGTERM] for p in r.spawned)
    assert len(r.spawned) == 2  # nothing restarted while stopping


def test_workers_that_do_not_stop_in_time_are_killed(rig):
    r = rig(obeys_sigterm=False, shutdown_timeout_s=4.0)
    r.sup.enqueue(signal.SIGTERM)
    assert r.run_for(3.9)
    assert all(p.signals == [signal.SIGTERM] for p in r.spawned)
    assert not r.run_for(0.3)
    assert all(p.signals == [signal.SIGTERM, signal.SIGKILL] for p in r.spawned)


def test_a_second_stop_signal_kills_at_once(rig):
    r = rig(obeys_sigterm=False, shutdown_timeout_s=4.0)
    r.sup.enqueue(signal.SIGTERM)
    r.run_for(0.1)
    r.sup.enqueue(signal.SIGINT)
    assert not r.run_for(0.1)
    assert all(p.signals == [signal.SIGTERM, signal.SIGKILL] for p in r.spawned)
    assert r.stops == 1


def test_sigchld_reaps_at_once_without_waiting_for_the_safety_net(rig):
    r = rig(heartbeat_interval_s=0.5)
    r.run_for(0.02)  # the periodic reap has run; the next is 0.5 s away
    gone = r.proc(0)
    gone.exit(1)  # and SIGCHLD
    r.sup.dispatch()
    assert r.proc(0) is None and r.exited == [gone.pid]
    assert r.sup.procs[0].last_exit == 1


def test_an_exit_is_found_by_the_periodic_reap_without_sigchld(rig):
    r = rig(heartbeat_interval_s=0.5, worker_kill_after_s=1e6)
    r.run_for(0.02)
    r.proc(0).exit(1, sigchld=False)
    r.run_for(0.4)
    assert r.proc(0) is not None  # not yet looked at
    r.run_for(0.2)
    assert r.sup.procs[0].last_exit == 1


def test_describe_reports_slots_restarts_and_when_the_next_restart_comes(rig):
    r = rig(workers=2)
    r.proc(0).exit(1)
    r.sup.dispatch()
    r.sup.reap()
    d = r.sup.describe()
    assert d["state"] == "serving"
    s0, s1 = d["slots"]
    assert s0["pid"] is None and s0["restarts"] == 1 and s0["last_exit"] == 1
    assert s0["restart_in_s"] == pytest.approx(RESTART_BACKOFF_MIN_S)
    assert s1["pid"] == r.proc(1).pid and s1["restart_in_s"] is None
    r.sup.begin_stop("test")
    assert r.sup.describe()["state"] == "stopping"


def test_a_worker_that_takes_its_time_to_die_of_sigkill_is_killed_and_counted_once(rig):
    r = rig(obeys_sigterm=False, worker_kill_after_s=5.0, shutdown_timeout_s=2.0, heartbeat_timeout_s=3.0)
    stuck, talker = r.proc(0), r.proc(1)
    stuck.stuck_in_the_kernel = True
    for _ in range(1500):  # 15 s: the limit, the grace, and several graces more
        r.heard[talker.pid] = r.now_ns
        r.run_for(0.01)
    assert stuck.signals == [signal.SIGTERM, signal.SIGCONT, signal.SIGKILL]
    assert r.sup.procs[0].kills == 1
    stuck.exit(-signal.SIGKILL)  # the kernel gets round to it
    for _ in range(30):
        r.heard[talker.pid] = r.now_ns
        r.run_for(0.01)
    assert r.proc(0) is not stuck and r.sup.procs[0].restarts == 1


def test_a_flood_of_signals_keeps_at_most_five_waiting_and_a_stop_is_not_crowded_out(rig, caplog):
    from snowfence.broker.supervisor import MAX_PENDING_SIGNALS

    r = rig(obeys_sigterm=False, shutdown_timeout_s=4.0)
    for _ in range(10_000):
        r.sup.enqueue(signal.SIGCHLD)  # a burst of exits: one reap collects them all
    assert list(r.sup.signals) == [signal.SIGCHLD] and r.sup.dropped_signals == 0
    r.sup.enqueue(signal.SIGTERM)
    for _ in range(10_000):
        r.sup.enqueue(signal.SIGHUP)
    assert MAX_PENDING_SIGNALS == 5 and len(r.sup.signals) == 5
    assert list(r.sup.signals) == [signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGHUP, signal.SIGHUP]
    assert r.sup.dropped_signals == 10_000 - 3
    caplog.set_level("WARNING", logger="snowfence.broker")
    r.sup.dispatch()
    assert not r.sup.signals and r.sup.stopping and r.stops == 1
    assert all(p.signals == [signal.SIGTERM, signal.SIGKILL] for p in r.spawned)  # the second stop signal kills
    [dropped] = [rec for rec in caplog.records if "were dropped" in rec.getMessage()]
    assert dropped.getMessage().startswith("9997 signals arrived while 5 were waiting")
    r.sup.enqueue(signal.SIGINT)
    r.sup.dispatch()
    assert len([rec for rec in caplog.records if "were dropped" in rec.getMessage()]) == 1  # said once
