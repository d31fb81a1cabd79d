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
- :mod:`.prefetch`: the blocks ``ids()`` keeps in hand (:class:`PrefetchDepth`,
  :class:`Prefetch`);
- :mod:`.client`: the constructor both clients share and what ties the above
  together: discovery, when a move may close the connection, which call takes the
  one-request path (:class:`ClientBase`).

The one thing here that touches a socket is how both clients open theirs
(:func:`open_dealer`).
"""

from __future__ import annotations

from .blocks import Block, Watermark, as_array, as_numpy, check_after, check_count
from .client import MAX_TIMEOUT_S, ClientBase
from .directory import DISCOVER_EVERY_S, DISCOVER_TIMEOUT_S, Directory
from .fastpath import FAST_CONNECT_TIMEOUT_S, FAST_RETRY_S, KEEP, FastPath, fits_one_request
from .inflight import Core, Pending
from .prefetch import Prefetch, PrefetchDepth
from .rounds import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WINDOW,
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
    "KEEP",
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
    "open_dealer",
]


def open_dealer(ctx, curve, endpoint: str):
    """A DEALER socket as both clients open one: on their context ``ctx``, no linger, with
    ``curve`` (a :class:`~snowfence.curve.Curve`) when the broker encrypts, connected to
    ``endpoint``."""
    import zmq

    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        curve.apply(sock)
    sock.connect(endpoint)
    return sock
