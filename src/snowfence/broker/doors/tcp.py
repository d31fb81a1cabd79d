"""What the fast port and the HTTP door share: a listening TCP socket and its connections,
read and written by the broker's own loop.

:class:`TcpDoor` binds (:func:`listen_tcp`), accepts up to its cap (one more is turned
away and closed at once), gives each connection a routing address of the broker's own
(``addresses.py``), keeps its connections by descriptor and by address, writes with a
buffer for what the kernel would not take yet, and closes. What is read, and what is
written, is each door's own.

The one watch interface: the loop's epoll set is a :class:`Watcher`. A door asks it to
watch a descriptor for an epoll mask (0: only hang-ups and errors) and names itself as
the descriptor's owner; the loop hands each event on that descriptor to the owner's
``on_event(fd, events)``. Until :meth:`TcpDoor.attach` (and after :meth:`TcpDoor.detach`)
nothing is watched: a test may drive ``on_event`` itself.
"""

from __future__ import annotations

import itertools
import select
import socket
from typing import Protocol

from ...errors import ConfigError
from .addresses import ADDR_SIZE

EPOLLIN = select.EPOLLIN
EPOLLOUT = select.EPOLLOUT
#: Connections accepted per wake-up.
ACCEPT_BATCH = 64


class Watcher(Protocol):
    """The loop's epoll set, as the doors see it."""

    def watch(self, fd: int, mask: int, owner: TcpDoor | None = None) -> None:
        """Watch ``fd`` for exactly ``mask``; its events go to ``owner.on_event``."""

    def unwatch(self, fd: int) -> None:
        """Stop watching ``fd`` (before it is closed)."""


class _Unwatched:
    """No epoll set: before the loop has one, after it has gone, or in a test that polls itself."""

    def watch(self, fd: int, mask: int, owner: TcpDoor | None = None) -> None:
        pass

    def unwatch(self, fd: int) -> None:
        pass


UNWATCHED = _Unwatched()


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


class TcpConn:
    """One accepted connection: its socket, descriptor, routing address and unsent bytes."""

    __slots__ = ("sock", "fd", "addr", "unsent")

    def __init__(self, sock: socket.socket, addr: bytes) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.addr = addr
        #: Bytes the kernel would not take yet.
        self.unsent = bytearray()


class TcpDoor:
    """A listening socket and its connections (``by_fd``, ``by_addr``); a subclass reads
    (``on_event``) and makes its connections (``_connection``).

    ``stats`` counts connections ``accepted``, ``closed`` (either end) and turned away
    as ``too_many``; a subclass adds its own counts."""

    def __init__(self, host: str, port: int, *, what: str, prefix: bytes, max_connections: int) -> None:
        self.listener = listen_tcp(host, port, what)
        self.listen_fd = self.listener.fileno()
        self.port = self.listener.getsockname()[1]
        self.host = host
        self.max_connections = max_connections
        self._prefix = prefix
        self._counter_bytes = ADDR_SIZE - len(prefix)
        self._next = itertools.count(1)
        self.by_fd: dict[int, TcpConn] = {}
        self.by_addr: dict[bytes, TcpConn] = {}
        self.watcher: Watcher = UNWATCHED
        self.stats = {"accepted": 0, "closed": 0, "too_many": 0}

    def describe(self) -> dict:
        return {"port": self.port, "host": self.host, "connections": len(self.by_fd), **self.stats}

    def attach(self, watcher: Watcher) -> None:
        """Watch the listening socket (and any connection) in the loop's epoll set."""
        self.watcher = watcher
        watcher.watch(self.listen_fd, EPOLLIN, self)
        for conn in self.by_fd.values():
            watcher.watch(conn.fd, EPOLLIN, self)

    def detach(self) -> None:
        """The loop's epoll set is going (the loop has ended): closing connections after it
        unregisters nothing."""
        self.watcher = UNWATCHED

    def on_event(self, fd: int, events: int) -> None:
        raise NotImplementedError

    # -- accepting ------------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, or the client gave up: the next turn may do
                return
            if len(self.by_fd) >= self.max_connections:
                self.stats["too_many"] += 1
                self._turn_away(sock)
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = self._connection(sock, self._prefix + next(self._next).to_bytes(self._counter_bytes, "big"))
            self.by_fd[conn.fd] = conn
            self.by_addr[conn.addr] = conn
            self.stats["accepted"] += 1
            self.watcher.watch(conn.fd, EPOLLIN, self)

    def _connection(self, sock: socket.socket, addr: bytes) -> TcpConn:
        return TcpConn(sock, addr)

    def _turn_away(self, sock: socket.socket) -> None:
        """A connection one past the cap, about to be closed: a last word, if the door has one."""

    # -- reading and writing --------------------------------------------------------------

    def _recv(self, conn: TcpConn, size: int) -> bytes | None:
        """Up to ``size`` bytes from ``conn``: b"" once its client has finished sending; None
        if none are there yet, or if the connection failed (then it is closed here)."""
        try:
            return conn.sock.recv(size)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            self._close(conn)
            return None

    def _write(self, conn: TcpConn, data: bytes) -> bool:
        """Send ``data`` after what waits already, keeping what the kernel would not take;
        True if bytes now wait (the caller watches for writing), False if none do or the
        connection was closed (a send that failed)."""
        if conn.unsent:
            conn.unsent += data
            return True
        try:
            sent = conn.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(conn)
            return False
        if sent < len(data):
            conn.unsent += memoryview(data)[sent:]
            return True
        return False

    def _flush(self, conn: TcpConn) -> bool:
        """Send what waits; False if nothing could be sent (or the connection was closed)."""
        try:
            sent = conn.sock.send(conn.unsent)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            self._close(conn)
            return False
        del conn.unsent[:sent]
        return True

    # -- ending ---------------------------------------------------------------------------

    def _close(self, conn: TcpConn, flush: bool = False) -> bool:
        """Close a connection (with ``flush``, its unsent bytes go first if the kernel takes
        them at once: never waited for); False if it was closed already (a send that failed
        on the way here closes it too)."""
        if self.by_fd.get(conn.fd) is not conn:
            return False
        if flush and conn.unsent:
            try:
                conn.sock.send(conn.unsent)
            except OSError:
                pass
        del self.by_fd[conn.fd]
        self.by_addr.pop(conn.addr, None)
        self.watcher.unwatch(conn.fd)
        self.stats["closed"] += 1
        conn.sock.close()
        return True

    def close(self) -> None:
        """Stop listening and close every connection (their clients see the end of the stream)."""
        for conn in list(self.by_fd.values()):
            self._close(conn)
        self.watcher.unwatch(self.listen_fd)
        self.listener.close()
