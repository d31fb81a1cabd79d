"""WATERMARK and WATERMARK_REPLY, per docs/PROTOCOL.md: the header, the 28-byte reply, what
``lowest`` is, the promise (every ID reserved after the reply is at or above it), and the
errors (flags, size; a server that has promised nothing yet)."""

from __future__ import annotations

import struct
import time

import sfwire
from sfwire import ERROR, WATERMARK, WATERMARK_REPLY


def ask(sock, rid: int):
    """The reply to one WATERMARK; (unix_ms, lowest), or the ERROR reply."""
    reply = sfwire.request(sock, sfwire.header(WATERMARK, rid))
    assert (reply.version, reply.flags, reply.request_id) == (1, 0, rid), reply
    if reply.type == ERROR:
        return reply
    assert reply.type == WATERMARK_REPLY and len(reply.payload) == 16, reply
    return struct.unpack("!QQ", reply.payload)


def first_promise(sock) -> tuple[int, int]:
    deadline = time.monotonic() + 30
    while True:
        answer = ask(sock, 1)
        if isinstance(answer, tuple):
            return answer
        err = answer.json
        assert err["code"] == "watermark_unavailable" and err["retriable"] is True, err
        assert time.monotonic() < deadline, "no watermark within 30 s"
        time.sleep(0.2)


def test_watermark_reply_is_the_promise_and_every_later_id_is_at_or_above_lowest(server, sockets, layout):
    sock = sockets()
    unix_ms, lowest = first_promise(sock)
    assert sfwire.watermark_breaches(layout, unix_ms, lowest, []) == []
    assert abs(unix_ms - time.time() * 1000) < 60_000
    for rid in range(2, 40):
        unix_ms, lowest = ask(sock, rid)
        first, count = sfwire.request(sock, sfwire.reserve(1000 + rid, 4096)).block
        assert sfwire.watermark_breaches(layout, unix_ms, lowest, [first, first + count - 1]) == []


def test_watermark_with_flags_or_a_body_is_a_bad_request(server, sockets):
    sock = sockets()
    for body in (sfwire.header(WATERMARK, 9, flags=1), sfwire.header(WATERMARK, 9) + b"\0"):
        reply = sfwire.request(sock, body)
        assert reply.type == ERROR and reply.request_id == 9, reply
        assert reply.json["code"] == "bad_request" and reply.json["retriable"] is False
