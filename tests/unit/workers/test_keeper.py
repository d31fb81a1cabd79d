"""The lease keeper: the fence counts from when a renewal was sent, the
reservation moves only after the store confirmed, and a lost lease fences."""

from __future__ import annotations

import time

import pytest
from fakeclock import FakeClock

from snowfence.errors import EtcdUnavailable, LeaseLost
from snowfence.ids import DEFAULT_LAYOUT
from snowfence.store.base import Lease
from snowfence.workers.keeper import Keeper
from snowfence.workers.minter import NEVER_NS


class ScriptedLease(Lease):
    """A lease whose store answers as the test says."""

    expires = True

    def __init__(self, clock: FakeClock, refresh_takes_s: float = 0.0) -> None:
        super().__init__(region=0, worker_id=1, token=7, mark_ms=0)
        self.clock = clock
        self.refresh_takes_s = refresh_takes_s
        self.refresh_error: Exception | None = None
        self.extend_error: Exception | None = None
        self.refreshes = 0
        self.extends: list[int] = []

    def refresh(self) -> None:
        self.refreshes += 1
        self.clock.advance_ms(self.refresh_takes_s * 1000)
        if self.refresh_error:
            raise self.refresh_error

    def extend(self, until_ms: int) -> None:
        if self.extend_error:
            raise self.extend_error
        self.extends.append(until_ms)
        self.reserved_until_ms = until_ms

    def release(self, last_used_ms: int) -> None:
        self.released = True


def setup(refresh_takes_s=0.0):
    clock = FakeClock()
    lease = ScriptedLease(clock, refresh_takes_s)
    minter = clock.minter(DEFAULT_LAYOUT, 0, 1)
    keeper = Keeper(lease, minter, interval_s=2.0, fence_after_s=5.0, window_ms=5000, mono_ns=clock.mono_ns)
    return clock, lease, minter, keeper


def test_fence_deadline_counts_from_when_the_renewal_was_sent():
    clock, lease, minter, keeper = setup(refresh_takes_s=3.0)  # a slow renewal
    sent = clock.mono_ns()
    keeper.renew_once()
    assert minter.fence_deadline_ns == sent + 5_000_000_000  # not from when it returned
    assert keeper.last_renewal_latency_s == pytest.approx(3.0)


def test_reservation_moves_only_after_the_store_confirmed():
    clock, lease, minter, keeper = setup()
    keeper.renew_once()
    assert minter.reserved_until_ms == minter.now_ms() + 5000 == lease.extends[-1]
    before = minter.reserved_until_ms
    clock.advance_ms(2000)
    lease.extend_error = EtcdUnavailable("deadline exceeded")
    with pytest.raises(EtcdUnavailable):
        keeper.renew_once()
    assert minter.reserved_until_ms == before


def test_failed_renewal_moves_neither_fence_nor_reservation():
    clock, lease, minter, keeper = setup()
    keeper.renew_once()
    fence, reserved = minter.fence_deadline_ns, minter.reserved_until_ms
    clock.advance_ms(2000)
    lease.refresh_error = EtcdUnavailable("no leader")
    with pytest.raises(EtcdUnavailable):
        keeper.renew_once()
    assert (minter.fence_deadline_ns, minter.reserved_until_ms) == (fence, reserved)
    assert lease.extends == [reserved]


def test_mark_never_moves_back_when_the_wall_clock_does():
    clock, lease, minter, keeper = setup()
    keeper.renew_once()
    high = minter.reserved_until_ms
    clock.step_ms(-60_000)
    keeper.renew_once()
    assert minter.reserved_until_ms == high and lease.extends == [high]


def test_reservation_is_capped_at_the_last_millisecond_of_the_layout():
    clock, lease, minter, keeper = setup()
    clock.wall_ns_value = (DEFAULT_LAYOUT.epoch_ms + DEFAULT_LAYOUT.max_ms - 10) * 1_000_000
    keeper.renew_once()
    assert minter.reserved_until_ms == DEFAULT_LAYOUT.max_ms


def test_a_lease_that_cannot_expire_is_never_fenced():
    clock, lease, minter, keeper = setup()
    lease.expires = False
    keeper.renew_once()
    assert minter.fence_deadline_ns == NEVER_NS


def test_lost_lease_fences_the_minter_and_ends_the_keeper():
    clock, lease, minter, keeper = setup()
    keeper.renew_once()
    lease.refresh_error = LeaseLost("TTL 0")
    events = []
    keeper._on_event = lambda name, fields: events.append(name)
    keeper.start()
    keeper.wake()
    keeper.join(2)
    assert not keeper.is_alive()
    assert isinstance(keeper.lost, LeaseLost)
    assert minter.fence_deadline_ns == -1
    assert events == ["lease_lost"]


def test_keeper_retries_soon_after_a_failure_and_recovers():
    clock = FakeClock()
    lease = ScriptedLease(clock)
    minter = clock.minter(DEFAULT_LAYOUT, 0, 1)
    keeper = Keeper(
        lease, minter, interval_s=60.0, fence_after_s=5.0, window_ms=5000, retry_s=0.01, mono_ns=clock.mono_ns
    )
    failures_left = [3]

    def flaky_refresh():
        lease.refreshes += 1
        if failures_left[0]:
            failures_left[0] -= 1
            raise EtcdUnavailable("election in progress")

    lease.refresh = flaky_refresh
    keeper.start()
    deadline = time.monotonic() + 5
    while minter.reserved_until_ms < 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    keeper.stop(timeout_s=2)
    assert lease.refreshes == 4  # three quick retries, not three 60 s intervals
    assert minter.reserved_until_ms > 0 and keeper.failures == 0
