"""STATUS and STATUS_REPLY, per docs/PROTOCOL.md: header, the documented fields, JSON rules."""

from __future__ import annotations

import json
import time

import sfwire
import zmq
from sfwire import STATUS_REPLY, WORKER_STATES


def get_status(sockets, rid: int = 77, kind: int = zmq.DEALER) -> tuple[sfwire.Reply, dict]:
    reply = sfwire.request(sockets(kind), sfwire.status(rid))
    assert (reply.version, reply.type, reply.flags, reply.request_id) == (1, STATUS_REPLY, 0, rid), reply
    return reply, reply.json


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def test_status_reply_header_and_utf8_json(server, sockets):
    reply, st = get_status(sockets, rid=2**64 - 2)
    reply.payload.decode("utf-8", errors="strict")
    assert isinstance(st, dict)


def test_status_over_req_and_with_delimiter(server, sockets):
    get_status(sockets, rid=5, kind=zmq.REQ)
    sock = sockets()
    sock.send_multipart([b"", sfwire.status(6)])
    frames = sfwire.recv_frames(sock)
    assert len(frames) == 2 and frames[0] == b"", frames
    assert sfwire.parse(frames[1]).request_id == 6


def test_status_top_level_fields(server, sockets):
    _, st = get_status(sockets)
    for key in ("version", "software_version", "broker", "layout", "region", "workers"):
        assert key in st, f"STATUS_REPLY lacks {key!r}: {sorted(st)}"
    assert st["version"] == 1
    assert isinstance(st["software_version"], str) and st["software_version"], st["software_version"]
    assert st["region"] == 0
    assert isinstance(st["workers"], list)


def test_status_broker_fields(server, sockets):
    _, st = get_status(sockets)
    broker = st["broker"]
    for key in ("pid", "bind", "mode", "state", "uptime_s", "workers_in_rotation", "slots", "counters"):
        assert key in broker, f"broker lacks {key!r}: {sorted(broker)}"
    assert is_int(broker["pid"]) and broker["pid"] > 0
    assert broker["bind"] == server.endpoint
    assert broker["mode"] in ("embedded", "etcd") and broker["mode"] == "embedded"
    assert broker["state"] in ("serving", "stopping") and broker["state"] == "serving"
    assert is_num(broker["uptime_s"]) and broker["uptime_s"] >= 0
    assert broker["workers_in_rotation"] == server.workers
    assert isinstance(broker["counters"], dict)
    slots = broker["slots"]
    assert isinstance(slots, list) and len(slots) == server.workers, slots
    for slot in slots:
        for key in ("slot", "pid", "restarts", "last_exit", "restart_in_s"):
            assert key in slot, f"slot lacks {key!r}: {slot}"
        assert is_int(slot["slot"]) and is_int(slot["pid"]) and is_int(slot["restarts"])
    assert sorted(s["slot"] for s in slots) == list(range(server.workers))


def test_status_layout_fields(server, sockets):
    _, st = get_status(sockets)
    lay = st["layout"]
    for key in ("epoch_ms", "time_bits", "region_bits", "worker_bits", "sequence_bits", "shard_bits"):
        assert key in lay and is_int(lay[key]), f"layout.{key}: {lay}"
    widths = ("shard_bits", "time_bits", "region_bits", "worker_bits", "sequence_bits")
    assert sum(lay[k] for k in widths) == 63, lay
    # The default layout of the doc (the server runs with defaults).
    assert lay == {
        "epoch_ms": 1767225600000,  # 2026-01-01T00:00:00Z
        "time_bits": 41,
        "region_bits": 3,
        "worker_bits": 7,
        "sequence_bits": 12,
        "shard_bits": 0,
    }


def test_status_worker_fields(server, sockets):
    _, st = get_status(sockets)
    workers = st["workers"]
    assert len(workers) == server.workers, workers
    slots = {s["slot"]: s["pid"] for s in st["broker"]["slots"]}
    max_worker = 1 << st["layout"]["worker_bits"]
    for w in workers:
        for key in (
            "worker_id",
            "state",
            "pid",
            "slot",
            "in_rotation",
            "token",
            "reserved_until_ms",
            "last_ms",
            "fence_in_s",
            "lease_remaining_s",
            "reason",
        ):
            assert key in w, f"worker entry lacks {key!r}: {sorted(w)}"
        assert is_int(w["worker_id"]) and 0 <= w["worker_id"] < max_worker, w
        assert w["state"] in WORKER_STATES, w["state"]
        assert w["state"] == "ready" and w["in_rotation"] is True, w
        assert slots.get(w["slot"]) == w["pid"], f"worker {w} is not the process of its slot {slots}"
        assert is_int(w["reserved_until_ms"])
    assert len({w["worker_id"] for w in workers}) == len(workers), "worker IDs are exclusive"


def test_reserved_until_ms_is_ahead_of_minted_ids(server, sockets, layout):
    """``reserved_until_ms`` is the persisted high-water mark in ms since the layout's epoch:
    a worker never mints past it."""
    sock = sockets()
    minted = {}
    for rid in range(1, 9):
        first, _ = sfwire.request(sock, sfwire.reserve(rid, 10)).block
        d = layout.decode(first)
        minted[d.worker] = max(minted.get(d.worker, 0), d.unix_ms - layout.epoch_ms)
    _, st = get_status(sockets)
    now_rel = time.time() * 1000 - layout.epoch_ms
    by_id = {w["worker_id"]: w for w in sfwire.held_entries(st)}
    for worker, ms in minted.items():
        mark = by_id[worker]["reserved_until_ms"]
        assert mark >= ms, f"worker {worker} minted in ms {ms} past its mark {mark}"
        assert mark < now_rel + 600_000, f"mark {mark} is not in ms since the epoch (now {now_rel:.0f})"


def test_json_never_carries_integers_beyond_2_53(server, sockets):
    """IDs inside JSON are decimal strings, because they exceed 2^53: no JSON number a JavaScript
    client would round may appear, and every document survives a float-only parser unchanged."""
    reply, st = get_status(sockets)
    text = reply.payload.decode()

    def walk(v, path="$"):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{path}.{k}")
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, f"{path}[{i}]")
        elif is_int(v):
            assert abs(v) <= 2**53, f"{path} = {v} is a JSON number beyond 2^53 (should be a string)"
        elif isinstance(v, str) and v.isdigit() and len(v) >= 16:
            assert int(v) >= 0  # an ID as a decimal string: fine

    walk(st)
    assert json.loads(text, parse_int=float) == st


def test_time_reply_carries_the_servers_wall_clock(server, sockets):
    import struct
    import time

    sock = sockets()
    t1 = time.time_ns()
    reply = sfwire.request(sock, sfwire.header(0x03, 4242))
    t4 = time.time_ns()
    assert (reply.version, reply.type, reply.flags, reply.request_id) == (1, 0x83, 0, 4242)
    assert len(reply.payload) == 16
    received, sent = struct.unpack("!QQ", reply.payload)
    assert received <= sent
    # Same host, same clock: the server's readings fall between ours.
    assert t1 <= received <= sent <= t4
    offset = ((received - t1) + (sent - t4)) / 2
    assert abs(offset) <= (t4 - t1)


def test_nodes_reply_lists_the_server_itself_in_embedded_mode(server, sockets):
    reply = sfwire.request(sockets(), sfwire.header(0x04, 31337))
    assert (reply.version, reply.type, reply.flags, reply.request_id) == (1, 0x84, 0, 31337), reply
    doc = json.loads(reply.payload.decode("utf-8", errors="strict"))
    assert set(doc) >= {"cluster", "nodes"} and doc["cluster"] is None  # embedded: a cluster of one
    [node] = doc["nodes"]
    assert isinstance(node["node"], str) and node["node"]
    assert node["endpoints"] == [server.endpoint]
    assert is_int(node["region"]) and node["in_rotation"] is True


def test_nodes_with_a_body_or_flags_is_a_bad_request(server, sockets):
    for body in (sfwire.header(0x04, 9) + b"x", sfwire.header(0x04, 9, flags=1)):
        reply = sfwire.request(sockets(), body)
        assert reply.type == sfwire.ERROR and reply.json["code"] == "bad_request" and reply.request_id == 9
