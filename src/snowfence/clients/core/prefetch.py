"""How many blocks ``ids()`` keeps in hand (:class:`PrefetchDepth`), which of them it
hands out next (:class:`Prefetch`), and until when each of its IDs may be handed out
(:func:`fresh`).

The promise of ``max_age_s``: every ID ``ids()`` hands out was minted less than
``max_age_s`` before the moment it is handed out, by the client's monotonic clock. A
block's age counts from when the client asked for it (before it was minted, so the age
is never less than the real one), and is checked at each ID handed out, not once per
block: a consumer may pause at any point of a block, and what its pause made stale is
dropped, never handed out. Checking per slice of a block would be cheaper and is not
exact: a pause inside a slice would hand out the rest of the slice stale.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from ... import protocol
from ...errors import SnowfenceError
from .blocks import Block


class PrefetchDepth:
    """How many blocks ``ids()`` keeps in hand: between 1 and ``depth``, doubling
    when the consumer had to wait and halving when a block went stale (older than
    ``max_age_s`` when its turn came; None keeps every block)."""

    def __init__(self, batch: int, depth: int, max_age_s: float | None) -> None:
        if not 1 <= batch <= protocol.MAX_BLOCK or depth < 1:
            raise ValueError(f"need 1 <= batch <= {protocol.MAX_BLOCK} and prefetch >= 1")
        if max_age_s is not None and (
            isinstance(max_age_s, bool) or not isinstance(max_age_s, (int, float)) or not 0 < max_age_s < 1e6
        ):
            raise ValueError(f"max_age_s must be a positive number of seconds or None, got {max_age_s!r}")
        self.batch = batch
        self.depth = depth
        self.target = min(2, depth)
        self.max_age_ns = None if max_age_s is None else int(max_age_s * 1e9)
        self.dropped = 0

    def starved(self) -> None:
        """The consumer found nothing in hand."""
        self.target = min(self.depth, self.target * 2)

    def stale(self, asked_ns: int, now_ns: int) -> bool:
        """Whether a block asked for at ``asked_ns`` is too old to hand out now (and is dropped)."""
        if self.max_age_ns is None or now_ns - asked_ns <= self.max_age_ns:
            return False
        self.dropped += 1
        self.target = max(1, self.target // 2)
        return True

    def wanted_ids(self, in_hand: int) -> int:
        """IDs to reserve now with ``in_hand`` blocks held (0: enough)."""
        return max(0, self.target - in_hand) * self.batch


class Prefetch:
    """The blocks ``ids()`` keeps in hand, and what the refill left to say: both clients
    hold their blocks here and differ only in how the consumer and the refill wait
    for each other (a condition variable, or asyncio events).

    The consumer calls :meth:`take` and, when it gives None, waits for the refill
    to :meth:`add` blocks (or to fail: :meth:`take` then raises its error); the
    refill asks for :meth:`wanted` IDs whenever that is not 0.
    """

    def __init__(self, depth: PrefetchDepth) -> None:
        self.depth = depth
        #: (monotonic ns when asked for, the block's IDs), oldest first.
        self.blocks: deque[tuple[int, range]] = deque()
        #: Why the refill stopped, for the consumer to raise once the blocks in hand are used.
        self.error: SnowfenceError | None = None
        self.closed = False

    def take(self, now_ns: int) -> tuple[range, int | None] | None:
        """The next block's IDs and the monotonic ns past which none of them may be handed
        out (None: no ``max_age_s``), passing over stale blocks; None when none is in hand
        (the consumer waits, and the depth grows). Raises the refill's error, or ValueError
        once the client is closed, when nothing is left in hand."""
        max_age_ns = self.depth.max_age_ns
        while self.blocks:
            asked_ns, ids = self.blocks.popleft()
            if not self.depth.stale(asked_ns, now_ns):
                return ids, None if max_age_ns is None else asked_ns + max_age_ns
        if self.error is not None:
            raise self.error
        if self.closed:
            raise ValueError("the client was closed")
        self.depth.starved()
        return None

    def wanted(self) -> int:
        """IDs the refill should reserve now (0: enough in hand, or closed)."""
        return 0 if self.closed else self.depth.wanted_ids(len(self.blocks))

    def add(self, blocks: list[Block], asked_ns: int) -> None:
        """Keep ``blocks``, reserved by a call that began at ``asked_ns`` (monotonic): their
        age counts from then, before they were minted."""
        self.blocks.extend((asked_ns, b.range()) for b in blocks)


def fresh(ids: range, deadline_ns: int, clock: Callable[[], int]) -> Iterator[int]:
    """The IDs of ``ids``, each handed out only while ``clock()`` has not passed
    ``deadline_ns``; once it has, the rest of the block is dropped. One read of the
    monotonic clock per ID: the price of an exact ``max_age_s`` (see the module)."""
    for id_ in ids:
        if clock() > deadline_ns:
            return
        yield id_
