"""The HTTP door: HTTP/1.1 and JSON beside the ROUTER and the fast port, for ``curl``.

Shell scripts, serverless functions and languages without ZeroMQ ask here. Each HTTP
request becomes the binary request bodies every other door sends
(``protocol.encode_reserve`` and the rest), handed to the routing core's one intake
(:meth:`Routing.requests`) under a routing address of the HTTP connection's own, so
fair shares, the in-flight limit and ``overloaded``, the peer clock veto, the
broker's own minting, retries on another worker and the counters apply unchanged;
the binary replies come back through the core's ``to_client`` (:meth:`HttpDoor.send`) and are
turned into JSON. Only ``/v1/bounds`` is answered without the core: it is
arithmetic on the layout. What a request asks, the bodies it becomes, how its replies
are taken in and its answer reads, and when an answer is overdue are decided without a
socket in ``http_requests.py``; this module reads and writes the bytes: the parser, the
connections (on ``tcp.TcpDoor``), their order and their limits.

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
import select
import socket
from collections import deque
from collections.abc import Callable

import httptools

from ... import protocol
from ...config import Config
from ...errors import BadRequest, FrameTooLarge, SnowfenceError, Unavailable
from .addresses import HTTP_PREFIX
from .http_requests import (
    ANSWER_S,
    DONE,
    REQUEST_READ_S,
    TOO_MANY,
    Request,
    Timeouts,
    ask,
    error_body,
    render,
    route,
    take_reply,
)
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
#: Answers are rendered only while fewer bytes than this wait to be written.
UNSENT_LOW = 256 * 1024
#: How many bytes of a client's a connection ended by the door reads and drops (for ``LINGER_S``).
LINGER_BYTES = 1 << 20

_HEADER = protocol.HEADER
_EPOLLIN = select.EPOLLIN
_EPOLLOUT = select.EPOLLOUT
_GONE = select.EPOLLHUP | select.EPOLLERR


class _TooLarge(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _NotHttp1(Exception):
    """A request line of another version (HTTP/0.9's has none): answered 400, then the end."""


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
        self.queue: deque[Request] = deque()
        self.started = 0
        #: request_id -> the request it is part of.
        self.waiting: dict[int, Request] = {}
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
        self.more: list[Request] = []

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
        self.timeouts = Timeouts()
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
        req = Request(DONE, True, False)
        req.fail(status, error_body(err))
        conn.queue.append(req)

    def _connection(self, sock: socket.socket, addr: bytes) -> _Conn:
        return _Conn(self, sock, addr)

    def _turn_away(self, sock: socket.socket) -> None:
        try:
            sock.setblocking(False)
            sock.send(TOO_MANY)
        except OSError:
            pass

    # -- a request, read --------------------------------------------------------------------

    def route(self, method: bytes, url: bytes, body: bytes | None, close: bool, ka10: bool) -> Request:
        """What a request asks for (``http_requests.route``); one the door refuses is counted."""
        req = route(method, url, body, close, ka10, self.layout)
        if req.refused:
            self.stats["bad_request"] += 1
        return req

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
                    self._write(conn, req.out if req.out is not None else render(req, self.layout))
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
                        ask(req, conn.addr, conn.next_rid, conn.waiting, batch)
                if conn.more:
                    for req in conn.more:
                        if not req.done:
                            ask(req, conn.addr, conn.next_rid, conn.waiting, batch)
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
        if take_reply(req, rid, reply, conn.waiting):
            conn.more.append(req)
        self._advance(conn)

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
        """The loop's housekeeping: on each scan (``Timeouts``), answers overdue, slow and idle
        connections closed."""
        timeouts = self.timeouts
        if not timeouts.scan_due(now_ns):
            return
        for conn in list(self.by_fd.values()):
            if conn.draining is not None:
                conn.request_scans += 1
                if conn.request_scans > timeouts.linger_scans:
                    self._close(conn)
                continue
            if conn.in_request:
                conn.request_scans += 1
                if conn.request_scans > timeouts.read_scans:
                    conn.in_request = False
                    err = BadRequest(f"a request was not read in full within {REQUEST_READ_S:g} s")
                    self._refuse(conn, 408, err, "slow_request")
                    self._advance(conn)
                    continue
            late = timeouts.overdue(itertools.islice(conn.queue, conn.started))
            if late:
                for req in late:
                    self.stats["timed_out"] += 1
                    req.forget(conn.waiting)
                    req.fail_with(Unavailable(f"no answer within {ANSWER_S:g} s; ask again"))
                self._advance(conn)
                continue
            if conn.active:
                conn.active = False
                conn.idle_scans = 0
            else:
                conn.idle_scans += 1
                if conn.idle_scans > timeouts.idle_scans:
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


def http_address(http_bind: str, bind: str, curve: bool) -> tuple[str, int] | None:
    """Where the HTTP door binds, or None for none: as the fast port (``fast.fast_address``):
    ``auto`` is the bind's host on a port the system picks when ``bind`` is tcp://, ``off``
    none, otherwise ``HOST:PORT``; never with CURVE (config.py refuses an explicit one)."""
    from .fast import fast_address

    return fast_address(http_bind, bind, curve)
