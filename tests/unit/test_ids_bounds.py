"""Layout.bounds: the lowest and highest ID, per shard, that can carry a time or a range of time."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snowfence.ids import DEFAULT_EPOCH_MS, DEFAULT_LAYOUT, IdRange, Layout, format_unix_ms, unix_ms_of


@st.composite
def layouts(draw):
    shard = draw(st.integers(0, 3))
    tb = draw(st.integers(30, 44))
    rb = draw(st.integers(0, 5))
    rest = 63 - shard - tb - rb  # for the worker and sequence bits
    sb = draw(st.integers(max(1, rest - 20), min(22, rest)))
    wb = rest - sb
    epoch = draw(st.sampled_from([0, DEFAULT_EPOCH_MS, 1_600_000_000_123]))
    return Layout(epoch_ms=epoch, time_bits=tb, region_bits=rb, worker_bits=wb, sequence_bits=sb, shard_bits=shard)


@st.composite
def layout_span_and_id(draw):
    """A layout, a span [a, b] of its milliseconds (since the epoch), and the fields of an ID inside it."""
    layout = draw(layouts())
    a = draw(st.integers(0, layout.max_ms))
    b = draw(st.integers(a, min(layout.max_ms, a + draw(st.sampled_from([0, 1, 5, 10**6, layout.max_ms])))))
    fields = (
        draw(st.integers(0, layout.max_region)),
        draw(st.integers(0, layout.max_worker)),
        draw(st.integers(0, layout.max_sequence)),
    )
    return layout, a, b, fields


def _by_shard(ranges):
    return {r.shard: r for r in ranges}


@given(layout_span_and_id(), st.data())
def test_an_id_minted_inside_the_range_lies_inside_its_shards_range_and_its_neighbours_outside(case, data):
    layout, a, b, (region, worker, seq) = case
    closed = data.draw(st.booleans())
    start = a + layout.epoch_ms
    if closed:
        ranges = layout.bounds(start, b + layout.epoch_ms, closed=True)
    else:
        ranges = layout.bounds(start, b + layout.epoch_ms + 1)
    shard = layout.shard_of(region, worker)
    mine = _by_shard(ranges)[shard]
    assert (mine.start_ms, mine.end_ms) == (start, b + layout.epoch_ms)
    for ms in {a, b, data.draw(st.integers(a, b))}:
        id_ = layout.compose(ms, region, worker, seq)
        assert mine.holds(id_) and mine.first <= id_ <= mine.last
        # ...and in no other shard's range.
        assert [r.shard for r in ranges if r.holds(id_)] == [shard]
    # The neighbouring milliseconds, whatever the other fields, lie outside.
    for ms, low in ((a - 1, True), (b + 1, False)):
        if 0 <= ms <= layout.max_ms:
            for fields in (
                (region, worker, seq),
                (0, 0, 0),
                (layout.max_region, layout.max_worker, layout.max_sequence),
            ):
                id_ = layout.compose(ms, *fields)
                assert not any(r.holds(id_) for r in ranges)
                if layout.shard_of(*fields[:2]) == shard:
                    assert (id_ < mine.first) if low else (id_ > mine.last)


@given(layout_span_and_id())
def test_one_range_per_shard_in_order_disjoint_and_tight(case):
    layout, a, b, _ = case
    ranges = layout.bounds(a + layout.epoch_ms, b + layout.epoch_ms, closed=True)
    assert all(isinstance(r, IdRange) for r in ranges)
    assert [r.shard for r in ranges] == list(range(2**layout.shard_bits))
    for r in ranges:
        assert 0 <= r.first <= r.last < 2**63
        # Tight: the bounds themselves carry the first and last millisecond of the span and the shard.
        first, last = layout.decompose(r.first), layout.decompose(r.last)
        assert (first.unix_ms, first.shard, first.region, first.worker, first.sequence) == (
            a + layout.epoch_ms,
            r.shard,
            0,
            0,
            0,
        )
        assert (last.unix_ms, last.shard) == (b + layout.epoch_ms, r.shard)
        assert (last.region, last.worker, last.sequence) == (layout.max_region, layout.max_worker, layout.max_sequence)
    for lower, upper in zip(ranges, ranges[1:], strict=False):
        assert lower.last < upper.first


def test_without_shard_bits_there_is_one_range_from_the_lowest_to_the_highest_id_of_the_span():
    L = DEFAULT_LAYOUT
    (r,) = L.bounds(L.epoch_ms + 1000, L.epoch_ms + 2000)
    assert r == IdRange(
        0, L.compose(1000, 0, 0, 0), L.compose(1999, 7, 127, 4095), L.epoch_ms + 1000, L.epoch_ms + 1999
    )
    (one,) = L.bounds(L.epoch_ms + 1000)
    assert (one.first, one.last) == (1000 << 22, (1001 << 22) - 1)


def test_with_shard_bits_each_shard_has_its_range_above_the_timestamp():
    L = Layout(time_bits=39, region_bits=3, worker_bits=7, sequence_bits=12, shard_bits=2)
    ranges = L.bounds(L.epoch_ms + 5)
    assert len(ranges) == 4
    for r in ranges:
        assert r.first == (r.shard << 61) | (5 << 22) and r.last == (r.shard << 61) | (6 << 22) - 1


def test_half_open_and_closed_ranges_agree_and_consecutive_ranges_share_no_id():
    L = DEFAULT_LAYOUT
    hour = 3_600_000
    t0 = L.epoch_ms + 10 * hour
    assert L.bounds(t0, t0 + hour) == L.bounds(t0, t0 + hour - 1, closed=True)
    (first,), (second,) = L.bounds(t0, t0 + hour), L.bounds(t0 + hour, t0 + 2 * hour)
    assert first.last + 1 == second.first


def test_times_may_be_unix_ms_aware_datetimes_or_iso_text_and_finer_than_a_ms_rounds_down():
    L = DEFAULT_LAYOUT
    ms = L.epoch_ms + 86_400_000 + 123
    moment = dt.datetime(2026, 1, 2, 0, 0, 0, 123_999, tzinfo=dt.UTC)
    expected = L.bounds(ms)
    assert L.bounds(moment) == expected
    assert L.bounds(moment.astimezone(dt.timezone(dt.timedelta(hours=-5)))) == expected
    assert L.bounds("2026-01-02T00:00:00.123999Z") == expected
    assert L.bounds("2026-01-02T00:00:00.123") == expected  # no offset: UTC
    assert L.bounds("2026-01-02T05:30:00.123+05:30") == expected
    assert L.bounds(str(ms)) == expected
    # Exact, where a float would lose the last millisecond.
    for frac in range(1000):
        text = f"2026-03-01T00:00:00.{frac:03d}Z"
        assert unix_ms_of(text) == 1_772_323_200_000 + frac
    assert format_unix_ms(unix_ms_of("2026-03-01T12:34:56.789Z")) == "2026-03-01T12:34:56.789Z"


@pytest.mark.parametrize(
    "args, kwargs, needle",
    [
        (("2025-12-31T23:59:59.999Z",), {}, "before the layout's epoch"),
        ((DEFAULT_EPOCH_MS - 1, DEFAULT_EPOCH_MS + 10), {}, "before the layout's epoch"),
        ((DEFAULT_LAYOUT.last_unix_ms + 1,), {}, "after the last millisecond"),
        ((DEFAULT_EPOCH_MS, DEFAULT_LAYOUT.last_unix_ms + 1), {"closed": True}, "after the last millisecond"),
        ((DEFAULT_EPOCH_MS + 5, DEFAULT_EPOCH_MS + 5), {}, "holds no millisecond"),
        ((DEFAULT_EPOCH_MS + 5, DEFAULT_EPOCH_MS + 4), {"closed": True}, "holds no millisecond"),
        ((dt.datetime(2026, 3, 1),), {}, "no time zone"),
        (("yesterday",), {}, "neither Unix milliseconds nor an ISO-8601 time"),
        ((True,), {}, "not True"),
        ((1.5,), {}, "not 1.5"),
    ],
)
def test_times_no_id_can_carry_and_empty_ranges_are_refused(args, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        DEFAULT_LAYOUT.bounds(*args, **kwargs)


def test_the_first_and_last_millisecond_of_the_layout_are_accepted():
    L = DEFAULT_LAYOUT
    (first,) = L.bounds(L.epoch_ms)
    (last,) = L.bounds(L.last_unix_ms)
    assert first.first == 0 and last.last == 2**63 - 1
    (everything,) = L.bounds(L.epoch_ms, L.last_unix_ms + 1)
    assert (everything.first, everything.last) == (0, 2**63 - 1)


def test_a_range_says_itself_as_json_with_ids_as_strings():
    L = Layout(time_bits=39, region_bits=3, worker_bits=7, sequence_bits=12, shard_bits=2)
    doc = L.bounds("2026-03-01T00:00:00Z", "2026-03-01T00:00:01Z")[3].to_dict()
    assert doc == {
        "shard": 3,
        "first": str((3 << 61) | ((1_772_323_200_000 - L.epoch_ms) << 22)),
        "last": str((3 << 61) | ((1_772_323_201_000 - L.epoch_ms) << 22) - 1),
        "start_ms": 1_772_323_200_000,
        "end_ms": 1_772_323_200_999,
        "start": "2026-03-01T00:00:00.000Z",
        "end": "2026-03-01T00:00:00.999Z",
    }
