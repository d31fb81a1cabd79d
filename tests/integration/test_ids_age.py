"""``ids()`` keeps ``max_age_s`` for every ID it hands out, the block in hand included:
after a pause at any point of a block, no ID handed out is older than ``max_age_s``
(by its millisecond, against this host's clock, which the node shares), sync and asyncio.

The producer of examples/windows.py pausing longer than ``max_age_s`` is the case that
matters: an ID older than that stamps an event into a window already emitted.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nodes import Node

from snowfence import AsyncClient, Client, decode

MAX_AGE_S = 1.0
PAUSE_S = 2.5
AFTER = 5000
#: The ID's millisecond is floored, and the hand-out time read just after next() returns.
GRANULARITY_MS = 2
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    node = Node(tmp_path_factory.mktemp("ids"), "ids", workers=1)
    try:
        node.start()
        node.wait_ready()
        yield node
    finally:
        node.close()


def stale(handed: list[tuple[int, int]], max_age_s: float = MAX_AGE_S) -> list[int]:
    """The ages (ms) of the IDs older than ``max_age_s`` when handed out: (ID, wall ms then)."""
    ages = [at_ms - decode(id_).unix_ms for id_, at_ms in handed]
    return [age for age in ages if age > max_age_s * 1000 + GRANULARITY_MS]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.mark.parametrize("before", [10, 1000])
def test_no_id_handed_out_after_a_pause_is_older_than_max_age(node, before):
    with Client(node.endpoint, timeout_s=2.0, discover=False) as client:
        ids = client.ids(max_age_s=MAX_AGE_S)
        first = [next(ids) for _ in range(before)]
        time.sleep(PAUSE_S)
        handed = []
        for _ in range(AFTER):
            id_ = next(ids)
            handed.append((id_, now_ms()))
    assert not stale(handed), f"{len(stale(handed))} of {AFTER} IDs older than {MAX_AGE_S} s: {stale(handed)[:5]} ms"
    assert len(set(first) | {i for i, _ in handed}) == before + AFTER


@pytest.mark.parametrize("before", [10, 1000])
def test_no_id_handed_out_after_a_pause_is_older_than_max_age_asyncio(node, before):
    async def main() -> list[tuple[int, int]]:
        async with AsyncClient(node.endpoint, timeout_s=2.0, discover=False) as client:
            ids = client.ids(max_age_s=MAX_AGE_S)
            for _ in range(before):
                await anext(ids)
            await asyncio.sleep(PAUSE_S)
            handed = []
            for _ in range(AFTER):
                id_ = await anext(ids)
                handed.append((id_, now_ms()))
            await ids.aclose()
            return handed

    handed = asyncio.run(main())
    assert not stale(handed), f"{len(stale(handed))} of {AFTER} IDs older than {MAX_AGE_S} s: {stale(handed)[:5]} ms"


def test_without_max_age_the_block_in_hand_is_kept_through_a_pause(node):
    # max_age_s=None checks nothing and drops nothing: the IDs after the pause continue the block.
    with Client(node.endpoint, timeout_s=2.0, discover=False) as client:
        ids = client.ids(batch=100, max_age_s=None)
        before = [next(ids) for _ in range(10)]
        time.sleep(0.3)
        after = next(ids)
    assert after == before[-1] + 1


def test_windows_stay_closed_when_a_producer_pauses_longer_than_max_age(node):
    # The example's producers pause for 2.5 s (its max_age_s is 0.5 s, its windows 1 s) every
    # 3 s or so: the IDs in their hand go stale, their windows close meanwhile, and none may
    # stamp an event into a window already emitted.
    p = subprocess.run(
        [sys.executable, str(EXAMPLES / "windows.py"), "--seconds", "10", "--pause-every-s", "3",
         "--pause-s", "2.5"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "SNOWFENCE_CONNECT": node.endpoint},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    windows = [line for line in p.stdout.splitlines() if line.startswith("window ")]
    assert len(windows) >= 2, p.stdout
    assert "late events: 0" in p.stderr, p.stderr
