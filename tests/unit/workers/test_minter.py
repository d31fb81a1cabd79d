"""The minter under a fake clock: every rule of the design, and properties over
arbitrary clock sequences."""

from __future__ import annotations

import pytest
from fakeclock import FakeClock
from hypothesis import given, settings
from hypothesis import strategies as st

from snowfence.errors import BadRequest, ClockUnsafe, Fenced, ReservationExpired
from snowfence.ids import DEFAULT_LAYOUT, Layout
from snowfence.workers.minter import NEVER_NS, Minter, WouldWait

LAYOUT = DEFAULT_LAYOUT
REGION, WORKER = 5, 77


def make(
    clock: FakeClock,
    *,
    layout: Layout = LAYOUT,
    fenced: bool = False,
    fence_s: float | None = 5.0,
    reserve_ms: int = 60_000,
    **kw,
) -> Minter:
    """A minter that may mint: its fence ``fence_s`` away (None: never), ``reserve_ms`` reserved."""
    m = clock.minter(layout, REGION, WORKER, **kw)
    if fenced:
        m.fence_deadline_ns = -1
    else:
        m.fence_deadline_ns = NEVER_NS if fence_s is None else clock.mono_ns() + int(fence_s * 1e9)
    m.reserved_until_ms = m.now_ms() + reserve_ms
    return m


def ms_of(id_: int) -> int:
    return LAYOUT.decompose(id_).unix_ms - LAYOUT.epoch_ms


def state(m: Minter) -> tuple[int, int, bool]:
    return m.last_ms, m.seq, m.clock_unsafe


# -- the happy path --------------------------------------------------------------------


def test_block_is_a_contiguous_range_within_one_millisecond_of_this_worker():
    clock = FakeClock()
    m = make(clock)
    first, count = m.reserve(100)
    assert count == 100
    d_first, d_last = LAYOUT.decompose(first), LAYOUT.decompose(first + count - 1)
    assert (d_first.region, d_first.worker, d_first.sequence) == (REGION, WORKER, 0)
    assert (d_last.region, d_last.worker, d_last.sequence) == (REGION, WORKER, 99)
    assert d_first.unix_ms == d_last.unix_ms == clock.wall_ms


def test_same_millisecond_continues_the_sequence_and_a_new_one_restarts_it():
    clock = FakeClock()
    m = make(clock)
    a, _ = m.reserve(10)
    b, _ = m.reserve(5)
    assert b == a + 10
    clock.advance_ms(1)
    c, _ = m.reserve(1)
    assert LAYOUT.decompose(c).sequence == 0 and ms_of(c) == ms_of(a) + 1


def test_a_block_never_crosses_a_millisecond():
    clock = FakeClock()
    m = make(clock)
    m.reserve(4000)
    first, count = m.reserve(4096)
    assert count == 96  # what is left of this millisecond; the client asks again
    assert LAYOUT.decompose(first).sequence == 4000
    assert ms_of(first) == ms_of(first + count - 1)


def test_used_up_millisecond_waits_for_the_next():
    clock = FakeClock()
    m = make(clock)
    a, _ = m.reserve(4096)
    b, count = m.reserve(4096)
    assert count == 4096
    assert ms_of(b) == ms_of(a) + 1
    assert clock.sleeps == 1 and clock.slept_s == 0.001  # one sleep, to the start of the next ms
    assert m.waits == {"step_back": 0, "sequence": 1}
    m.reserve(1)  # b used up its millisecond too
    assert m.waits == {"step_back": 0, "sequence": 2}  # counted, not just flagged


def test_smaller_sequence_space_grants_at_most_one_millisecond():
    layout = Layout(time_bits=41, region_bits=3, worker_bits=9, sequence_bits=10)
    clock = FakeClock()
    m = make(clock, layout=layout)
    first, count = m.reserve(4096)
    assert count == 1024


@pytest.mark.parametrize("n", [0, -1, 4097, 10**9])
def test_absurd_counts_are_bad_requests_and_change_nothing(n):
    clock = FakeClock()
    m = make(clock)
    m.reserve(1)
    before = state(m)
    with pytest.raises(BadRequest):
        m.reserve(n)
    assert state(m) == before


# -- guard 1: the fence ------------------------------------------------------------------


def test_fenced_when_the_last_renewal_was_sent_too_long_ago():
    clock = FakeClock()
    m = make(clock)
    m.reserve(1)
    before = state(m)
    clock.pause_s(5.001)
    with pytest.raises(Fenced) as info:
        m.reserve(1)
    assert info.value.code == "fenced" and info.value.retriable
    assert state(m) == before


def test_fence_is_monotonic_a_wall_clock_step_does_not_move_it():
    clock = FakeClock()
    m = make(clock, reserve_ms=10**9)
    clock.step_ms(-60_000_000)  # a huge wall step back changes nothing about the fence...
    clock.step_ms(+60_000_000)
    m.reserve(1)  # ...so this is still inside the fence window
    clock.step_ms(+3_600_000)  # nor does a wall step forward trip it
    m.reserve(1)


def test_embedded_minter_is_never_fenced():
    clock = FakeClock()
    m = make(clock, reserve_ms=10**9)
    m.fence_deadline_ns = NEVER_NS
    clock.pause_s(10**6)
    m.reserve(1)


def test_fence_checked_again_after_waiting():
    clock = FakeClock()
    m = make(clock)
    m.reserve(4096)
    m.fence_deadline_ns = clock.mono_ns() + 100_000  # passes during the wait for the next ms
    before = state(m)
    with pytest.raises(Fenced):
        m.reserve(1)
    assert state(m) == before


# -- guard 2: the clock going back ---------------------------------------------------------


def test_small_step_back_is_waited_out():
    clock = FakeClock()
    m = make(clock)
    a, _ = m.reserve(1)
    clock.step_ms(-10)
    b, _ = m.reserve(1)
    assert b == a + 1  # back at the millisecond it had reached: its next sequence number
    assert clock.sleeps == 1 and clock.slept_s == 0.010
    assert m.waits == {"step_back": 1, "sequence": 0}
    assert not m.clock_unsafe


def test_large_step_back_refuses_marks_unsafe_and_changes_nothing():
    clock = FakeClock()
    seen = []
    m = make(clock, on_step_back=lambda back, refused: seen.append((back, refused)))
    m.reserve(1)
    before_ms, before_seq, _ = state(m)
    clock.step_ms(-40)
    with pytest.raises(ClockUnsafe) as info:
        m.reserve(1)
    assert info.value.code == "clock_unsafe" and info.value.retriable
    assert (m.last_ms, m.seq) == (before_ms, before_seq)
    assert m.clock_unsafe and seen == [(40, True)]
    assert clock.slept_s == 0  # refused at once, no waiting
    # Still behind: not recovered, still refused.
    clock.advance_ms(20)
    assert not m.clock_recovered()
    with pytest.raises(ClockUnsafe):
        m.reserve(1)
    # Once the wall clock has passed last_ms again, the minter rejoins by itself.
    clock.advance_ms(21)
    assert m.clock_recovered() and not m.clock_unsafe
    first, _ = m.reserve(1)
    assert ms_of(first) > before_ms


def test_step_back_threshold_is_configurable():
    clock = FakeClock()
    m = make(clock, max_step_back_ms=50)
    m.reserve(1)
    clock.step_ms(-40)
    m.reserve(1)  # waited out under a 50 ms limit
    assert m.waits["step_back"] == 1


def test_clock_stepping_back_further_while_waiting_refuses():
    clock = FakeClock()
    m = make(clock)
    m.reserve(1)
    before = state(m)[:2]
    clock.step_ms(-5)
    clock.on_sleep = lambda c: (c.step_ms(-50), setattr(c, "on_sleep", None))
    with pytest.raises(ClockUnsafe, match="stepped back 50 ms while waiting"):
        m.reserve(1)
    assert state(m)[:2] == before and m.clock_unsafe is True


def test_a_clock_that_does_not_advance_gives_up_within_a_bound():
    clock = FakeClock()
    m = make(clock)
    m.reserve(4096)
    m.fence_deadline_ns = NEVER_NS

    def sleep_with_frozen_wall_clock(seconds):
        clock.mono_ns_value += max(int(seconds * 1e9), 1)

    m._sleep = sleep_with_frozen_wall_clock
    before = state(m)
    start = clock.mono_ns()
    with pytest.raises(ClockUnsafe):
        m.reserve(1)
    assert state(m)[:2] == before[:2]
    assert 1.0 < (clock.mono_ns() - start) / 1e9 < 1.1  # more than the bound, and not much more


def test_wall_clock_before_the_epoch_refuses():
    clock = FakeClock(wall_ms=LAYOUT.epoch_ms - 1000)
    m = make(clock)
    with pytest.raises(ClockUnsafe):
        m.reserve(1)


# -- guard 4: the reservation --------------------------------------------------------------


def test_refuses_past_the_persisted_reservation_and_changes_nothing():
    clock = FakeClock()
    m = make(clock, reserve_ms=5)
    m.reserve(1)
    before = state(m)
    clock.advance_ms(6)
    with pytest.raises(ReservationExpired) as info:
        m.reserve(1)
    assert info.value.code == "reservation_expired" and info.value.retriable
    assert state(m) == before
    m.reserved_until_ms += 10  # the keeper persisted more
    m.reserve(1)


def test_reservation_checked_after_waiting_for_the_next_millisecond():
    clock = FakeClock()
    m = make(clock, reserve_ms=0)  # may use only the current millisecond
    m.reserve(4096)
    before = state(m)
    with pytest.raises(ReservationExpired):
        m.reserve(1)  # would need the next millisecond, which is not reserved
    assert state(m) == before


def test_nothing_is_reserved_until_the_keeper_says_so():
    clock = FakeClock()
    m = clock.minter(LAYOUT, REGION, WORKER)
    m.fence_deadline_ns = NEVER_NS
    with pytest.raises(ReservationExpired):
        m.reserve(1)


# -- a new owner and the previous owner's mark -------------------------------------------


def test_new_owner_never_mints_at_or_below_the_mark():
    clock = FakeClock()
    m = make(clock)
    mark = m.now_ms() + 3
    m.start_after(mark)
    clock.advance_ms(3)  # now == mark: that millisecond belongs to the old owner
    first, _ = m.reserve(1)
    assert ms_of(first) == mark + 1


def test_start_after_never_lowers():
    clock = FakeClock()
    m = make(clock)
    m.reserve(1)
    last = m.last_ms
    m.start_after(last - 100)
    assert m.last_ms == last


# -- properties over arbitrary clock sequences -------------------------------------------------

steps = st.one_of(
    st.tuples(st.just("advance"), st.integers(0, 3)),
    st.tuples(st.just("step"), st.integers(-60, 60)),  # small and large steps back, jumps forward
    st.tuples(st.just("jump"), st.integers(1_000, 20_000)),  # big forward jumps
    st.tuples(st.just("pause"), st.integers(0, 7_000)),  # process paused (ms)
    st.tuples(st.just("renew"), st.just(0)),
    st.tuples(st.just("extend"), st.integers(0, 6_000)),
    st.tuples(st.just("reserve"), st.integers(1, 4096)),
    st.tuples(st.just("reserve"), st.sampled_from([1, 4096])),
    st.tuples(st.just("stall"), st.just(0)),
    st.tuples(st.just("step_while_waiting"), st.integers(-30, 30)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(steps, min_size=1, max_size=120), st.integers(0, 40))
def test_invariants_hold_for_any_clock_sequence(ops, max_step_back_ms):
    clock = FakeClock()
    m = make(clock, reserve_ms=5_000, max_step_back_ms=max_step_back_ms)
    last_id = -1
    issued = 0
    for op, arg in ops:
        if op == "advance":
            clock.advance_ms(arg)
        elif op == "step":
            clock.step_ms(arg)
        elif op == "jump":
            clock.step_ms(arg)
        elif op == "pause":
            clock.advance_ms(arg)
        elif op == "renew":
            m.fence_deadline_ns = clock.mono_ns() + 5_000_000_000
        elif op == "extend":
            m.reserved_until_ms = max(m.reserved_until_ms, m.now_ms() + arg)
        elif op == "step_while_waiting":
            clock.on_sleep = lambda c, d=arg: (c.step_ms(d), setattr(c, "on_sleep", None))
        elif op in ("reserve", "stall"):
            n = arg if op == "reserve" else 1
            before = (m.last_ms, m.seq)
            mono_at_call = clock.mono_ns()
            fenced_at_call = mono_at_call > m.fence_deadline_ns
            behind_at_call = m.last_ms - m.now_ms()
            reserved = m.reserved_until_ms
            try:
                first, count = m.reserve(n)
            except Fenced:
                assert (m.last_ms, m.seq) == before
                assert fenced_at_call or clock.mono_ns() > m.fence_deadline_ns
                continue
            except ClockUnsafe:
                assert (m.last_ms, m.seq) == before
                assert not fenced_at_call
                continue
            except ReservationExpired:
                assert (m.last_ms, m.seq) == before
                assert not fenced_at_call and behind_at_call <= max_step_back_ms
                continue
            finally:
                clock.on_sleep = None
            # Refuse rather than risk: a success means every guard held.
            assert not fenced_at_call
            assert behind_at_call <= max_step_back_ms
            assert 1 <= count <= n
            d, e = LAYOUT.decompose(first), LAYOUT.decompose(first + count - 1)
            assert (d.region, d.worker, e.region, e.worker) == (REGION, WORKER, REGION, WORKER)
            assert d.unix_ms == e.unix_ms, "a block crossed a millisecond"
            ms = d.unix_ms - LAYOUT.epoch_ms
            assert ms <= reserved, "minted past the reservation"
            assert ms <= m.now_ms(), "minted a millisecond the clock has not reached"
            assert first > last_id, "IDs of one worker must strictly increase"
            assert 0 < first < 2**63
            last_id = first + count - 1
            issued += count
    # uniqueness follows from strict increase; state is consistent with the last ID
    if last_id >= 0:
        assert LAYOUT.decompose(last_id).sequence == m.seq


# -- the hybrid logical clock policy and causal floors ----------------------------------------------

from snowfence.errors import TokenAhead  # noqa: E402


def make_hlc(clock: FakeClock, **kw) -> Minter:
    return make(clock, clock_policy="hlc", **kw)


def test_hlc_mints_straight_through_a_40_ms_step_back_without_waiting():
    clock = FakeClock()
    m = make_hlc(clock)
    a, _ = m.reserve(10)
    clock.step_ms(-40)
    b, _ = m.reserve(10)
    assert b == a + 10 and clock.slept_s == 0 and not m.clock_unsafe
    assert ms_of(b) == ms_of(a)  # the same logical millisecond, later sequence numbers


def test_hlc_runs_one_millisecond_ahead_when_a_millisecond_is_used_up():
    clock = FakeClock()
    m = make_hlc(clock)
    a, _ = m.reserve(4096)
    b, count = m.reserve(4096)
    assert count == 4096 and ms_of(b) == ms_of(a) + 1 == m.now_ms() + 1
    assert clock.slept_s == 0 and m.waits["ahead"] == 1


def test_hlc_refuses_beyond_max_ahead_and_changes_nothing():
    clock = FakeClock()
    m = make_hlc(clock, max_ahead_ms=100)
    m.reserve(1)
    before = state(m)
    clock.step_ms(-150)
    with pytest.raises(ClockUnsafe):
        m.reserve(1)
    assert state(m)[:2] == before[:2] and m.clock_unsafe


def test_wait_policy_waits_for_a_causal_floor_a_few_ms_ahead():
    clock = FakeClock()
    m = make(clock)
    floor = m.now_ms() + 5
    first, _ = m.reserve(1, floor_ms=floor)
    assert ms_of(first) == floor and 0.004 <= clock.slept_s <= 0.0051


def test_wait_policy_rejects_a_causal_floor_far_ahead_and_changes_nothing():
    clock = FakeClock()
    m = make(clock)
    m.reserve(1)
    before = state(m)
    with pytest.raises(TokenAhead) as info:
        m.reserve(1, floor_ms=m.now_ms() + 500)
    assert info.value.retriable and state(m) == before and clock.slept_s == 0


def test_hlc_jumps_to_a_causal_floor_within_max_ahead_and_rejects_beyond():
    clock = FakeClock()
    m = make_hlc(clock, max_ahead_ms=1000)
    floor = m.now_ms() + 500
    first, _ = m.reserve(1, floor_ms=floor)
    assert ms_of(first) == floor and LAYOUT.decompose(first).sequence == 0 and clock.slept_s == 0
    before = state(m)
    with pytest.raises(TokenAhead):
        m.reserve(1, floor_ms=m.now_ms() + 5000)
    assert state(m) == before


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["wait", "hlc"]),
    st.lists(
        st.one_of(
            st.tuples(st.just("advance"), st.integers(0, 3)),
            st.tuples(st.just("step"), st.integers(-200, 60)),
            st.tuples(st.just("extend"), st.integers(0, 6_000)),
            st.tuples(st.just("reserve"), st.integers(1, 4096)),
            st.tuples(st.just("floor"), st.integers(-50, 300)),
        ),
        min_size=1,
        max_size=150,
    ),
)
def test_both_policies_keep_ids_unique_increasing_and_above_their_floor(policy, ops):
    clock = FakeClock()
    m = make(clock, fence_s=None, reserve_ms=5_000, clock_policy=policy, max_ahead_ms=100)
    last_id = -1
    for op, arg in ops:
        if op == "advance":
            clock.advance_ms(arg)
        elif op == "step":
            clock.step_ms(arg)
        elif op == "extend":
            m.reserved_until_ms = max(m.reserved_until_ms, m.now_ms() + arg)
        else:
            floor = m.now_ms() + arg if op == "floor" else -(1 << 62)
            before = (m.last_ms, m.seq)
            slept = clock.slept_s
            try:
                first, count = m.reserve(arg if op == "reserve" else 1, floor_ms=floor)
            except (ClockUnsafe, ReservationExpired, TokenAhead):
                assert (m.last_ms, m.seq) == before
                continue
            ms = ms_of(first)
            assert first > last_id and ms == ms_of(first + count - 1)
            assert ms >= floor, "a causal floor was not honoured"
            assert ms <= m.reserved_until_ms
            if policy == "hlc":
                assert clock.slept_s == slept, "the HLC policy never waits"
                assert ms <= m.now_ms() + 100
            else:
                assert ms <= m.now_ms()
            last_id = first + count - 1


def test_shard_prefixed_ids_and_causal_floors_across_shards():
    layout = Layout(time_bits=39, region_bits=3, worker_bits=7, sequence_bits=12, shard_bits=2)
    clock = FakeClock()
    by_shard = {}
    for w in range(128):
        by_shard.setdefault(layout.shard_of(0, w), w)
    low, high = by_shard[0], by_shard[3]
    lo = clock.minter(layout, 0, low)
    hi = clock.minter(layout, 0, high)
    for m in (lo, hi):
        m.fence_deadline_ns = NEVER_NS
        m.reserved_until_ms = m.now_ms() + 10_000
    a, _ = lo.reserve(1)
    b, _ = hi.reserve(1)
    assert layout.decompose(a).shard == 0 and layout.decompose(b).shard == 3 and b > a
    assert hi.floor_after(a) == -(1 << 62)  # a higher shard already sorts after anything lower
    with pytest.raises(BadRequest):
        lo.floor_after(b)  # nothing shard 0 mints sorts after shard 3
    c, _ = lo.reserve(1, lo.floor_after(a))
    assert c > a


# -- causal tokens from any worker ID --------------------------------------------------------

from snowfence.errors import ConfigError  # noqa: E402
from snowfence.workers.minter import NO_FLOOR  # noqa: E402

SHARDED = Layout(time_bits=39, region_bits=3, worker_bits=7, sequence_bits=12, shard_bits=2)


@settings(max_examples=400, deadline=None)
@given(
    policy=st.sampled_from(["wait", "hlc"]),
    layout=st.sampled_from([LAYOUT, SHARDED]),
    own=st.tuples(st.integers(0, 7), st.integers(0, 127)),
    token=st.tuples(st.integers(-3, 3), st.integers(0, 7), st.integers(0, 127), st.integers(0, 4095)),
    minted_before=st.lists(st.integers(1, 4096), max_size=3),
    n=st.integers(1, 4096),
)
def test_every_id_minted_after_a_causal_token_sorts_after_it(policy, layout, own, token, minted_before, n):
    """Any token: a lower, the same or a higher region and worker ID, any sequence,
    this millisecond or a few either side of it."""
    clock = FakeClock()
    m = clock.minter(layout, *own, clock_policy=policy)
    m.fence_deadline_ns = NEVER_NS
    m.reserved_until_ms = m.now_ms() + 60_000
    for k in minted_before:
        m.reserve(k)
    d_ms, t_region, t_worker, t_seq = token
    after = layout.compose(m.now_ms() + d_ms, t_region, t_worker, t_seq)
    try:
        floor = m.floor_after(after)
    except BadRequest:
        assert layout.decompose(after).shard > layout.shard_of(*own)
        return
    first, count = m.reserve(n, floor)
    assert first > after, "an ID minted after a causal token sorts before it"
    assert count >= 1


@settings(max_examples=400, deadline=None)
@given(
    layout=st.sampled_from([LAYOUT, SHARDED]),
    own=st.tuples(st.integers(0, 7), st.integers(0, 127)),
    token=st.tuples(st.integers(1, (1 << 39) - 2), st.integers(0, 7), st.integers(0, 127), st.integers(0, 4095)),
)
def test_the_causal_floor_is_the_earliest_millisecond_whose_ids_all_sort_after_the_token(layout, own, token):
    m = Minter(layout, *own)
    region, worker = own
    after = layout.compose(*token)
    try:
        floor = m.floor_after(after)
    except BadRequest:
        assert layout.decompose(after).shard > layout.shard_of(region, worker)
        return
    if floor == NO_FLOOR:
        assert layout.compose(0, region, worker, 0) > after  # a higher shard: anything sorts after
        return
    assert layout.compose(floor, region, worker, 0) > after
    assert layout.compose(floor - 1, region, worker, 0) <= after  # not all of the one before


@pytest.mark.parametrize(
    "token_region, token_worker, same_ms",
    [
        (REGION, WORKER - 1, True),  # a lower worker ID: this millisecond already sorts after it
        (REGION - 1, 127, True),  # a lower region, whatever its worker
        (REGION, WORKER, False),  # this worker ID itself: only the next millisecond is sure
        (REGION, WORKER + 1, False),  # a higher worker ID
        (REGION + 1, 0, False),  # a higher region
    ],
)
def test_a_token_of_this_millisecond_is_honoured_whatever_worker_id_minted_it(token_region, token_worker, same_ms):
    clock = FakeClock()
    m = make(clock)
    now = m.now_ms()
    after = LAYOUT.compose(now, token_region, token_worker, 4095)
    floor = m.floor_after(after)
    assert floor == (now if same_ms else now + 1)
    first, _ = m.reserve(1, floor)
    assert first > after
    assert ms_of(first) == floor


# -- a minter taking over a mark, and its constructor's checks ------------------------------------


def test_start_after_the_millisecond_just_minted_moves_on_to_the_next():
    clock = FakeClock()
    m = make(clock)
    a, _ = m.reserve(10)
    m.start_after(ms_of(a))  # a mark equal to what this minter used: that millisecond is spent
    b, _ = m.reserve(1)
    assert ms_of(b) == ms_of(a) + 1


def test_start_after_a_later_mark_on_a_minter_that_minted():
    clock = FakeClock()
    m = make(clock)
    a, _ = m.reserve(10)
    mark = ms_of(a) + 3
    m.start_after(mark)
    assert (m.last_ms, m.seq) == (mark, LAYOUT.max_sequence)
    clock.advance_ms(3)  # the wall clock is at the mark: still the previous owner's
    b, _ = m.reserve(1)
    assert ms_of(b) == mark + 1 and LAYOUT.decompose(b).sequence == 0


@pytest.mark.parametrize(
    "region, worker",
    [(8, 0), (-1, 0), (0, 128), (0, -1), (True, 0), (0, True), ("1", 0), (0, 1.0), (None, 0)],
)
def test_minter_refuses_a_region_or_worker_id_outside_the_layout(region, worker):
    with pytest.raises(ConfigError):
        Minter(LAYOUT, region, worker)


def test_minter_accepts_the_edges_of_the_layout_and_stamps_them():
    for region, worker in [(0, 0), (7, 127), (0, 127), (7, 0)]:
        clock = FakeClock()
        m = clock.minter(LAYOUT, region, worker)
        assert (m.region, m.worker_id) == (region, worker)
        m.fence_deadline_ns = NEVER_NS
        m.reserved_until_ms = m.now_ms() + 10
        d = LAYOUT.decompose(m.reserve(1)[0])
        assert (d.region, d.worker, d.unix_ms) == (region, worker, clock.wall_ms)


def test_unknown_clock_policy_is_refused():
    with pytest.raises(ValueError, match="clock_policy"):
        Minter(LAYOUT, REGION, WORKER, clock_policy="guess")


# -- edges of every guard: one millisecond (or nanosecond) either side ---------------------------


def test_a_fresh_minter_is_fenced_and_reserves_nothing_until_the_keeper_says_so():
    clock = FakeClock()
    m = clock.minter(LAYOUT, REGION, WORKER)
    assert (m.fence_deadline_ns, m.reserved_until_ms, m.clock_unsafe) == (-1, -1, False)
    assert (m.max_step_back_ms, m.max_ahead_ms, m.hlc) == (10, 1000, False)  # the documented defaults
    with pytest.raises(Fenced):
        m.reserve(1)


def test_the_first_id_is_minted_in_the_first_millisecond_after_the_epoch():
    clock = FakeClock(wall_ms=LAYOUT.epoch_ms + 1)
    m = make(clock)
    first, _ = m.reserve(1)
    assert ms_of(first) == 1 and clock.slept_s == 0
    clock = FakeClock(wall_ms=LAYOUT.epoch_ms)  # millisecond 0 counts as used up
    m = make(clock)
    first, _ = m.reserve(1)
    assert ms_of(first) == 1 and clock.slept_s == 0.001


def test_the_fence_deadline_itself_still_mints_and_a_nanosecond_later_does_not():
    clock = FakeClock()
    m = make(clock)
    m.fence_deadline_ns = clock.mono_ns()
    m.reserve(1)
    clock.mono_ns_value += 1
    with pytest.raises(Fenced):
        m.reserve(1)


def test_the_fence_deadline_reached_exactly_while_waiting_still_mints():
    clock = FakeClock()
    m = make(clock)
    m.reserve(4096)
    m.fence_deadline_ns = clock.mono_ns() + 1_000_000  # the wait for the next ms takes exactly 1 ms
    first, _ = m.reserve(1)
    assert ms_of(first) == m.now_ms()


def test_waits_are_counted_in_the_dict_the_worker_shares():
    shared = {"step_back": 0, "sequence": 0}
    clock = FakeClock()
    m = make(clock, waits=shared)
    m.reserve(4096)
    m.reserve(1)
    assert m.waits is shared and shared == {"step_back": 0, "sequence": 1}


def test_a_causal_floor_at_the_current_millisecond_mints_at_once_without_a_wait():
    clock = FakeClock()
    m = make(clock)
    now = m.now_ms()
    a, _ = m.reserve(1, floor_ms=now)  # a new millisecond
    b, _ = m.reserve(1, floor_ms=now)  # the same one, continued
    assert (ms_of(a), b) == (now, a + 1)
    assert clock.sleeps == 0 and m.waits == {"step_back": 0, "sequence": 0}


@pytest.mark.parametrize("ahead, ok", [(10, True), (11, False)])
def test_wait_policy_waits_for_a_floor_up_to_max_step_back_ahead(ahead, ok):
    clock = FakeClock()
    m = make(clock)
    floor = m.now_ms() + ahead
    if ok:
        first, _ = m.reserve(1, floor_ms=floor)
        assert ms_of(first) == floor and clock.slept_s == 0.010
    else:
        with pytest.raises(TokenAhead, match="is 11 ms ahead of this worker's clock") as refused:
            m.reserve(1, floor_ms=floor)
        assert refused.value.retry_after_ms == 1  # then 10 ms ahead: within the wait
        assert refused.value.to_wire()["retry_after_ms"] == 1


def test_refusing_a_large_step_back_says_by_how_much():
    clock = FakeClock()
    m = make(clock)
    m.reserve(1)
    clock.step_ms(-40)
    with pytest.raises(ClockUnsafe, match="wall clock is 40 ms behind"):
        m.reserve(1)


@pytest.mark.parametrize("back, reported", [(0, None), (1, (1, False)), (10, (10, False)), (11, (11, True))])
def test_every_step_back_is_reported_and_a_used_up_millisecond_is_not_one(back, reported):
    clock = FakeClock()
    seen = []
    m = make(clock, on_step_back=lambda b, refused: seen.append((b, refused)))
    m.reserve(4096)  # used up: a back of 0 waits for the next millisecond, and is no step back
    clock.step_ms(-back)
    try:
        m.reserve(1)
    except ClockUnsafe:
        pass
    assert seen == ([] if reported is None else [reported])


def test_clock_recovered_only_once_the_wall_clock_has_passed_the_last_millisecond():
    clock = FakeClock()
    m = make(clock)
    m.reserve(1)
    clock.step_ms(-40)
    with pytest.raises(ClockUnsafe):
        m.reserve(1)
    clock.advance_ms(40)  # back at last_ms: not passed yet
    assert not m.clock_recovered() and m.clock_unsafe is True
    clock.advance_ms(1)
    assert m.clock_recovered() and m.clock_unsafe is False


def test_hlc_continues_the_last_millisecond_for_a_floor_at_it_while_the_clock_is_behind():
    clock = FakeClock()
    m = make_hlc(clock)
    a, _ = m.reserve(10)
    clock.step_ms(-5)
    b, count = m.reserve(10, floor_ms=ms_of(a))
    assert b == a + 10 and count == 10  # not sequence 0 again: that would repeat a's IDs


@pytest.mark.parametrize("ahead, ok", [(100, True), (101, False)])
def test_hlc_follows_a_floor_up_to_max_ahead_ms_and_no_further(ahead, ok):
    clock = FakeClock()
    m = make_hlc(clock, max_ahead_ms=100)
    floor = m.now_ms() + ahead
    if ok:
        first, _ = m.reserve(1, floor_ms=floor)
        assert ms_of(first) == floor and m.waits["ahead"] == 1
    else:
        with pytest.raises(TokenAhead, match="is 101 ms ahead of this worker's clock") as refused:
            m.reserve(1, floor_ms=floor)
        assert not m.clock_unsafe and refused.value.retry_after_ms == 1


def test_hlc_counts_every_time_it_runs_ahead():
    clock = FakeClock()
    m = make_hlc(clock)
    for _ in range(3):
        m.reserve(4096)
    assert m.waits["ahead"] == 2  # the first millisecond was the wall clock's own


def test_hlc_refuses_a_step_back_beyond_max_ahead_as_an_unsafe_clock_and_reports_it():
    clock = FakeClock()
    seen = []
    m = make_hlc(clock, max_ahead_ms=100, on_step_back=lambda b, refused: seen.append((b, refused)))
    a, _ = m.reserve(1)
    clock.step_ms(-150)
    with pytest.raises(ClockUnsafe, match="would run 150 ms ahead"):
        m.reserve(1, floor_ms=ms_of(a))  # the floor is where it would mint, but the clock is the cause
    assert m.clock_unsafe and seen == [(150, True)]


def test_hlc_running_just_past_max_ahead_on_a_used_up_millisecond_is_an_unsafe_clock():
    clock = FakeClock()
    m = make_hlc(clock, max_ahead_ms=100)
    m.reserve(4096)
    clock.step_ms(-100)  # behind by exactly max_ahead; the next free ms would be 101 ahead
    with pytest.raises(ClockUnsafe):
        m.reserve(1)
    assert m.clock_unsafe


# -- a minter that may not wait (the broker's own) --------------------------------------


def test_a_minter_that_may_not_wait_declines_where_it_would_sleep_and_changes_nothing():
    clock = FakeClock()
    m = make(clock, may_wait=False)
    m.reserve(4096)  # the millisecond is used up
    before = state(m)
    with pytest.raises(WouldWait):
        m.reserve(1)
    assert state(m) == before and clock.sleeps == 0 and m.waits == {"step_back": 0, "sequence": 0}
    clock.step_ms(-3)  # a small step back: a waiting minter would sleep it out
    with pytest.raises(WouldWait):
        m.reserve(1)
    assert state(m) == before and clock.sleeps == 0
    clock.step_ms(3)
    clock.advance_ms(1)
    first, count = m.reserve(1)
    assert count == 1 and ms_of(first) == before[0] + 1


def test_a_minter_that_may_not_wait_still_refuses_a_large_step_back_as_unsafe():
    clock = FakeClock()
    m = make(clock, may_wait=False)
    m.reserve(1)
    clock.step_ms(-500)
    with pytest.raises(ClockUnsafe):
        m.reserve(1)
    assert m.clock_unsafe and clock.sleeps == 0
