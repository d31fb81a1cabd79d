"""`snowfence id-at --connect`, `snowfence decode --connect` and Client.bounds against real nodes
whose layouts are not the default: every value asserted is computed here, bit by bit, from the
widths the node was started with and the IDs it reserved, not with snowfence.ids."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import orjson

from snowfence import AsyncClient

EPOCH_MS = 1_780_272_000_000  # 2026-06-01T00:00:00Z, not the default epoch
# Time 40, region 3, worker 6, sequence 14: the timestamp starts at bit 23 (the default's at 22).
WIDE = ("--epoch", "2026-06-01T00:00:00Z", "--time-bits", "40", "--worker-bits", "6", "--sequence-bits", "14")
WIDE_SHIFT, WIDE_TIME_BITS = 14 + 6 + 3, 40
# Two shard bits above 39 time bits; the timestamp at bit 22, the shard at bit 61.
SHARDED = ("--time-bits", "39", "--shard-bits", "2")
SHARDED_SHIFT, SHARDED_TIME_BITS, DEFAULT_EPOCH_MS = 22, 39, 1_767_225_600_000


def snowfence(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snowfence", *args], capture_output=True, text=True, timeout=60)


def iso(unix_ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(unix_ms // 1000)) + f".{unix_ms % 1000:03d}Z"


def reserved(node, n: int = 20) -> list[int]:
    with node.client() as c:
        ids = [i for _ in range(4) for b in c.reserve(n // 4) for i in b.range()]
    assert len(set(ids)) == n
    return ids


def id_at(node, *args) -> list[dict]:
    p = snowfence("id-at", *args, "--connect", node.endpoint, "--json")
    assert p.returncode == 0, p.stderr
    return [orjson.loads(line) for line in p.stdout.splitlines()]


def test_id_at_and_decode_take_a_wide_layout_from_the_node(nodes):
    node = nodes.start(workers=1, args=WIDE)
    node.wait_ready()
    ids = reserved(node)
    for id_ in ids[:: len(ids) // 4]:
        unix_ms = ((id_ >> WIDE_SHIFT) & ((1 << WIDE_TIME_BITS) - 1)) + EPOCH_MS
        assert abs(unix_ms - time.time() * 1000) < 60_000  # the node's epoch, read back independently
        (r,) = id_at(node, iso(unix_ms))
        first, last = int(r["first"]), int(r["last"])
        assert first <= id_ <= last
        assert first == (unix_ms - EPOCH_MS) << WIDE_SHIFT and last == ((unix_ms - EPOCH_MS + 1) << WIDE_SHIFT) - 1
        # The neighbouring milliseconds' ranges do not hold it; a range of three does (Unix ms in, END excluded).
        (before,) = id_at(node, str(unix_ms - 1))
        (after,) = id_at(node, str(unix_ms + 1))
        assert int(before["last"]) < id_ < int(after["first"])
        (span,) = id_at(node, str(unix_ms - 1), str(unix_ms + 2))
        assert (int(span["first"]), int(span["last"])) == (int(before["first"]), int(after["last"]))
    # Text: one line, "first last ...".
    p = snowfence("id-at", iso(EPOCH_MS + 1000), "--connect", node.endpoint)
    assert p.returncode == 0 and p.stdout.split()[:2] == [str(1000 << WIDE_SHIFT), str((1001 << WIDE_SHIFT) - 1)]
    # A time before the node's epoch (after the default one) is refused, once, with 78.
    p = snowfence("id-at", "2026-05-31T23:59:59Z", "--connect", node.endpoint)
    assert p.returncode == 78 and "before the layout's epoch" in p.stderr and len(p.stderr.splitlines()) == 1

    # decode --connect reads the fields with the node's widths.
    p = snowfence("decode", *map(str, ids[:3]), "--connect", node.endpoint, "--json")
    assert p.returncode == 0, p.stderr
    for id_, doc in zip(ids[:3], map(orjson.loads, p.stdout.splitlines()), strict=True):
        assert doc["id"] == str(id_) and doc["flags"] == []
        assert doc["unix_ms"] == ((id_ >> WIDE_SHIFT) & ((1 << WIDE_TIME_BITS) - 1)) + EPOCH_MS
        assert doc["worker"] == (id_ >> 14) & 63 and doc["sequence"] == id_ & ((1 << 14) - 1)
    # An ID carrying a millisecond two days ahead: printed, flagged, exit status 1.
    ahead_ms = int(time.time() * 1000) + 2 * 86_400_000 - EPOCH_MS
    forged = (ahead_ms << WIDE_SHIFT) | (ids[0] & ((1 << WIDE_SHIFT) - 1))
    p = snowfence("decode", str(ids[0]), str(forged), "--connect", node.endpoint)
    lines = p.stdout.splitlines()
    assert p.returncode == 1 and len(lines) == 2
    assert "INVALID" not in lines[0] and lines[1].startswith(str(forged)) and "from the future" in lines[1]
    assert iso(ahead_ms + EPOCH_MS) in lines[1]


def test_id_at_and_decode_with_shard_bits_one_range_per_shard(nodes):
    node = nodes.start(workers=2, args=SHARDED)
    node.wait_ready(2)
    ids = reserved(node, 40)
    for id_ in ids[:: len(ids) // 4]:
        shard = id_ >> 61
        unix_ms = ((id_ >> SHARDED_SHIFT) & ((1 << SHARDED_TIME_BITS) - 1)) + DEFAULT_EPOCH_MS
        ranges = id_at(node, iso(unix_ms))
        assert [r["shard"] for r in ranges] == [0, 1, 2, 3]
        holding = [r["shard"] for r in ranges if int(r["first"]) <= id_ <= int(r["last"])]
        assert holding == [shard]
        for r in ranges:
            ms = unix_ms - DEFAULT_EPOCH_MS
            assert int(r["first"]) == (r["shard"] << 61) | (ms << SHARDED_SHIFT)
            assert int(r["last"]) == (r["shard"] << 61) | ((ms + 1) << SHARDED_SHIFT) - 1
    # decode --connect: the node's IDs pass; the same IDs with other shard bits are flagged.
    p = snowfence("decode", *map(str, ids[:4]), "--connect", node.endpoint)
    assert p.returncode == 0 and "INVALID" not in p.stdout, p.stdout + p.stderr
    assert all(f"shard={i >> 61} " in line for i, line in zip(ids[:4], p.stdout.splitlines(), strict=True))
    moved = ids[0] ^ (1 << 61)
    p = snowfence("decode", str(ids[1]), str(moved), "--connect", node.endpoint, "--json")
    docs = [orjson.loads(line) for line in p.stdout.splitlines()]
    assert p.returncode == 1 and docs[0]["flags"] == [] and docs[1]["id"] == str(moved)
    assert len(docs[1]["flags"]) == 1 and docs[1]["flags"][0].startswith(f"shard {moved >> 61}, but")
    # The same ID decoded without the node (default layout, no check): not flagged, other fields.
    p = snowfence("decode", str(moved), "--json")
    assert p.returncode == 0 and "flags" not in orjson.loads(p.stdout)


def test_both_clients_bound_the_nodes_ids_with_the_nodes_layout(nodes):
    node = nodes.start(workers=1, args=SHARDED)
    node.wait_ready()
    ids = reserved(node)
    low = min((i >> SHARDED_SHIFT) & ((1 << SHARDED_TIME_BITS) - 1) for i in ids) + DEFAULT_EPOCH_MS
    high = max((i >> SHARDED_SHIFT) & ((1 << SHARDED_TIME_BITS) - 1) for i in ids) + DEFAULT_EPOCH_MS
    with node.client() as c:
        assert (c.layout().time_bits, c.layout().shard_bits) == (39, 2)
        ranges = c.bounds(low, high, closed=True)
        assert len(ranges) == 4
        assert all(any(r.first <= i <= r.last and r.shard == i >> 61 for r in ranges) for i in ids)
        (later,) = [r for r in c.bounds(high + 1) if r.shard == ids[0] >> 61]
        assert all(i < later.first for i in ids)

    async def from_asyncio():
        async with AsyncClient(node.endpoint, discover=False, timeout_s=2.0) as c:
            return await c.bounds(iso(low), iso(high + 1))

    assert asyncio.run(from_asyncio()) == ranges


def test_on_etcd_id_at_decode_verify_and_the_clients_use_the_nodes_layout(nodes, etcd, tmp_path):
    from nodes import etcd_args

    node = nodes.start(workers=1, args=etcd_args(etcd, "ranges", *WIDE))
    node.wait_ready()
    ids = reserved(node, 40)
    unix_ms = ((ids[0] >> WIDE_SHIFT) & ((1 << WIDE_TIME_BITS) - 1)) + EPOCH_MS
    (r,) = id_at(node, str(unix_ms))
    assert int(r["first"]) == (unix_ms - EPOCH_MS) << WIDE_SHIFT <= ids[0] <= int(r["last"])
    p = snowfence("decode", str(ids[0]), "--connect", node.endpoint, "--json")
    assert p.returncode == 0 and orjson.loads(p.stdout)["unix_ms"] == unix_ms, p.stdout + p.stderr
    dump = tmp_path / "ids.txt"
    dump.write_text("\n".join(map(str, ids)) + "\n")
    p = snowfence("verify", str(dump), "--connect", node.endpoint, "--json")
    assert p.returncode == 0 and orjson.loads(p.stdout)["ids"] == 40, p.stdout + p.stderr
    dump.write_text("\n".join(map(str, [*ids, ids[3]])) + "\n")
    assert snowfence("verify", str(dump), "--connect", node.endpoint).returncode == 1  # a duplicate
    with node.client() as c:
        (bound,) = c.bounds(unix_ms)
        assert bound.first <= ids[0] <= bound.last

    async def from_asyncio():
        async with AsyncClient(node.endpoint, discover=False, timeout_s=2.0) as c:
            return await c.bounds(unix_ms)

    assert asyncio.run(from_asyncio()) == (bound,)
