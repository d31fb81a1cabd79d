"""CPU cost of one minter call (pytest-benchmark): `pytest benchmarks/test_minter.py`."""

from snowfence.ids import DEFAULT_LAYOUT
from snowfence.workers.minter import NEVER_NS, Minter


def minter() -> Minter:
    m = Minter(DEFAULT_LAYOUT, 0, 1)
    m.fence_deadline_ns = NEVER_NS
    m.reserved_until_ms = DEFAULT_LAYOUT.max_ms
    return m


def test_reserve_one_id(benchmark):
    m = minter()
    first, count = benchmark(m.reserve, 1)
    assert count == 1


def test_reserve_a_block_of_16(benchmark):
    m = minter()
    first, count = benchmark(m.reserve, 16)
    assert count >= 1
