"""The client side of ``docs/PROTOCOL.md``, written from the document alone.

Nothing here imports ``snowfence``: the conformance suite must catch a server
that drifts from the document, so it may not share the server's own encoders.
Only pyzmq, ``struct`` and ``json`` are used.
"""

from __future__ import annotations

import json
import socket as _socket
import struct
from dataclasses import dataclass

import zmq

VERSION = 1

RESERVE = 0x01
STATUS = 0x02
TIME = 0x03
NODES = 0x04
WATERMARK = 0x05
BLOCK = 0x81
STATUS_REPLY = 0x82
TIME_REPLY = 0x83
NODES_REPLY = 0x84
WATERMARK_REPLY = 0x85
ERROR = 0xFF

FLAG_AFTER = 0x0001

MAX_COUNT = 4096
MAX_BODY = 255
#: Messages larger than this are dropped by the broker's transport.
MAX_MESSAGE = 64 * 1024
#: A causal token must be below this (bit 63 is never set in an ID).
TOKEN_LIMIT = 1 << 63

#: version:u8 type:u8 flags:u16 request_id:u64, big-endian ("network order").
HEADER = struct.Struct("!BBHQ")
HEADER_SIZE = HEADER.size  # 12
RESERVE_BODY = struct.Struct("!BBHQI")  # 16
RESERVE_AFTER_BODY = struct.Struct("!BBHQIQ")  # 24
BLOCK_BODY = struct.Struct("!BBHQQI")  # 24

#: Error codes of the doc's table, with their ``retriable`` column.
ERROR_CODES = {
    "bad_request": False,
    "unsupported_version": False,
    "frame_too_large": False,
    "fenced": True,
    "clock_unsafe": True,
    "reservation_expired": True,
    "unavailable": True,
    "overloaded": True,
    "token_ahead": True,
    "watermark_unavailable": True,
    "internal": False,
}

WORKER_STATES = {"claiming", "waiting", "ready", "fenced", "clock_unsafe", "reserving", "stopping", "silent"}


# -- requests -----------------------------------------------------------------------


def header(type_: int, request_id: int, flags: int = 0, version: int = VERSION) -> bytes:
    return HEADER.pack(version, type_, flags, request_id)


def reserve(request_id: int, count: int, flags: int = 0, version: int = VERSION) -> bytes:
    return RESERVE_BODY.pack(version, RESERVE, flags, request_id, count)


def reserve_after(request_id: int, count: int, after: int) -> bytes:
    return RESERVE_AFTER_BODY.pack(VERSION, RESERVE, FLAG_AFTER, request_id, count, after)


def status(request_id: int) -> bytes:
    return header(STATUS, request_id)


def nodes(request_id: int) -> bytes:
    return header(NODES, request_id)


# -- replies --------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    version: int
    type: int
    flags: int
    request_id: int
    payload: bytes  # everything after the 12-byte header

    @property
    def block(self) -> tuple[int, int]:
        """``(first, count)`` of a BLOCK reply (which must be exactly 24 bytes)."""
        assert self.type == BLOCK, f"expected BLOCK (0x81), got type 0x{self.type:02x}: {self.payload[:200]!r}"
        assert len(self.payload) == BLOCK_BODY.size - HEADER_SIZE, f"BLOCK of {HEADER_SIZE + len(self.payload)} bytes"
        return struct.unpack("!QI", self.payload)

    @property
    def json(self) -> dict:
        """The UTF-8 JSON object of a STATUS_REPLY, NODES_REPLY or ERROR."""
        assert self.type in (STATUS_REPLY, NODES_REPLY, ERROR), f"type 0x{self.type:02x} carries no JSON"
        value = json.loads(self.payload.decode("utf-8"))
        assert isinstance(value, dict), f"expected a JSON object, got {type(value).__name__}"
        return value

    def __repr__(self) -> str:
        return (
            f"Reply(version={self.version}, type=0x{self.type:02x}, flags={self.flags}, "
            f"request_id={self.request_id}, payload={self.payload[:160]!r})"
        )


def parse(body: bytes) -> Reply:
    assert len(body) >= HEADER_SIZE, f"reply body of {len(body)} bytes is shorter than the header: {body!r}"
    version, type_, flags, request_id = HEADER.unpack_from(body)
    return Reply(version, type_, flags, request_id, body[HEADER_SIZE:])


def body_of(frames: list[bytes]) -> bytes:
    """The body of a reply received on a DEALER socket: one frame, or an empty delimiter and one frame."""
    assert frames and len(frames) <= 2, f"a reply is one body frame, optionally after a delimiter: {frames!r}"
    if len(frames) == 2:
        assert frames[0] == b"", f"the first of two reply frames must be an empty delimiter: {frames!r}"
    return frames[-1]


# -- the ID layout --------------------------------------------------------------------


@dataclass(frozen=True)
class Decoded:
    id: int
    unix_ms: int
    region: int
    worker: int
    sequence: int
    shard: int = 0


@dataclass(frozen=True)
class Layout:
    epoch_ms: int
    time_bits: int
    region_bits: int
    worker_bits: int
    sequence_bits: int
    shard_bits: int = 0

    @classmethod
    def of(cls, status_reply: dict) -> Layout:
        lay = status_reply["layout"]
        return cls(
            int(lay["epoch_ms"]),
            int(lay["time_bits"]),
            int(lay["region_bits"]),
            int(lay["worker_bits"]),
            int(lay["sequence_bits"]),
            int(lay.get("shard_bits", 0)),
        )

    @property
    def time_shift(self) -> int:
        return self.sequence_bits + self.worker_bits + self.region_bits

    @property
    def shard_shift(self) -> int:
        return self.time_shift + self.time_bits

    def shard_of(self, region: int, worker: int) -> int:
        """The shard of a worker ID, by the document's formula."""
        if not self.shard_bits:
            return 0
        key = (region << 20) | worker
        return ((key * 0x9E3779B97F4A7C15) % 2**64) >> (64 - self.shard_bits)

    def compose(self, shard: int, unix_ms: int, region: int, worker: int, sequence: int = 0) -> int:
        """An ID of these fields (any shard: a token need not be one this layout's hash gives)."""
        return (
            (shard << self.shard_shift)
            | ((unix_ms - self.epoch_ms) << self.time_shift)
            | (region << (self.sequence_bits + self.worker_bits))
            | (worker << self.sequence_bits)
            | sequence
        )

    def decode(self, id_: int) -> Decoded:
        seq_mask = (1 << self.sequence_bits) - 1
        worker_shift = self.sequence_bits
        region_shift = worker_shift + self.worker_bits
        time_shift = region_shift + self.region_bits
        return Decoded(
            id=id_,
            unix_ms=((id_ >> time_shift) & ((1 << self.time_bits) - 1)) + self.epoch_ms,
            region=(id_ >> region_shift) & ((1 << self.region_bits) - 1),
            worker=(id_ >> worker_shift) & ((1 << self.worker_bits) - 1),
            sequence=id_ & seq_mask,
            shard=id_ >> self.shard_shift,
        )


# -- ID forms (docs/GUIDE.md, "ID forms: UUIDv7 and base32") ---------------------------------

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def uuid_tag(layout: Layout) -> int:
    """The layout tag: the first 12 bits of the SHA-256 of the guide's text of six fields."""
    import hashlib

    text = (
        f"epoch_ms={layout.epoch_ms},region_bits={layout.region_bits},sequence_bits={layout.sequence_bits},"
        f"shard_bits={layout.shard_bits},time_bits={layout.time_bits},worker_bits={layout.worker_bits}"
    )
    return int.from_bytes(hashlib.sha256(text.encode("ascii")).digest()[:2], "big") >> 4


def id_of_uuid(text: str, layout: Layout) -> int:
    """The ID of a UUIDv7 of ``layout``, per the guide's bit placement; asserts every fixed field."""
    n = int(text.replace("-", ""), 16)
    assert len(text) == 36 and text == text.lower() and [len(p) for p in text.split("-")] == [8, 4, 4, 4, 12], text
    unix_ms, version, tag, variant = n >> 80, n >> 76 & 0xF, n >> 64 & 0xFFF, n >> 62 & 0b11
    assert (version, variant, tag) == (7, 0b10, uuid_tag(layout)), text
    k = 63 - layout.time_bits
    rand_b = n & (2**62 - 1)
    assert rand_b >> k == 0, f"{text}: bits above the ID's {k} low bits are not zeros"
    low = rand_b & ((1 << k) - 1)
    shard, rest = low >> layout.time_shift, low & ((1 << layout.time_shift) - 1)
    return (shard << layout.shard_shift) | ((unix_ms - layout.epoch_ms) << layout.time_shift) | rest


def id_of_base32(text: str) -> int:
    """The ID of its 13 characters of Crockford base32 (uppercase, zero-padded)."""
    assert len(text) == 13 and all(c in CROCKFORD for c in text), text
    value = 0
    for c in text:
        value = value * 32 + CROCKFORD.index(c)
    return value


# -- sockets --------------------------------------------------------------------------


def watermark_breaches(layout: Layout, unix_ms: int, lowest: int, later_ids) -> list[str]:
    """What breaks a WATERMARK reply's promise (docs/PROTOCOL.md), each said in a line:
    ``lowest`` that is not the first ID of ``unix_ms`` (shard 0), and each ID reserved after
    the reply that is below ``lowest`` or carries a millisecond below ``unix_ms`` (an ID of a
    higher shard is above ``lowest`` whatever its time). Empty when the promise held."""
    out = []
    if lowest != layout.compose(0, unix_ms, 0, 0):
        out.append(f"lowest {lowest} is not the first ID of {unix_ms} ms, {layout.compose(0, unix_ms, 0, 0)}")
    for id_ in later_ids:
        ms = layout.decode(id_).unix_ms
        if id_ < lowest or ms < unix_ms:
            out.append(f"ID {id_} ({ms} ms) reserved after the watermark {unix_ms} ms (lowest {lowest}) is below it")
    return out


def held_entries(status: dict) -> list[dict]:
    """Every held worker ID's entry in a STATUS_REPLY: the workers' and the broker's own."""
    own = (status.get("broker") or {}).get("own_worker_id") or {}
    return [w for w in status["workers"] if w.get("worker_id") is not None] + list(own.get("held", []))


def held_worker_ids(status: dict) -> set[int]:
    """The worker IDs a STATUS_REPLY says the server holds: its workers' and the broker's
    own (``broker.own_worker_id``, which answers small requests; PROTOCOL.md)."""
    own = (status.get("broker") or {}).get("own_worker_id") or {}
    return {w["worker_id"] for w in status["workers"] if w.get("worker_id") is not None} | {
        h["worker_id"] for h in own.get("held", [])
    }


def socket(ctx: zmq.Context, kind: int = zmq.DEALER, timeout_ms: int = 3000) -> zmq.Socket:
    """A socket whose sends and receives give up after ``timeout_ms`` and that never lingers."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
    sock.setsockopt(zmq.SNDTIMEO, timeout_ms)
    return sock


def connect(ctx: zmq.Context, endpoint: str, kind: int = zmq.DEALER, timeout_ms: int = 3000) -> zmq.Socket:
    sock = socket(ctx, kind, timeout_ms)
    sock.connect(endpoint)
    return sock


def recv_frames(sock: zmq.Socket, what: str = "a reply") -> list[bytes]:
    try:
        return sock.recv_multipart()
    except zmq.Again:
        raise AssertionError(f"no reply within the socket's receive timeout, waiting for {what}") from None


def request(sock: zmq.Socket, *frames: bytes) -> Reply:
    """Send one request message, return the parsed reply (a DEALER or a REQ socket)."""
    sock.send_multipart(list(frames))
    return parse(body_of(recv_frames(sock, f"the reply to {frames!r}"[:200])))


# -- the fast port (plain TCP) --------------------------------------------------------------

#: The fast port's framing: each body after its length, a u32, big-endian.
LENGTH = struct.Struct("!I")


def framed(body: bytes) -> bytes:
    """A body as the fast port carries it."""
    return LENGTH.pack(len(body)) + body


class FastConn:
    """One plain TCP connection to a fast port: bodies out, replies in (by their length prefix)."""

    def __init__(self, host: str, port: int, timeout_s: float = 3.0) -> None:
        self.sock = _socket.create_connection((host, port), timeout=timeout_s)
        self.buf = b""
        #: Why the last :meth:`replies` stopped: ``"eof"`` (the server closed), ``"timeout"``.
        self.ended: str | None = None

    def send(self, *bodies: bytes) -> None:
        self.sock.sendall(b"".join(framed(b) for b in bodies))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _frames(self) -> list[Reply]:
        out = []
        while len(self.buf) >= LENGTH.size:
            (n,) = LENGTH.unpack_from(self.buf)
            if len(self.buf) < LENGTH.size + n:
                break
            out.append(parse(self.buf[LENGTH.size : LENGTH.size + n]))
            self.buf = self.buf[LENGTH.size + n :]
        return out

    def replies(self, n: int | None = None, timeout_s: float = 3.0) -> list[Reply]:
        """Replies until ``n`` have come, the server closes the connection, or ``timeout_s`` passes."""
        self.sock.settimeout(timeout_s)
        out = self._frames()
        while n is None or len(out) < n:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                self.ended = "timeout"
                return out
            except ConnectionResetError:
                data = b""
            if not data:
                self.ended = "eof"
                return out
            self.buf += data
            out += self._frames()
        self.ended = None
        return out

    def request(self, body: bytes) -> Reply:
        self.send(body)
        got = self.replies(1)
        assert got, f"no reply on the fast port ({self.ended}) to {body!r}"
        return got[0]

    def close(self) -> None:
        self.sock.close()
