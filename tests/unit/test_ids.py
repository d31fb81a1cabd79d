"""The bit layout: exact inverses, validation, the default layout's numbers."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snowfence.errors import ConfigError
from snowfence.ids import DEFAULT_EPOCH_MS, DEFAULT_LAYOUT, Layout, decode, format_unix_ms, parse_epoch


def test_default_layout_matches_the_design():
    L = DEFAULT_LAYOUT
    assert (L.time_bits, L.region_bits, L.worker_bits, L.sequence_bits) == (41, 3, 7, 12)
    assert L.epoch_ms == DEFAULT_EPOCH_MS == parse_epoch("2026-01-01T00:00:00Z")
    assert (L.time_shift, L.region_shift, L.worker_shift) == (22, 19, 12)
    assert L.compose(1, 2, 3, 4) == (1 << 22) | (2 << 19) | (3 << 12) | 4
    # 41 bits of milliseconds last until 2095-09-07.
    assert format_unix_ms(L.epoch_ms + L.max_ms).startswith("2095-09-07")


def test_ids_are_positive_signed_64_bit():
    L = DEFAULT_LAYOUT
    biggest = L.compose(L.max_ms, L.max_region, L.max_worker, L.max_sequence)
    assert biggest == 2**63 - 1


@st.composite
def layout_and_fields(draw):
    tb = draw(st.integers(35, 45))
    rb = draw(st.integers(0, 5))
    wb = draw(st.integers(0, 10))
    sb = 63 - tb - rb - wb
    if not 1 <= sb <= 22:
        wb = 63 - tb - rb - 12
        sb = 12
    L = Layout(time_bits=tb, region_bits=rb, worker_bits=wb, sequence_bits=sb)
    return L, (
        draw(st.integers(0, L.max_ms)),
        draw(st.integers(0, L.max_region)),
        draw(st.integers(0, L.max_worker)),
        draw(st.integers(0, L.max_sequence)),
    )


@given(layout_and_fields())
def test_compose_and_decompose_are_exact_inverses(lf):
    L, (ms, region, worker, seq) = lf
    id_ = L.compose(ms, region, worker, seq)
    assert 0 <= id_ < 2**63
    d = L.decompose(id_)
    assert (d.unix_ms - L.epoch_ms, d.region, d.worker, d.sequence) == (ms, region, worker, seq)
    assert L.compose(d.unix_ms - L.epoch_ms, d.region, d.worker, d.sequence) == id_
    assert L.to_time(id_) == dt.datetime.fromtimestamp((ms + L.epoch_ms) / 1000, tz=dt.UTC)


@given(st.integers(0, 2**63 - 1))
def test_every_63_bit_integer_decodes_and_recomposes(id_):
    d = DEFAULT_LAYOUT.decompose(id_)
    assert DEFAULT_LAYOUT.compose(d.unix_ms - DEFAULT_LAYOUT.epoch_ms, d.region, d.worker, d.sequence) == id_


def test_ids_sort_by_time_first():
    L = DEFAULT_LAYOUT
    assert L.compose(10, 7, 127, 4095) < L.compose(11, 0, 0, 0)


def test_decode_takes_strings_and_reports_fields():
    L = DEFAULT_LAYOUT
    id_ = L.compose(1000, 1, 2, 3)
    d = decode(str(id_))
    assert d.to_dict() == {
        "id": str(id_),
        "unix_ms": L.epoch_ms + 1000,
        "time": "2026-01-01T00:00:01.000Z",
        "region": 1,
        "worker": 2,
        "sequence": 3,
    }


@pytest.mark.parametrize("bad", [-1, 2**63, "abc", "-5", "1.5", True])
def test_decode_rejects_what_is_not_an_id(bad):
    with pytest.raises(ValueError):
        decode(bad)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(time_bits=41, region_bits=3, worker_bits=7, sequence_bits=13),  # sums to 64
        dict(time_bits=40, region_bits=3, worker_bits=7, sequence_bits=12),  # sums to 62
        dict(time_bits=20, region_bits=3, worker_bits=28, sequence_bits=12),  # too few time bits
        dict(time_bits=41, region_bits=3, worker_bits=19, sequence_bits=0),  # no sequence
        dict(time_bits=41, region_bits=-1, worker_bits=11, sequence_bits=12),
        dict(epoch_ms=-1),
        dict(time_bits="41"),
    ],
)
def test_invalid_layouts_are_refused_with_a_named_error(kwargs):
    with pytest.raises(ConfigError):
        Layout(**kwargs)


def test_compose_rejects_fields_out_of_range():
    L = DEFAULT_LAYOUT
    for args in [(-1, 0, 0, 0), (L.max_ms + 1, 0, 0, 0), (0, 8, 0, 0), (0, 0, 128, 0), (0, 0, 0, 4096)]:
        with pytest.raises(ValueError):
            L.compose(*args)


def test_parse_epoch_forms():
    assert parse_epoch("1767225600000") == DEFAULT_EPOCH_MS
    assert parse_epoch(DEFAULT_EPOCH_MS) == DEFAULT_EPOCH_MS
    assert parse_epoch("2026-01-01T00:00:00+00:00") == DEFAULT_EPOCH_MS
    assert parse_epoch("2026-01-01T00:00:00") == DEFAULT_EPOCH_MS  # naive means UTC
    with pytest.raises(ConfigError):
        parse_epoch("yesterday")


def test_layout_round_trips_through_a_dict_and_rejects_unknown_fields():
    L = Layout(epoch_ms=5, time_bits=40, region_bits=4, worker_bits=7, sequence_bits=12)
    assert Layout.from_dict(L.to_dict()) == L
    with pytest.raises(ConfigError):
        Layout.from_dict({**L.to_dict(), "shard_bits": 2})


def test_shard_prefixed_layout_round_trips_and_stays_time_ordered_within_a_shard():
    L = Layout(time_bits=39, region_bits=3, worker_bits=7, sequence_bits=12, shard_bits=2)
    assert L.shard_shift == 61
    shards = {L.shard_of(0, w) for w in range(128)}
    assert shards == {0, 1, 2, 3}, "workers spread over every shard"
    for w in (0, 5, 77):
        a, b = L.compose(1000, 1, w, 7), L.compose(1001, 1, w, 0)
        assert a < b and L.ms_of(a) == 1000 and L.ms_of(b) == 1001
        d = L.decompose(a)
        assert (d.unix_ms - L.epoch_ms, d.region, d.worker, d.sequence, d.shard) == (1000, 1, w, 7, L.shard_of(1, w))
        assert a >> 61 == L.shard_of(1, w) and a < 2**63
    assert Layout.from_dict(L.to_dict()) == L
    assert "2 shard" in L.describe()


@pytest.mark.parametrize(
    "data",
    [
        {},
        [],
        "",
        {"epoch_ms": DEFAULT_EPOCH_MS},
        {k: v for k, v in DEFAULT_LAYOUT.to_dict().items() if k != "worker_bits"},
    ],
)
def test_a_recorded_layout_must_say_every_field_not_fall_back_to_defaults(data):
    with pytest.raises(ConfigError, match="layout"):
        Layout.from_dict(data)


def test_a_layout_recorded_before_shards_existed_still_matches():
    old = {"epoch_ms": DEFAULT_EPOCH_MS, "time_bits": 41, "region_bits": 3, "worker_bits": 7, "sequence_bits": 12}
    assert Layout.from_dict(old) == DEFAULT_LAYOUT


def test_shard_bits_must_fit():
    with pytest.raises(ConfigError):
        Layout(shard_bits=2)  # 41+3+7+12+2 = 65
    with pytest.raises(ConfigError):
        Layout(time_bits=32, region_bits=3, worker_bits=7, sequence_bits=12, shard_bits=9)


@pytest.mark.parametrize(
    "layout",
    [DEFAULT_LAYOUT, Layout(time_bits=41, region_bits=0, worker_bits=10, sequence_bits=12)],
)
def test_check_worker_and_check_region_take_exactly_their_ranges(layout):
    for worker in (0, layout.max_worker):
        assert layout.check_worker(worker) == worker
    for region in (0, layout.max_region):
        assert layout.check_region(region) == region
    for bad in (-1, layout.max_worker + 1, True, False, 1.0, "1", None):
        with pytest.raises(ConfigError, match=f"worker must be 0..{layout.max_worker}"):
            layout.check_worker(bad)
    for bad in (-1, layout.max_region + 1, True, False, 0.0, "0", None):
        with pytest.raises(ConfigError, match=f"region must be 0..{layout.max_region}"):
            layout.check_region(bad)
