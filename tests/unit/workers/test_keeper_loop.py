"""The keeper's loop, driven step by step on a fake clock: renewal intervals,
back-off after failures, waking early, stopping, and what it reports.

The keeper runs in the test's own thread; its waits advance the fake clock
instead of taking real time, so every renewal's instant is exact.
"""

from __future__ import annotations

import pytest
from fakeclock import FakeClock

from snowfence.errors import EtcdUnavailable, LeaseLost
from snowfence.ids import DEFAULT_LAYOUT
from snowfence.store.base import Lease
from snowfence.workers.keeper import Keeper
from snowfence.workers.minter import NEVER_NS

INTERVAL_S, RETRY_S, FENCE_S = 2.0, 0.25, 5.0


class SimulatedWake:
    """The keeper's wake event on a fake clock.

    ``wait(timeout)`` returns at once if the event is set; otherwise it moves the
    clock on to the end of the timeout, running on the way whatever the test
    scheduled with :meth:`at` (a wake from the worker, a stop), and returns early
    if one of those set the event. A keeper that never stops waiting, or waits
    forever, fails the test instead of hanging it.
    """

    def __init__(self, clock: FakeClock, max_waits: int = 100) -> None:
        self.clock = clock
        self.start_ns = clock.mono_ns()
        self.flag = False
        self.timeouts: list[float | None] = []
        self.max_waits = max_waits
        self._timers: list[tuple[int, int, object]] = []
        #: Wait number (1 = the first) -> ns it takes beyond its timeout (the process was paused).
        self.oversleep_ns: dict[int, int] = {}

    def at(self, s: float, action) -> None:
        """Run ``action`` once the clock is ``s`` seconds past the start."""
        self._timers.append((self.start_ns + int(s * 1e9), len(self._timers), action))

    def now_s(self) -> float:
        return (self.clock.mono_ns() - self.start_ns) / 1e9

    def set(self) -> None:
        self.flag = True

    def clear(self) -> None:
        self.flag = False

    def is_set(self) -> bool:
        return self.flag

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        assert len(self.timeouts) <= self.max_waits, f"the keeper is spinning: {self.timeouts[-5:]}"
        if self.flag:
            return True
        end = None if timeout is None else self.clock.mono_ns() + round(timeout * 1e9)
        while True:
            due = [t for t in self._timers if end is None or t[0] <= end]
            if not due:
                break
            timer = min(due)
            self._timers.remove(timer)
            self.clock.mono_ns_value = max(self.clock.mono_ns_value, timer[0])
            timer[2]()
            if self.flag:
                return True
        assert end is not None, "the keeper waits without a timeout and nothing will wake it"
        self.clock.mono_ns_value = end + self.oversleep_ns.get(len(self.timeouts), 0)
        return False


class Lease1(Lease):
    """A lease whose renewals answer from a script; it records when each was sent."""

    expires = True

    def __init__(self, clock: FakeClock, wake: SimulatedWake, script=()) -> None:
        super().__init__(region=0, worker_id=1, token=7, mark_ms=0)
        self.clock = clock
        self.wake = wake
        #: One entry per renewal: None succeeds, an exception is raised; then all succeed.
        self.script = list(script)
        self.takes_s = 0.0
        self.sent_at: list[float] = []
        self.keeper: Keeper | None = None
        self.renewals_seen: list[int] = []

    def refresh(self) -> None:
        self.sent_at.append(round(self.wake.now_s(), 6))
        if self.keeper is not None:
            self.renewals_seen.append(self.keeper.renewals)
        self.clock.mono_ns_value += round(self.takes_s * 1e9)
        outcome = self.script.pop(0) if self.script else None
        if outcome is not None:
            raise outcome

    def extend(self, until_ms: int) -> None:
        self.reserved_until_ms = until_ms

    def release(self, last_used_ms: int) -> None:
        self.released = True

    def abandon(self) -> None:
        self.abandoned = True
        super().abandon()


def setup(script=(), **kw):
    clock = FakeClock()
    wake = SimulatedWake(clock)
    lease = Lease1(clock, wake, script)
    minter = clock.minter(DEFAULT_LAYOUT, 0, 1)
    events: list[tuple[str, dict]] = []
    keeper = Keeper(
        lease,
        minter,
        interval_s=INTERVAL_S,
        fence_after_s=FENCE_S,
        window_ms=5000,
        retry_s=RETRY_S,
        mono_ns=clock.mono_ns,
        on_event=lambda name, fields: events.append((name, fields)),
        wake_event=wake,
        **kw,
    )
    lease.keeper = keeper
    return wake, lease, minter, keeper, events


def test_renews_every_interval_and_a_stop_ends_the_wait_at_once():
    wake, lease, minter, keeper, events = setup()
    wake.at(7.0, keeper.stop)
    keeper.run()
    assert lease.sent_at == [0.0, 2.0, 4.0, 6.0]
    assert wake.timeouts == [INTERVAL_S] * 4
    assert wake.now_s() == 7.0  # the stop cut the last wait short
    assert keeper.renewals == 4 and keeper.failures == 0 and keeper.lost is None
    assert events == []


def test_counts_every_renewal_so_the_worker_can_leave_waiting():
    wake, lease, minter, keeper, events = setup(script=[EtcdUnavailable("no leader")])
    wake.at(5.0, keeper.stop)
    keeper.run()
    # The first renewal failed; the count moves only with a renewal that succeeded.
    assert lease.renewals_seen == [0, 0, 1, 2]
    assert keeper.renewals == 3


def test_failures_are_retried_with_doubling_back_off_capped_at_half_the_interval():
    failures = [EtcdUnavailable(f"no leader {i}") for i in range(5)]
    wake, lease, minter, keeper, events = setup(script=failures)
    wake.at(6.5, keeper.stop)
    keeper.run()
    assert wake.timeouts == [0.25, 0.5, 1.0, 1.0, 1.0, INTERVAL_S, INTERVAL_S]
    assert lease.sent_at == [0.0, 0.25, 0.75, 1.75, 2.75, 3.75, 5.75]
    assert events[:5] == [
        ("renewal_failed", {"worker_id": 1, "reason": f"no leader {i}", "failures": i + 1}) for i in range(5)
    ]
    assert events[5:] == [("renewed", {"worker_id": 1, "after_failures": 5})]
    assert keeper.failures == 0 and keeper.renewals == 2
    assert minter.reserved_until_ms > 0


def test_back_off_starts_again_from_the_retry_delay_after_a_success():
    err = EtcdUnavailable("election")
    wake, lease, minter, keeper, events = setup(script=[err, err, None, err, err])
    wake.at(4.0, keeper.stop)
    keeper.run()
    assert wake.timeouts[:6] == [0.25, 0.5, INTERVAL_S, 0.25, 0.5, INTERVAL_S]
    assert [e[0] for e in events] == ["renewal_failed"] * 2 + ["renewed"] + ["renewal_failed"] * 2 + ["renewed"]
    assert events[3][1]["failures"] == 1  # counted afresh


def test_a_bug_in_a_renewal_is_logged_and_retried_not_the_end_of_renewals(caplog):
    bug = RuntimeError("unexpected")
    wake, lease, minter, keeper, events = setup(script=[bug] * 5)
    wake.at(5.0, keeper.stop)
    with caplog.at_level("ERROR", logger="snowfence.lease"):
        keeper.run()
    assert wake.timeouts == [0.25, 0.5, 1.0, 1.0, 1.0, INTERVAL_S]  # the same back-off as a store error
    assert lease.sent_at == [0.0, 0.25, 0.75, 1.75, 2.75, 3.75]
    assert events[:5] == [
        ("renewal_failed", {"worker_id": 1, "reason": repr(bug), "failures": i + 1}) for i in range(5)
    ]
    assert events[5] == ("renewed", {"worker_id": 1, "after_failures": 5})
    assert "lease keeper for worker 1 failed" in caplog.text
    assert keeper.renewals == 1


def test_wake_renews_at_once_and_then_waits_a_full_interval_again():
    wake, lease, minter, keeper, events = setup()
    wake.at(0.5, keeper.wake)
    wake.at(5.0, keeper.stop)
    keeper.run()
    assert lease.sent_at == [0.0, 0.5, 2.5, 4.5]
    assert keeper.renewals == 4


def test_a_wake_during_back_off_retries_at_once():
    wake, lease, minter, keeper, events = setup(script=[EtcdUnavailable("no leader")] * 3)
    wake.at(0.3, keeper.wake)  # during the second wait (0.25 + 0.5)
    wake.at(1.0, keeper.stop)
    keeper.run()
    assert lease.sent_at[:3] == [0.0, 0.25, 0.3]


def test_a_lost_lease_fences_the_minter_ends_the_keeper_and_says_why():
    lost = LeaseLost("lease 7 expired (TTL 0)")
    wake, lease, minter, keeper, events = setup(script=[None, lost])
    keeper.run()  # returns by itself: no stop scheduled
    assert lease.sent_at == [0.0, 2.0]
    assert keeper.lost is lost and str(keeper.lost) == "lease 7 expired (TTL 0)"
    assert minter.fence_deadline_ns == -1
    assert events == [("lease_lost", {"worker_id": 1, "reason": "lease 7 expired (TTL 0)"})]


@pytest.mark.parametrize("takes_s, late", [(1.3004, True), (FENCE_S / 4, False), (0.5, False)])
def test_a_slow_renewal_is_reported_once_it_takes_more_than_a_quarter_of_the_fence(takes_s, late):
    wake, lease, minter, keeper, events = setup()
    lease.takes_s = takes_s
    wake.at(1.0, keeper.stop)
    keeper.run()
    assert keeper.renewals == 1
    assert keeper.last_renewal_latency_s == takes_s
    assert events == ([("renewed_late", {"worker_id": 1, "latency_s": round(takes_s, 3)})] if late else [])


def test_a_renewal_in_the_same_millisecond_does_not_write_the_mark_again():
    wake, lease, minter, keeper, events = setup()
    writes = []
    lease.extend = lambda until_ms: (writes.append(until_ms), setattr(lease, "reserved_until_ms", until_ms))
    keeper.renew_once()
    keeper.renew_once()  # the wall clock has not moved
    assert writes == [minter.now_ms() + 5000]


def test_minting_through_a_partition_drops_the_fence_but_not_the_reservation():
    wake, lease, minter, keeper, events = setup(fence=False)
    keeper.renew_once()
    assert minter.fence_deadline_ns == NEVER_NS
    assert minter.reserved_until_ms == minter.now_ms() + 5000


def test_a_fresh_keeper_has_renewed_nothing_and_keeps_no_process_alive():
    wake, lease, minter, keeper, events = setup()
    assert (keeper.renewals, keeper.failures, keeper.lost) == (0, 0, None)
    assert keeper.last_renewal_ns is None and keeper.last_renewal_latency_s is None
    assert keeper.daemon and keeper.name == "keeper-1"


def test_the_last_renewal_is_stamped_with_when_it_was_sent():
    wake, lease, minter, keeper, events = setup()
    lease.takes_s = 0.5
    sent = wake.clock.mono_ns()
    keeper.renew_once()
    assert keeper.last_renewal_ns == sent and keeper.last_renewal_latency_s == 0.5


def test_the_default_retry_delay_is_a_quarter_second():
    clock = FakeClock()
    wake = SimulatedWake(clock)
    lease = Lease1(clock, wake, [EtcdUnavailable("no leader")])
    minter = clock.minter(DEFAULT_LAYOUT, 0, 1)
    keeper = clock.keeper(lease, minter, wake_event=wake)
    wake.at(1.0, keeper.stop)
    keeper.run()
    assert wake.timeouts == [0.25, 2.0]


def test_stop_gives_up_waiting_after_its_timeout_when_a_renewal_hangs():
    """A renewal stuck in the store must not hang the worker's shutdown."""
    import threading

    clock = FakeClock()
    entered, release = threading.Event(), threading.Event()

    class Hanging(Lease1):
        def refresh(self):
            entered.set()
            release.wait(30)

    lease = Hanging(clock, SimulatedWake(clock))
    minter = clock.minter(DEFAULT_LAYOUT, 0, 1)
    keeper = Keeper(lease, minter, interval_s=2.0, fence_after_s=5.0, window_ms=5000, mono_ns=clock.mono_ns)
    keeper.start()
    try:
        assert entered.wait(10)
        stopper = threading.Thread(target=keeper.stop, args=(0.01,))
        stopper.start()
        stopper.join(10)
        assert not stopper.is_alive(), "stop() waited for the hanging renewal"
        assert keeper.is_alive()
    finally:
        release.set()
        keeper.join(10)
    assert not keeper.is_alive()


# -- the loop watchdog: a stalled minting loop must not keep its worker ID alive -------------------


def watched(stall_s=2.0, loop_turned_s=0.0, expires=True, **kw):
    """A keeper renewing every second, watching a loop that last turned at ``loop_turned_s``."""
    loop = [0]
    wake, lease, minter, keeper, events = setup(loop_ns=lambda: loop[0], stall_s=stall_s, **kw)
    lease.expires = expires
    loop[0] = wake.start_ns + round(loop_turned_s * 1e9)
    keeper.interval_s = 1.0
    return wake, lease, minter, keeper, events, loop


def test_a_stalled_loop_is_given_up_on_after_the_bound_and_not_at_it():
    wake, lease, minter, keeper, events, loop = watched()
    keeper.run()  # returns by itself
    assert lease.sent_at == [0.0, 1.0, 2.0]  # at 2.0 s the loop has been idle exactly the bound
    assert wake.now_s() == 3.0
    assert keeper.stalled is True and isinstance(keeper.lost, LeaseLost)
    assert str(keeper.lost) == "the minting loop has not turned for 3.0 s"
    assert minter.fence_deadline_ns == -1
    assert events == [("loop_stalled", {"worker_id": 1, "reason": "the minting loop has not turned for 3.0 s"})]
    assert not getattr(lease, "abandoned", False)  # an etcd lease lapses by itself; the mark stays


def test_a_loop_idle_a_nanosecond_past_the_bound_is_given_up_on():
    wake, lease, minter, keeper, events, loop = watched(loop_turned_s=-1e-9)
    keeper.run()
    assert lease.sent_at == [0.0, 1.0] and wake.now_s() == 2.0


def test_a_lock_only_the_process_can_free_is_let_go_when_the_loop_stalls():
    wake, lease, minter, keeper, events, loop = watched(expires=False)
    keeper.run()
    assert lease.abandoned and lease.released and keeper.stalled


def test_a_loop_that_keeps_turning_keeps_its_worker_id():
    wake, lease, minter, keeper, events, loop = watched()
    for t in range(1, 10):
        wake.at(t - 0.5, lambda: loop.__setitem__(0, wake.clock.mono_ns()))
    wake.at(9.2, keeper.stop)
    keeper.run()
    assert len(lease.sent_at) == 10 and keeper.stalled is False and keeper.lost is None and events == []


@pytest.mark.parametrize("stall_s, watch", [(0.0, True), (2.0, False)])
def test_no_watchdog_without_a_bound_or_without_a_loop_to_watch(stall_s, watch):
    if watch:
        wake, lease, minter, keeper, events, loop = watched(stall_s=stall_s)
    else:
        wake, lease, minter, keeper, events = setup(stall_s=stall_s)
        keeper.interval_s = 1.0
    wake.at(5.5, keeper.stop)
    keeper.run()
    assert lease.sent_at == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and keeper.stalled is False


def test_the_watchdog_is_off_by_default():
    wake, lease, minter, keeper, events = setup(loop_ns=lambda: 0)  # a loop that never turned
    wake.at(5.0, keeper.stop)
    keeper.run()
    assert keeper.stalled is False and keeper.renewals == 3


@pytest.mark.parametrize(
    "overslept_s, sent_at",
    [
        (1.000000001, [0.0, 1.0, 3.0]),  # just over half the bound: the loop gets one more turn
        (1.0, [0.0, 1.0]),  # exactly half: judged at once
        (0.8, [0.0, 1.0]),
    ],
)
def test_a_keeper_paused_with_its_process_gives_the_loop_a_turn_before_judging_it(overslept_s, sent_at):
    wake, lease, minter, keeper, events, loop = watched()
    wake.oversleep_ns[2] = round(overslept_s * 1e9)  # the wait after the renewal at 1.0 s
    keeper.run()
    assert lease.sent_at == sent_at and keeper.stalled is True
