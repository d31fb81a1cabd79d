"""`snowfence reserve --format uuid|base32` and `snowfence decode` of those forms against real
nodes: every UUID is read here bit by bit (RFC 9562's fields), not with snowfence.ids, and a
million UUIDs from two nodes on one etcd are all distinct version-7 UUIDs."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import orjson
from nodes import etcd_args

DEFAULT_EPOCH_MS = 1_767_225_600_000
TIME_SHIFT = 22  # the default layout: 41 bits of ms above region 3, worker 7, sequence 12


def snowfence(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snowfence", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def id_of(u: uuid.UUID) -> int:
    """The default layout's ID a UUID stands for, from the documented placement."""
    return (u.int >> 80) - DEFAULT_EPOCH_MS << TIME_SHIFT | (u.int & ((1 << TIME_SHIFT) - 1))


def test_reserve_uuid_and_base32_from_a_node_decode_back_to_its_ids(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    before_ms = int(time.time() * 1000)
    p = snowfence("reserve", "3000", "--format", "uuid", "--connect", node.endpoint)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    uuids = [uuid.UUID(line) for line in lines]
    assert len(uuids) == len(set(uuids)) == 3000
    for line, u in zip(lines, uuids, strict=True):
        assert str(u) == line and u.version == 7 and u.variant == uuid.RFC_4122
        assert abs((u.int >> 80) - before_ms) < 60_000  # unix_ts_ms is now
        assert u.int >> 22 & ((1 << 40) - 1) == 0  # rand_b: zeros above the ID's 22 low bits
    ids = [id_of(u) for u in uuids]
    assert len(set(ids)) == 3000

    # decode, with the node's layout, maps each UUID to that ID and prints its fields.
    p = subprocess.run(
        [sys.executable, "-m", "snowfence", "decode", "-", "--connect", node.endpoint, "--json"],
        input="\n".join(lines),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    docs = [orjson.loads(line) for line in p.stdout.splitlines()]
    assert [int(d["id"]) for d in docs] == ids
    assert [d["unix_ms"] for d in docs] == [u.int >> 80 for u in uuids]
    assert all(d["flags"] == [] for d in docs)
    # The same fields as the decimal form of each ID gives.
    p = snowfence("decode", *map(str, ids[::300]), "--connect", node.endpoint, "--json")
    assert p.stdout.splitlines() == [orjson.dumps(d).decode() for d in docs[::300]]
    # The node's workers minted them: their worker IDs, in its region.
    workers = node.all_worker_ids()
    assert {d["worker"] for d in docs} <= workers and {d["region"] for d in docs} == {0}

    # IDs as text reserved after them sort after them, as their UUIDs do after the first ones'.
    p = snowfence("reserve", "100", "--format", "text", "--after", str(max(ids)), "--connect", node.endpoint)
    later = list(map(int, p.stdout.split()))
    assert len(later) == 100 and min(later) > max(ids)
    p = snowfence("reserve", "100", "--format", "uuid", "--after", str(max(later)), "--connect", node.endpoint)
    later_uuids = [uuid.UUID(line) for line in p.stdout.splitlines()]
    assert min(later_uuids) > max(uuids) and min(map(id_of, later_uuids)) > max(later)

    # base32: 13 Crockford characters per ID, read back to the IDs by decode.
    p = snowfence("reserve", "500", "--format", "base32", "--connect", node.endpoint)
    words = p.stdout.split()
    assert p.returncode == 0 and len(words) == len(set(words)) == 500 and all(len(w) == 13 for w in words)
    as_int = [int(w.translate(str.maketrans("ABCDEFGHJKMNPQRSTVWXYZ", "abcdefghijklmnopqrstuv")), 32) for w in words]
    p = snowfence("decode", *words[::50], "--connect", node.endpoint, "--json")
    assert p.returncode == 0, p.stderr
    assert [int(orjson.loads(line)["id"]) for line in p.stdout.splitlines()] == as_int[::50]


def test_a_million_uuids_from_two_nodes_on_one_etcd_are_distinct_version_7(nodes, etcd3):
    a = nodes.start("a", workers=2, args=etcd_args(etcd3, "forms"))
    b = nodes.start("b", workers=2, args=etcd_args(etcd3, "forms"))
    a.wait_ready()
    b.wait_ready()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "snowfence", "reserve", "500000", "--format", "uuid", "--connect", n.endpoint],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in (a, b)
    ]
    outputs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outputs]
    lines = [line for out, _ in outputs for line in out.splitlines()]
    assert len(lines) == 1_000_000
    assert len(set(lines)) == 1_000_000
    uuids = [uuid.UUID(line) for line in lines]
    assert all(u.version == 7 and u.variant == uuid.RFC_4122 for u in uuids)
    assert all(str(u) == line for u, line in zip(uuids, lines, strict=True))
    # Each node's UUIDs carry its own worker IDs: the two sets of IDs do not meet.
    worker_of = [{(u.int >> 12) & 127 for u in uuids[i * 500_000 : (i + 1) * 500_000]} for i in (0, 1)]
    assert not worker_of[0] & worker_of[1]
    assert worker_of[0] <= a.all_worker_ids() and worker_of[1] <= b.all_worker_ids()
