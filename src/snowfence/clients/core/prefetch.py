"""How many blocks ``ids()`` keeps in hand (:class:`PrefetchDepth`) and which of them
it hands out next (:class:`Prefetch`)."""

from __future__ import annotations

from collections import deque

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
        self.batch = batch
        self.depth = depth
        self.target = min(2, depth)
        self.max_age_ns = None if max_age_s is None else int(max_age_s * 1e9)
        self.dropped = 0

    def starved(self) -> None:
        """The consumer found nothing in hand."""
        self.target = min(self.depth, self.target * 2)

    def stale(self, fetched_ns: int, now_ns: int) -> bool:
        """Whether a block fetched at ``fetched_ns`` is too old to hand out now (and is dropped)."""
        if self.max_age_ns is None or now_ns - fetched_ns <= self.max_age_ns:
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
        #: (monotonic ns when fetched, the block's IDs), oldest first.
        self.blocks: deque[tuple[int, range]] = deque()
        #: Why the refill stopped, for the consumer to raise once the blocks in hand are used.
        self.error: SnowfenceError | None = None
        self.closed = False

    def take(self, now_ns: int) -> range | None:
        """The next block's IDs, passing over stale ones; None when none is in hand (the
        consumer waits, and the depth grows). Raises the refill's error, or ValueError
        once the client is closed, when nothing is left in hand."""
        while self.blocks:
            fetched_ns, ids = self.blocks.popleft()
            if not self.depth.stale(fetched_ns, now_ns):
                return ids
        if self.error is not None:
            raise self.error
        if self.closed:
            raise ValueError("the client was closed")
        self.depth.starved()
        return None

    def wanted(self) -> int:
        """IDs the refill should reserve now (0: enough in hand, or closed)."""
        return 0 if self.closed else self.depth.wanted_ids(len(self.blocks))

    def add(self, blocks: list[Block], now_ns: int) -> None:
        self.blocks.extend((now_ns, b.range()) for b in blocks)
