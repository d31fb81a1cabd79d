"""The other forms of an ID: the RFC 9562 UUIDv7 of Layout.to_uuid / from_uuid and the
Crockford base32 of to_base32 / from_base32. Exact inverses, order, the version and variant
bits, and refusals of what no layout's ID can be."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from snowfence.ids import BASE32_WIDTH, DEFAULT_EPOCH_MS, DEFAULT_LAYOUT, Layout, from_base32, to_base32

ANY_ID = st.integers(0, 2**63 - 1)
UUID_MS_LIMIT = 1 << 48
ANY_SHARD_BITS = st.integers(0, 8)


@st.composite
def layouts(draw, shard: st.SearchStrategy[int] = ANY_SHARD_BITS):
    """Any valid layout: every width in its range, the four (or five) summing to 63."""
    shard_bits = draw(shard)
    time_bits = draw(st.integers(30, 61 - shard_bits))
    left = 63 - shard_bits - time_bits  # >= 2
    region_bits = draw(st.integers(0, min(16, left - 1)))
    worker_bits = draw(st.integers(max(0, left - region_bits - 22), min(20, left - region_bits - 1)))
    sequence_bits = left - region_bits - worker_bits
    assume(1 <= sequence_bits <= 22)
    epoch_ms = draw(st.one_of(st.just(DEFAULT_EPOCH_MS), st.integers(0, 2**47)))
    return Layout(epoch_ms, time_bits, region_bits, worker_bits, sequence_bits, shard_bits)


def fits(layout: Layout, id_: int) -> bool:
    """Whether the ID's Unix millisecond fits the 48 bits of a UUIDv7's timestamp."""
    return layout.decompose(id_).unix_ms < UUID_MS_LIMIT


def in_uuid_range(layout: Layout):
    """IDs of ``layout`` whose time a UUIDv7 can carry."""
    return ANY_ID.filter(lambda i: fits(layout, i))


def unpack(u: uuid.UUID) -> tuple[int, int, int, int, int]:
    """unix_ts_ms, version, rand_a, variant, rand_b: RFC 9562's fields, read directly."""
    n = u.int
    return n >> 80, n >> 76 & 0xF, n >> 64 & 0xFFF, n >> 62 & 0b11, n & (2**62 - 1)


# -- UUIDv7 ---------------------------------------------------------------------------


def test_the_default_layouts_uuid_is_the_documented_bit_placement():
    L = DEFAULT_LAYOUT
    id_ = L.compose(1_000_000, 3, 5, 7)
    u = L.to_uuid(id_)
    # unix_ts_ms = epoch + 1,000,000; version 7; rand_a = the layout's tag; variant 10;
    # rand_b = zeros, then region 3 / worker 5 / sequence 7 in the ID's low 22 bits.
    assert str(u) == "019b76e9-ea40-7dfd-8000-000000185007"
    assert unpack(u) == (DEFAULT_EPOCH_MS + 1_000_000, 7, 0xDFD, 0b10, (3 << 19) | (5 << 12) | 7)
    assert L.uuid_tag == int(L.digest()[:3], 16) == 0xDFD
    assert L.from_uuid(u) == L.from_uuid(str(u)) == L.from_uuid(u.hex) == id_


def tag_by_the_rule(epoch_ms, time_bits, region_bits, worker_bits, sequence_bits, shard_bits) -> int:
    """The layout tag as the ID forms' rule in docs/GUIDE.md defines it, written from the rule alone:
    the first 12 bits of the SHA-256 of the ASCII text of the six widths and the epoch, in
    this order, as decimal numbers."""
    import hashlib

    text = (
        f"epoch_ms={epoch_ms},region_bits={region_bits},sequence_bits={sequence_bits},"
        f"shard_bits={shard_bits},time_bits={time_bits},worker_bits={worker_bits}"
    )
    return int.from_bytes(hashlib.sha256(text.encode("ascii")).digest()[:2], "big") >> 4


@pytest.mark.parametrize(
    "fields",
    [
        (DEFAULT_EPOCH_MS, 41, 3, 7, 12, 0),
        (DEFAULT_EPOCH_MS, 39, 3, 7, 12, 2),
        (0, 61, 0, 0, 2, 0),
        (1_700_000_000_000, 38, 4, 8, 10, 3),
        (DEFAULT_EPOCH_MS, 30, 16, 10, 1, 6),
    ],
)
def test_the_layout_tag_is_the_documented_rule(fields):
    assert Layout(*fields).uuid_tag == tag_by_the_rule(*fields)


def test_a_field_added_to_layouts_leaves_every_tag_as_it_was():
    # "Servers may add fields": a layout with one more field (at any value) keeps the tag its
    # six numbers give, so UUIDs made before the field was added still read.
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Wider(Layout):
        something_new: int = 5

    for fields in [(DEFAULT_EPOCH_MS, 41, 3, 7, 12, 0), (DEFAULT_EPOCH_MS, 39, 3, 7, 12, 2)]:
        wider = Wider(*fields)
        assert wider.uuid_tag == Layout(*fields).uuid_tag == tag_by_the_rule(*fields)
        id_ = wider.compose(1000, 1, 2, 3)
        assert Layout(*fields).from_uuid(wider.to_uuid(id_)) == id_


def test_with_shard_bits_the_shard_sits_just_below_the_tag_and_zeros():
    L = Layout(time_bits=39, shard_bits=2)
    id_ = L.compose(1000, 3, 5, 7)
    shard = L.shard_of(3, 5)
    assert id_ >> 61 == shard
    unix_ms, version, tag, variant, rand_b = unpack(L.to_uuid(id_))
    assert (unix_ms, version, tag, variant) == (DEFAULT_EPOCH_MS + 1000, 7, L.uuid_tag, 0b10)
    assert rand_b == (shard << 22) | (3 << 19) | (5 << 12) | 7


@given(st.data())
def test_every_id_round_trips_through_its_uuidv7(data):
    L = data.draw(layouts())
    id_ = data.draw(ANY_ID)  # any 63 bits, shard bits agreeing with the worker or not
    if not fits(L, id_):
        with pytest.raises(ValueError, match="past the last a UUIDv7 can carry"):
            L.to_uuid(id_)
        return
    u = L.to_uuid(id_)
    assert isinstance(u, uuid.UUID)
    assert u.version == 7 and u.variant == uuid.RFC_4122
    text = str(u)
    assert text == text.lower() and len(text) == 36
    assert uuid.UUID(text).version == 7 and uuid.UUID(text) == u
    d = L.decompose(id_)
    unix_ms, version, tag, variant, rand_b = unpack(u)
    assert (unix_ms, version, tag, variant) == (d.unix_ms, 7, L.uuid_tag, 0b10)
    assert rand_b < 2 ** (63 - L.time_bits)  # everything else is zero
    assert L.from_uuid(u) == L.from_uuid(text) == L.from_uuid(text.upper()) == id_


@given(st.data())
def test_minted_ids_round_trip_and_keep_their_fields(data):
    L = data.draw(layouts())
    ms = data.draw(st.integers(0, min(L.max_ms, UUID_MS_LIMIT - 1 - L.epoch_ms)))
    region, worker = data.draw(st.integers(0, L.max_region)), data.draw(st.integers(0, L.max_worker))
    seq = data.draw(st.integers(0, L.max_sequence))
    id_ = L.compose(ms, region, worker, seq)
    back = L.decompose(L.from_uuid(L.to_uuid(id_)))
    assert back == L.decompose(id_)
    assert (back.unix_ms, back.region, back.worker, back.sequence, back.shard) == (
        L.epoch_ms + ms,
        region,
        worker,
        seq,
        L.shard_of(region, worker),
    )


@given(st.data())
def test_without_shard_bits_uuid_order_is_id_order(data):
    L = data.draw(layouts(shard=st.just(0)))
    a, b = data.draw(in_uuid_range(L)), data.draw(in_uuid_range(L))
    ua, ub = L.to_uuid(a), L.to_uuid(b)
    assert (a < b) == (ua < ub) == (ua.int < ub.int) == (str(ua) < str(ub)) == (ua.bytes < ub.bytes)
    assert (a == b) == (ua == ub)


@given(st.data())
def test_without_shard_bits_neighbouring_ids_keep_their_order(data):
    # Random pairs are rarely in one millisecond; a run of consecutive IDs crosses fields' edges.
    L = data.draw(layouts(shard=st.just(0)))
    start = data.draw(in_uuid_range(L))
    ids = [i for i in range(start, min(start + 40, 2**63)) if fits(L, i)]
    uuids = [L.to_uuid(i) for i in ids]
    assert uuids == sorted(uuids) and [str(u) for u in uuids] == sorted(map(str, uuids))
    assert len(set(uuids)) == len(ids)


@given(st.data())
def test_with_shard_bits_uuids_sort_by_time_then_shard_and_keep_id_order_within_a_shard(data):
    L = data.draw(layouts(shard=st.integers(1, 8)))
    a, b = data.draw(in_uuid_range(L)), data.draw(in_uuid_range(L))
    same_shard = data.draw(st.booleans())
    if same_shard:  # b moved into a's shard
        b = (a >> L.shard_shift) << L.shard_shift | (b & ((1 << L.shard_shift) - 1))
        assume(fits(L, b))
    ua, ub = L.to_uuid(a), L.to_uuid(b)

    def key(i):
        d = L.decompose(i)
        return (d.unix_ms, d.shard, d.region, d.worker, d.sequence)

    assert (key(a) < key(b)) == (ua < ub) == (str(ua) < str(ub))
    if same_shard:
        assert (a < b) == (ua < ub)


def test_with_shard_bits_an_earlier_id_of_a_higher_shard_sorts_first_as_a_uuid():
    L = Layout(time_bits=39, shard_bits=2)
    workers = {L.shard_of(0, w): w for w in range(128)}
    low, high = workers[0], workers[3]
    later_low_shard, earlier_high_shard = L.compose(2000, 0, low, 0), L.compose(1000, 0, high, 0)
    assert later_low_shard < earlier_high_shard
    assert L.to_uuid(later_low_shard) > L.to_uuid(earlier_high_shard)


def with_fields(u: uuid.UUID, *, version=None, tag=None, variant=None, rand_b=None, unix_ms=None) -> uuid.UUID:
    ms, v, t, var, rb = unpack(u)
    ms, v, t, var, rb = (
        ms if unix_ms is None else unix_ms,
        v if version is None else version,
        t if tag is None else tag,
        var if variant is None else variant,
        rb if rand_b is None else rand_b,
    )
    return uuid.UUID(int=ms << 80 | v << 76 | t << 64 | var << 62 | rb)


GOOD = DEFAULT_LAYOUT.to_uuid(DEFAULT_LAYOUT.compose(1_000_000, 3, 5, 7))


@pytest.mark.parametrize(
    "bad, needle",
    [
        (with_fields(GOOD, version=4), "version 4, not 7"),
        (with_fields(GOOD, version=8), "version 8, not 7"),
        (with_fields(GOOD, variant=0b11), "variant bits are not 10"),
        (with_fields(GOOD, variant=0b01), "variant bits are not 10"),
        (with_fields(GOOD, tag=0xDFC), "of this layout: it carries layout tag"),
        (Layout(time_bits=39, shard_bits=2).to_uuid(5 << 22), "of this layout: it carries layout tag"),
        (with_fields(GOOD, rand_b=1 << 22), "leaves zero"),
        (with_fields(GOOD, rand_b=1 << 61), "leaves zero"),
        (with_fields(GOOD, unix_ms=DEFAULT_EPOCH_MS - 1), "outside the layout's"),
        (with_fields(GOOD, unix_ms=DEFAULT_LAYOUT.last_unix_ms + 1), "outside the layout's"),
        (uuid.UUID("dde19362-f7f9-4467-8528-59cded0d8179"), "version 4, not 7"),
        (uuid.UUID(int=0), "variant"),
        ("not-a-uuid", "not a UUID"),
        ("019b76e9-ea40-7dfd-8000-00000018500", "not a UUID"),
        (12345, "not a UUID"),
        (None, "not a UUID"),
    ],
)
def test_from_uuid_refuses_what_this_layout_did_not_make(bad, needle):
    with pytest.raises(ValueError, match=needle):
        DEFAULT_LAYOUT.from_uuid(bad)


@given(st.integers(0, 2**48 - 1), st.integers(0, 2**12 - 1), st.integers(0, 2**62 - 1))
def test_a_uuidv7_of_random_bits_is_refused_unless_its_tag_and_zeros_are_this_layouts(ms, rand_a, rand_b):
    u = uuid.UUID(int=ms << 80 | 7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b)
    L = DEFAULT_LAYOUT
    ok = rand_a == L.uuid_tag and rand_b < 2**22 and L.epoch_ms <= ms <= L.last_unix_ms
    if ok:
        assert L.to_uuid(L.from_uuid(u)) == u
    else:
        with pytest.raises(ValueError, match=str(u)):
            L.from_uuid(u)


@pytest.mark.parametrize("bad", [-1, 2**63, True, 1.0, "5"])
def test_to_uuid_refuses_what_is_not_an_id(bad):
    with pytest.raises(ValueError, match="not a snowfence ID"):
        DEFAULT_LAYOUT.to_uuid(bad)


def test_to_uuid_refuses_an_id_past_the_last_uuidv7_millisecond():
    L = Layout(time_bits=51, region_bits=0, worker_bits=0, sequence_bits=12)
    last = L.compose(UUID_MS_LIMIT - 1 - L.epoch_ms, 0, 0, 0)
    assert L.from_uuid(L.to_uuid(last)) == last
    with pytest.raises(ValueError, match="past the last a UUIDv7 can carry"):
        L.to_uuid(last + (1 << L.time_shift))


# -- base32 ---------------------------------------------------------------------------


def test_base32_known_values():
    assert to_base32(0) == "0" * 13
    assert to_base32(31) == "000000000000Z"
    assert to_base32(32) == "0000000000010"
    assert to_base32(2**63 - 1) == "7ZZZZZZZZZZZZ"
    assert to_base32(DEFAULT_LAYOUT.compose(1_000_000, 3, 5, 7)) == "00003T281GM07"
    assert from_base32("7ZZZZZZZZZZZZ") == 2**63 - 1


@given(ANY_ID)
def test_base32_round_trips_at_fixed_width_in_uppercase_crockford(id_):
    text = to_base32(id_)
    assert len(text) == BASE32_WIDTH == 13
    assert set(text) <= set("0123456789ABCDEFGHJKMNPQRSTVWXYZ") and text[0] in "01234567"
    assert from_base32(text) == from_base32(text.lower()) == id_
    assert int(text.translate(str.maketrans("ABCDEFGHJKMNPQRSTVWXYZ", "abcdefghijklmnopqrstuv")), 32) == id_


@given(ANY_ID, ANY_ID)
def test_base32_text_order_is_id_order(a, b):
    assert (a < b) == (to_base32(a) < to_base32(b))
    assert (a == b) == (to_base32(a) == to_base32(b))


@given(ANY_ID, st.data())
def test_base32_reads_crockfords_aliases(id_, data):
    text = to_base32(id_)
    aliased = "".join(data.draw(st.sampled_from({"1": "1IiLl", "0": "0Oo"}.get(c, c + c.lower()))) for c in text)
    assert from_base32(aliased) == id_


@pytest.mark.parametrize(
    "bad, needle",
    [
        ("000000000000U", "'U' is not a Crockford"),
        ("000000000000u", "'u' is not a Crockford"),
        ("0000-00000000", "'-' is not a Crockford"),
        ("00000000000 1", "' ' is not a Crockford"),
        ("00000000000*1", "'*' is not a Crockford"),
        ("000000000000", "13 Crockford"),
        ("00000000000000", "13 Crockford"),
        ("", "13 Crockford"),
        ("8000000000000", "above the largest ID"),
        ("Z000000000000", "above the largest ID"),
        (12, "13 Crockford"),
        (b"0000000000000", "13 Crockford"),
    ],
)
def test_from_base32_refuses_anything_else(bad, needle):
    with pytest.raises(ValueError, match=needle):
        from_base32(bad)


@pytest.mark.parametrize("bad", [-1, 2**63, True, "5"])
def test_to_base32_refuses_what_is_not_an_id(bad):
    with pytest.raises(ValueError, match="not a snowfence ID"):
        to_base32(bad)


def test_the_forms_are_exported_by_the_package():
    import snowfence

    assert snowfence.to_base32 is to_base32 and snowfence.from_base32 is from_base32
    assert "to_base32" in snowfence.__all__ and "from_base32" in snowfence.__all__


def test_the_guide_shows_the_forms_as_they_are():
    import hashlib
    import re
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[2] / "docs" / "GUIDE.md").read_text()
    section = next(s for s in re.split(r"^## ", guide, flags=re.M) if s.startswith("ID forms: UUIDv7 and base32"))
    id_ = 121057962826403840
    assert f"snowfence decode {DEFAULT_LAYOUT.to_uuid(id_)} {to_base32(id_)} " in section
    assert f"# {id_}  2026-12-01T01:21:07.486Z  region=0 worker=1 sequence=0" in section
    canonical = re.search(r"`(epoch_ms=\d+,[a-z_=0-9,]+)`", section).group(1)
    assert hashlib.sha256(canonical.encode()).hexdigest()[:3] == f"{DEFAULT_LAYOUT.uuid_tag:03x}"
    assert f"and the tag `{DEFAULT_LAYOUT.uuid_tag:03x}`" in section
    assert "`0123456789ABCDEFGHJKMNPQRSTVWXYZ`" in section
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert f"snowfence decode {DEFAULT_LAYOUT.to_uuid(id_)} " in readme and f"snowfence decode {id_} --json" in readme
