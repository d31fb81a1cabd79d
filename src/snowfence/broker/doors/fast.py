"""The fast port: plain TCP beside the ROUTER, for requests that fit one reply.

Every ZeroMQ message crosses an I/O thread on each end before it reaches Python,
and on these machines that alone makes one ZeroMQ round trip slower than a Redis
``INCR`` (docs/BENCHMARKS.md). The fast port carries the same request and reply
bodies on a plain TCP connection, each after its length (``protocol.Stream``), read
and written by the broker's own loop: no thread in between on either end.

A fast connection is a client connection like any other to the routing core: it
gets a routing address of its own (``b"\\x00"`` + 8 bytes; libzmq's own ids are 5
bytes, and the router drops requests from a peer that set itself an id of this
form), so fair shares, the in-flight limit and ``overloaded``, the peer clock
veto, the broker's own minting, retries on another worker and the metrics apply
to it unchanged. What it lacks is CURVE: a node with CURVE has no fast port
(``Config.fast_bind``).

Reads are bounded per wake-up (``READ_BYTES``: some 200 small requests), so one
connection cannot hold the loop; replies a client does not read are buffered up
to ``MAX_UNSENT_BYTES``, then the connection is closed.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Callable

from ... import protocol
from ...errors import BadRequest, ConfigError

#: Bytes read from one connection per wake-up: about 200 plain RESERVEs.
READ_BYTES = 4096
#: Replies kept for a connection whose client does not read them; beyond, it is closed.
MAX_UNSENT_BYTES = 1 << 20
#: Connections at once; one more is closed as soon as it is accepted. Each is one more
#: descriptor the broker's loop polls on every turn (about 0.1 us each, idle or not).
MAX_CONNECTIONS = 1024
#: Connections accepted per wake-up.
ACCEPT_BATCH = 64

_ADDR_PREFIX = b"\x00"
ADDR_SIZE = 9
_stream = protocol.encode_stream


def _no_watch(fd: int, writable: bool) -> None:
    pass


def _no_unwatch(fd: int) -> None:
    pass


def is_fast_addr(addr: bytes) -> bool:
    """Whether a routing address is a fast connection's (the router drops ZeroMQ peers that claim one).

    The one test of the address's shape: the router sends a reply for such an address here,
    and refuses a ZeroMQ peer that set itself one."""
    return len(addr) == ADDR_SIZE and addr[0] == 0


class _Conn:
    __slots__ = ("sock", "fd", "addr", "frames", "unsent")

    def __init__(self, sock: socket.socket, addr: bytes) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.addr = addr
        self.frames = protocol.Stream(protocol.MAX_REQUEST_BYTES)
        #: Reply bytes the kernel would not take yet.
        self.unsent = bytearray()


def listen_tcp(host: str, port: int, what: str) -> socket.socket:
    """A non-blocking TCP listener on ``host:port`` (IPv6 when the host has a colon), for the
    broker's loop; a port that cannot be bound is a ConfigError naming ``what``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(512)
    except OSError as exc:
        listener.close()
        raise ConfigError(f"cannot bind {what} {host}:{port}: {exc.strerror}") from None
    listener.setblocking(False)
    return listener


class FastPort:
    """The listening socket and its connections; the broker's loop polls ``listen_fd``
    and each connection's descriptor (``by_fd``) and hands their events here.

    ``requests`` and ``bad_request`` are the routing core's (:meth:`Routing.requests`,
    its intake of every client request, given what each read brought, which counts
    the fast port's with the rest;
    :meth:`Routing.bad_request`, for a frame that is not a request). ``watch(fd,
    writable)`` and ``unwatch(fd)`` register descriptors with the loop's epoll set."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        requests: Callable[[list[tuple[int, bytes, bytes]]], None],
        bad_request: Callable[[int, bytes, BadRequest], None],
        watch: Callable[[int, bool], None] | None = None,
        unwatch: Callable[[int], None] | None = None,
    ) -> None:
        self.listener = listen_tcp(host, port, "the fast port")
        self.listen_fd = self.listener.fileno()
        self.port = self.listener.getsockname()[1]
        self.host = host
        self._requests = requests
        self._bad_request = bad_request
        self.watch = watch or _no_watch
        self.unwatch = unwatch or _no_unwatch
        self.by_fd: dict[int, _Conn] = {}
        self.by_addr: dict[bytes, _Conn] = {}
        self._next = itertools.count(1)
        #: Connections accepted and closed (either end); requests read; connections the
        #: broker closed because of a bad frame, a client not reading its replies, or
        #: one connection too many.
        self.stats = {"accepted": 0, "closed": 0, "requests": 0, "bad_frame": 0, "not_reading": 0, "too_many": 0}

    def describe(self) -> dict:
        return {"port": self.port, "host": self.host, "connections": len(self.by_fd), **self.stats}

    def detach(self) -> None:
        """The loop's epoll set is going (the loop has ended): closing connections after it
        unregisters nothing."""
        self.watch, self.unwatch = _no_watch, _no_unwatch

    # -- the loop's events ----------------------------------------------------------------

    def on_readable(self, fd: int) -> None:
        if fd == self.listen_fd:
            self._accept()
            return
        conn = self.by_fd.get(fd)
        if conn is None:
            return
        try:
            data = conn.sock.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not data:
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
        self._requests([(0, addr, body) for body in bodies])

    def on_writable(self, fd: int) -> None:
        conn = self.by_fd.get(fd)
        if conn is not None:
            self._flush(conn)

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, or the client gave up: the next turn may do
                return
            if len(self.by_fd) >= MAX_CONNECTIONS:
                self.stats["too_many"] += 1
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, _ADDR_PREFIX + next(self._next).to_bytes(8, "big"))
            self.by_fd[conn.fd] = conn
            self.by_addr[conn.addr] = conn
            self.stats["accepted"] += 1
            self.watch(conn.fd, False)

    # -- replies --------------------------------------------------------------------------

    def send(self, addr: bytes, reply: bytes) -> None:
        """One reply to the fast connection ``addr``; dropped if it has closed (as a
        ROUTER drops one for a peer that has gone)."""
        conn = self.by_addr.get(addr)
        if conn is None:
            return
        frame = _stream(reply)
        if conn.unsent:
            conn.unsent += frame
            if len(conn.unsent) > MAX_UNSENT_BYTES:
                self.stats["not_reading"] += 1
                self._close(conn)
            return
        try:
            sent = conn.sock.send(frame)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(conn)
            return
        if sent < len(frame):
            conn.unsent += frame[sent:]
            self.watch(conn.fd, True)

    def _flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.unsent)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        del conn.unsent[:sent]
        if not conn.unsent:
            self.watch(conn.fd, False)

    # -- ending ---------------------------------------------------------------------------

    def _close(self, conn: _Conn, flush: bool = False) -> None:
        if self.by_fd.get(conn.fd) is not conn:
            return  # closed already (a send that failed on the way here closes it too)
        if flush and conn.unsent:
            try:  # the last word (an ERROR) if the kernel takes it at once; never waited for
                conn.sock.send(conn.unsent)
            except OSError:
                pass
        self.by_fd.pop(conn.fd, None)
        self.by_addr.pop(conn.addr, None)
        self.unwatch(conn.fd)
        self.stats["closed"] += 1
        conn.sock.close()

    def close(self) -> None:
        """Stop listening and close every connection (their clients see the end of the stream)."""
        for conn in list(self.by_fd.values()):
            self._close(conn)
        self.unwatch(self.listen_fd)
        self.listener.close()


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
