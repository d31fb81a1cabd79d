"""The watermark against real nodes: the CLI, both clients, STATUS and the metric, on the
embedded store and on a 3-member etcd cluster with shard bits. Every ID reserved after a
watermark reply is at or above it (per shard), and the watermark advances."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
import urllib.request

import orjson
from nodes import etcd_args, wait_for

from snowfence import AsyncClient, Client, WatermarkUnavailable
from snowfence.ids import Layout


def snowfence(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snowfence", *args], capture_output=True, text=True, timeout=60)


def first_watermark(client: Client):
    def ask():
        try:
            return client.watermark()
        except WatermarkUnavailable:
            return None

    return wait_for(ask, 30, what="a watermark")


def shard_of(id_: int, layout: Layout) -> int:
    return id_ >> layout.shard_shift


def test_every_id_reserved_after_a_watermark_is_at_or_above_it_embedded(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    early = snowfence("watermark", "--connect", node.endpoint)
    with node.client() as client:
        first = first_watermark(client)
        if early.returncode != 0:  # asked before the new store's window had passed: said so, by name
            assert "watermark_unavailable" in early.stderr and "Traceback" not in early.stderr
        deadline = time.monotonic() + 3.0
        marks = [first]
        while time.monotonic() < deadline:
            mark = client.watermark()
            assert mark.unix_ms >= marks[-1].unix_ms  # a promise never goes back
            marks.append(mark)
            for block in client.reserve(4096) + client.reserve(1):
                assert block.first >= mark.lowest, (block.first, mark)
        assert marks[-1].unix_ms > first.unix_ms  # it advances
        assert abs(marks[-1].unix_ms - time.time() * 1000) < 60_000
    p = snowfence("watermark", "--connect", node.endpoint, "--json")
    assert p.returncode == 0, p.stderr
    doc = orjson.loads(p.stdout)
    assert doc["unix_ms"] >= marks[-1].unix_ms and int(doc["lowest"]) >= marks[-1].lowest
    assert doc["time"].endswith("Z") and isinstance(doc["lag_ms"], int)
    status = node.status()["broker"]["watermark"]
    assert status["unix_ms"] >= marks[-1].unix_ms and status["failures"] == 0 and status["rounds"] > 0
    low = status["held_back_by"]  # the holder whose floor is lowest: one of this node's
    assert low["held"] and low["worker_id"] in node.all_worker_ids() and low["floor_unix_ms"] >= status["unix_ms"]


def test_a_watermark_from_one_node_holds_for_ids_from_another_on_etcd_with_shards(nodes, etcd3):
    args = etcd_args(etcd3, "marks", "--shard-bits", "2", "--time-bits", "39", "--metrics-bind", "127.0.0.1:0")
    a = nodes.start("a", workers=1, args=args)
    b = nodes.start("b", workers=1, args=args)
    a.wait_ready()
    b.wait_ready()
    layout = Layout(shard_bits=2, time_bits=39)
    with a.client() as asker, b.client() as minter:
        mark = first_watermark(asker)
        assert asker.layout() == layout
        floors = mark.ids(layout)
        assert len(floors) == 4 and floors[0] == mark.lowest
        seen_shards = set()
        for _ in range(200):
            mark = asker.watermark()
            floors = mark.ids(layout)
            for block in minter.reserve(64):
                shard = shard_of(block.first, layout)
                seen_shards.add(shard)
                assert block.first >= floors[shard], (block.first, shard, mark)
        assert seen_shards  # the check saw blocks of the shards b holds
    text = snowfence("watermark", "--connect", b.endpoint)
    assert text.returncode == 0 and "lowest=shard=0:" in text.stdout, text.stdout + text.stderr

    async def ask_async():
        async with AsyncClient(b.endpoint, discover=False) as client:
            return await client.watermark()

    assert asyncio.run(ask_async()).unix_ms >= mark.unix_ms - 60_000
    address = _metrics_address(a)

    def lag_s():  # the metrics are a snapshot, taken every half second
        body = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
        (line,) = [x for x in body.splitlines() if x.startswith("snowfence_watermark_lag_seconds ")]
        value = float(line.split()[1])
        return None if value != value else value  # NaN: no promise when the snapshot was taken

    assert 0 <= wait_for(lag_s, 10, what="the lag metric") < 60

    def pool():  # region 0's worker IDs as a's last round read the cluster's marks: b's are among them
        body = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
        found = re.findall(r'^snowfence_worker_id_pool\{region="0",state="(\w+)"\} (\S+)$', body, re.M)
        return {state: float(value) for state, value in found} or None

    counts = wait_for(lambda: (lambda p: p if p and p["held"] >= 2 else None)(pool()), 10, what="both nodes held")
    assert counts["held"] + counts["quarantined"] + counts["free"] == 128 and counts["held"] <= 4, counts


def _metrics_address(node) -> str:
    return wait_for(lambda: re.search(r"metrics and health on http://(\S+)/metrics", node.log()), 10).group(1)


def test_a_node_asked_not_to_answer_says_so(nodes):
    node = nodes.start(workers=1, args=("--watermark-interval-s", "0"))
    node.wait_ready()
    p = snowfence("watermark", "--connect", node.endpoint)
    assert p.returncode == 1 and "watermark_unavailable" in p.stderr and "watermark_interval_s is 0" in p.stderr
    assert "Traceback" not in p.stderr
    assert node.status()["broker"]["watermark"] is None
