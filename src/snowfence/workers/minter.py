"""The minter: turns (worker ID, clock) into blocks of IDs, and refuses rather than risk.

One minter per worker ID. ``reserve(n)`` runs the guards of the design in order
and commits nothing until all of them passed:

1. fenced?  the last successful lease renewal was *sent* too long ago (monotonic);
2. clock went back?  a step of ``max_step_back_ms`` or less is waited out, a larger
   one marks the clock unsafe and refuses;
3. sequence: continue the millisecond or start a new one; a used-up millisecond
   waits for the next; a block never crosses a millisecond;
4. reservation: the millisecond must not pass the persisted high-water mark;
5. commit ``last_ms`` and ``seq``.

The wall clock, the monotonic clock and sleeping are injected so tests can drive
any sequence of readings. The lease keeper (another thread) moves
``fence_deadline_ns`` and ``reserved_until_ms`` forward; plain attribute writes are
atomic under the GIL and the minter only ever compares against them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import BadRequest, ClockUnsafe, Fenced, ReservationExpired, TokenAhead
from ..ids import Layout
from ..protocol import MAX_BLOCK

#: A fence deadline that never passes (embedded mode: the kernel holds the lock).
NEVER_NS = 1 << 62

#: No causal token: any millisecond will do.
NO_FLOOR = -(1 << 62)

#: How far an idle minter's floor trails the wall clock (:meth:`Minter.raise_floor`): an idle
#: worker ID still takes a step back of the clock this large in its stride, as one that minted
#: a second ago does, at the price of as much more lag in the watermark.
FLOOR_TRAIL_MS = 1000

#: How long the minter may wait in one call for the clock to reach a millisecond
#: before it gives up with ``clock_unsafe`` (a clock that does not advance).
MAX_WAIT_NS = 1_000_000_000


class WouldWait(Exception):
    """A minter that may not wait (the broker's own) found its millisecond used up or
    its clock behind: nothing changed, and the request belongs to a minter that may."""


def _token_ahead(ahead_ms: int, allowed_ms: int, how: str) -> TokenAhead:
    """A causal token ``ahead_ms`` ahead of the clock, beyond the ``allowed_ms`` the minter
    follows it: ``retry_after_ms`` is when the clock will have come within reach of it."""
    err = TokenAhead(
        f"the causal token is {ahead_ms} ms ahead of this worker's clock (more than the {allowed_ms} ms {how})"
    )
    err.retry_after_ms = ahead_ms - allowed_ms
    return err


class Minter:
    """Mints blocks for one worker ID. Not thread-safe: one caller at a time."""

    __slots__ = (
        "layout",
        "region",
        "worker_id",
        "last_ms",
        "seq",
        "fence_deadline_ns",
        "reserved_until_ms",
        "clock_unsafe",
        "max_step_back_ms",
        "max_ahead_ms",
        "may_wait",
        "hlc",
        "on_step_back",
        "waits",
        "_wall_ns",
        "_mono_ns",
        "_sleep",
        "_epoch_ms",
        "_time_shift",
        "_base",
        "_base_mask",
        "_shard",
        "_max_seq",
        "_span",
    )

    def __init__(
        self,
        layout: Layout,
        region: int,
        worker_id: int,
        *,
        wall_ns: Callable[[], int] = time.time_ns,
        mono_ns: Callable[[], int] = time.monotonic_ns,
        sleep: Callable[[float], None] = time.sleep,
        max_step_back_ms: int = 10,
        on_step_back: Callable[[int, bool], None] | None = None,
        waits: dict | None = None,
        clock_policy: str = "wait",
        max_ahead_ms: int = 1000,
        may_wait: bool = True,
    ) -> None:
        self.layout = layout
        self.region = layout.check_region(region)
        self.worker_id = layout.check_worker(worker_id)
        self._wall_ns = wall_ns
        self._mono_ns = mono_ns
        self._sleep = sleep
        self.max_step_back_ms = max_step_back_ms
        if clock_policy not in ("wait", "hlc"):
            raise ValueError(f"clock_policy must be 'wait' or 'hlc', not {clock_policy!r}")
        #: "hlc": when the wall clock is behind (or a millisecond is used up), keep
        #: minting from the logical millisecond instead of waiting, up to ``max_ahead_ms``.
        self.hlc = clock_policy == "hlc"
        self.max_ahead_ms = max_ahead_ms
        #: False for a minter on a loop that must never block (the broker's): where
        #: this one would sleep, it raises :class:`WouldWait` instead, changing nothing.
        self.may_wait = may_wait
        #: Called with (step_back_ms, refused) whenever the clock is seen behind last_ms.
        self.on_step_back = on_step_back
        self._epoch_ms = layout.epoch_ms
        self._time_shift = layout.time_shift
        self._shard = layout.shard_of(region, worker_id)
        self._base = (
            (self._shard << layout.shard_shift) | (region << layout.region_shift) | (worker_id << layout.worker_shift)
        )
        self._base_mask = ((1 << layout.time_shift) - 1) ^ layout.max_sequence
        self._max_seq = layout.max_sequence
        self._span = layout.max_sequence + 1
        #: The last millisecond (since the epoch) minted from, and its last sequence.
        #: Millisecond 0 counts as used up, so the first ID is minted after the epoch.
        self.last_ms = 0
        self.seq = self._max_seq
        #: Monotonic ns after which the minter refuses as fenced. Set by the lease keeper.
        self.fence_deadline_ns = -1
        #: The highest millisecond this owner has persisted as its reservation.
        self.reserved_until_ms = -1
        #: Set when a large step back was refused; the worker leaves rotation until
        #: the wall clock has passed ``last_ms`` again (see :meth:`clock_recovered`).
        self.clock_unsafe = False
        #: Count of waits by cause: "step_back" and "sequence" (may be shared by
        #: the minters of one process, so the counts outlive a lost lease).
        self.waits = {"step_back": 0, "sequence": 0} if waits is None else waits

    # -- setup by the lease ------------------------------------------------------------

    def start_after(self, mark_ms: int) -> None:
        """Never mint at or below ``mark_ms`` (a previous owner's high-water mark)."""
        if mark_ms >= self.last_ms:
            self.last_ms = mark_ms
            self.seq = self._max_seq

    def raise_floor(self) -> None:
        """Promise never to mint below the wall clock's millisecond less ``FLOOR_TRAIL_MS``
        (nor past the reservation): ``last_ms`` moves up to it as if it had been used up.
        Every later mint carries ``last_ms`` or more, so the lease keeper publishes
        ``last_ms`` as the holder's floor, and an idle worker ID's floor keeps up with time
        (the watermark waits for the lowest floor). It trails the clock so that an idle
        worker ID absorbs a step back of the clock of up to that much, as before. On the
        minting thread only, like :meth:`reserve`; it mints nothing and costs the hot path
        nothing."""
        target = min(self._wall_ns() // 1_000_000 - self._epoch_ms - FLOOR_TRAIL_MS, self.reserved_until_ms + 1) - 1
        if target > self.last_ms:
            self.last_ms = target
            self.seq = self._max_seq

    def floor_after(self, after: int) -> int:
        """The earliest millisecond whose IDs from this worker ID all sort after ``after``.

        In the same millisecond, IDs order by region and worker bits: a token
        from a lower one is passed by this millisecond already, anything else
        only by the next.
        """
        layout = self.layout
        shard = after >> layout.shard_shift
        if shard != self._shard:
            if self._shard > shard:
                return NO_FLOOR  # a higher shard sorts after anything of a lower one
            raise BadRequest(
                f"the causal token is in shard {shard}, above this worker ID's shard {self._shard}: "
                "no ID minted here can sort after it"
            )
        ms = (after >> self._time_shift) & layout.max_ms
        own = self._base & self._base_mask
        return ms if own > (after & self._base_mask) else ms + 1

    def now_ms(self) -> int:
        """The wall clock in milliseconds since the epoch."""
        return self._wall_ns() // 1_000_000 - self._epoch_ms

    def clock_recovered(self) -> bool:
        """True once the wall clock has passed ``last_ms``; clears ``clock_unsafe``."""
        if self.now_ms() > self.last_ms:
            self.clock_unsafe = False
            return True
        return False

    # -- the hot path ----------------------------------------------------------------

    def reserve(self, n: int, floor_ms: int = NO_FLOOR) -> tuple[int, int]:
        """Reserve up to ``n`` IDs minted within one millisecond: ``(first, count)``.

        ``count`` may be less than ``n`` when the millisecond has fewer IDs left;
        the caller asks again for the rest. ``floor_ms`` is the earliest
        millisecond the IDs may carry (a causal token). Raises :class:`Fenced`,
        :class:`ClockUnsafe`, :class:`ReservationExpired` or :class:`TokenAhead`
        without changing state.
        """
        if not 0 < n <= MAX_BLOCK:
            raise BadRequest(f"count must be 1..{MAX_BLOCK}, got {n}")
        if self._mono_ns() > self.fence_deadline_ns:
            raise Fenced("no lease renewal succeeded within the fence window")
        now = self._wall_ns() // 1_000_000 - self._epoch_ms
        last = self.last_ms
        if now > last and now >= floor_ms:
            seq = 0
        elif now == last and self.seq < self._max_seq and now >= floor_ms:
            seq = self.seq + 1
        elif self.hlc:
            now, seq = self._logical(now, floor_ms)
        else:
            now, seq = self._wait_for_millisecond(now, floor_ms)
        if now > self.reserved_until_ms:
            raise ReservationExpired(f"millisecond {now} is past the persisted reservation {self.reserved_until_ms}")
        count = self._span - seq
        if n < count:
            count = n
        self.last_ms = now
        self.seq = seq + count - 1
        return self._base | (now << self._time_shift) | seq, count

    def _report_step_back(self, now: int, limit_ms: int) -> bool:
        """Tell the observer about a clock behind ``last_ms``; True if it is beyond ``limit_ms``."""
        back = self.last_ms - now
        if back <= 0:
            return False
        refused = back > limit_ms
        if self.on_step_back is not None:
            self.on_step_back(back, refused)
        return refused

    def _logical(self, now: int, floor_ms: int) -> tuple[int, int]:
        """The hybrid logical clock's slow path: never wait, run ahead of the wall clock instead.

        The millisecond minted is the earliest one that is free, not below
        ``floor_ms`` and not below the wall clock; it may be ahead of the wall
        clock by up to ``max_ahead_ms``.
        """
        if self.seq < self._max_seq:
            ms, seq = self.last_ms, self.seq + 1
        else:
            ms, seq = self.last_ms + 1, 0
        if now > ms:
            ms, seq = now, 0
        if floor_ms > ms:
            ms, seq = floor_ms, 0
        ahead = ms - now
        refused = self._report_step_back(now, self.max_ahead_ms)
        if ahead > self.max_ahead_ms:
            if ms == floor_ms and not refused:
                raise _token_ahead(floor_ms - now, self.max_ahead_ms, "it may run ahead")
            self.clock_unsafe = True
            raise ClockUnsafe(
                f"the logical clock would run {ahead} ms ahead of the wall clock "
                f"(more than {self.max_ahead_ms} ms); refusing until the wall clock catches up"
            )
        if ahead > 0:
            self.waits["ahead"] = self.waits.get("ahead", 0) + 1
        return ms, seq

    def _wait_for_millisecond(self, now: int, floor_ms: int) -> tuple[int, int]:
        """The slow path: the clock is behind ``last_ms`` or ``floor_ms``, or its millisecond is used up.

        Waits (bounded) until a millisecond with a free sequence number comes, and
        returns it with that sequence number; or raises without changing state.
        """
        last = self.last_ms
        if floor_ms - now > self.max_step_back_ms:
            raise _token_ahead(floor_ms - now, self.max_step_back_ms, "it may wait")
        if self._report_step_back(now, self.max_step_back_ms):
            self.clock_unsafe = True
            raise ClockUnsafe(
                f"wall clock is {last - now} ms behind the last minted millisecond "
                f"(more than {self.max_step_back_ms} ms); refusing until it passes it"
            )
        if not self.may_wait:
            raise WouldWait
        self.waits["step_back" if now < last else "sequence"] += 1
        give_up_ns = self._mono_ns() + MAX_WAIT_NS
        while True:
            # Sleep to the start of the millisecond we can use: ``last`` itself if
            # its sequence has room, else the one after it; never below the floor.
            target = last if self.seq < self._max_seq else last + 1
            if floor_ms > target:
                target = floor_ms
            wall = self._wall_ns()
            now = wall // 1_000_000 - self._epoch_ms
            if now >= target:
                seq = 0 if now > last else self.seq + 1
                break
            if last - now > self.max_step_back_ms or floor_ms - now > self.max_step_back_ms:
                self.clock_unsafe = True
                raise ClockUnsafe(f"wall clock stepped back {max(last, floor_ms) - now} ms while waiting")
            if self._mono_ns() > give_up_ns:
                raise ClockUnsafe("wall clock did not reach the next millisecond within 1 s")
            self._sleep(((target + self._epoch_ms) * 1_000_000 - wall) / 1e9)
        if self._mono_ns() > self.fence_deadline_ns:
            raise Fenced("the lease fence passed while waiting for the clock")
        return now, seq
