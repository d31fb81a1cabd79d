"""Client.layout() and Client.bounds(), on both clients: the layout comes from STATUS, asked once."""

from __future__ import annotations

import asyncio

import pytest

from snowfence import AsyncClient, Client
from snowfence.ids import Layout

LAYOUT = Layout(time_bits=39, region_bits=3, worker_bits=5, sequence_bits=14, shard_bits=2)


def _status():
    """What STATUS answers, as far as the layout goes; counts how often it was asked."""
    asked = []

    def status():
        asked.append(1)
        return {"layout": LAYOUT.to_dict(), "workers": [], "broker": {}}

    return status, asked


def test_the_blocking_client_asks_status_for_the_layout_once(tmp_path):
    with Client(f"ipc://{tmp_path}/nobody.sock", discover=False) as client:
        client.status, asked = _status()
        assert client.layout() == LAYOUT
        assert client.layout() is client.layout()
        ranges = client.bounds("2026-03-01T00:00:00Z", "2026-03-01T01:00:00Z")
        assert ranges == LAYOUT.bounds("2026-03-01T00:00:00Z", "2026-03-01T01:00:00Z")
        assert len(ranges) == 4  # one per shard
        assert client.bounds(LAYOUT.epoch_ms + 5, LAYOUT.epoch_ms + 5, closed=True) == LAYOUT.bounds(
            LAYOUT.epoch_ms + 5
        )
        with pytest.raises(ValueError, match="before the layout's epoch"):
            client.bounds(LAYOUT.epoch_ms - 1)
        assert len(asked) == 1


def test_the_asyncio_client_asks_status_for_the_layout_once(tmp_path):
    async def main():
        async with AsyncClient(f"ipc://{tmp_path}/nobody.sock", discover=False) as client:
            status, asked = _status()

            async def astatus():
                return status()

            client.status = astatus
            assert await client.layout() == LAYOUT
            ranges = await client.bounds("2026-03-01T00:00:00Z")
            assert ranges == LAYOUT.bounds("2026-03-01T00:00:00Z") and len(ranges) == 4
            assert (await client.bounds(LAYOUT.epoch_ms, LAYOUT.epoch_ms + 10))[2].last == (
                (2 << LAYOUT.shard_shift) | (10 << LAYOUT.time_shift)
            ) - 1
            assert len(asked) == 1

    asyncio.run(main())
