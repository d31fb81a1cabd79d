"""What a reservation hands back, and the checks on what it is asked for.

A :class:`Block` is a run of IDs one worker minted within one millisecond;
:func:`as_array` and :func:`as_numpy` flatten a reservation's blocks. The counts
and causal tokens a call takes are checked here, before anything is sent.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator
from typing import NamedTuple

from ...errors import BadRequest


class Watermark(NamedTuple):
    """A promise about the past: no ID carrying a millisecond before ``unix_ms`` is minted,
    by any node of the cluster, after the reply that carried it. ``lowest`` is the lowest
    ID of that millisecond in shard 0: with no shard bits, every ID minted later is at or
    above it (with shard bits, :meth:`ids` gives one per shard)."""

    unix_ms: int
    lowest: int

    @property
    def time(self) -> _dt.datetime:
        return _dt.datetime.fromtimestamp(self.unix_ms / 1000, tz=_dt.UTC)

    def ids(self, layout) -> tuple[int, ...]:
        """Per shard, the lowest ID every later mint of that shard is at or above."""
        return tuple(r.first for r in layout.bounds(self.unix_ms))


class Block:
    """IDs ``first .. first+count-1``: minted by one worker within one millisecond."""

    __slots__ = ("first", "count")

    def __init__(self, first: int, count: int) -> None:
        self.first = first
        self.count = count

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    def range(self) -> range:
        return range(self.first, self.first + self.count)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.first, self.first + self.count))

    def __len__(self) -> int:
        return self.count

    def __contains__(self, id_: object) -> bool:
        return isinstance(id_, int) and self.first <= id_ < self.first + self.count

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Block) and (self.first, self.count) == (other.first, other.count)

    def __hash__(self) -> int:
        return hash((self.first, self.count))

    def __repr__(self) -> str:
        return f"Block(first={self.first}, count={self.count})"


#: The most IDs one ``reserve()`` returns. Its blocks are all held until it returns (one per
#: 4,096 IDs or fewer), so 10**12 would run for hours with its memory growing: more is asked
#: for in a loop of calls, or streamed with ``ids()``.
MAX_RESERVE = 1 << 30


def check_count(n: object) -> int:
    """A count of IDs to reserve: a programming error (``TypeError``, ``ValueError``) when it is
    not one, raised before anything is sent, as Python's own functions do."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"count must be an integer, not {type(n).__name__}")
    if not 1 <= n <= MAX_RESERVE:
        raise ValueError(
            f"count must be 1 .. {MAX_RESERVE:,} (2**30) per reserve() call, got {n:,}: reserve more in a loop, "
            "or stream them with ids()"
        )
    return n


def check_after(after: object) -> int | None:
    """A causal token is an ID: an integer 0 .. 2**63-1 (or None for none)."""
    if after is None:
        return None
    if isinstance(after, bool) or not isinstance(after, int):
        raise BadRequest(f"after must be an ID (an integer), not {type(after).__name__}")
    if not 0 <= after < 1 << 63:
        raise BadRequest(f"after must be an ID, 0 .. 2**63-1, got {after}")
    return after


def as_array(blocks: list[Block]):
    """All IDs of ``blocks`` as one flat ``array('q')`` (64-bit signed ints)."""
    import array

    out = array.array("q")
    for b in blocks:
        out.extend(range(b.first, b.first + b.count))
    return out


def as_numpy(blocks: list[Block]):
    """All IDs of ``blocks`` as one NumPy int64 array, built without Python ints."""
    import numpy as np

    if not blocks:
        return np.empty(0, dtype=np.int64)
    return np.concatenate([np.arange(b.first, b.first + b.count, dtype=np.int64) for b in blocks])
