"""The routing addresses of the broker's own connections, and which door a reply leaves by.

Every client connection has a routing address for the routing core: ZeroMQ names its
peers itself (5 bytes, the first zero), and the broker names the connections of its own
doors in a shape ZeroMQ never gives: nine bytes, the first zero (:func:`is_fast_addr`,
the one test of it). The second byte says which door: 0 for the fast port (its counter
would need 2**56 connections to reach the next), 1 for the HTTP door.
A ZeroMQ peer may set itself any identity, one of this shape too: the routing core's gate
(``broker/gate.py``) drops its requests, since their replies would go to another's
connection.

No sockets here: :class:`Doors` is only where each reply goes, given each door's send.
"""

from __future__ import annotations

from collections.abc import Callable

#: The length of an address the broker gives its own connections.
ADDR_SIZE = 9
#: A fast connection's address: this, then an 8-byte counter.
FAST_PREFIX = b"\x00"
#: An HTTP connection's address: this, then a 7-byte counter.
HTTP_PREFIX = b"\x00\x01"


def is_fast_addr(addr: bytes) -> bool:
    """Whether a routing address is one of the broker's own connections' (a fast or an HTTP one).

    The one test of the address's shape: a reply for such an address leaves by the fast
    port or the HTTP door, and the gate drops a ZeroMQ peer that set itself one."""
    return len(addr) == ADDR_SIZE and addr[0] == 0


def _nobody(addr: bytes, reply: bytes) -> None:
    """A reply for a door the node does not have: no connection of it can exist."""


class Doors:
    """Which door a reply leaves by: the routing core's ``to_client``.

    ``zmq_send(meta, addr, reply)`` is the ZeroMQ front's; the fast port's and the HTTP
    door's ``send(addr, reply)`` are set as they open (:meth:`add`)."""

    def __init__(self, zmq_send: Callable[[int, bytes, bytes], None]) -> None:
        self._zmq_send = zmq_send
        self._fast_send: Callable[[bytes, bytes], None] = _nobody
        self._http_send: Callable[[bytes, bytes], None] = _nobody

    def add(self, *, fast: Callable[[bytes, bytes], None] | None = None, http=None) -> None:
        if fast is not None:
            self._fast_send = fast
        if http is not None:
            self._http_send = http

    def to_client(self, meta: int, addr: bytes, reply: bytes) -> None:
        # is_fast_addr, written out: every reply passes here.
        if len(addr) == ADDR_SIZE and addr[0] == 0:
            if addr[1]:
                self._http_send(addr, reply)
            else:
                self._fast_send(addr, reply)
        else:
            self._zmq_send(meta, addr, reply)
