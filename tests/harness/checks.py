"""Checks over IDs collected by clients: the invariants of the design."""

from __future__ import annotations

import array
from collections import defaultdict

from snowfence.ids import DEFAULT_LAYOUT, Layout


def read_pairs(path) -> list[tuple[int, int]]:
    data = array.array("q")
    with open(path, "rb") as f:
        data.frombytes(f.read())
    return list(zip(data[0::2], data[1::2], strict=False))


def check_blocks(per_client: list[list[tuple[int, int]]], layout: Layout = DEFAULT_LAYOUT) -> dict:
    """Every ID unique; every block within one millisecond of one worker ID;
    within each client, the blocks of one worker ID strictly increase.

    Returns figures: ids, blocks, worker IDs seen.
    """
    shift = layout.worker_shift
    wmask = (layout.max_region << layout.worker_bits | layout.max_worker) << shift
    intervals = []
    workers = set()
    for pairs in per_client:
        last_by_worker: dict[int, int] = {}
        for first, count in pairs:
            assert count >= 1
            last = first + count - 1
            a, b = layout.decompose(first), layout.decompose(last)
            assert (a.unix_ms, a.region, a.worker) == (b.unix_ms, b.region, b.worker), (
                f"block {first}+{count} crosses a millisecond or a worker"
            )
            key = first & wmask
            workers.add(key >> shift)
            prev = last_by_worker.get(key)
            assert prev is None or first > prev, (
                f"worker {a.worker}: block {first} does not follow {prev} (per-worker order broken)"
            )
            last_by_worker[key] = last
            intervals.append((first, last))
    intervals.sort()
    for (f1, last1), (f2, last2) in zip(intervals, intervals[1:], strict=False):
        assert f2 > last1, f"IDs issued twice: blocks [{f1}, {last1}] and [{f2}, {last2}] overlap"
    return {"ids": sum(last - f + 1 for f, last in intervals), "blocks": len(intervals), "workers": len(workers)}


def repeated_ids(blocks) -> int:
    """How many IDs were acknowledged more than once."""
    spans = sorted((f, f + c) for client in blocks for f, c in client)
    repeated, reach = 0, -1
    for f, end in spans:
        if f < reach:
            repeated += min(end, reach) - f
        reach = max(reach, end)
    return repeated


def below_earlier(before, after, layout: Layout) -> dict[int, tuple[int, int]]:
    """Worker IDs whose IDs ``after`` go at or below their IDs ``before``: {worker: (lowest after, highest before)}."""
    high: dict[int, int] = {}
    for client in before:
        for f, c in client:
            w = layout.decompose(f).worker
            high[w] = max(high.get(w, -1), f + c - 1)
    low: dict[int, int] = {}
    for client in after:
        for f, _ in client:
            w = layout.decompose(f).worker
            low[w] = min(low.get(w, 1 << 63), f)
    return {w: (low[w], high[w]) for w in low if w in high and low[w] <= high[w]}


def by_worker(pairs: list[tuple[int, int]], layout: Layout = DEFAULT_LAYOUT) -> dict[int, list[tuple[int, int]]]:
    out = defaultdict(list)
    for first, count in pairs:
        out[layout.decompose(first).worker].append((first, count))
    return out
