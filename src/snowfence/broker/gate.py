"""Which client requests the broker drops before its intake, unanswered: the routing core's gate.

Two kinds, both ZeroMQ peers', both dropped without an answer and counted in the routing
core's counters (so in STATUS, ``broker.counters``, and in the metrics,
``snowfence_requests_dropped_total``):

- ``revoked_dropped``: the request of a connection whose CURVE key was taken off the
  allow-list after it connected. ZeroMQ asks the allow-list only when a client connects,
  so from the allow-list's reload on such a connection's requests go unanswered, and a
  revoked client gets no ID whether it reconnects or not (docs/OPERATIONS.md).
- ``impostors``: a ZeroMQ peer that set itself the routing address of one of the
  broker's own connections (``doors/addresses.py``): an answer would go to that
  connection. Counted as a ``bad_request`` too, as it always was.

No sockets: the ZeroMQ front reads each message's address and, only while the
allow-list has revoked keys (reading a connection's key costs about a microsecond), its
connection's key, and asks :meth:`Gate.admits`.
"""

from __future__ import annotations

from typing import Protocol

from .doors.addresses import is_fast_addr


class AllowList(Protocol):
    """What the gate reads of the CURVE allow-list's keeper (``auth.Gatekeeper``)."""

    #: The keys (Z85) taken off the list since the node started.
    revoked: frozenset[bytes]


class _NoAllowList:
    revoked: frozenset[bytes] = frozenset()


class Gate:
    """The routing core's gate; ``counters`` are the core's (``revoked_dropped``,
    ``impostors``, and ``bad_request`` for an impostor). ``allow_list`` is the CURVE
    allow-list's keeper when the node has one (``Node`` sets it)."""

    def __init__(self, counters: dict[str, int]) -> None:
        self.counters = counters
        counters["revoked_dropped"] = 0
        counters["impostors"] = 0
        self.allow_list: AllowList = _NoAllowList()

    def admits(self, addr: bytes, key: bytes | None) -> bool:
        """Whether a ZeroMQ client's request, from the routing address ``addr`` on a
        connection whose CURVE key is ``key`` (None: not read, as none is revoked), goes
        to the intake; a request refused here is counted, and never answered."""
        if key is not None and key in self.allow_list.revoked:
            self.counters["revoked_dropped"] += 1
            return False
        if is_fast_addr(addr):
            counters = self.counters
            counters["impostors"] += 1
            counters["bad_request"] += 1
            return False
        return True
