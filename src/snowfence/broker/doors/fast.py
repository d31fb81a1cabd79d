"""The fast port: plain TCP beside the ROUTER, for requests that fit one reply.

Every ZeroMQ message crosses an I/O thread on each end before it reaches Python,
and on these machines that alone makes one ZeroMQ round trip slower than a Redis
``INCR`` (docs/BENCHMARKS.md). The fast port carries the same request and reply
bodies on a plain TCP connection, each after its length (``protocol.Stream``), read
and written by the broker's own loop: no thread in between on either end.

A fast connection is a client connection like any other to the routing core: it
gets a routing address of its own (``b"\\x00"`` + 8 bytes, ``addresses.py``; libzmq's
own ids are 5 bytes, and the routing core's gate drops requests from a ZeroMQ peer
that set itself an id of this form), so fair shares, the in-flight limit and ``overloaded``, the peer clock
veto, the broker's own minting, retries on another worker and the metrics apply
to it unchanged. What it lacks is CURVE: a node with CURVE has no fast port
(``Config.fast_bind``).

Reads are bounded per wake-up (``READ_BYTES``: some 200 small requests), so one
connection cannot hold the loop; replies a client does not read are buffered up
to ``MAX_UNSENT_BYTES``, then the connection is closed.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from ... import protocol
from ...errors import BadRequest
from .addresses import FAST_PREFIX
from .tcp import EPOLLIN, EPOLLOUT, TcpConn, TcpDoor

#: Bytes read from one connection per wake-up: about 200 plain RESERVEs.
READ_BYTES = 4096
#: Replies kept for a connection whose client does not read them; beyond, it is closed.
MAX_UNSENT_BYTES = 1 << 20
#: Connections at once; one more is closed as soon as it is accepted. Each is one more
#: descriptor the broker's loop polls on every turn (about 0.1 us each, idle or not).
MAX_CONNECTIONS = 1024

_stream = protocol.encode_stream
_IN_OUT = EPOLLIN | EPOLLOUT
_NOT_OUT = ~EPOLLOUT


class _Conn(TcpConn):
    __slots__ = ("frames",)

    def __init__(self, sock: socket.socket, addr: bytes) -> None:
        super().__init__(sock, addr)
        self.frames = protocol.Stream(protocol.MAX_REQUEST_BYTES)


class FastPort(TcpDoor):
    """The listening socket and its connections (``tcp.TcpDoor``); the broker's loop hands
    the events of its descriptors to :meth:`on_event`.

    ``requests`` and ``bad_request`` are the routing core's (:meth:`Routing.requests`,
    its intake of every client request, given what each read brought, which counts
    the fast port's with the rest;
    :meth:`Routing.bad_request`, for a frame that is not a request)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        requests: Callable[[list[tuple[int, bytes, bytes]]], None],
        bad_request: Callable[[int, bytes, BadRequest], None],
    ) -> None:
        super().__init__(host, port, what="the fast port", prefix=FAST_PREFIX, max_connections=MAX_CONNECTIONS)
        self._requests = requests
        self._bad_request = bad_request
        #: Besides connections accepted, closed and turned away (too_many): requests read,
        #: and connections the broker closed because of a bad frame or a client not
        #: reading its replies.
        self.stats.update(requests=0, bad_frame=0, not_reading=0)

    def _connection(self, sock: socket.socket, addr: bytes) -> _Conn:
        return _Conn(sock, addr)

    # -- the loop's events ----------------------------------------------------------------

    def on_event(self, fd: int, events: int) -> None:
        conn = self.by_fd.get(fd)
        if conn is None:
            if fd == self.listen_fd:
                self._accept()
            return
        if events & EPOLLOUT:
            if self._flush(conn) and not conn.unsent:
                self.watcher.watch(fd, EPOLLIN, self)
            if self.by_fd.get(fd) is not conn:
                return
        if not events & _NOT_OUT:
            return
        try:  # TcpDoor._recv, written out: every request on the fast port comes this way
            data = conn.sock.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the end of the stream, or a connection that failed
            self._close(conn)
            return
        try:
            bodies = conn.frames.feed(data)
        except BadRequest as err:
            self.stats["bad_frame"] += 1
            self._bad_request(0, conn.addr, err)
            self._close(conn, flush=True)
            return
        addr = conn.addr
        self.stats["requests"] += len(bodies)
        if len(bodies) == 1:  # the common case, without a comprehension's call
            self._requests(((0, addr, bodies[0]),))
        else:
            self._requests([(0, addr, body) for body in bodies])

    # -- replies --------------------------------------------------------------------------

    def send(self, addr: bytes, reply: bytes) -> None:
        """One reply to the fast connection ``addr``; dropped if it has closed (as a
        ROUTER drops one for a peer that has gone)."""
        conn = self.by_addr.get(addr)
        if conn is None:
            return
        backed_up = bool(conn.unsent)
        if self._write(conn, _stream(reply)):
            if not backed_up:
                self.watcher.watch(conn.fd, _IN_OUT, self)
            elif len(conn.unsent) > MAX_UNSENT_BYTES:
                self.stats["not_reading"] += 1
                self._close(conn)


def fast_address(fast_bind: str, bind: str, curve: bool) -> tuple[str, int] | None:
    """Where the fast port binds, or None for none: ``auto`` is the bind's host on a
    port the system picks, when ``bind`` is tcp:// and CURVE is off; ``off`` (or
    empty) is none; otherwise ``HOST:PORT``. Never with CURVE: it would be a way
    around the allow-list."""
    from ...config import host_port

    if fast_bind in ("", "off") or curve:
        return None
    if fast_bind != "auto":
        host, port = host_port(fast_bind, "127.0.0.1:5556")
        return host or "0.0.0.0", port
    scheme, _, address = bind.partition("://")
    if scheme != "tcp":
        return None
    host = address.rpartition(":")[0]
    if host == "*":
        return "0.0.0.0", 0
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, 0
