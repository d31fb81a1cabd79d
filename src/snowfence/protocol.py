"""Every byte snowfence puts on a wire: frame constants, encoders and decoders.

Client <-> broker (``docs/PROTOCOL.md`` is the full specification)
--------------------------------------------------------------------

A client talks to the broker's ROUTER socket from a DEALER (or REQ) socket.
A request is one body frame, optionally preceded by one empty delimiter frame
(REQ sockets add it); the reply carries the same delimiter, then one body.
Integers are big-endian. Every body starts with the same 12-byte header::

     0        1        2                 4                                   12
    +--------+--------+-----------------+-----------------------------------+
    |version | type   | flags           | request_id                        |
    +--------+--------+-----------------+-----------------------------------+
       u8       u8          u16                        u64

    RESERVE      0x01  header + count:u32                            (16 bytes)
                       flags bit 0 (AFTER): + after:u64             (24 bytes)
    STATUS       0x02  header                                        (12 bytes)
    TIME         0x03  header                                        (12 bytes)
    NODES        0x04  header                                        (12 bytes)
    WATERMARK    0x05  header                                        (12 bytes)
    BLOCK        0x81  header + first:u64 + count:u32                (24 bytes)
    STATUS_REPLY 0x82  header + UTF-8 JSON object
    TIME_REPLY   0x83  header + received:u64 + sent:u64 (Unix ns)    (28 bytes)
    NODES_REPLY  0x84  header + UTF-8 JSON {"cluster", "nodes": [...]}
    WATERMARK_REPLY 0x85 header + unix_ms:u64 + lowest:u64           (28 bytes)
    ERROR        0xFF  header + UTF-8 JSON {"code", "message", "retriable"}

A reply echoes the request's ``request_id``; 0 means the request could not be
read far enough to know it (too short, or another protocol version).

The fast port (plain TCP, beside the ROUTER)
--------------------------------------------

The same request and reply bodies on a plain TCP connection, each preceded by
its length (u32, big-endian); no delimiter frame. A request body longer than
``MAX_REQUEST_BYTES`` (or empty) ends the connection after one ERROR reply with
request_id 0, since nothing after it can be framed. See :class:`Stream`.

Broker <-> worker (internal; both ends ship together)
------------------------------------------------------

Workers connect DEALER sockets to the broker's backend ROUTER. Every message is
one frame whose first byte is its kind. A client request travels with its
return address (the client's routing id) so neither side keeps a table::

    broker -> worker  WORK     0x01 meta:u8 alen:u8 addr body
                      PING     0x02
                      STOP     0x03
    worker -> broker  STATE    0x11 JSON status (also the heartbeat; :class:`WorkerState`)
                      REPLY    0x12 meta:u8 alen:u8 addr reply_body
                      REFUSED  0x13 meta:u8 alen:u8 addr blen:u8 request_body error_body

``meta`` bit 7 says the client used a delimiter frame; bits 0-6 count how
many workers have refused this request so far.
"""

from __future__ import annotations

import dataclasses
import struct
import types
import typing
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from .errors import BadRequest, FrameTooLarge, SnowfenceError, UnsupportedVersion, from_code

VERSION = 1

# Message types, client <-> broker.
RESERVE = 0x01
STATUS = 0x02
TIME = 0x03
NODES = 0x04
WATERMARK = 0x05
BLOCK = 0x81
STATUS_REPLY = 0x82
NODES_REPLY = 0x84
TIME_REPLY = 0x83
WATERMARK_REPLY = 0x85
ERROR = 0xFF

FLAG_AFTER = 0x0001

#: The most IDs one RESERVE may ask for: one millisecond of the default layout.
MAX_BLOCK = 4096

#: Request bodies longer than this are refused without further reading.
MAX_REQUEST_BYTES = 255

HEADER = struct.Struct("!BBHQ")
_RESERVE = struct.Struct("!BBHQI")
_RESERVE_AFTER = struct.Struct("!BBHQIQ")
_BLOCK = struct.Struct("!BBHQQI")
_TIME_REPLY = struct.Struct("!BBHQQQ")
_WATERMARK_REPLY = struct.Struct("!BBHQQQ")

HEADER_SIZE = HEADER.size
RESERVE_SIZE = _RESERVE.size
RESERVE_AFTER_SIZE = _RESERVE_AFTER.size
BLOCK_SIZE = _BLOCK.size

_KNOWN_FLAGS = FLAG_AFTER


class Request(NamedTuple):
    """A client request, as read by a server."""

    type: int
    request_id: int
    count: int = 0
    after: int | None = None


class Reply(NamedTuple):
    """A server reply, as read by a client. ``error`` is set for ERROR replies."""

    type: int
    request_id: int
    first: int = 0
    count: int = 0
    status: dict | None = None
    error: SnowfenceError | None = None
    #: TIME_REPLY: the server's wall clock (Unix ns) when it received the request and when it replied.
    times: tuple[int, int] | None = None
    #: NODES_REPLY: ``{"cluster": ..., "nodes": [{"node", "endpoints", "region", ...}, ...]}``.
    nodes: dict | None = None
    #: WATERMARK_REPLY: (W in Unix ms, the lowest ID of W's millisecond in shard 0): no ID
    #: carrying an earlier millisecond is minted after this reply.
    watermark: tuple[int, int] | None = None


# -- endpoints ---------------------------------------------------------------------

#: ZeroMQ transports a ROUTER/DEALER pair can speak.
TRANSPORTS = ("tcp", "ipc", "inproc", "ws", "wss")
#: sizeof(sockaddr_un.sun_path) - 1: the longest ipc:// path the kernel takes.
IPC_PATH_MAX = 107


def with_scheme(endpoint: object, scheme: str = "tcp") -> object:
    """An endpoint to connect to as given, or ``host:port`` without a transport (as etcdctl
    and most tools take it) as ``tcp://host:port``; anything else is left for
    :func:`endpoint_problem` to say what is wrong with it."""
    if isinstance(endpoint, str) and endpoint and "://" not in endpoint and ":" in endpoint:
        return f"{scheme}://{endpoint}"
    return endpoint


def endpoint_problem(endpoint: object, *, bind: bool = False) -> str | None:
    """What is wrong with a ZeroMQ endpoint as snowfence uses it, or None.

    Checks what libzmq would reject (or worse, accept: it wraps a port above
    65535) without touching a socket: the transport, a tcp host and port, the
    length of an ipc path. ``bind`` allows the wildcards a bind takes (``*``).
    """
    if not isinstance(endpoint, str) or "://" not in endpoint:
        return f"{endpoint!r} is not a ZeroMQ endpoint such as tcp://127.0.0.1:5555 or ipc:///run/snowfence.sock"
    scheme, address = endpoint.split("://", 1)
    if scheme not in TRANSPORTS:
        return f"{endpoint!r}: unknown transport {scheme!r} (use {', '.join(TRANSPORTS)})"
    if not address or not address.isprintable() or any(c.isspace() for c in address):
        return f"{endpoint!r}: the address after {scheme}:// is empty or has spaces or control characters"
    if scheme == "ipc" and len(address.encode()) > IPC_PATH_MAX:
        return f"{endpoint!r}: an ipc path may have at most {IPC_PATH_MAX} bytes"
    if scheme in ("tcp", "ws", "wss"):
        hostport = address.split("/", 1)[0] if scheme != "tcp" else address
        host, sep, port = hostport.rpartition(":")
        if not sep or not host:
            return f"{endpoint!r}: a {scheme} endpoint needs host:port"
        if port == "*" and bind:
            return None
        if not (port.isascii() and port.isdigit()) or int(port) > 65535:
            return f"{endpoint!r}: the port must be a number 0..65535" + (" or *" if bind else "")
        if host == "*" and not bind:
            return f"{endpoint!r}: connect to a host, not *"
    return None


# -- the fast port's framing ------------------------------------------------------

_LENGTH = struct.Struct("!I")
#: The longest reply body a client reads from the fast port (a STATUS of a large node is tens of KB).
MAX_REPLY_BYTES = 16 * 1024 * 1024


def encode_stream(body: bytes) -> bytes:
    """One body as the fast port carries it: its length, then itself."""
    return _LENGTH.pack(len(body)) + body


class Stream:
    """The bodies in a byte stream of length-prefixed frames (the fast port's), sans I/O.

    ``feed(data)`` takes what a read returned and gives back the bodies it completed,
    in order; a partial frame waits for the next read. A length above ``max_bytes``
    (or 0) raises :class:`FrameTooLarge` or :class:`BadRequest`: the stream cannot be
    read further, and its connection is to be closed."""

    __slots__ = ("_buf", "max_bytes")

    def __init__(self, max_bytes: int) -> None:
        self._buf = b""
        self.max_bytes = max_bytes

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        out = []
        at, end = 0, len(buf)
        while end - at >= 4:
            (n,) = _LENGTH.unpack_from(buf, at)
            if n > self.max_bytes:
                self._buf = b""
                raise FrameTooLarge(f"a frame of {n} bytes on the fast port (at most {self.max_bytes})")
            if n == 0:
                self._buf = b""
                raise BadRequest("an empty frame on the fast port")
            if end - at - 4 < n:
                break
            out.append(buf[at + 4 : at + 4 + n])
            at += 4 + n
        self._buf = buf[at:] if at < end else b""
        return out

    @property
    def partial(self) -> bool:
        """Whether part of a frame is waiting for more bytes."""
        return bool(self._buf)


# -- client side ------------------------------------------------------------------


def encode_reserve(request_id: int, count: int, after: int | None = None) -> bytes:
    if after is None:
        return _RESERVE.pack(VERSION, RESERVE, 0, request_id, count)
    return _RESERVE_AFTER.pack(VERSION, RESERVE, FLAG_AFTER, request_id, count, after)


def unpack_block(body: bytes) -> tuple[int, int, int]:
    """``(request_id, first, count)`` of a BLOCK reply, for hot loops; raises
    ``struct.error`` or ``ValueError`` for anything else (then use :func:`decode_reply`)."""
    version, type_, _, request_id, first, count = _BLOCK.unpack(body)
    if version != VERSION or type_ != BLOCK:
        raise ValueError("not a BLOCK reply")
    return request_id, first, count


def encode_time(request_id: int) -> bytes:
    return HEADER.pack(VERSION, TIME, 0, request_id)


def encode_time_reply(request_id: int, received_ns: int, sent_ns: int) -> bytes:
    return _TIME_REPLY.pack(VERSION, TIME_REPLY, 0, request_id, received_ns, sent_ns)


def encode_watermark(request_id: int) -> bytes:
    return HEADER.pack(VERSION, WATERMARK, 0, request_id)


def encode_watermark_reply(request_id: int, unix_ms: int, lowest: int) -> bytes:
    return _WATERMARK_REPLY.pack(VERSION, WATERMARK_REPLY, 0, request_id, unix_ms, lowest)


def encode_status(request_id: int) -> bytes:
    return HEADER.pack(VERSION, STATUS, 0, request_id)


def decode_reply(body: bytes) -> Reply:
    """Read a reply body; raises :class:`BadRequest` if it is not one."""
    if len(body) < HEADER_SIZE:
        raise BadRequest(f"reply of {len(body)} bytes is shorter than the {HEADER_SIZE}-byte header")
    version, type_, _flags, request_id = HEADER.unpack_from(body)
    if version != VERSION:
        raise UnsupportedVersion(f"reply has protocol version {version}, expected {VERSION}")
    if type_ == BLOCK:
        if len(body) != BLOCK_SIZE:
            raise BadRequest(f"BLOCK reply of {len(body)} bytes, expected {BLOCK_SIZE}")
        _, _, _, _, first, count = _BLOCK.unpack(body)
        return Reply(BLOCK, request_id, first=first, count=count)
    if type_ == ERROR:
        try:
            data = orjson.loads(body[HEADER_SIZE:])
            err = from_code(str(data["code"]), str(data.get("message", "")), data.get("retriable"))
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise BadRequest("ERROR reply does not carry a JSON object with a code") from None
        retry_after = data.get("retry_after_ms")
        if isinstance(retry_after, int) and not isinstance(retry_after, bool) and 0 <= retry_after <= 60_000:
            err.retry_after_ms = retry_after
        return Reply(ERROR, request_id, error=err)
    if type_ == NODES_REPLY:
        try:
            nodes = orjson.loads(body[HEADER_SIZE:])
        except orjson.JSONDecodeError:
            raise BadRequest("NODES reply does not carry JSON") from None
        if not isinstance(nodes, dict) or not isinstance(nodes.get("nodes"), list):
            raise BadRequest("NODES reply does not carry a list of nodes")
        return Reply(NODES_REPLY, request_id, nodes=nodes)
    if type_ == STATUS_REPLY:
        try:
            status = orjson.loads(body[HEADER_SIZE:])
        except orjson.JSONDecodeError:
            raise BadRequest("STATUS reply does not carry JSON") from None
        return Reply(STATUS_REPLY, request_id, status=status)
    if type_ == TIME_REPLY:
        if len(body) != _TIME_REPLY.size:
            raise BadRequest(f"TIME reply of {len(body)} bytes, expected {_TIME_REPLY.size}")
        _, _, _, _, received, sent = _TIME_REPLY.unpack(body)
        return Reply(TIME_REPLY, request_id, times=(received, sent))
    if type_ == WATERMARK_REPLY:
        if len(body) != _WATERMARK_REPLY.size:
            raise BadRequest(f"WATERMARK reply of {len(body)} bytes, expected {_WATERMARK_REPLY.size}")
        _, _, _, _, unix_ms, lowest = _WATERMARK_REPLY.unpack(body)
        return Reply(WATERMARK_REPLY, request_id, watermark=(unix_ms, lowest))
    raise BadRequest(f"unknown reply type 0x{type_:02x}")


# -- server side ------------------------------------------------------------------


def request_id_of(body: bytes) -> int:
    """The request id of a body, or 0 if the body is too short to carry one."""
    if len(body) >= HEADER_SIZE:
        return HEADER.unpack_from(body)[3]
    return 0


def decode_request(body: bytes) -> Request:
    """Read a request body.

    Raises :class:`BadRequest` (or a subclass) for anything malformed; the error's
    ``request_id`` attribute holds the id to echo (0 if unreadable).
    """
    size = len(body)
    if size == 0:
        raise _with_id(BadRequest("empty request frame"), body)
    if body[0] != VERSION:
        # Another version's header need not have the request id where ours does.
        err = UnsupportedVersion(f"protocol version {body[0]} is not supported; this server speaks {VERSION}")
        err.request_id = 0
        raise err
    if size > MAX_REQUEST_BYTES:
        raise _with_id(FrameTooLarge(f"request of {size} bytes exceeds {MAX_REQUEST_BYTES}"), body)
    if size < HEADER_SIZE:
        raise _with_id(BadRequest(f"request of {size} bytes is shorter than the {HEADER_SIZE}-byte header"), body)
    _, type_, flags, request_id = HEADER.unpack_from(body)
    if flags & ~_KNOWN_FLAGS:
        raise _with_id(BadRequest(f"unknown flags 0x{flags:04x}"), body)
    if type_ == RESERVE:
        if flags & FLAG_AFTER:
            if size != RESERVE_AFTER_SIZE:
                raise _with_id(BadRequest(f"RESERVE with AFTER must be {RESERVE_AFTER_SIZE} bytes, got {size}"), body)
            _, _, _, _, count, after = _RESERVE_AFTER.unpack(body)
        else:
            if size != RESERVE_SIZE:
                raise _with_id(BadRequest(f"RESERVE must be {RESERVE_SIZE} bytes, got {size}"), body)
            _, _, _, _, count = _RESERVE.unpack(body)
            after = None
        if not 1 <= count <= MAX_BLOCK:
            raise _with_id(BadRequest(f"count must be 1..{MAX_BLOCK}, got {count}"), body)
        return Request(RESERVE, request_id, count, after)
    if type_ in (STATUS, TIME, NODES, WATERMARK):
        if size != HEADER_SIZE or flags:
            raise _with_id(
                BadRequest(f"STATUS, TIME, NODES and WATERMARK must be {HEADER_SIZE} bytes without flags"), body
            )
        return Request(type_, request_id)
    raise _with_id(BadRequest(f"unknown request type 0x{type_:02x}"), body)


def _with_id(err: SnowfenceError, body: bytes) -> SnowfenceError:
    err.request_id = request_id_of(body)
    return err


def plain_reserve(body: bytes) -> tuple[int, int] | None:
    """``(request_id, count)`` of a well-formed RESERVE without flags, else None.

    The hot path's shortcut: anything it does not accept goes through
    :func:`decode_request`, which says what is wrong.
    """
    if len(body) == RESERVE_SIZE:
        version, type_, flags, request_id, count = _RESERVE.unpack(body)
        if version == VERSION and type_ == RESERVE and not flags and 0 < count <= MAX_BLOCK:
            return request_id, count
    return None


def encode_block(request_id: int, first: int, count: int) -> bytes:
    return _BLOCK.pack(VERSION, BLOCK, 0, request_id, first, count)


def encode_nodes(request_id: int) -> bytes:
    return HEADER.pack(VERSION, NODES, 0, request_id)


def encode_nodes_reply(request_id: int, nodes: dict) -> bytes:
    return HEADER.pack(VERSION, NODES_REPLY, 0, request_id) + orjson.dumps(nodes)


def encode_status_reply(request_id: int, status: dict) -> bytes:
    return HEADER.pack(VERSION, STATUS_REPLY, 0, request_id) + orjson.dumps(status)


def encode_error(request_id: int, err: SnowfenceError) -> bytes:
    return HEADER.pack(VERSION, ERROR, 0, request_id) + orjson.dumps(err.to_wire())


# -- broker <-> worker ---------------------------------------------------------------

WORK = 0x01
PING = 0x02
STOP = 0x03
#: The node's clock against its peers': ``CLOCK`` alone, it agrees (or is not judged);
#: ``CLOCK`` + UTF-8 text, it disagrees, and why. Sent on every change and to each new worker.
CLOCK = 0x04
STATE = 0x11
REPLY = 0x12
REFUSED = 0x13

#: ``meta`` bit saying the client framed its request with an empty delimiter.
META_DELIMITED = 0x80
META_TRIES = 0x7F

PING_FRAME = bytes((PING,))
STOP_FRAME = bytes((STOP,))


def encode_clock(veto: str | None) -> bytes:
    return bytes((CLOCK,)) + (veto.encode() if veto else b"")


def decode_clock(frame: bytes) -> str | None:
    """Why the node's clock disagrees with its peers, or None if it does not."""
    return frame[1:].decode(errors="replace") or None


def encode_work(meta: int, addr: bytes, body: bytes) -> bytes:
    return b"\x01%c%c%b%b" % (meta, len(addr), addr, body)


def split_routed(frame: bytes) -> tuple[int, bytes, bytes]:
    """``(meta, addr, rest)`` of a WORK, REPLY or REFUSED frame."""
    end = 3 + frame[2]
    return frame[1], frame[3:end], frame[end:]


def encode_reply(meta: int, addr: bytes, reply: bytes) -> bytes:
    return b"\x12%c%c%b%b" % (meta, len(addr), addr, reply)


def encode_refused(meta: int, addr: bytes, request: bytes, error_reply: bytes) -> bytes:
    return b"\x13%c%c%b%c%b%b" % (meta, len(addr), addr, len(request), request, error_reply)


def split_refused(rest: bytes) -> tuple[bytes, bytes]:
    """``(request_body, error_reply)`` from the ``rest`` of a REFUSED frame."""
    end = 1 + rest[0]
    return rest[1:end], rest[end:]


# -- the STATE payload ----------------------------------------------------------------------


class BadState(ValueError):
    """A STATE payload that is not JSON, not an object, or has a field of the wrong type."""


_NUMBER = (int, float)


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _kinds(hint: object) -> tuple[type, ...]:
    """The JSON types a field's annotation admits (a float admits an int; None is the default's)."""
    kinds: list[type] = []
    for arg in typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,):
        if arg is type(None):
            continue
        origin = typing.get_origin(arg) or arg
        kinds += _NUMBER if origin is float else (list if origin is tuple else origin,)
    return tuple(dict.fromkeys(kinds))


def _wire(cls: type) -> dict[str, tuple[dataclasses.Field, tuple[type, ...]]]:
    """A STATE dataclass's fields on the wire, each with the JSON types its annotation admits.

    The annotation is the one declaration of a field's type; fields marked
    ``local`` (what the reader adds) are not on the wire."""
    hints = typing.get_type_hints(cls)
    return {f.name: (f, _kinds(hints[f.name])) for f in dataclasses.fields(cls) if not f.metadata.get("local")}


def _read(cls: type, obj: dict) -> dict:
    """The fields of ``cls`` from ``obj``: each the type its annotation says, or its default if absent."""
    out = {}
    for name, (f, kinds) in cls._WIRE.items():
        value = obj.get(name, None)
        if value is None:
            out[name] = _default(f)
            if f.default is not None and name in obj:
                raise BadState(f"STATE field {name!r} is null, not {'/'.join(k.__name__ for k in kinds)}")
            continue
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise BadState(f"STATE field {name!r} is {type(value).__name__}, not {'/'.join(k.__name__ for k in kinds)}")
        out[name] = value
    return out


_LOCAL = {"local": True}


@dataclass(frozen=True)
class HeldState:
    """One worker ID a worker holds, as its STATE reports it.

    The lease's store adds fields of its own (``store``, ``lease_id``,
    ``lease_ttl_s``): those travel in ``extra`` and come back out of
    :meth:`to_dict` for STATUS."""

    worker_id: int | None = None
    state: str = "claiming"
    token: int | None = None
    last_ms: int | None = None
    reserved_until_ms: int | None = None
    reservation_headroom_ms: float | None = None
    fence_in_s: float | None = None
    lease_remaining_s: float | None = None
    renewal_failures: int = 0
    renewed_ago_s: float | None = None
    last_renewal_latency_s: float | None = None
    #: The store's own fields, by design not declared here.
    extra: dict = field(default_factory=dict, metadata=_LOCAL)

    @classmethod
    def from_json(cls, obj: object) -> HeldState:
        if not isinstance(obj, dict):
            raise BadState(f"a STATE 'held' entry is {type(obj).__name__}, not an object")
        return cls(**_read(cls, obj), extra={k: v for k, v in obj.items() if k not in cls._WIRE})

    def to_dict(self) -> dict:
        out = {name: getattr(self, name) for name in self._WIRE}
        return {**out, **self.extra}


@dataclass(frozen=True)
class WorkerState:
    """What a worker reports in every STATE frame (its heartbeat, and on every change).

    Written by the worker's core, read by the router (rotation, room, STATUS),
    the metrics (counters, step-back and minting-time histograms, gauges) and,
    through STATUS, ``snowfence status``. A field missing from the JSON takes
    its default; a field of the wrong type makes the whole payload a
    :class:`BadState`; a key this version does not know (a worker of another
    version) is named in ``unknown``, for the reader to count and log, and the
    rest is read."""

    slot: int = -1
    pid: int = 0
    #: The worker's own state: ``claiming``, ``ready``, ``stopping``, or its first worker ID's.
    state: str = "claiming"
    #: Whether the worker takes requests now.
    ready: bool = False
    #: Worker IDs ready to mint: the worker's minting rate, in sequences per millisecond.
    ready_ids: int = 0
    #: Requests the broker may queue at the worker at once.
    credits: int = 1
    #: Why it is not ready, in words.
    reason: str | None = None
    held: tuple[HeldState, ...] = ()
    #: Monotonic counts since the worker process started.
    counters: dict = field(default_factory=dict)
    #: Steps back of the wall clock: ``le`` bucket bounds, cumulative ``counts``, ``sum_ms``, ``count``.
    step_back_ms: dict | None = None
    #: The kernel's view of the wall clock (``synchronized``, ``max_error_s``, ``est_error_s``, ``state``).
    kernel_clock: dict | None = None
    #: How far the wall clock is ahead after a forward jump.
    clock_ahead_ms: float = 0
    #: Worker IDs the store passed over when claiming: ``worker_id`` and ``reason`` each.
    passed_over: list = field(default_factory=list)
    #: What the store forgot or went back on, by the node's journal: claims are refused until a restore is accepted.
    store_problem: str | None = None
    #: Minting times by request kind: ``le`` bucket bounds (ns), and per kind in
    #: ``kinds`` its ``counts`` (one per bucket, then the overflow) and ``sum_ns``.
    mint_ns: dict | None = None
    #: Keys of the payload this version does not know (not on the wire).
    unknown: tuple[str, ...] = field(default=(), metadata=_LOCAL)

    @classmethod
    def from_json(cls, obj: object) -> WorkerState:
        if not isinstance(obj, dict):
            raise BadState(f"a STATE payload is {type(obj).__name__}, not an object")
        known = _read(cls, obj)
        for key, value in known["counters"].items():
            if isinstance(value, bool) or not isinstance(value, _NUMBER):
                raise BadState(f"STATE counter {key!r} is {type(value).__name__}, not a number")
        hist = known["step_back_ms"]
        if hist is not None and not (
            _is_numbers(hist.get("le"))
            and _is_numbers(hist.get("counts"))
            and len(hist["counts"]) >= len(hist["le"])
            and isinstance(hist.get("sum_ms"), _NUMBER)
        ):
            raise BadState("STATE field 'step_back_ms' is not a histogram (le, counts, sum_ms)")
        mint = known["mint_ns"]
        if mint is not None and not _is_histograms(mint):
            raise BadState("STATE field 'mint_ns' is not histograms by kind (le, kinds: counts, sum_ns)")
        if not all(isinstance(p, dict) and isinstance(p.get("worker_id"), int) for p in known["passed_over"]):
            raise BadState("STATE field 'passed_over' is not a list of objects with a worker_id")
        known["held"] = tuple(HeldState.from_json(h) for h in known["held"])
        unknown = tuple(sorted(k for k in obj if k not in cls._WIRE))
        return cls(**known, unknown=unknown)

    def to_dict(self) -> dict:
        out = {name: getattr(self, name) for name in self._WIRE}
        out["held"] = [h.to_dict() for h in self.held]
        return out


HeldState._WIRE = _wire(HeldState)
WorkerState._WIRE = _wire(WorkerState)


def _is_numbers(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, _NUMBER) and not isinstance(v, bool) for v in value)


def _is_histograms(value: dict) -> bool:
    """``{"le": [...], "kinds": {kind: {"counts": [...], "sum_ns": n}}}``, a count per bucket and the overflow."""
    le, kinds = value.get("le"), value.get("kinds")
    return (
        _is_numbers(le)
        and isinstance(kinds, dict)
        and all(
            isinstance(h, dict)
            and _is_numbers(h.get("counts"))
            and len(h["counts"]) == len(le) + 1
            and isinstance(h.get("sum_ns"), _NUMBER)
            and not isinstance(h["sum_ns"], bool)
            for h in kinds.values()
        )
    )


def encode_state(status: WorkerState) -> bytes:
    return b"\x11" + orjson.dumps(status.to_dict())


def decode_state(frame: bytes) -> WorkerState:
    """The payload of a STATE frame; :class:`BadState` for anything else."""
    try:
        obj = orjson.loads(frame[1:])
    except orjson.JSONDecodeError as exc:
        raise BadState(f"a STATE payload is not JSON: {exc}") from None
    return WorkerState.from_json(obj)
