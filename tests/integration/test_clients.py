"""The clients against real servers: asyncio on uvloop, threads, prefetching,
failover, large reservations, and the command line for pipelines."""

from __future__ import annotations

import array
import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import orjson
import pytest
import uvloop
from checks import check_blocks
from nodes import wait_for

from snowfence import AsyncClient, Client, as_array
from snowfence.errors import ConnectionRefused, SnowfenceError
from snowfence.ids import DEFAULT_LAYOUT as L


def pairs(blocks) -> list[tuple[int, int]]:
    return [(b.first, b.count) for b in blocks]


def test_async_client_on_uvloop_many_tasks_get_unique_ids(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()

    async def main():
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        async with AsyncClient(node.endpoint, timeout_s=2.0) as client:
            status = await client.status()
            assert len(status["workers"]) == 2

            async def task(i):
                got = []
                for n in (1, 10, 4096, 5000, 7):
                    got.extend(await client.reserve(n + i))
                return got

            results = await asyncio.gather(*(task(i) for i in range(16)))
            big = await client.reserve(100_000)
        return results, big

    results, big = uvloop.run(main())
    for blocks in results:
        assert sum(b.count for b in blocks) == sum(n + 0 for n in (1, 10, 4096, 5000, 7)) + 5 * results.index(blocks)
    check_blocks([pairs(b) for b in results] + [pairs(big)])
    assert sum(b.count for b in big) == 100_000


def test_async_ids_prefetch_and_drop_stale_blocks(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()

    async def main():
        async with AsyncClient(node.endpoint) as client:
            stream = client.ids(batch=1, max_age_s=0.2)
            first = [await anext(stream) for _ in range(50)]
            await asyncio.sleep(0.5)
            resumed_ms = time.time_ns() // 1_000_000
            later = await anext(stream)
            rest = [await anext(stream) for _ in range(5000)]
            await stream.aclose()
            return first, resumed_ms, later, rest

    first, resumed_ms, later, rest = uvloop.run(main())
    assert L.decompose(later).unix_ms >= resumed_ms - 1, "a stale block was handed out"
    check_blocks([[(i, 1) for i in first + [later] + rest]])


def test_async_client_is_refused_at_once_by_a_dead_endpoint(tmp_path):
    async def main():
        async with AsyncClient(f"ipc://{tmp_path}/nobody.sock", timeout_s=5.0, retries=1) as client:
            t0 = time.monotonic()
            with pytest.raises(ConnectionRefused) as info:
                await client.reserve(1)
            assert info.value.retriable and "refused the connection" in str(info.value)
            return time.monotonic() - t0

    assert uvloop.run(main()) < 2  # not the timeout of 5 s


def test_blocking_client_shared_by_8_threads(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    results: list[list] = [[] for _ in range(8)]
    errors: list[Exception] = []
    with node.client() as client:

        def run(i):
            try:
                for n in (1, 4096, 777, 5000):
                    results[i].extend(client.reserve(n))
                stream = client.ids()
                results[i].extend((next(stream), 1) for _ in range(3000))
            except SnowfenceError as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors
    flat = [[(b.first, b.count) if hasattr(b, "first") else b for b in r] for r in results]
    check_blocks(flat)


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_failover_to_the_second_broker_within_the_timeout(nodes, fault):
    # Two nodes on one state directory share its file locks: disjoint worker IDs.
    a = nodes.start("a", workers=1)
    a.wait_ready()
    b = nodes.start("b", workers=1, state_dir=a.state_dir)
    b.wait_ready()
    timeout_s = 0.5
    with Client([a.endpoint, b.endpoint], timeout_s=timeout_s, retries=3) as client:
        before = client.reserve(10_000)
        assert client.endpoint == a.endpoint
        if fault == "kill":
            os.killpg(a.pgid, signal.SIGKILL)
        else:
            os.killpg(a.pgid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            during = client.reserve(10_000)
            took = time.monotonic() - t0
            assert client.endpoint == b.endpoint
            assert took < timeout_s + 0.5, f"failover took {took:.2f} s"
        finally:
            if fault == "pause":
                os.killpg(a.pgid, signal.SIGCONT)
        # Replies the paused broker sends now go to a socket that no longer exists.
        time.sleep(0.3)
        after = client.reserve(10_000)
    for got in (before, during, after):
        assert sum(x.count for x in got) == 10_000
    check_blocks([pairs(before + during + after)])
    held_by_b = {w["worker_id"] for w in b.status()["workers"]}
    assert {L.decompose(x.first).worker for x in during + after} <= held_by_b


def test_async_failover_to_the_second_broker(nodes):
    a = nodes.start("a", workers=1)
    a.wait_ready()
    b = nodes.start("b", workers=1, state_dir=a.state_dir)
    b.wait_ready()

    async def main():
        async with AsyncClient([a.endpoint, b.endpoint], timeout_s=0.5, retries=3) as client:
            before = await client.reserve(5000)
            os.killpg(a.pgid, signal.SIGKILL)
            during = await asyncio.gather(*(client.reserve(3000) for _ in range(4)))
            return before, during

    before, during = uvloop.run(main())
    assert [sum(x.count for x in got) for got in during] == [3000] * 4
    check_blocks([pairs(before)] + [pairs(got) for got in during])  # concurrent calls: one list each


def test_large_reservation_pipelines_and_flattens(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    with node.client(window=64) as client:
        t0 = time.monotonic()
        blocks = client.reserve(1_000_000)
        took = time.monotonic() - t0
    assert sum(b.count for b in blocks) == 1_000_000
    assert took < 5
    flat = as_array(blocks)
    assert isinstance(flat, array.array) and flat.typecode == "q" and len(flat) == 1_000_000
    assert len(set(flat)) == 1_000_000
    assert list(flat[:3]) == list(blocks[0])[:3]
    check_blocks([pairs(blocks)])


def test_flat_numpy_array_when_numpy_is_installed(nodes):
    np = pytest.importorskip("numpy")
    from snowfence import as_numpy

    node = nodes.start(workers=1)
    node.wait_ready()
    with node.client() as client:
        blocks = client.reserve(50_000)
    ids = as_numpy(blocks)
    assert ids.dtype == np.int64 and len(ids) == 50_000 and len(np.unique(ids)) == 50_000


# -- the command line for pipelines -------------------------------------------------------------------


def run_cli(*args) -> bytes:
    p = subprocess.run([sys.executable, "-m", "snowfence", *args], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout


def test_reserve_streams_text_json_and_raw_int64(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    n = 123_457
    text = run_cli("reserve", str(n), "--connect", node.endpoint, "--format", "text")
    ids_text = [int(x) for x in text.split()]
    as_json = orjson.loads(run_cli("reserve", str(n), "--connect", node.endpoint, "--format", "json"))
    assert all(isinstance(x, str) for x in as_json)
    raw = run_cli("reserve", str(n), "--connect", node.endpoint, "--format", "binary")
    assert len(raw) == 8 * n
    ids_raw = array.array("q")
    ids_raw.frombytes(raw)
    if sys.byteorder == "big":
        ids_raw.byteswap()
    for ids in (ids_text, [int(x) for x in as_json], list(ids_raw)):
        assert len(ids) == n and len(set(ids)) == n
        assert all(0 < i < 2**63 for i in ids)
    everything = ids_text + [int(x) for x in as_json] + list(ids_raw)
    assert len(set(everything)) == 3 * n
    blocks = run_cli("reserve", "10000", "--connect", node.endpoint, "--format", "blocks").decode().split("\n")
    assert sum(int(line.split()[1]) for line in blocks if line) == 10_000


def test_reserve_pipes_into_a_consumer_that_stops_early(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    shell = f"{sys.executable} -m snowfence reserve 50000000 --connect {node.endpoint} | head -n 5"
    p = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and len(p.stdout.split()) == 5
    assert "Traceback" not in p.stderr


def test_client_waits_out_a_restart_with_retries(nodes):
    node = nodes.start(workers=1)
    node.wait_ready()
    assert node.stop() == 0
    again = nodes.start("again", workers=1, state_dir=node.state_dir)
    # The client was created before the server answers: with wait_for_server, retries carry it over.
    with Client(again.endpoint, timeout_s=1.0, retries=10, wait_for_server=True) as client:
        assert sum(b.count for b in client.reserve(100)) == 100
    wait_for(lambda: again.ready_workers(), 5)
