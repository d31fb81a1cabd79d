"""The HTTP door's requests and answers, with no socket.

An HTTP request (method, target, body) becomes a :class:`Request` (:func:`route`): what it
asks for (IDs, STATUS, NODES, WATERMARK), or its answer at once where the door answers
itself (an error; ``/v1/bounds``, from the layout). :func:`ask` turns it into the binary
request bodies every door hands to the routing core's intake (RESERVEs of up to 4,096,
or one STATUS, NODES or WATERMARK), :func:`take_reply` takes each binary reply in (a
partial grant is asked for again), and :func:`render` makes the JSON answer. When an
answer is overdue, and the door's other timers, :class:`Timeouts` decides on the times
it is given. ``broker/doors/http.py`` reads and writes the bytes (docs/HTTP.md).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Iterable
from urllib.parse import unquote_plus

import httptools
import orjson

from ... import protocol
from ...errors import BadRequest, SnowfenceError, Unavailable
from ...ids import Layout, to_base32

#: IDs one request may ask for.
MAX_COUNT = 100_000
#: How often the door's timers are looked at (seconds).
SCAN_S = 0.5
#: A request must be read in full within this long once its first byte came (408).
REQUEST_READ_S = 10.0
#: An answer not complete within this long is a 503 ``unavailable`` (a worker died with it, say).
ANSWER_S = 5.0
#: A connection with nothing read or written for this long is closed.
IDLE_S = 60.0
#: How long a connection ended by the door is read after its answer.
LINGER_S = 1.0

_BLOCK_UNPACK = struct.Struct("!QI").unpack_from
_WATERMARK_UNPACK = struct.Struct("!QQ").unpack_from
_BLOCK = protocol.BLOCK
_ERROR = protocol.ERROR
_encode_reserve = protocol.encode_reserve

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
#: The HTTP status of each binary error code; a code not here: 503 if retriable, else 500.
STATUS_OF_CODE = {
    "bad_request": 400,
    "unsupported_version": 400,
    "frame_too_large": 413,
    "overloaded": 429,
    "internal": 500,
}

#: The kinds of request: IDs, STATUS, NODES, WATERMARK, and one the door answered itself.
IDS, STATUS, NODES, WATERMARK, DONE = range(5)
_PATHS = {b"/v1/ids": IDS, b"/v1/status": STATUS, b"/v1/nodes": NODES, b"/v1/watermark": WATERMARK}
_ENCODE = {STATUS: protocol.encode_status, NODES: protocol.encode_nodes, WATERMARK: protocol.encode_watermark}


# -- answers as bytes ----------------------------------------------------------------------


def response(status: int, body: bytes, *, close: bool = False, keep_alive_10: bool = False, extra: str = "") -> bytes:
    """A whole HTTP/1.1 response with a JSON body; never cached (every ID is new)."""
    conn = "Connection: close\r\n" if close else ("Connection: keep-alive\r\n" if keep_alive_10 else "")
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\n{conn}{extra}\r\n"
    )
    return head.encode() + body


def error_body(err: SnowfenceError) -> bytes:
    return orjson.dumps(err.to_wire())


def status_of(err: SnowfenceError) -> int:
    return STATUS_OF_CODE.get(err.code, 503 if err.retriable else 500)


def retry_after_header(err: SnowfenceError) -> str:
    """``Retry-After`` in whole seconds (``retry_after_ms`` rounded up), for a retriable error."""
    if not err.retriable:
        return ""
    ms = err.retry_after_ms if err.retry_after_ms is not None else 1000
    return f"Retry-After: {max(1, math.ceil(ms / 1000))}\r\n"


#: ``@dddd","`` for every four-digit suffix: an ID list is slices of this with ``@``
#: replaced by the ID's leading digits (IDs of a block are consecutive integers).
_SUFFIXES = b"".join(b'@%04d","' % i for i in range(10_000))


def ids_json(blocks: list[tuple[int, int]]) -> bytes:
    """``{"ids": ["...", ...]}``: every ID of the blocks as a decimal string, in order.

    About 25 ns an ID: 100,000 take 2.6 ms of the loop, where ``str`` and ``join`` take 19 ms."""
    if len(blocks) == 1 and blocks[0][1] == 1:
        return b'{"ids":["%d"]}' % blocks[0][0]
    parts = []
    for first, count in blocks:
        n, end = first, first + count
        while n < end:
            prefix, low = divmod(n, 10_000)
            stop = min(end, (prefix + 1) * 10_000)
            if prefix:
                parts.append(_SUFFIXES[low * 8 : (low + stop - n) * 8].replace(b"@", b"%d" % prefix))
            else:  # IDs below 10,000 (a layout of few bits, a test): no leading digits to share
                parts.append(b"".join(b'%d","' % i for i in range(n, stop)))
            n = stop
    return b'{"ids":["' + b"".join(parts)[:-2] + b"]}"  # each part ends '","': keep its quote


def blocks_json(blocks: list[tuple[int, int]]) -> bytes:
    return orjson.dumps({"blocks": [{"first": str(first), "count": count} for first, count in blocks]})


# -- requests ------------------------------------------------------------------------------


class Request:
    """One HTTP request, from parsed to answered."""

    __slots__ = ("kind", "close", "ka10", "want", "blocks", "got", "rids", "done", "out", "status", "answer", "scans")

    def __init__(self, kind: int, close: bool, ka10: bool) -> None:
        self.kind = kind
        self.close = close
        #: An HTTP/1.0 client that asked for keep-alive (it is told it has it).
        self.ka10 = ka10
        #: IDs asked for and not yet granted or asked of the core.
        self.want = 0
        #: How the IDs are answered: False (decimal strings), True (blocks), "uuid" or "base32".
        self.blocks: bool | str = False
        #: Blocks granted: (first, count).
        self.got: list[tuple[int, int]] = []
        #: request_id -> IDs asked, of the bodies sent and not yet answered.
        self.rids: dict[int, int] = {}
        #: Whether the answer is complete (written in turn; rendered then, unless ``out`` holds it).
        self.done = False
        #: The response, when it was made as it completed (an error, an answer of the door's own).
        self.out: bytes | None = None
        #: The HTTP status of ``out``.
        self.status = 0
        #: The binary reply of a STATUS, NODES or WATERMARK.
        self.answer: bytes | None = None
        #: Scans of the timers since it was asked of the core.
        self.scans = 0

    def fail(self, status: int, body: bytes, extra: str = "") -> None:
        """Answered now, with ``status`` and ``body``: an error, or an answer of the door's own."""
        self.done = True
        self.status = status
        self.out = response(status, body, close=self.close, keep_alive_10=self.ka10, extra=extra)

    def fail_with(self, err: SnowfenceError) -> None:
        self.fail(status_of(err), error_body(err), retry_after_header(err))

    def forget(self, waiting: dict[int, Request]) -> None:
        """Forget what it still waits for (``waiting``: its connection's request_id -> request):
        answers to it that come later are dropped."""
        for rid in self.rids:
            waiting.pop(rid, None)
        self.rids.clear()
        self.want = 0

    @property
    def refused(self) -> bool:
        """Answered with an error by the door itself: a bad request."""
        return self.status >= 400


def _json_object(body: bytes) -> dict:
    """A POST body as a JSON object, as strict as a query string: a name given twice is refused, and so
    are NaN and Infinity (stdlib json, unlike orjson, shows the duplicates; a body is at most 1 KiB)."""

    def pairs(items: list) -> dict:
        out = {}
        for key, value in items:
            if key in out:
                raise BadRequest(f"{key!r} is given twice in the JSON body")
            out[key] = value
        return out

    def constant(name: str):
        raise BadRequest(f"{name} is not a JSON number")

    try:
        data = json.loads(body, object_pairs_hook=pairs, parse_constant=constant)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        data = None
    if not isinstance(data, dict):
        raise BadRequest('a POST body is a JSON object: {"count": N, "blocks": true}')
    return data


#: The type each parameter has in a JSON body (in a query every value is text).
_BODY_TYPES = {"count": (int, "an integer"), "blocks": (bool, "true or false"), "format": (str, "a string")}


# -- a request, read ------------------------------------------------------------------------


def route(method: bytes, url: bytes, body: bytes | None, close: bool, ka10: bool, layout: Layout) -> Request:
    """What a request asks for; one that can be answered at once (an error, ``/v1/bounds``
    from the ``layout``) is answered here (its ``refused``: a bad request)."""
    path, _, query = url.partition(b"?")
    if not path.startswith(b"/"):  # absolute-form: http://host/path
        try:
            parsed = httptools.parse_url(url)
            path, query = parsed.path or b"/", parsed.query or b""
        except httptools.HttpParserInvalidURLError:
            path = b""
    kind = _PATHS.get(path)
    req = Request(DONE if kind is None else kind, close, ka10)
    if kind is None:
        if path == b"/v1/bounds":
            bounds(req, method, query, layout)
        else:
            req.fail(404, error_body(BadRequest(f"no such path: {path.decode('latin-1')!r}; see docs/HTTP.md")))
        return req
    if method != b"GET" and not (method == b"POST" and kind == IDS):
        allow = "GET, POST" if kind == IDS else "GET"
        req.kind = DONE
        req.fail(405, error_body(BadRequest(f"{method.decode('latin-1')} is not allowed here")), f"Allow: {allow}\r\n")
        return req
    if kind == IDS:
        try:
            req.want, req.blocks = ids_params(query, body)
        except BadRequest as err:
            req.kind = DONE
            req.fail_with(err)
    elif query or body:
        req.kind = DONE
        req.fail_with(BadRequest("this path takes no parameters"))
    return req


def ids_params(query: bytes, body: bytes | None) -> tuple[int, bool | str]:
    """How many IDs a request for IDs asks, and in what form (``Request.blocks``)."""
    if query == b"count=1":  # the common case, read without the general parser
        params = {"count": "1"}
    else:
        params = _params(query)
    if body:
        data = _json_object(body)
        for key, value in data.items():
            if key in params:
                raise BadRequest(f"{key} is given in both the query and the body")
            kind, words = _BODY_TYPES.get(key, (type(value), ""))
            if type(value) is not kind:  # not isinstance: true is no count
                raise BadRequest(f"{key} in a JSON body is {words}, got {orjson.dumps(value).decode()}")
            params[key] = value
    unknown = set(params) - {"count", "blocks", "format"}
    if unknown:
        raise BadRequest(f"unknown parameter {sorted(unknown)[0]!r} (count, blocks, format)")
    count = params.get("count", 1)
    if isinstance(count, str):
        count = int(count) if count.isascii() and count.isdigit() else None
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise BadRequest(f"count must be an integer 1..{MAX_COUNT}, got {params.get('count')!r}")
    blocks = params.get("blocks", False)
    if isinstance(blocks, str):
        blocks = {"1": True, "true": True, "0": False, "false": False}.get(blocks.lower(), None)
    if not isinstance(blocks, bool):
        raise BadRequest(f"blocks must be 1, true, 0 or false, got {params.get('blocks')!r}")
    form = params.get("format", "decimal")
    if form not in ("decimal", "uuid", "base32"):
        raise BadRequest(f"format must be decimal, uuid or base32, got {form!r}")
    if form != "decimal":
        if blocks:
            raise BadRequest("blocks come as first and count: format is for IDs one by one")
        return count, form  # each ID in that form (ids.py: Layout.to_uuid, to_base32)
    return count, blocks


def bounds(req: Request, method: bytes, query: bytes, layout: Layout) -> None:
    """``/v1/bounds``, answered from the layout."""
    if method != b"GET":
        req.fail(405, error_body(BadRequest(f"{method.decode('latin-1')} is not allowed here")), "Allow: GET\r\n")
        return
    try:
        params = _params(query)
        unknown = set(params) - {"start", "end", "closed"}
        if unknown:
            raise BadRequest(f"unknown parameter {sorted(unknown)[0]!r} (start, end, closed)")
        if "start" not in params:
            raise BadRequest("start is required: Unix milliseconds or ISO-8601 time (UTC unless it says)")
        closed = {"1": True, "true": True, "0": False, "false": False}.get(params.get("closed", "0").lower())
        if closed is None:
            raise BadRequest("closed must be 1, true, 0 or false")
        try:
            ranges = layout.bounds(params["start"], params.get("end"), closed=closed)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
    except BadRequest as err:
        req.fail_with(err)
        return
    req.fail(200, orjson.dumps({"ranges": [r.to_dict() for r in ranges]}))


# -- asking the core, and its answers ----------------------------------------------------------


def ask(req: Request, addr: bytes, next_rid: Callable[[], int], waiting: dict[int, Request], batch: list) -> None:
    """The request bodies ``req`` needs now, into ``batch`` under the connection's ``addr``:
    RESERVEs of up to 4,096 for the IDs not yet asked for, or its one STATUS, NODES or
    WATERMARK; each body's request_id (from ``next_rid``) goes into ``waiting``."""
    if req.kind == IDS:
        want = req.want
        while want:
            n = min(want, protocol.MAX_BLOCK)
            want -= n
            rid = next_rid()
            req.rids[rid] = n
            waiting[rid] = req
            batch.append((0, addr, _encode_reserve(rid, n)))
        req.want = 0
    elif not req.rids:
        rid = next_rid()
        req.rids[rid] = 0
        waiting[rid] = req
        batch.append((0, addr, _ENCODE[req.kind](rid)))


def take_reply(req: Request, rid: int, reply: bytes, waiting: dict[int, Request]) -> bool:
    """The binary reply to ``req``'s body ``rid`` (taken out of ``waiting`` already); True if
    it granted fewer IDs than that body asked, whose rest is to be asked for again."""
    asked = req.rids.pop(rid)
    kind = reply[1]
    if kind == _BLOCK and req.kind == IDS and len(reply) == protocol.BLOCK_SIZE:
        first, count = _BLOCK_UNPACK(reply, protocol.HEADER_SIZE)
        if count:
            req.got.append((first, count))
        if count < asked:  # fewer than asked: the rest is asked for again
            req.want += asked - count
            return True
        if not req.rids and not req.want:
            req.done = True
    elif kind == _ERROR:
        try:
            err = protocol.decode_reply(reply).error
        except BadRequest:
            err = Unavailable("the node's answer could not be read")
        req.forget(waiting)
        req.fail_with(err)
    else:
        req.answer = reply
        req.done = True
    return False


def render(req: Request, layout: Layout) -> bytes:
    """The whole HTTP response to a request whose answers are all in."""
    kind, answer = req.kind, req.answer
    if kind == IDS:
        if len(req.got) > 1:
            req.got.sort()
        form = req.blocks
        if form is True:
            body = blocks_json(req.got)
        elif form == "uuid":
            to_uuid = layout.to_uuid
            body = orjson.dumps({"ids": [str(to_uuid(i)) for f, n in req.got for i in range(f, f + n)]})
        elif form == "base32":
            body = orjson.dumps({"ids": [to_base32(i) for f, n in req.got for i in range(f, f + n)]})
        else:
            body = ids_json(req.got)
    elif kind == WATERMARK:
        if answer[1] != protocol.WATERMARK_REPLY or len(answer) != 28:
            return unreadable(req)
        unix_ms, lowest = _WATERMARK_UNPACK(answer, protocol.HEADER_SIZE)
        body = b'{"unix_ms":%d,"lowest":"%d"}' % (unix_ms, lowest)
    elif answer[1] in (protocol.STATUS_REPLY, protocol.NODES_REPLY):
        body = answer[protocol.HEADER_SIZE :]  # the JSON object itself
    else:
        return unreadable(req)
    return response(200, body, close=req.close, keep_alive_10=req.ka10)


#: The answer to a connection one past the door's cap.
TOO_MANY = response(
    503, error_body(Unavailable("too many HTTP connections; ask again")), close=True, extra="Retry-After: 1\r\n"
)


def unreadable(req: Request) -> bytes:
    err = Unavailable("the node's answer could not be read")
    return response(503, error_body(err), close=req.close, extra=retry_after_header(err))


def _params(query: bytes) -> dict[str, str]:
    """A query string's parameters (``application/x-www-form-urlencoded``); a name twice is refused."""
    out: dict[str, str] = {}
    if not query:
        return out
    try:
        text = query.decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest("a query string is ASCII (percent-encode the rest)") from None
    for part in text.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        name = unquote_plus(name, errors="strict") if "%" in name or "+" in name else name
        value = unquote_plus(value, errors="strict") if "%" in value or "+" in value else value
        if name in out:
            raise BadRequest(f"{name!r} is given twice")
        out[name] = value
    return out


# -- timers ------------------------------------------------------------------------------------


class Timeouts:
    """When the HTTP door's timers fire, on the monotonic times its ``tick`` is given: no clock
    and no socket of their own. The door looks at its connections on a scan every
    ``scan_s`` (:meth:`scan_due`), and each timer counts scans: a deadline of D seconds
    passes on the first scan more than D after its start, at most ``scan_s`` late. Its
    starts: a request asked of the core (its answer, ``answer_s``: :meth:`overdue`), the
    first byte of a request (read in full within ``read_s``), the last byte read or written
    (``idle_s``), an ended connection's shutdown (read and dropped for ``linger_s``)."""

    def __init__(
        self,
        *,
        scan_s: float = SCAN_S,
        answer_s: float = ANSWER_S,
        read_s: float = REQUEST_READ_S,
        idle_s: float = IDLE_S,
        linger_s: float = LINGER_S,
    ) -> None:
        self.scan_ns = int(scan_s * 1e9)
        self.answer_scans = math.ceil(answer_s / scan_s)
        self.read_scans = math.ceil(read_s / scan_s)
        self.idle_scans = math.ceil(idle_s / scan_s)
        self.linger_scans = math.ceil(linger_s / scan_s)
        self._next_scan_ns = 0

    def scan_due(self, now_ns: int) -> bool:
        """Whether the connections are looked at now (and the next scan is ``scan_s`` on)."""
        if now_ns < self._next_scan_ns:
            return False
        self._next_scan_ns = now_ns + self.scan_ns
        return True

    def overdue(self, started: Iterable[Request]) -> list[Request]:
        """Of the requests asked of the core (``started``), those whose answer is overdue as of
        this scan (the door answers them 503 ``unavailable``). Each not answered yet counts
        the scan; one answered (``out``) never is."""
        late = []
        for req in started:
            if req.out is None:
                req.scans += 1
                if req.scans > self.answer_scans:
                    late.append(req)
        return late
