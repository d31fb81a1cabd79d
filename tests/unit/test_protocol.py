"""Frames: round trips, and every kind of malformed request gets a typed error."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snowfence import protocol as p
from snowfence.errors import BadRequest, ClockUnsafe, FrameTooLarge, SnowfenceError, UnsupportedVersion


def test_reserve_round_trip_and_size():
    body = p.encode_reserve(42, 4096)
    assert len(body) == p.RESERVE_SIZE == 16
    assert body[:2] == b"\x01\x01"
    assert p.decode_request(body) == p.Request(p.RESERVE, 42, 4096, None)


def test_reserve_after_round_trip():
    body = p.encode_reserve(7, 3, after=123456789)
    assert len(body) == p.RESERVE_AFTER_SIZE == 24
    assert p.decode_request(body) == p.Request(p.RESERVE, 7, 3, 123456789)


def test_wire_bytes_are_big_endian_as_documented():
    assert p.encode_reserve(1, 2) == bytes([1, 1, 0, 0]) + (1).to_bytes(8, "big") + (2).to_bytes(4, "big")
    assert p.encode_block(1, 2**62, 5) == bytes([1, 0x81, 0, 0]) + (1).to_bytes(8, "big") + (2**62).to_bytes(
        8, "big"
    ) + (5).to_bytes(4, "big")


def test_block_and_error_and_status_replies_decode():
    r = p.decode_reply(p.encode_block(9, 12345, 17))
    assert (r.type, r.request_id, r.first, r.count) == (p.BLOCK, 9, 12345, 17)
    e = p.decode_reply(p.encode_error(9, ClockUnsafe("behind by 40 ms")))
    assert e.type == p.ERROR and isinstance(e.error, ClockUnsafe) and e.error.retriable
    assert "40 ms" in e.error.message
    s = p.decode_reply(p.encode_status_reply(3, {"a": "1"}))
    assert s.status == {"a": "1"} and s.request_id == 3


def test_unknown_error_code_keeps_code_and_flag():
    body = p.HEADER.pack(1, p.ERROR, 0, 5) + b'{"code":"brand_new","message":"m","retriable":true}'
    err = p.decode_reply(body).error
    assert isinstance(err, SnowfenceError) and err.code == "brand_new" and err.retriable


@pytest.mark.parametrize(
    "body, error, rid",
    [
        (b"", BadRequest, 0),
        (b"\x01", BadRequest, 0),
        (b"garbage!", UnsupportedVersion, 0),
        (b"\x02" + p.encode_reserve(5, 1)[1:], UnsupportedVersion, 0),
        (p.encode_reserve(5, 1)[:-1], BadRequest, 5),
        (p.encode_reserve(5, 1) + b"x", BadRequest, 5),
        (struct.pack("!BBHQI", 1, 1, 0, 6, 0), BadRequest, 6),  # count 0
        (struct.pack("!BBHQI", 1, 1, 0, 6, 4097), BadRequest, 6),  # count > 4096
        (struct.pack("!BBHQI", 1, 1, 0, 6, 2**32 - 1), BadRequest, 6),  # absurd count
        (struct.pack("!BBHQI", 1, 1, 0x8000, 6, 1), BadRequest, 6),  # unknown flag
        (struct.pack("!BBHQ", 1, 0x33, 0, 8), BadRequest, 8),  # unknown type
        (struct.pack("!BBHQ", 1, p.BLOCK, 0, 8), BadRequest, 8),  # a reply sent as a request
        (struct.pack("!BBHQ", 1, p.STATUS, 1, 8), BadRequest, 8),  # STATUS with flags
        (b"\x01" * (p.MAX_REQUEST_BYTES + 1), FrameTooLarge, 0),
    ],
)
def test_malformed_requests_raise_typed_errors_with_the_request_id(body, error, rid):
    with pytest.raises(error) as info:
        p.decode_request(body)
    assert isinstance(info.value, BadRequest) and not info.value.retriable
    expect_rid = rid if error is not FrameTooLarge else p.request_id_of(body)
    assert info.value.request_id == expect_rid


@given(st.binary(max_size=300))
def test_any_bytes_either_decode_or_raise_bad_request(body):
    try:
        req = p.decode_request(body)
    except BadRequest as err:
        assert isinstance(err.request_id, int)
    else:
        assert req.type in (p.RESERVE, p.STATUS)
        if req.type == p.RESERVE:
            assert 1 <= req.count <= p.MAX_BLOCK


@given(st.binary(max_size=64))
def test_any_reply_bytes_either_decode_or_raise_bad_request(body):
    try:
        p.decode_reply(body)
    except BadRequest:
        pass


def test_internal_frames_carry_the_client_address_and_request():
    addr, body = b"\x00\x80\x00\x41\xa7", p.encode_reserve(3, 10)
    work = p.encode_work(p.META_DELIMITED | 2, addr, body)
    assert work[0] == p.WORK
    assert p.split_routed(work) == (p.META_DELIMITED | 2, addr, body)
    reply = p.encode_reply(1, addr, p.encode_block(3, 99, 10))
    assert p.split_routed(reply) == (1, addr, p.encode_block(3, 99, 10))
    err = p.encode_error(3, ClockUnsafe())
    refused = p.encode_refused(0, addr, body, err)
    meta, a, rest = p.split_routed(refused)
    assert (meta, a) == (0, addr) and p.split_refused(rest) == (body, err)
    assert p.decode_state(p.encode_state({"ready": True})) == {"ready": True}
