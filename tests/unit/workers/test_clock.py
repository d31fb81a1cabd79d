"""The host-clock watch on injected clocks: forward jumps, the kernel's error
bound, the step-back histogram, and the veto they make."""

from __future__ import annotations

import logging

from snowfence.clock import KERNEL_CHECK_INTERVAL_NS, STEP_BACK_BUCKETS_MS, HostClock, KernelClock, StepBacks

MS = 1_000_000
SYNCED = KernelClock(synchronized=True, max_error_s=0.01, est_error_s=0.001, state=0)
UNSYNCED = KernelClock(synchronized=False, max_error_s=16.0, est_error_s=16.0, state=5)
LOOSE = KernelClock(synchronized=True, max_error_s=0.5, est_error_s=0.1, state=0)


class Clocks:
    def __init__(self) -> None:
        self.wall_ns = 1_700_000_000_000 * MS
        self.kernel: KernelClock | None = SYNCED
        self.kernel_reads = 0

    def wall(self) -> int:
        return self.wall_ns

    def read_kernel(self) -> KernelClock | None:
        self.kernel_reads += 1
        return self.kernel


def watch(clocks: Clocks, refuse_forward_jumps=False, max_clock_error_ms=0, forward_jump_ms=100) -> HostClock:
    return HostClock(
        forward_jump_ms=forward_jump_ms,
        refuse_forward_jumps=refuse_forward_jumps,
        max_clock_error_ms=max_clock_error_ms,
        log=logging.getLogger("test.clock"),
        wall_ns=clocks.wall,
        read_kernel=clocks.read_kernel,
    )


def test_a_forward_jump_is_reported_once_and_vetoes_only_when_told_to():
    for refuse in (False, True):
        clocks = Clocks()
        hc = watch(clocks, refuse_forward_jumps=refuse)
        assert hc.check(0) == (False, False)
        clocks.wall_ns += 10 * MS + 500 * MS  # the wall clock runs 500 ms ahead in 10 ms
        jumped, changed = hc.check(10 * MS)
        assert jumped and hc.ahead_ms == 500
        assert changed is refuse
        assert (hc.veto is not None) is refuse
        clocks.wall_ns += 10 * MS
        assert hc.check(20 * MS)[0] is False  # the same jump, not a new one
        assert hc.jumps.jumps == 1


def test_the_veto_after_a_jump_lifts_when_the_clock_comes_back():
    clocks = Clocks()
    hc = watch(clocks, refuse_forward_jumps=True)
    hc.check(0)
    clocks.wall_ns += 500 * MS
    hc.check(0)
    assert "500 ms ahead" in hc.veto
    clocks.wall_ns -= 500 * MS  # corrected
    assert hc.check(0) == (False, True) and hc.veto is None


def test_slow_drift_is_not_a_jump():
    clocks = Clocks()
    hc = watch(clocks, refuse_forward_jumps=True, forward_jump_ms=100)
    for step in range(1, 1000):
        clocks.wall_ns += 10 * MS + MS // 2  # 50 ms/s fast, in small steps
        assert hc.check(step * 10 * MS) == (False, False)
    assert hc.veto is None and hc.ahead_ms == 0


def test_an_unsynchronised_kernel_clock_or_one_with_too_large_an_error_vetoes_when_bounded():
    for kernel, bound_ms, vetoed in [
        (UNSYNCED, 100, True),
        (LOOSE, 100, True),
        (LOOSE, 1000, False),
        (SYNCED, 100, False),
        (UNSYNCED, 0, False),  # no bound set: watched, never vetoed
        (None, 100, False),  # no adjtimex here
    ]:
        clocks = Clocks()
        clocks.kernel = kernel
        hc = watch(clocks, max_clock_error_ms=bound_ms)
        hc.check(0)
        assert (hc.veto is not None) is vetoed, (kernel, bound_ms)
    clocks = Clocks()
    clocks.kernel = UNSYNCED
    hc = watch(clocks, max_clock_error_ms=100)
    hc.check(0)
    assert hc.veto.startswith("kernel clock unsynchronised")


def test_the_kernel_is_read_again_once_a_second_and_the_veto_follows_it():
    clocks = Clocks()
    hc = watch(clocks, max_clock_error_ms=100)
    hc.check(0)
    reads = clocks.kernel_reads
    clocks.kernel = UNSYNCED
    assert hc.check(KERNEL_CHECK_INTERVAL_NS - 1) == (False, False)  # not looked at yet
    assert clocks.kernel_reads == reads
    assert hc.check(KERNEL_CHECK_INTERVAL_NS) == (False, True)
    assert hc.kernel_clock is UNSYNCED and hc.veto is not None
    clocks.kernel = SYNCED
    assert hc.check(2 * KERNEL_CHECK_INTERVAL_NS) == (False, True) and hc.veto is None


def test_steps_back_land_in_cumulative_buckets_and_refusals_are_logged(caplog):
    sb = StepBacks()
    for back_ms in (1, 3, 10, 11, 50_000):
        sb.record(back_ms)
    d = sb.to_dict()
    assert d["le"] == list(STEP_BACK_BUCKETS_MS)
    assert len(d["counts"]) == len(STEP_BACK_BUCKETS_MS) + 1
    assert d["counts"][0] == 1  # <= 1
    assert d["counts"][2] == 1  # <= 5
    assert d["counts"][3] == 1  # <= 10
    assert d["counts"][4] == 1  # <= 20
    assert d["counts"][-1] == 1  # beyond the last bound
    assert d["count"] == 5 and d["sum_ms"] == 1 + 3 + 10 + 11 + 50_000
    hc = watch(Clocks())
    with caplog.at_level(logging.INFO, logger="test.clock"):
        hc.on_step_back(4, refused=False)
        hc.on_step_back(40, refused=True)
    assert hc.step_backs.count == 2
    assert [r.getMessage() for r in caplog.records] == ["wall clock stepped back 40 ms; refusing"]
