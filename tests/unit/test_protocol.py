"""Frames: round trips, and every kind of malformed request gets a typed error."""

from __future__ import annotations

import struct

import orjson
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
        assert req.type in (p.RESERVE, p.STATUS, p.TIME)
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
    assert p.decode_state(p.encode_state(p.WorkerState(ready=True))).ready is True


# -- the hot path's shortcut: only exactly-right frames ---------------------------------------------


def reserve_frame(version=1, type_=p.RESERVE, flags=0, rid=9, count=10, tail=b""):
    return struct.pack("!BBHQI", version, type_, flags, rid, count) + tail


@pytest.mark.parametrize(
    "body, expected",
    [
        (reserve_frame(), (9, 10)),
        (reserve_frame(count=1), (9, 1)),
        (reserve_frame(count=p.MAX_BLOCK, rid=2**64 - 1), (2**64 - 1, p.MAX_BLOCK)),
        (reserve_frame(version=0), None),
        (reserve_frame(version=2), None),
        (reserve_frame(type_=p.STATUS), None),
        (reserve_frame(type_=p.TIME), None),
        (reserve_frame(type_=p.BLOCK), None),
        (reserve_frame(flags=p.FLAG_AFTER), None),  # AFTER needs the long form
        (reserve_frame(flags=0x8000), None),
        (reserve_frame(flags=0x0002), None),
        (reserve_frame(count=0), None),
        (reserve_frame(count=p.MAX_BLOCK + 1), None),
        (reserve_frame()[:-1], None),
        (reserve_frame(tail=b"\x00"), None),
        (p.encode_reserve(9, 10, after=5), None),  # well formed, but not plain: decode_request reads it
        (b"", None),
    ],
)
def test_plain_reserve_accepts_exactly_the_plain_well_formed_reserve(body, expected):
    assert p.plain_reserve(body) == expected


@given(st.binary(min_size=16, max_size=16) | st.binary(max_size=40))
def test_plain_reserve_agrees_with_the_full_decoder(body):
    plain = p.plain_reserve(body)
    try:
        req = p.decode_request(body)
    except BadRequest:
        assert plain is None
        return
    if req.type == p.RESERVE and req.after is None:
        assert plain == (req.request_id, req.count)
    else:
        assert plain is None


@given(st.integers(0, 2**64 - 1), st.integers(1, p.MAX_BLOCK))
def test_every_plain_reserve_a_client_sends_takes_the_shortcut(rid, count):
    assert p.plain_reserve(p.encode_reserve(rid, count)) == (rid, count)


# -- sizes and flags of every request type -----------------------------------------------------------


@pytest.mark.parametrize("type_", [p.STATUS, p.TIME])
@pytest.mark.parametrize(
    "body_of, ok",
    [
        (lambda t: struct.pack("!BBHQ", 1, t, 0, 44), True),
        (lambda t: struct.pack("!BBHQ", 1, t, 0, 44)[:-1], False),  # 11 bytes
        (lambda t: struct.pack("!BBHQ", 1, t, 0, 44) + b"\x00", False),  # 13 bytes
        (lambda t: struct.pack("!BBHQI", 1, t, 0, 44, 1), False),  # a count it does not take
        (lambda t: struct.pack("!BBHQ", 1, t, p.FLAG_AFTER, 44), False),
    ],
)
def test_status_and_time_are_exactly_a_header_without_flags(type_, body_of, ok):
    body = body_of(type_)
    if ok:
        assert p.decode_request(body) == p.Request(type_, 44)
        return
    with pytest.raises(BadRequest) as info:
        p.decode_request(body)
    assert type(info.value) is BadRequest
    assert info.value.request_id == (44 if len(body) >= p.HEADER_SIZE else 0)  # 0: too short to carry one


def test_encoded_status_and_time_requests_decode():
    assert p.decode_request(p.encode_status(5)) == p.Request(p.STATUS, 5)
    assert p.decode_request(p.encode_time(6)) == p.Request(p.TIME, 6)
    assert p.encode_time(6) == bytes([1, p.TIME, 0, 0]) + (6).to_bytes(8, "big")
    assert p.encode_status(5) == bytes([1, p.STATUS, 0, 0]) + (5).to_bytes(8, "big")


@pytest.mark.parametrize("size", [12, 16, 20, 23, 25, 32])
def test_reserve_with_after_of_the_wrong_length_is_a_bad_request(size):
    full = p.encode_reserve(77, 3, after=2**40)
    body = (full + b"\x00" * 16)[:size]
    with pytest.raises(BadRequest) as info:  # not struct.error
        p.decode_request(body)
    assert type(info.value) is BadRequest and info.value.request_id == 77


@pytest.mark.parametrize("count, ok", [(0, False), (1, True), (p.MAX_BLOCK, True), (p.MAX_BLOCK + 1, False)])
def test_reserve_with_after_checks_its_count(count, ok):
    body = p.encode_reserve(3, count, after=99)
    if ok:
        assert p.decode_request(body) == p.Request(p.RESERVE, 3, count, 99)
    else:
        with pytest.raises(BadRequest):
            p.decode_request(body)


def test_requests_up_to_the_size_limit_are_read_and_longer_ones_refused_unread():
    at_limit = p.encode_reserve(8, 1) + b"\x00" * (p.MAX_REQUEST_BYTES - p.RESERVE_SIZE)
    with pytest.raises(BadRequest) as info:
        p.decode_request(at_limit)
    assert type(info.value) is BadRequest  # read, and refused for its RESERVE size
    with pytest.raises(FrameTooLarge):
        p.decode_request(at_limit + b"\x00")


# -- replies a client reads ----------------------------------------------------------------------


def test_time_reply_round_trip_and_sizes():
    body = p.encode_time_reply(4, 1_000, 2_000)
    assert len(body) == 28
    r = p.decode_reply(body)
    assert (r.type, r.request_id, r.times) == (p.TIME_REPLY, 4, (1_000, 2_000))
    for bad in (body[:-1], body + b"\x00"):
        with pytest.raises(BadRequest):
            p.decode_reply(bad)


@pytest.mark.parametrize(
    "body, error",
    [
        (b"\x01" * 11, BadRequest),
        (p.HEADER.pack(2, p.BLOCK, 0, 1) + b"\x00" * 12, UnsupportedVersion),
        (p.encode_block(1, 2, 3)[:-1], BadRequest),
        (p.encode_block(1, 2, 3) + b"\x00", BadRequest),
        (p.HEADER.pack(1, p.ERROR, 0, 1) + b"not json", BadRequest),
        (p.HEADER.pack(1, p.ERROR, 0, 1) + b'{"message": "no code"}', BadRequest),
        (p.HEADER.pack(1, p.ERROR, 0, 1) + b"[1, 2]", BadRequest),
        (p.HEADER.pack(1, p.STATUS_REPLY, 0, 1) + b"{", BadRequest),
        (p.HEADER.pack(1, 0x84, 0, 1), BadRequest),
        (p.encode_reserve(1, 1), BadRequest),  # a request is not a reply
    ],
)
def test_malformed_replies_raise_typed_errors(body, error):
    with pytest.raises(error):
        p.decode_reply(body)


def test_unpack_block_reads_only_blocks():
    assert p.unpack_block(p.encode_block(5, 2**62, 7)) == (5, 2**62, 7)
    with pytest.raises(ValueError):
        p.unpack_block(p.HEADER.pack(2, p.BLOCK, 0, 5) + b"\x00" * 12)
    with pytest.raises(ValueError):
        p.unpack_block(p.HEADER.pack(1, p.ERROR, 0, 5) + b"\x00" * 12)
    with pytest.raises(struct.error):
        p.unpack_block(p.encode_block(5, 1, 1)[:-1])


def test_status_and_error_replies_carry_a_plain_header():
    status = p.encode_status_reply(3, {"a": 1})
    assert status[:12] == bytes([1, p.STATUS_REPLY, 0, 0]) + (3).to_bytes(8, "big")
    error = p.encode_error(3, ClockUnsafe("x"))
    assert error[:12] == bytes([1, p.ERROR, 0, 0]) + (3).to_bytes(8, "big")
    assert p.encode_block(3, 1, 1)[:4] == bytes([1, p.BLOCK, 0, 0])
    assert p.encode_time_reply(3, 1, 1)[:4] == bytes([1, p.TIME_REPLY, 0, 0])


# -- endpoints -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "endpoint, bind, problem",
    [
        ("tcp://127.0.0.1:5555", False, None),
        ("tcp://127.0.0.1:0", False, None),
        ("tcp://127.0.0.1:65535", False, None),
        ("tcp://[::1]:5555", False, None),
        ("tcp://*:5555", True, None),
        ("tcp://127.0.0.1:*", True, None),
        ("ipc:///run/snowfence.sock", False, None),
        ("ipc://" + "/" + "a" * (p.IPC_PATH_MAX - 1), False, None),
        ("inproc://broker", False, None),
        ("ws://127.0.0.1:8080/ids", False, None),
        ("wss://127.0.0.1:8443", False, None),
        (5555, False, "is not a ZeroMQ endpoint such as tcp://127.0.0.1:5555"),
        (None, False, "is not a ZeroMQ endpoint"),
        ("127.0.0.1:5555", False, "is not a ZeroMQ endpoint"),
        ("udp://127.0.0.1:5555", False, "unknown transport 'udp' (use tcp, ipc, inproc, ws, wss)"),
        ("tcp://", False, "the address after tcp:// is empty or has spaces or control characters"),
        ("tcp://127.0.0.1 :5555", False, "has spaces"),
        ("tcp://127.0.0.1:55\x0055", False, "control characters"),
        ("ipc://" + "/" + "a" * p.IPC_PATH_MAX, False, f"an ipc path may have at most {p.IPC_PATH_MAX} bytes"),
        ("tcp://127.0.0.1", False, "a tcp endpoint needs host:port"),
        ("tcp://:5555", False, "a tcp endpoint needs host:port"),
        ("ws://127.0.0.1/ids", False, "a ws endpoint needs host:port"),
        ("tcp://127.0.0.1:*", False, "the port must be a number 0..65535"),
        ("tcp://127.0.0.1:65536", False, "the port must be a number 0..65535"),
        ("tcp://127.0.0.1:65536", True, "the port must be a number 0..65535 or *"),
        ("tcp://127.0.0.1:５５", False, "the port must be a number"),
        ("tcp://127.0.0.1:-1", False, "the port must be a number"),
        ("tcp://127.0.0.1:5555/x", False, "the port must be a number"),  # a tcp address has no path
        ("tcp://*:5555", False, "connect to a host, not *"),
    ],
)
def test_endpoint_problems_are_named_before_any_socket_sees_them(endpoint, bind, problem):
    found = p.endpoint_problem(endpoint, bind=bind)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(repr(endpoint)) and problem in found


def test_endpoint_problem_checks_connect_endpoints_by_default():
    assert p.endpoint_problem("tcp://*:5555") is not None
    assert p.endpoint_problem("tcp://127.0.0.1:*") is not None


@pytest.mark.parametrize(
    "body, says",
    [
        (b"", "empty request frame"),
        (b"\x07" + p.encode_reserve(5, 1)[1:], "protocol version 7 is not supported; this server speaks 1"),
        (b"\x01" * (p.MAX_REQUEST_BYTES + 1), f"request of 256 bytes exceeds {p.MAX_REQUEST_BYTES}"),
        (b"\x01\x01\x00", "request of 3 bytes is shorter than the 12-byte header"),
        (struct.pack("!BBHQI", 1, 1, 0x8000, 6, 1), "unknown flags 0x8000"),
        (p.encode_reserve(5, 1, after=9)[:-1], "RESERVE with AFTER must be 24 bytes, got 23"),
        (p.encode_reserve(5, 1) + b"x", "RESERVE must be 16 bytes, got 17"),
        (struct.pack("!BBHQI", 1, 1, 0, 6, 0), f"count must be 1..{p.MAX_BLOCK}, got 0"),
        (p.encode_status(5) + b"x", "STATUS, TIME, NODES and WATERMARK must be 12 bytes without flags"),
        (struct.pack("!BBHQ", 1, 0x33, 0, 8), "unknown request type 0x33"),
    ],
)
def test_each_malformed_request_says_what_is_wrong(body, says):
    """The message is the one line a client's user sees: it names the problem."""
    with pytest.raises(BadRequest) as info:
        p.decode_request(body)
    assert info.value.message == says


def test_error_and_status_replies_keep_their_request_id_and_type():
    e = p.decode_reply(p.encode_error(9, ClockUnsafe("x")))
    assert (e.type, e.request_id, e.error.message) == (p.ERROR, 9, "x")
    s = p.decode_reply(p.encode_status_reply(4, {"ready": True}))
    assert (s.type, s.request_id, s.status) == (p.STATUS_REPLY, 4, {"ready": True})


def test_an_error_reply_without_a_message_reads_as_its_code_described():
    body = p.HEADER.pack(1, p.ERROR, 0, 5) + b'{"code": "clock_unsafe"}'
    err = p.decode_reply(body).error
    assert isinstance(err, ClockUnsafe) and err.message == ClockUnsafe().message


def test_a_reply_of_another_version_is_named_as_such_even_when_only_a_header():
    with pytest.raises(UnsupportedVersion):
        p.decode_reply(p.HEADER.pack(2, p.BLOCK, 0, 1))
    with pytest.raises(BadRequest, match="shorter than the 12-byte header"):
        p.decode_reply(p.HEADER.pack(1, p.BLOCK, 0, 1)[:-1])


def test_an_ipc_path_may_itself_contain_the_scheme_separator():
    assert p.endpoint_problem("ipc:///run/odd://name") is None
    assert p.endpoint_problem("ws://127.0.0.1:8080/a/b:c") is None


@pytest.mark.parametrize(
    "retry_after, kept",
    [(0, True), (1500, True), (60_000, True), (60_001, False), (-1, False), (True, False), ("5", False), (1.5, False)],
)
def test_an_error_reply_keeps_a_plausible_retry_after_only(retry_after, kept):
    wire = {"code": "overloaded", "message": "busy", "retriable": True, "retry_after_ms": retry_after}
    err = p.decode_reply(p.HEADER.pack(1, p.ERROR, 0, 5) + orjson.dumps(wire)).error
    assert getattr(err, "retry_after_ms", None) == (retry_after if kept else None)


def test_a_wss_endpoint_needs_host_and_port_too():
    assert "a wss endpoint needs host:port" in p.endpoint_problem("wss://127.0.0.1")


def test_a_bad_port_to_connect_to_is_not_offered_the_bind_wildcard():
    assert p.endpoint_problem("tcp://127.0.0.1:x").endswith(": the port must be a number 0..65535")
    assert p.endpoint_problem("tcp://127.0.0.1:x", bind=True).endswith(": the port must be a number 0..65535 or *")


def test_nodes_request_and_reply_round_trip():
    body = p.encode_nodes(12)
    assert body == bytes([1, p.NODES, 0, 0]) + (12).to_bytes(8, "big")
    assert p.decode_request(body) == p.Request(p.NODES, 12)
    listing = {"cluster": "c", "nodes": [{"node": "n0", "endpoints": ["tcp://127.0.0.1:5555"]}]}
    reply = p.encode_nodes_reply(12, listing)
    assert reply[:12] == bytes([1, p.NODES_REPLY, 0, 0]) + (12).to_bytes(8, "big")
    r = p.decode_reply(reply)
    assert (r.type, r.request_id, r.nodes) == (p.NODES_REPLY, 12, listing)


@pytest.mark.parametrize("payload", [b"{", b"[]", b'{"nodes": {}}', b'{"cluster": "c"}', b"null"])
def test_a_nodes_reply_without_a_list_of_nodes_is_refused(payload):
    with pytest.raises(BadRequest):
        p.decode_reply(p.HEADER.pack(1, p.NODES_REPLY, 0, 3) + payload)
