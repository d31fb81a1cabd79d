"""ERROR replies, per docs/PROTOCOL.md: every row of the table a client can provoke.

Each ERROR must be version 1, type 0xFF, flags 0, the documented request id (the
request's, or 0 when the request could not be read that far), and a UTF-8 JSON
object with ``code`` (string), ``message`` (string) and ``retriable`` (bool, as
the table says).
"""

from __future__ import annotations

import json
import struct

import pytest
import sfwire
import zmq
from sfwire import ERROR, ERROR_CODES, MAX_BODY, MAX_MESSAGE
from zmq.utils.monitor import recv_monitor_message

RID = 0x0A0B0C0D0E0F1011


def check_error(reply: sfwire.Reply, codes, request_id: int) -> dict:
    codes = (codes,) if isinstance(codes, str) else tuple(codes)
    assert (reply.version, reply.type, reply.flags) == (1, ERROR, 0), reply
    err = reply.json
    assert set(err) >= {"code", "message", "retriable"}, err
    assert isinstance(err["code"], str) and isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["retriable"], bool), err
    assert err["code"] in codes, f"expected {codes}, got {err}"
    assert err["retriable"] is ERROR_CODES[err["code"]], f"retriable flag differs from the doc's table: {err}"
    assert reply.request_id == request_id, f"request id {reply.request_id}, expected {request_id}: {err}"
    return err


def ask(sockets, *frames: bytes, kind=zmq.DEALER) -> sfwire.Reply:
    return sfwire.request(sockets(kind), *frames)


# -- bad_request ------------------------------------------------------------------------


@pytest.mark.parametrize("count", [0, 4097, 65536, 2**32 - 1])
def test_count_out_of_range(server, sockets, count):
    check_error(ask(sockets, sfwire.reserve(RID, count)), "bad_request", RID)


@pytest.mark.parametrize("type_", [0x00, 0x03, 0x7F, 0x81, 0x82, 0xFF])
def test_unknown_type(server, sockets, type_):
    # Reply types sent as requests are unknown request types too.
    body = struct.pack("!BBHQI", 1, type_, 0, RID, 1)
    check_error(ask(sockets, body), "bad_request", RID)


@pytest.mark.parametrize("flags", [0x0002, 0x0004, 0x0100, 0x8000, 0xFFFE])
def test_unknown_flags_on_reserve(server, sockets, flags):
    check_error(ask(sockets, sfwire.reserve(RID, 1, flags=flags)), "bad_request", RID)


@pytest.mark.parametrize("flags", [0x0001, 0x0002, 0x8000])
def test_flags_on_status(server, sockets, flags):
    # Bit 0 (AFTER) is RESERVE only; all other bits must be 0.
    check_error(ask(sockets, sfwire.header(sfwire.STATUS, RID, flags=flags)), "bad_request", RID)


def test_after_flag_with_a_16_byte_body(server, sockets):
    """AFTER makes RESERVE 24 bytes; a 16-byte one is malformed."""
    check_error(ask(sockets, sfwire.reserve(RID, 1, flags=sfwire.FLAG_AFTER)), "bad_request", RID)


def after_reply(sockets):
    after = (1 << 62) + 12345  # far in the future: a supporting server cannot honour it now
    return after, ask(sockets, sfwire.reserve_after(RID, 10, after))


def test_a_token_far_ahead_is_refused_as_token_ahead_or_bad_request(server, sockets):
    _, reply = after_reply(sockets)
    assert reply.type == ERROR, reply
    code = reply.json["code"]
    assert code in ("token_ahead", "bad_request"), reply.json
    check_error(reply, code, RID)


def test_after_a_token_just_minted_every_id_sorts_after_it(server, sockets):
    sock = sockets()
    token, _ = sfwire.request(sock, sfwire.reserve(RID, 1)).block
    for n in (1, 100, 4096):
        reply = sfwire.request(sock, sfwire.reserve_after(RID, n, token))
        if reply.type == ERROR:
            assert reply.json["code"] == "bad_request"  # a server without causal tokens
            return
        first, count = reply.block
        assert first > token and 1 <= count <= n
        token = first + count - 1


@pytest.mark.parametrize(
    "body, rid",
    [
        (sfwire.reserve(RID, 1)[:15], RID),  # header complete: the id can be read
        (sfwire.reserve(RID, 1)[:12], RID),  # RESERVE without its count
        (sfwire.reserve_after(RID, 1, 5)[:23], RID),  # AFTER body one byte short
        (sfwire.status(RID)[:11], 0),  # too short to carry the request id
        (sfwire.status(RID)[:4], 0),
        (b"\x01", 0),  # version byte only
        (b"", 0),  # empty body frame
    ],
    ids=["reserve15", "reserve12", "after23", "status11", "status4", "version-only", "empty"],
)
def test_truncated_bodies(server, sockets, body, rid):
    check_error(ask(sockets, body), "bad_request", rid)


@pytest.mark.parametrize(
    "body",
    [sfwire.reserve(RID, 1) + b"\x00", sfwire.status(RID) + b"\x00", sfwire.reserve_after(RID, 1, 5) + b"\x00"],
    ids=["reserve17", "status13", "after25"],
)
def test_bodies_longer_than_their_type(server, sockets, body):
    check_error(ask(sockets, body), "bad_request", RID)


def test_255_byte_body_is_bad_request_not_too_large(server, sockets):
    body = sfwire.reserve(RID, 1) + b"\x00" * (MAX_BODY - 16)
    assert len(body) == 255
    check_error(ask(sockets, body), "bad_request", RID)


# -- framing ----------------------------------------------------------------------------

GOOD = sfwire.reserve(RID, 1)


@pytest.mark.parametrize(
    "frames",
    [
        [GOOD, GOOD],  # two non-empty frames
        [GOOD, b""],  # a trailing empty frame
        [b"", b"", GOOD],  # two delimiters
        [b"", GOOD, GOOD],  # delimiter, then two bodies
        [GOOD, GOOD, GOOD],
        [b"", b""],  # a delimiter and an empty body (or two delimiters, no body)
    ],
    ids=["body-body", "body-empty", "delim-delim-body", "delim-body-body", "three-bodies", "delim-delim"],
)
def test_extra_frames(server, sockets, frames):
    sock = sockets()
    sock.send_multipart(frames)
    reply_frames = sfwire.recv_frames(sock)
    # The reply is one body frame, after a delimiter when the request began with one.
    assert len(reply_frames) == (2 if frames[0] == b"" else 1), reply_frames
    check_error(sfwire.parse(sfwire.body_of(reply_frames)), "bad_request", 0)


def test_extra_frames_over_req(server, sockets):
    """A REQ socket only accepts a reply that carries its delimiter back."""
    check_error(ask(sockets, GOOD, GOOD, kind=zmq.REQ), "bad_request", 0)


def test_a_lone_empty_frame_is_an_empty_body_answered_without_a_delimiter(server, sockets):
    # One frame is the body, even an empty one: the reply is one frame, as to any body alone.
    sock = sockets()
    sock.send(b"")
    frames = sfwire.recv_frames(sock)
    assert len(frames) == 1 and frames[0] != b"", frames
    check_error(sfwire.parse(frames[0]), "bad_request", 0)


def test_error_reply_keeps_the_delimiter(server, sockets):
    sock = sockets()
    sock.send_multipart([b"", sfwire.reserve(RID, 0)])
    frames = sfwire.recv_frames(sock)
    assert len(frames) == 2 and frames[0] == b"", frames
    check_error(sfwire.parse(frames[1]), "bad_request", RID)


def test_error_over_req(server, sockets):
    check_error(ask(sockets, sfwire.reserve(RID, 4097), kind=zmq.REQ), "bad_request", RID)


# -- unsupported_version ------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 2, 3, 0x81, 255])
@pytest.mark.parametrize("type_", [sfwire.RESERVE, sfwire.STATUS])
def test_unsupported_version(server, sockets, version, type_):
    if type_ == sfwire.RESERVE:
        body = sfwire.reserve(RID, 1, version=version)
    else:
        body = sfwire.header(sfwire.STATUS, RID, version=version)
    check_error(ask(sockets, body), "unsupported_version", 0)


def test_unsupported_version_of_a_short_body(server, sockets):
    # The version is read before the size: too short and another version is unsupported_version.
    check_error(ask(sockets, b"\x02\x01"), "unsupported_version", 0)


# -- frame_too_large ------------------------------------------------------------------------


@pytest.mark.parametrize("size", [256, 1000, 4096, MAX_MESSAGE])
def test_frame_too_large(server, sockets, size):
    body = sfwire.reserve(RID, 1) + b"\x00" * (size - 16)
    # The header is readable, so the request id is echoed.
    check_error(ask(sockets, body), "frame_too_large", RID)


def test_frame_too_large_with_a_delimiter(server, sockets):
    sock = sockets()
    sock.send_multipart([b"", sfwire.status(RID) + b"\x00" * 300])
    frames = sfwire.recv_frames(sock)
    assert len(frames) == 2 and frames[0] == b""
    check_error(sfwire.parse(frames[1]), "frame_too_large", RID)


@pytest.mark.parametrize("size", [256, 1000])
def test_an_oversized_body_of_another_version_is_unsupported_version_with_request_id_0(server, sockets, size):
    # The version is read before the size ("Body layout": the order a server reads in).
    body = sfwire.reserve(RID, 1, version=2) + b"\x00" * (size - 16)
    check_error(ask(sockets, body), "unsupported_version", 0)


def test_message_over_64_kib_is_dropped_and_the_connection_closed(server, sockets):
    sock = sockets(timeout_ms=500, connect=False)
    monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    monitor.setsockopt(zmq.RCVTIMEO, 3000)
    sock.connect(server.endpoint)  # after the monitor, so that it sees the connection
    try:
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_CONNECTED
        sock.send(sfwire.reserve(RID, 1) + b"\x00" * (MAX_MESSAGE + 1 - 16))
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
        with pytest.raises(zmq.Again):
            sock.recv_multipart()  # no reply at all
    finally:
        sock.disable_monitor()
        monitor.close(0)
    # The server itself is unharmed.
    reply = ask(sockets, sfwire.reserve(RID + 1, 1))
    assert reply.type == sfwire.BLOCK and reply.request_id == RID + 1, reply


# -- no worker in rotation: unavailable -------------------------------------------------------


def test_unavailable_when_no_worker_is_in_rotation(stalled_server, sockets):
    sock = sockets(endpoint=stalled_server.endpoint)
    # More IDs than the broker answers from its own worker ID (PROTOCOL.md): only a worker may.
    err = check_error(sfwire.request(sock, sfwire.reserve(RID, 4096)), ERROR_CODES.keys(), RID)
    assert err["retriable"] is True, err
    assert err["code"] == "unavailable", err
    # STATUS is answered by the broker itself.
    st = sfwire.request(sock, sfwire.status(RID + 1)).json
    assert st["broker"]["workers_in_rotation"] == 0
    assert all(w["in_rotation"] is False for w in st["workers"]), st["workers"]


@pytest.mark.parametrize(
    "body",
    [
        sfwire.reserve(RID, 0),
        sfwire.reserve(RID, 4097),
        sfwire.reserve(RID, 1, flags=2),
        sfwire.reserve_after(RID, 0, 0),
    ],
    ids=["count0", "count4097", "flags2", "after-count0"],
)
def test_malformed_reserve_is_bad_request_even_when_no_worker_is_ready(stalled_server, sockets, body):
    reply = sfwire.request(sockets(endpoint=stalled_server.endpoint), body)
    check_error(reply, "bad_request", RID)


def test_error_json_is_an_object_with_exactly_typed_fields(server, sockets):
    reply = ask(sockets, sfwire.reserve(RID, 0))
    err = json.loads(reply.payload.decode("utf-8"))
    assert isinstance(err, dict)
    assert type(err["code"]) is str and type(err["message"]) is str and type(err["retriable"]) is bool


def test_overloaded_carries_a_retry_after_hint_in_milliseconds(server, sockets):
    # More RESERVEs at once than a connection may have in flight (1,024 by default):
    # the server accepts up to its limit and answers the rest `overloaded`.
    sock = sockets(timeout_ms=10_000)
    total = 1400
    for rid in range(1, total + 1):
        sock.send(sfwire.reserve(rid, 4096))
    codes, hints, blocks = {}, [], 0
    for _ in range(total):
        reply = sfwire.parse(sfwire.body_of(sfwire.recv_frames(sock)))
        if reply.type == ERROR:
            err = check_error(reply, "overloaded", reply.request_id)
            assert 1 <= reply.request_id <= total
            hint = err.get("retry_after_ms")
            assert type(hint) is int and 0 <= hint <= 60_000, err
            hints.append(hint)
            codes[err["code"]] = codes.get(err["code"], 0) + 1
        else:
            blocks += 1
    assert hints, "no request was answered overloaded"
    assert blocks >= 1024  # the limit's worth was served
