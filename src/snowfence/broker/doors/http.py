"""The HTTP door: HTTP/1.1 and JSON beside the ROUTER and the fast port, for ``curl``.

Shell scripts, serverless functions and languages without ZeroMQ ask here. Each HTTP
request becomes the binary request bodies every other door sends
(``protocol.encode_reserve`` and the rest), handed to the routing core's one intake
(:meth:`Routing.requests`) under a routing address of the HTTP connection's own, so
fair shares, the in-flight limit and ``overloaded``, the peer clock veto, the
broker's own minting, retries on another worker and the counters apply unchanged;
the binary replies come back through the core's ``to_client`` (:meth:`HttpDoor.send`) and are
turned into JSON here. Only ``/v1/bounds`` is answered without the core: it is
arithmetic on the layout.

Like the fast port it is read and written by the broker's own loop, no thread per
connection. Requests are parsed by ``httptools`` (llhttp, the parser of Node.js and
uvicorn): about 0.3 us a request where the pure-Python ``h11`` takes about 37 us
(benchmarks/http.py ``--parsers``), which on this loop would be more than the rest of
a single ID's round trip.

An HTTP connection's routing address is ``b"\\x00\\x01"`` + 7 bytes: the shape of the
broker's own connections (``addresses.py``), whose second byte tells the HTTP door's
(1) from the fast port's (0).

Bounds, so bad input never holds the loop or its memory: at most ``MAX_CONNECTIONS``
connections (one more gets a 503 and is closed); a request head of at most
``MAX_HEAD_BYTES`` (431) and a body of at most ``MAX_BODY_BYTES`` (413); at most
``MAX_QUEUED`` requests read and unanswered per connection (reading stops until one is
answered), of which ``MAX_STARTED`` are asked of the core at once; a request not
complete within ``REQUEST_READ_S`` (slow headers or body: 408, closed), an answer not
complete within ``ANSWER_S`` (503 ``unavailable``), a connection with nothing read or
written for ``IDLE_S`` closed; answers are rendered only while less than ``UNSENT_LOW``
waits for a client to read it (so a connection holds that and one answer at most: 2.2 MB
for 100,000 IDs). A connection the door ends after an error is closed gently: its
sending side first, then what the client still sends is read and dropped for up to
``LINGER_S`` (``LINGER_BYTES``), so that the client reads the error rather than a reset.
There is no HTTP door with CURVE: it has neither encryption nor authentication
(``Config.http_bind``).
"""

from __future__ import annotations

import itertools
import json
import math
import select
import socket
import struct
from collections import deque
from collections.abc import Callable
from urllib.parse import unquote_plus

import httptools
import orjson

from ... import protocol
from ...config import Config
from ...errors import BadRequest, FrameTooLarge, SnowfenceError, Unavailable
from ...ids import to_base32
from .addresses import HTTP_PREFIX
from .tcp import TcpConn, TcpDoor

#: Bytes read from one connection per wake-up.
READ_BYTES = 16 * 1024
#: Connections at once; one more gets a 503 and is closed.
MAX_CONNECTIONS = 256
#: Request line and headers of one request, at most (431 beyond).
MAX_HEAD_BYTES = 16 * 1024
#: A request's body, at most (413 beyond): a POST's JSON ``{"count": N, "blocks": true}``.
MAX_BODY_BYTES = 1024
#: Requests read and not yet answered on one connection; beyond, the connection is not read.
MAX_QUEUED = 32
#: Of those, how many are asked of the routing core at once (each up to 25 RESERVEs).
MAX_STARTED = 8
#: IDs one request may ask for.
MAX_COUNT = 100_000
#: Answers are rendered only while fewer bytes than this wait to be written.
UNSENT_LOW = 256 * 1024
#: How often the timers below are looked at (seconds).
SCAN_S = 0.5
#: A request must be read in full within this long once its first byte came (408).
REQUEST_READ_S = 10.0
#: An answer not complete within this long is a 503 ``unavailable`` (a worker died with it, say).
ANSWER_S = 5.0
#: A connection with nothing read or written for this long is closed.
IDLE_S = 60.0
#: How long, and how many bytes of a client's, a connection ended by the door is read after its answer.
LINGER_S = 1.0
LINGER_BYTES = 1 << 20

_HEADER = protocol.HEADER
_BLOCK_UNPACK = struct.Struct("!QI").unpack_from
_WATERMARK_UNPACK = struct.Struct("!QQ").unpack_from
_BLOCK = protocol.BLOCK
_ERROR = protocol.ERROR
_encode_reserve = protocol.encode_reserve
_EPOLLIN = select.EPOLLIN
_EPOLLOUT = select.EPOLLOUT
_GONE = select.EPOLLHUP | select.EPOLLERR

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

# The kinds of request.
_IDS, _STATUS, _NODES, _WATERMARK, _DONE = range(5)
_PATHS = {b"/v1/ids": _IDS, b"/v1/status": _STATUS, b"/v1/nodes": _NODES, b"/v1/watermark": _WATERMARK}
_ENCODE = {_STATUS: protocol.encode_status, _NODES: protocol.encode_nodes, _WATERMARK: protocol.encode_watermark}


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


class _Request:
    """One HTTP request, from parsed to answered."""

    __slots__ = ("kind", "close", "ka10", "want", "blocks", "got", "rids", "done", "out", "answer", "scans")

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
        #: The binary reply of a STATUS, NODES or WATERMARK.
        self.answer: bytes | None = None
        #: Scans of the timers since it was asked of the core.
        self.scans = 0

    def fail(self, status: int, body: bytes, extra: str = "") -> None:
        self.done = True
        self.out = response(status, body, close=self.close, keep_alive_10=self.ka10, extra=extra)

    def fail_with(self, err: SnowfenceError) -> None:
        self.fail(status_of(err), error_body(err), retry_after_header(err))


class _TooLarge(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _NotHttp1(Exception):
    """A request line of another version (HTTP/0.9's has none): answered 400, then the end."""


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


class _Conn(TcpConn):
    """One HTTP connection: its parser's callbacks, and its requests in order."""

    __slots__ = (
        "door",
        "parser",
        "queue",
        "started",
        "waiting",
        "mask",
        "ending",
        "eof",
        "draining",
        "busy",
        "again",
        "active",
        "idle_scans",
        "in_request",
        "request_scans",
        "head_bytes",
        "method",
        "url",
        "body",
        "next_rid",
        "more",
    )

    def __init__(self, door: HttpDoor, sock: socket.socket, addr: bytes) -> None:
        super().__init__(sock, addr)
        self.door = door
        self.parser = httptools.HttpRequestParser(self)
        #: Requests read and not yet answered, oldest first; the first ``started`` were asked of the core.
        self.queue: deque[_Request] = deque()
        self.started = 0
        #: request_id -> the request it is part of.
        self.waiting: dict[int, _Request] = {}
        #: What the loop's epoll set watches this descriptor for.
        self.mask = _EPOLLIN
        #: No more reading: an answer that closes the connection is queued (or a request could not be parsed).
        self.ending = False
        #: The client has finished sending.
        self.eof = False
        #: Bytes read and dropped since the door shut its side (None: it has not).
        self.draining: int | None = None
        self.busy = False
        self.again = False
        #: Read or written since the last scan.
        self.active = True
        self.idle_scans = 0
        #: A request whose first byte came, not yet read in full; for how many scans.
        self.in_request = False
        self.request_scans = 0
        self.head_bytes = 0
        self.method = b""
        self.url = b""
        self.body: bytes | None = None
        self.next_rid = itertools.count(1).__next__
        #: Requests granted in part: the rest is to be asked for.
        self.more: list[_Request] = []

    # -- httptools' callbacks (they run inside feed_data) ------------------------------------

    def on_message_begin(self) -> None:
        self.in_request = True
        self.request_scans = 0
        self.head_bytes = 0
        self.url = b""
        self.body = None

    def on_url(self, url: bytes) -> None:
        self.url = self.url + url if self.url else url
        self.head_bytes += len(url)
        if self.head_bytes > MAX_HEAD_BYTES:
            raise _TooLarge(431, f"the request line and headers exceed {MAX_HEAD_BYTES} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value) + 4
        if self.head_bytes > MAX_HEAD_BYTES:
            raise _TooLarge(431, f"the request line and headers exceed {MAX_HEAD_BYTES} bytes")
        if len(name) == 14 and name.lower() == b"content-length" and value.strip().isdigit():
            if int(value) > MAX_BODY_BYTES:
                raise _TooLarge(413, f"a request body may have at most {MAX_BODY_BYTES} bytes")

    def on_body(self, body: bytes) -> None:
        self.body = self.body + body if self.body else body
        if len(self.body) > MAX_BODY_BYTES:
            raise _TooLarge(413, f"a request body may have at most {MAX_BODY_BYTES} bytes")

    def on_message_complete(self) -> None:
        self.in_request = False
        parser = self.parser
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise _NotHttp1(f"not an HTTP/1.x request: HTTP/{version}")
        keep = parser.should_keep_alive()
        ka10 = keep and version == "1.0"
        self.queue.append(self.door.route(parser.get_method(), self.url, self.body, not keep, ka10))
        self.active = True


class HttpDoor(TcpDoor):
    """The listening socket and its connections (``tcp.TcpDoor``); the broker's loop hands
    the events of its descriptors to :meth:`on_event`.

    ``requests`` is the routing core's intake (:meth:`Routing.requests`); replies to an
    HTTP connection's address come back through :meth:`send` (the routing core's
    ``to_client``, by ``addresses.Doors``); :meth:`tick` is the loop's housekeeping."""

    def __init__(
        self,
        host: str,
        port: int,
        config: Config,
        *,
        requests: Callable[[list[tuple[int, bytes, bytes]]], None],
    ) -> None:
        super().__init__(host, port, what="the HTTP port", prefix=HTTP_PREFIX, max_connections=MAX_CONNECTIONS)
        self.layout = config.layout
        self._requests = requests
        self._next_scan_ns = 0
        self._answer_scans = math.ceil(ANSWER_S / SCAN_S)
        self._read_scans = math.ceil(REQUEST_READ_S / SCAN_S)
        self._idle_scans = math.ceil(IDLE_S / SCAN_S)
        self._linger_scans = math.ceil(LINGER_S / SCAN_S)
        #: Besides connections accepted, closed and turned away (too_many): HTTP requests
        #: read; answered with an error of the door's own (bad or too large, unknown path or
        #: method); connections closed for a request read too slowly, or idleness; answers
        #: not complete in time.
        self.stats.update(requests=0, bad_request=0, slow_request=0, idle=0, timed_out=0)

    # -- the loop's events ----------------------------------------------------------------

    def on_event(self, fd: int, events: int) -> None:
        if fd == self.listen_fd:
            self._accept()
            return
        conn = self.by_fd.get(fd)
        if conn is None:
            return
        if events & _EPOLLOUT:
            self._flush(conn)
            if self.by_fd.get(fd) is not conn:
                return
        if conn.draining is not None:
            self._drain(conn)
        elif events & _EPOLLIN and not conn.ending:
            self._read(conn)
        elif events & _GONE:
            self._close(conn)

    def _read(self, conn: _Conn) -> None:
        data = self._recv(conn, READ_BYTES)
        if data is None:
            return
        if not data:
            # The client has finished sending (or gone): answer what it asked, then close.
            conn.ending = conn.eof = True
            if conn.queue:
                conn.queue[-1].close = True
            self._advance(conn)
            return
        conn.active = True
        queued = len(conn.queue)
        try:
            conn.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # A protocol switch (or CONNECT) is not offered: what was asked is answered, then the end.
            conn.ending = True
            if conn.queue:
                conn.queue[-1].close = True
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _TooLarge):
                self._refuse(conn, cause.status, FrameTooLarge(str(cause)))
            elif isinstance(cause, _NotHttp1):
                self._refuse(conn, 400, BadRequest(str(cause)))
            else:
                raise
        except httptools.HttpParserError as exc:
            self._refuse(conn, 400, BadRequest(f"not an HTTP/1.1 request: {exc}"))
        else:
            if conn.in_request:
                # A head that spans reads: what has come of it counts (the parser keeps a
                # header's name and value until each is whole).
                conn.head_bytes += len(data)
                if conn.head_bytes > 2 * MAX_HEAD_BYTES:
                    self._refuse(
                        conn, 431, FrameTooLarge(f"the request line and headers exceed {MAX_HEAD_BYTES} bytes")
                    )
        self.stats["requests"] += len(conn.queue) - queued
        self._advance(conn)

    def _refuse(self, conn: _Conn, status: int, err: SnowfenceError, counter: str = "bad_request") -> None:
        """A request that cannot be read: its error after the answers before it, then the end."""
        self.stats[counter] += 1
        conn.ending = True
        req = _Request(_DONE, True, False)
        req.fail(status, error_body(err))
        conn.queue.append(req)

    def _connection(self, sock: socket.socket, addr: bytes) -> _Conn:
        return _Conn(self, sock, addr)

    def _turn_away(self, sock: socket.socket) -> None:
        try:
            sock.setblocking(False)
            sock.send(_TOO_MANY)
        except OSError:
            pass

    # -- a request, read --------------------------------------------------------------------

    def route(self, method: bytes, url: bytes, body: bytes | None, close: bool, ka10: bool) -> _Request:
        """What a request asks for; a request that can be answered at once is answered here."""
        path, _, query = url.partition(b"?")
        if not path.startswith(b"/"):  # absolute-form: http://host/path
            try:
                parsed = httptools.parse_url(url)
                path, query = parsed.path or b"/", parsed.query or b""
            except httptools.HttpParserInvalidURLError:
                path = b""
        kind = _PATHS.get(path)
        req = _Request(_DONE if kind is None else kind, close, ka10)
        if kind is None:
            if path == b"/v1/bounds":
                self._bounds(req, method, query)
            else:
                self.stats["bad_request"] += 1
                req.fail(404, error_body(BadRequest(f"no such path: {path.decode('latin-1')!r}; see docs/HTTP.md")))
            return req
        if method != b"GET" and not (method == b"POST" and kind == _IDS):
            self.stats["bad_request"] += 1
            allow = "GET, POST" if kind == _IDS else "GET"
            req.kind = _DONE
            req.fail(
                405, error_body(BadRequest(f"{method.decode('latin-1')} is not allowed here")), f"Allow: {allow}\r\n"
            )
            return req
        if kind == _IDS:
            try:
                req.want, req.blocks = self._ids_params(query, body)
            except BadRequest as err:
                self.stats["bad_request"] += 1
                req.kind = _DONE
                req.fail_with(err)
        elif query or body:
            self.stats["bad_request"] += 1
            req.kind = _DONE
            req.fail_with(BadRequest("this path takes no parameters"))
        return req

    @staticmethod
    def _ids_params(query: bytes, body: bytes | None) -> tuple[int, bool]:
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

    def _bounds(self, req: _Request, method: bytes, query: bytes) -> None:
        if method != b"GET":
            self.stats["bad_request"] += 1
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
                ranges = self.layout.bounds(params["start"], params.get("end"), closed=closed)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
        except BadRequest as err:
            self.stats["bad_request"] += 1
            req.fail_with(err)
            return
        req.fail(200, orjson.dumps({"ranges": [r.to_dict() for r in ranges]}))

    # -- asking the core, and its answers --------------------------------------------------

    def _advance(self, conn: _Conn) -> None:
        """Write the answers complete at the head of the queue, ask the core for the
        requests next in line (and for the rest of any granted in part), and watch the
        connection for what it now waits for. Answers may come back while the core is
        asked (the broker mints small requests itself): then this runs again rather
        than within itself."""
        if conn.busy:
            conn.again = True
            return
        conn.busy = True
        queue = conn.queue
        try:
            while True:
                conn.again = False
                while queue and queue[0].done and len(conn.unsent) < UNSENT_LOW:
                    req = queue.popleft()
                    if conn.started:
                        conn.started -= 1
                    self._write(conn, req.out if req.out is not None else self._render(req))
                    if self.by_fd.get(conn.fd) is not conn:
                        return
                    if req.close:
                        conn.ending = True
                        queue.clear()
                        conn.started = 0
                        conn.more.clear()
                        break
                batch: list[tuple[int, bytes, bytes]] = []
                while conn.started < len(queue) and conn.started < MAX_STARTED:
                    req = queue[conn.started]
                    conn.started += 1
                    if not req.done:
                        req.scans = 0
                        self._ask(conn, req, batch)
                if conn.more:
                    for req in conn.more:
                        if not req.done:
                            self._ask(conn, req, batch)
                    conn.more.clear()
                if batch:
                    self._requests(batch)
                    if self.by_fd.get(conn.fd) is not conn:
                        return
                if not conn.again:
                    break
        finally:
            conn.busy = False
        if conn.ending and not queue and not conn.unsent:
            self._linger(conn)
            return
        mask = 0 if conn.ending or len(queue) >= MAX_QUEUED else _EPOLLIN
        if conn.unsent:
            mask |= _EPOLLOUT
        if mask != conn.mask:
            conn.mask = mask
            self.watcher.watch(conn.fd, mask, self)

    @staticmethod
    def _ask(conn: _Conn, req: _Request, batch: list) -> None:
        """The request bodies ``req`` needs now, into ``batch``: RESERVEs of up to 4,096
        for the IDs not yet asked for, or its one STATUS, NODES or WATERMARK."""
        addr = conn.addr
        if req.kind == _IDS:
            want = req.want
            while want:
                n = min(want, protocol.MAX_BLOCK)
                want -= n
                rid = conn.next_rid()
                req.rids[rid] = n
                conn.waiting[rid] = req
                batch.append((0, addr, _encode_reserve(rid, n)))
            req.want = 0
        elif not req.rids:
            rid = conn.next_rid()
            req.rids[rid] = 0
            conn.waiting[rid] = req
            batch.append((0, addr, _ENCODE[req.kind](rid)))

    def send(self, addr: bytes, reply: bytes) -> None:
        """One binary reply to the HTTP connection ``addr`` (the core's ``to_client``); dropped
        if the connection has closed or its request was answered already."""
        conn = self.by_addr.get(addr)
        if conn is None or len(reply) < protocol.HEADER_SIZE:
            return
        rid = _HEADER.unpack_from(reply)[3]
        req = conn.waiting.pop(rid, None)
        if req is None:
            return
        asked = req.rids.pop(rid)
        kind = reply[1]
        if kind == _BLOCK and req.kind == _IDS and len(reply) == protocol.BLOCK_SIZE:
            first, count = _BLOCK_UNPACK(reply, protocol.HEADER_SIZE)
            if count:
                req.got.append((first, count))
            if count < asked:  # fewer than asked: the rest is asked for again
                req.want += asked - count
                conn.more.append(req)
            elif not req.rids and not req.want:
                req.done = True
        elif kind == _ERROR:
            try:
                err = protocol.decode_reply(reply).error
            except BadRequest:
                err = Unavailable("the node's answer could not be read")
            self._drop(conn, req)
            req.fail_with(err)
        else:
            req.answer = reply
            req.done = True
        self._advance(conn)

    def _render(self, req: _Request) -> bytes:
        kind, answer = req.kind, req.answer
        if kind == _IDS:
            if len(req.got) > 1:
                req.got.sort()
            form = req.blocks
            if form is True:
                body = blocks_json(req.got)
            elif form == "uuid":
                to_uuid = self.layout.to_uuid
                body = orjson.dumps({"ids": [str(to_uuid(i)) for f, n in req.got for i in range(f, f + n)]})
            elif form == "base32":
                body = orjson.dumps({"ids": [to_base32(i) for f, n in req.got for i in range(f, f + n)]})
            else:
                body = ids_json(req.got)
        elif kind == _WATERMARK:
            if answer[1] != protocol.WATERMARK_REPLY or len(answer) != 28:
                return _unreadable(req)
            unix_ms, lowest = _WATERMARK_UNPACK(answer, protocol.HEADER_SIZE)
            body = b'{"unix_ms":%d,"lowest":"%d"}' % (unix_ms, lowest)
        elif answer[1] in (protocol.STATUS_REPLY, protocol.NODES_REPLY):
            body = answer[protocol.HEADER_SIZE :]  # the JSON object itself
        else:
            return _unreadable(req)
        return response(200, body, close=req.close, keep_alive_10=req.ka10)

    def _drop(self, conn: _Conn, req: _Request) -> None:
        """Forget what ``req`` still waits for: answers to it that come later are dropped."""
        for rid in req.rids:
            conn.waiting.pop(rid, None)
        req.rids.clear()
        req.want = 0

    # -- writing ----------------------------------------------------------------------------

    def _write(self, conn: _Conn, data: bytes) -> bool:
        conn.active = True
        return super()._write(conn, data)

    def _flush(self, conn: _Conn) -> bool:
        if not super()._flush(conn):
            return False
        conn.active = True
        self._advance(conn)
        return True

    # -- timers -----------------------------------------------------------------------------

    def tick(self, now_ns: int) -> None:
        """The loop's housekeeping: every ``SCAN_S``, answers overdue, slow and idle connections closed."""
        if now_ns < self._next_scan_ns:
            return
        self._next_scan_ns = now_ns + int(SCAN_S * 1e9)
        for conn in list(self.by_fd.values()):
            if conn.draining is not None:
                conn.request_scans += 1
                if conn.request_scans > self._linger_scans:
                    self._close(conn)
                continue
            if conn.in_request:
                conn.request_scans += 1
                if conn.request_scans > self._read_scans:
                    conn.in_request = False
                    err = BadRequest(f"a request was not read in full within {REQUEST_READ_S:g} s")
                    self._refuse(conn, 408, err, "slow_request")
                    self._advance(conn)
                    continue
            overdue = False
            for req in itertools.islice(conn.queue, conn.started):
                if req.out is None:
                    req.scans += 1
                    if req.scans > self._answer_scans:
                        self.stats["timed_out"] += 1
                        self._drop(conn, req)
                        req.fail_with(Unavailable(f"no answer within {ANSWER_S:g} s; ask again"))
                        overdue = True
            if overdue:
                self._advance(conn)
                continue
            if conn.active:
                conn.active = False
                conn.idle_scans = 0
            else:
                conn.idle_scans += 1
                if conn.idle_scans > self._idle_scans:
                    self.stats["idle"] += 1
                    self._close(conn)

    # -- ending -----------------------------------------------------------------------------

    def _linger(self, conn: _Conn) -> None:
        """Every answer is out and the connection ends: at once if the client has finished
        sending; otherwise shut the door's side and read what comes for a while, since
        closing with unread bytes resets the connection, and a reset may take the last
        answer (an error, say) with it before the client reads it."""
        if conn.eof:
            self._close(conn)
            return
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.draining = 0
        conn.request_scans = 0
        if conn.mask != _EPOLLIN:
            conn.mask = _EPOLLIN
            self.watcher.watch(conn.fd, _EPOLLIN, self)

    def _drain(self, conn: _Conn) -> None:
        data = self._recv(conn, READ_BYTES)
        if data is None:
            return
        conn.draining += len(data)
        if not data or conn.draining > LINGER_BYTES:
            self._close(conn)

    def _close(self, conn: _Conn, flush: bool = False) -> bool:
        if not super()._close(conn, flush):
            return False
        conn.waiting.clear()
        conn.queue.clear()
        return True


_TOO_MANY = response(
    503, error_body(Unavailable("too many HTTP connections; ask again")), close=True, extra="Retry-After: 1\r\n"
)


def _unreadable(req: _Request) -> bytes:
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


def http_address(http_bind: str, bind: str, curve: bool) -> tuple[str, int] | None:
    """Where the HTTP door binds, or None for none: as the fast port (``fast.fast_address``):
    ``auto`` is the bind's host on a port the system picks when ``bind`` is tcp://, ``off``
    none, otherwise ``HOST:PORT``; never with CURVE (config.py refuses an explicit one)."""
    from .fast import fast_address

    return fast_address(http_bind, bind, curve)
