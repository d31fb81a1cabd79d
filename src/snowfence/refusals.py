"""The refusal a client gets when no worker ID can serve it, by the states it is in.

A worker (for a request none of its worker IDs can serve) and the broker (for a
request no worker in rotation can take) both answer with :func:`refusal_for`
the states they see, so a client learns the real reason rather than a generic
"unavailable". It lives here, beside :mod:`snowfence.errors`, because both
sides use it and neither may reach into the other's package.

The states are named as on the wire (a STATE frame's ``state`` fields, see
:class:`snowfence.workers.states.State`): only their names matter here.
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import ClockUnsafe, Fenced, ReservationExpired, SnowfenceError, Unavailable

#: The states that stand for a refusal of their own, the most telling first, and
#: the error each gives. Any other state (waiting, claiming, stopping) gives
#: ``unavailable``.
REFUSALS: tuple[tuple[str, type[SnowfenceError], str], ...] = (
    ("fenced", Fenced, "lease renewals are failing"),
    ("clock_unsafe", ClockUnsafe, "the wall clock cannot be trusted"),
    ("reserving", ReservationExpired, "waiting for the reservation to be extended"),
)


def refusal_for(states: Iterable[str], reasons: Iterable[str] = ()) -> SnowfenceError:
    """The most telling error for worker IDs in ``states``, none of them ready.

    ``reasons`` (why each is not ready, in words) travel with it, each once."""
    states = set(states)
    reasons = sorted({r for r in reasons if r})
    why = f" ({'; '.join(reasons)})" if reasons else ""
    for state, error, message in REFUSALS:
        if state in states:
            return error(message + why)
    return Unavailable("no worker is ready" + why)
