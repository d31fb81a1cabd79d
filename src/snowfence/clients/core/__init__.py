"""The sans-I/O heart of both clients: every choice they make, by job.

Nothing here waits on a socket or reads a clock; the blocking and asyncio clients
feed it reply bodies and the monotonic time, and do what it says. The two clients
differ only in how they wait.

- :mod:`.blocks`: what a reservation hands back (:class:`Block`) and the checks on
  what it is asked for;
- :mod:`.inflight`: the request table, requests on the wire and which reply answers
  which (:class:`Core`);
- :mod:`.directory`: the endpoints, when to ask the cluster for them, and where to
  fail over to (:class:`Directory`);
- :mod:`.fastpath`: when a reservation goes to a node's fast TCP port, and what a
  failure there means (:class:`FastPath`);
- :mod:`.rounds`: how a reservation is split, what a reply, a timeout or a refusal
  makes it do next, retries and back-off (:class:`ReserveJob`, :class:`ReserveRound`,
  :class:`StatusRound`);
- :mod:`.handshake`: what the socket monitor says about the connection, and the error
  it names (:class:`Link`);
- :mod:`.prefetch`: the blocks ``ids()`` keeps in hand (:class:`PrefetchDepth`,
  :class:`Prefetch`);
- :mod:`.client`: the constructor both clients share and what ties the above
  together: discovery, when a move may close the connection, which call takes the
  one-request path (:class:`ClientBase`).

The one thing here that touches a socket is how both clients open theirs
(:func:`open_dealer`, :func:`close_dealer`).
"""

from __future__ import annotations

from .blocks import Block, Watermark, as_array, as_numpy, check_after, check_count
from .client import DEFAULT_RETRIES, DEFAULT_TIMEOUT_S, DEFAULT_WINDOW, MAX_TIMEOUT_S, ClientBase
from .directory import DISCOVER_EVERY_S, DISCOVER_TIMEOUT_S, Directory
from .fastpath import FAST_CONNECT_TIMEOUT_S, FAST_RETRY_S, KEEP, FastPath, fits_one_request
from .handshake import EVENTS, GREETING_BYTES, GREETING_START, Link, greeting_address, greeting_mechanism
from .inflight import Core, Pending
from .prefetch import Prefetch, PrefetchDepth, fresh
from .rounds import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    ReserveJob,
    ReserveRound,
    StatusRound,
    apply_reply,
)

__all__ = [
    "BACKOFF_MAX_S",
    "BACKOFF_MIN_S",
    "DEFAULT_RETRIES",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_WINDOW",
    "DISCOVER_EVERY_S",
    "DISCOVER_TIMEOUT_S",
    "FAST_CONNECT_TIMEOUT_S",
    "FAST_RETRY_S",
    "EVENTS",
    "GREETING_BYTES",
    "GREETING_START",
    "KEEP",
    "Link",
    "MAX_TIMEOUT_S",
    "Block",
    "Watermark",
    "ClientBase",
    "Core",
    "Directory",
    "FastPath",
    "Pending",
    "Prefetch",
    "PrefetchDepth",
    "ReserveJob",
    "ReserveRound",
    "StatusRound",
    "apply_reply",
    "as_array",
    "as_numpy",
    "check_after",
    "check_count",
    "fits_one_request",
    "fresh",
    "greeting_address",
    "greeting_mechanism",
    "close_dealer",
    "monitor_event",
    "open_dealer",
]


def open_dealer(ctx, curve, endpoint: str):
    """A DEALER socket as both clients open one, and its monitor: on their context ``ctx``,
    no linger, with ``curve`` (a :class:`~snowfence.curve.Curve`) when the broker encrypts,
    connected to ``endpoint``. Returns ``(socket, monitor)``: the monitor is a PAIR socket
    that receives the connection's events (:data:`handshake.EVENTS`; read them with
    :func:`monitor_event` and feed them to a :class:`Link`).

    No send on the socket ever blocks (a send timeout of 0): a send that cannot go out now
    raises ``zmq.Again``, and the client waits for room with the request's deadline, and
    for the monitor, which says when a refused handshake has left it with nowhere to send.
    """
    import zmq

    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, 0)
    if curve is not None:
        curve.apply(sock)
    monitor = sock.get_monitor_socket(EVENTS)
    sock.connect(endpoint)
    return sock, monitor


def close_dealer(sock, monitor) -> None:
    """Close what :func:`open_dealer` opened."""
    try:
        sock.disable_monitor()
    except Exception:  # noqa: BLE001 - the socket may be closed already; nothing to stop then
        pass
    monitor.close(linger=0)
    sock.close(linger=0)


def monitor_event(frames: list[bytes]) -> tuple[int, int]:
    """(event, value) from one monitor message's frames (libzmq: uint16 event, uint32 value)."""
    head = frames[0]
    return int.from_bytes(head[:2], "little"), int.from_bytes(head[2:6], "little")
