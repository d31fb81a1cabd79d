"""A refused endpoint is noticed at once: the client moves on without waiting a timeout."""

from __future__ import annotations

import asyncio
import socket
import time

from snowfence import AsyncClient, Client

TIMEOUT_S = 5.0


def _refused_endpoint() -> str:
    """A tcp:// endpoint on which nothing listens (a port just freed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"tcp://127.0.0.1:{port}"


def test_a_refused_first_endpoint_costs_far_less_than_a_timeout(nodes):
    node = nodes.start(bind="tcp://127.0.0.1:0")
    endpoint = node.wait_bound()
    node.wait_ready()
    endpoints = [_refused_endpoint(), endpoint]
    with Client(endpoints, timeout_s=TIMEOUT_S, discover=False) as client:
        started = time.monotonic()
        blocks = client.reserve(1)
        took = time.monotonic() - started
    assert sum(block.count for block in blocks) == 1
    assert took < TIMEOUT_S / 2, f"a refused first endpoint cost {took:.2f} s"

    async def run() -> float:
        async with AsyncClient(endpoints, timeout_s=TIMEOUT_S, discover=False) as client:
            started = time.monotonic()
            await client.reserve(1)
            return time.monotonic() - started

    took = asyncio.run(run())
    assert took < TIMEOUT_S / 2, f"a refused first endpoint cost {took:.2f} s (asyncio)"
