"""The states of a held worker ID: which one it is in, and the one a refusal moves it to.

    claiming -> waiting -> ready <-> fenced | clock_unsafe | reserving

:func:`next_state` is the decision, with no I/O and no clock of its own: the
worker feeds it what its keeper, its minter and its host-clock watch know, and
acts on the answer (moves rotation, logs, tells the broker). The same function
runs in the deterministic simulator (``tests/sim``).

The refusal each state stands for, which the broker uses too, is
:func:`snowfence.refusals.refusal_for`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from ..errors import ClockUnsafe, Fenced, ReservationExpired, SnowfenceError


class State(enum.StrEnum):
    """A state's value is its name on the wire (STATE frames, status, logs)."""

    CLAIMING = "claiming"
    WAITING = "waiting"
    READY = "ready"
    FENCED = "fenced"
    CLOCK_UNSAFE = "clock_unsafe"
    RESERVING = "reserving"
    STOPPING = "stopping"


CLAIMING = State.CLAIMING
WAITING = State.WAITING
READY = State.READY
FENCED = State.FENCED
CLOCK_UNSAFE = State.CLOCK_UNSAFE
RESERVING = State.RESERVING
STOPPING = State.STOPPING


def next_state(
    *,
    worker_id: int,
    renewals: int,
    mono_ns: int,
    fence_deadline_ns: int,
    clock_veto: str | None,
    clock_unsafe: bool,
    now_ms: int,
    mark_ms: int,
    reserved_until_ms: int,
) -> tuple[State, str]:
    """The state a held worker ID should be in, and why.

    ``renewals``: lease renewals that succeeded so far; ``mono_ns`` against
    ``fence_deadline_ns``: whether the fence has passed; ``clock_veto``: a host-clock
    policy forbidding minting, if any; ``clock_unsafe``: the minter refused a
    step back and the wall clock has not passed its last millisecond yet;
    ``now_ms``: the wall clock (ms since the epoch) against ``mark_ms`` (the
    previous owner's mark, found when claiming) and ``reserved_until_ms`` (what
    this owner has persisted).

    The first cause that holds wins, in this order: no renewal yet, fenced,
    clock veto, clock unsafe, the previous owner's mark not passed, the
    reservation behind the clock. A lost lease is not a state: the worker drops
    the worker ID and claims again.
    """
    if renewals == 0:
        return WAITING, f"worker ID {worker_id}: waiting for the first renewal"
    if mono_ns > fence_deadline_ns:
        return FENCED, "no lease renewal succeeded within the fence window"
    if clock_veto:
        return CLOCK_UNSAFE, clock_veto
    if clock_unsafe:
        return CLOCK_UNSAFE, "wall clock is behind the last minted millisecond"
    if now_ms <= mark_ms:
        return WAITING, (
            f"worker ID {worker_id}: waiting for the wall clock to pass the "
            f"previous owner's mark ({mark_ms - now_ms} ms)"
        )
    if reserved_until_ms < now_ms:
        return RESERVING, "waiting for the reservation to be extended"
    return READY, f"worker ID {worker_id} is ready"


def state_after_refusal(err: SnowfenceError) -> State | None:
    """The state a worker ID moves to when its minter refused with ``err``: the
    refusal tells at once what the next timer tick would find (None: not a
    refusal about this worker ID)."""
    if isinstance(err, ReservationExpired):
        return RESERVING  # the caller also wakes the keeper: extend now
    if isinstance(err, Fenced):
        return FENCED
    if isinstance(err, ClockUnsafe):
        return CLOCK_UNSAFE
    return None


def process_state(stopping: bool, any_ready: bool, held: Sequence[State]) -> State:
    """A worker process's own state, as STATE and STATUS show it: stopping, ready
    if any worker ID it holds is, else its first worker ID's, else claiming."""
    if stopping:
        return STOPPING
    if any_ready:
        return READY
    if held:
        return held[0]
    return CLAIMING
