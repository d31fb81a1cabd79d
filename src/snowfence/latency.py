"""Request latency histograms, cheap enough for the hot path.

Two durations of every RESERVE are measured on the server, by request kind
(``reserve``, and ``reserve_after`` for one that carries a causal token):

* queued: how long the broker held it waiting for a worker with room (zero when
  a worker had room at once: that case reads no clock at all);
* minting: how long its worker took, from taking it off the socket to handing
  the answer back.

The broker keeps the first; each worker keeps the second and reports its
cumulative counts in STATE, and the broker adds up the increments as it does
for counters. Both use the same fixed bounds (10 us to 10 s), in nanoseconds,
so observing is one comparison (most requests fall in the first bucket) or a
bisection, an index and an addition: no allocation besides the integers.
"""

from __future__ import annotations

from bisect import bisect_left

#: Request kinds, in the order of the histograms indexed by them: a kind's
#: index is ``int(has_causal_token)``.
KINDS = ("reserve", "reserve_after")

#: Upper bounds of the buckets (ns): 1, 2.5, 5 per decade from 10 us to 10 s.
BOUNDS_NS = (
    10_000, 25_000, 50_000,
    100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000,
    10_000_000, 25_000_000, 50_000_000,
    100_000_000, 250_000_000, 500_000_000,
    1_000_000_000, 2_500_000_000, 5_000_000_000,
    10_000_000_000,
)  # fmt: skip

_FIRST_NS = BOUNDS_NS[0]


class Durations:
    """One histogram: a count per bucket (not cumulative; the last is above every
    bound) and the sum of what was observed, in ns."""

    __slots__ = ("counts", "sum_ns")

    def __init__(self) -> None:
        self.counts = [0] * (len(BOUNDS_NS) + 1)
        self.sum_ns = 0

    def observe(self, ns: int) -> None:
        self.counts[0 if ns <= _FIRST_NS else bisect_left(BOUNDS_NS, ns)] += 1
        self.sum_ns += ns

    @property
    def count(self) -> int:
        return sum(self.counts)

    def to_dict(self) -> dict:
        """As a worker reports it in STATE (see :func:`report`)."""
        return {"counts": list(self.counts), "sum_ns": self.sum_ns}

    def add_increase(self, now: dict, before: dict | None) -> None:
        """Add what one worker's reported histogram ``now`` gained since ``before``."""
        then = before["counts"] if before else ()
        for i, n in enumerate(now["counts"]):
            gained = n - (then[i] if i < len(then) else 0)
            if gained > 0:
                self.counts[i] += gained
        gained_ns = now["sum_ns"] - (before["sum_ns"] if before else 0)
        if gained_ns > 0:
            self.sum_ns += gained_ns

    def buckets(self) -> list[tuple[str, int]]:
        """Cumulative ``(le, count)`` pairs in seconds, ``+Inf`` last, as Prometheus has them."""
        out, total = [], 0
        for le, n in zip((*(f"{b / 1e9:g}" for b in BOUNDS_NS), "+Inf"), self.counts, strict=True):
            total += n
            out.append((le, total))
        return out


def by_kind() -> tuple[Durations, ...]:
    """One empty histogram per kind, indexed as :data:`KINDS`."""
    return tuple(Durations() for _ in KINDS)


def report(histograms: tuple[Durations, ...]) -> dict:
    """The STATE field ``mint_ns``: the bounds and each kind's counts."""
    return {"le": list(BOUNDS_NS), "kinds": {kind: h.to_dict() for kind, h in zip(KINDS, histograms, strict=True)}}
