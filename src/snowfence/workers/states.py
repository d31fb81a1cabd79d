"""The states of a held worker ID, and the refusal each stands for.

    claiming -> waiting -> ready <-> fenced | clock_unsafe | reserving

Both a worker (for a request it cannot serve) and the broker (for a request no
worker in rotation can take) answer with :func:`refusal_for` the states they see,
so a client learns the real reason rather than a generic "unavailable".
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ClockUnsafe, Fenced, ReservationExpired, SnowfenceError, Unavailable

CLAIMING = "claiming"
WAITING = "waiting"
READY = "ready"
FENCED = "fenced"
CLOCK_UNSAFE = "clock_unsafe"
RESERVING = "reserving"
STOPPING = "stopping"


def refusal_for(states: Iterable[str], reasons: Iterable[str] = ()) -> SnowfenceError:
    """The most telling error for worker IDs in ``states``, none of them ready."""
    states = set(states)
    reasons = sorted({r for r in reasons if r})
    why = f" ({'; '.join(reasons)})" if reasons else ""
    if FENCED in states:
        return Fenced("fenced: lease renewals are failing" + why)
    if CLOCK_UNSAFE in states:
        return ClockUnsafe("the wall clock cannot be trusted" + why)
    if RESERVING in states:
        return ReservationExpired("waiting for the reservation to be extended" + why)
    return Unavailable("no worker is ready" + why)
