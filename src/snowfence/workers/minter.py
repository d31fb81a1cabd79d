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

from ..errors import BadRequest, ClockUnsafe, Fenced, ReservationExpired
from ..ids import Layout
from ..protocol import MAX_BLOCK

#: A fence deadline that never passes (embedded mode: the kernel holds the lock).
NEVER_NS = 1 << 62

#: How long the minter may wait in one call for the clock to reach a millisecond
#: before it gives up with ``clock_unsafe`` (a clock that does not advance).
MAX_WAIT_NS = 1_000_000_000


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
        "on_step_back",
        "waits",
        "_wall_ns",
        "_mono_ns",
        "_sleep",
        "_epoch_ms",
        "_time_shift",
        "_base",
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
    ) -> None:
        self.layout = layout
        self.region = layout.check_region(region)
        self.worker_id = layout.check_worker(worker_id)
        self._wall_ns = wall_ns
        self._mono_ns = mono_ns
        self._sleep = sleep
        self.max_step_back_ms = max_step_back_ms
        #: Called with (step_back_ms, refused) whenever the clock is seen behind last_ms.
        self.on_step_back = on_step_back
        self._epoch_ms = layout.epoch_ms
        self._time_shift = layout.time_shift
        self._base = (region << layout.region_shift) | (worker_id << layout.worker_shift)
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

    def reserve(self, n: int) -> tuple[int, int]:
        """Reserve up to ``n`` IDs minted within one millisecond: ``(first, count)``.

        ``count`` may be less than ``n`` when the millisecond has fewer IDs left;
        the caller asks again for the rest. Raises :class:`Fenced`,
        :class:`ClockUnsafe` or :class:`ReservationExpired` without changing state.
        """
        if not 0 < n <= MAX_BLOCK:
            raise BadRequest(f"count must be 1..{MAX_BLOCK}, got {n}")
        if self._mono_ns() > self.fence_deadline_ns:
            raise Fenced("no lease renewal succeeded within the fence window")
        now = self._wall_ns() // 1_000_000 - self._epoch_ms
        last = self.last_ms
        if now > last:
            seq = 0
        elif now == last and self.seq < self._max_seq:
            seq = self.seq + 1
        else:
            now, seq = self._wait_for_millisecond(now)
        if now > self.reserved_until_ms:
            raise ReservationExpired(f"millisecond {now} is past the persisted reservation {self.reserved_until_ms}")
        count = self._span - seq
        if n < count:
            count = n
        self.last_ms = now
        self.seq = seq + count - 1
        return self._base | (now << self._time_shift) | seq, count

    def _wait_for_millisecond(self, now: int) -> tuple[int, int]:
        """The slow path: the clock is behind ``last_ms``, or its millisecond is used up.

        Waits (bounded) until a millisecond with a free sequence number comes, and
        returns it with that sequence number; or raises without changing state.
        """
        last = self.last_ms
        back = last - now
        if back > 0:
            refused = back > self.max_step_back_ms
            if self.on_step_back is not None:
                self.on_step_back(back, refused)
            if refused:
                self.clock_unsafe = True
                raise ClockUnsafe(
                    f"wall clock is {back} ms behind the last minted millisecond "
                    f"(more than {self.max_step_back_ms} ms); refusing until it passes it"
                )
            self.waits["step_back"] += 1
        else:
            self.waits["sequence"] += 1
        give_up_ns = self._mono_ns() + MAX_WAIT_NS
        while True:
            # Sleep to the start of the millisecond we can use: ``last`` itself if
            # its sequence has room, else the one after it.
            target = last if self.seq < self._max_seq else last + 1
            wall = self._wall_ns()
            now = wall // 1_000_000 - self._epoch_ms
            if now > last:
                seq = 0
                break
            if now == last and self.seq < self._max_seq:
                seq = self.seq + 1
                break
            if last - now > self.max_step_back_ms:
                self.clock_unsafe = True
                raise ClockUnsafe(f"wall clock stepped back {last - now} ms while waiting")
            if self._mono_ns() > give_up_ns:
                raise ClockUnsafe("wall clock did not reach the next millisecond within 1 s")
            self._sleep(((target + self._epoch_ms) * 1_000_000 - wall) / 1e9)
        if self._mono_ns() > self.fence_deadline_ns:
            raise Fenced("the lease fence passed while waiting for the clock")
        return now, seq
