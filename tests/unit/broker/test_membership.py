"""A node's membership in its cluster, kept in an in-memory etcd on a fake clock: its entry
published under a lease of its own and renewed, the others' entries read back as they come
and go, unreadable ones passed over, etcd failures outlived, and a clean stop. Also the
endpoints a node advertises, its name, and the bounds its nodes must set alike."""

from __future__ import annotations

import logging
import threading

import pytest
from etcdrig import PREFIX, TTL_S, config
from fake_etcd import RpcError

from snowfence.broker.membership import Membership, advertised_endpoints, bounds_differ, node_name
from snowfence.errors import EtcdUnavailable


def member(etcd, name: str, **overrides) -> Membership:
    m = Membership(config(**overrides), name, {"node": name, "endpoints": [f"tcp://{name}:5555"]})
    m.cluster = etcd.cluster(**overrides)
    return m


def names(m: Membership) -> list[str]:
    return [n["node"] for n in m.nodes]


def lease_of(etcd, name: str) -> int | None:
    etcd.server.expire()
    kv = etcd.server.kv.get(f"{PREFIX}nodes/{name}")
    return None if kv is None else kv.lease


# -- publishing ------------------------------------------------------------------------------------


def test_a_first_step_registers_the_node_under_a_lease_of_its_own_and_reads_it_back(etcd):
    m = member(etcd, "a")
    assert m.nodes == [] and m.read_ns is None and m.lease_id is None
    m.step()
    assert m.lease_id is not None and lease_of(etcd, "a") == m.lease_id
    assert etcd.server.leases[m.lease_id][0] == TTL_S
    assert etcd.json("nodes/a") == {"node": "a", "endpoints": ["tcp://a:5555"]}
    assert etcd.json("regions/1") == {"first_node": "a"}
    assert m.nodes == [{"node": "a", "endpoints": ["tcp://a:5555"]}] and m.read_ns is not None
    assert m.error is None


def test_the_lease_is_renewed_and_a_published_entry_is_written_at_the_next_step(etcd):
    m = member(etcd, "a")
    m.step()
    lease = m.lease_id
    m.publish({"node": "a", "endpoints": ["tcp://a:5555"], "worker_ids": [1, 2]})
    assert etcd.json("nodes/a") == {"node": "a", "endpoints": ["tcp://a:5555"]}  # not yet
    for _ in range(4):  # 24 s, past the TTL more than once, renewed every 6
        etcd.elapse_s(TTL_S - 4)
        m.step()
    assert m.lease_id == lease and lease_of(etcd, "a") == lease
    assert etcd.json("nodes/a")["worker_ids"] == [1, 2]
    assert m.nodes[0]["worker_ids"] == [1, 2]


def test_a_lapsed_lease_is_taken_again_and_the_entry_written_back(etcd, caplog):
    caplog.set_level(logging.INFO, logger="snowfence.broker")
    m = member(etcd, "a")
    m.step()
    lapsed = m.lease_id
    etcd.elapse_s(TTL_S + 1)  # the process was paused
    assert etcd.value("nodes/a") is None
    m.step()
    assert m.lease_id != lapsed and lease_of(etcd, "a") == m.lease_id
    assert names(m) == ["a"]
    assert [r.event for r in caplog.records if getattr(r, "event", None)] == ["membership_lapsed"]


# -- the others ------------------------------------------------------------------------------------


def test_other_nodes_appear_as_they_register_and_go_as_their_leases_lapse_or_their_entries_are_removed(etcd):
    a, b, c = member(etcd, "a"), member(etcd, "b"), member(etcd, "c")
    a.step()
    assert names(a) == ["a"]
    b.step()
    c.step()
    a.step()
    assert names(a) == ["a", "b", "c"]
    for _ in range(3):  # b stops renewing; a and c go on
        etcd.elapse_s(4)
        a.step()
        c.step()
    assert names(a) == ["a", "c"] and etcd.value("nodes/b") is None
    etcd.delete("nodes/c")  # an operator's etcdctl del
    a.step()
    assert names(a) == ["a"]
    c.step()  # c, still running, writes its entry back under its lease
    a.step()
    assert names(a) == ["a", "c"]
    c.stop()  # a clean shutdown: gone at once
    a.step()
    assert names(a) == ["a"]


def test_the_view_shows_this_node_as_it_is_now_among_the_others_in_order(etcd):
    a, b, c = member(etcd, "a"), member(etcd, "b"), member(etcd, "c")
    own = {"node": "b", "endpoints": ["tcp://b:5555"], "in_rotation": False}
    assert b.view(own) == [own]  # nothing read yet
    for m in (c, a, b):
        m.step()
    view = b.view(own)
    assert [n["node"] for n in view] == ["a", "b", "c"]
    assert view[1] is own and "in_rotation" not in b.nodes[1]


def test_unreadable_entries_in_etcd_are_passed_over_and_left_as_they_are(etcd):
    junk = {
        "nodes/x1": b"{not json",
        "nodes/x2": b"[1, 2]",
        "nodes/x3": {"node": None},
        "nodes/x4": {"endpoints": ["tcp://x:1"]},
        "nodes/x5": b"",
        "nodes/x6": {"node": "e", "endpoints": "tcp://e:1"},
    }
    for key, value in junk.items():
        etcd.put(key, value)
    stored = {k: etcd.value(k) for k in junk}
    a = member(etcd, "a")
    a.step()
    assert names(a) == ["a", "e"]
    assert a.nodes[1]["endpoints"] == []  # listed, but nobody connects to it
    assert a.error is None
    assert {k: etcd.value(k) for k in junk} == stored
    assert [n["node"] for n in a.view({"node": "a", "endpoints": []})] == ["a", "e"]


def test_when_etcd_fails_the_last_read_is_kept(etcd):
    a, b = member(etcd, "a"), member(etcd, "b")
    a.step()
    b.step()
    a.step()
    read, read_ns = a.nodes, a.read_ns
    a.cluster.client.fail(RpcError("UNAVAILABLE"), on="range")
    b.stop()
    with pytest.raises(EtcdUnavailable):
        a.step()
    assert a.nodes is read and a.read_ns == read_ns and names(a) == ["a", "b"]
    a.step()
    assert names(a) == ["a"] and a.read_ns > read_ns


# -- the thread ------------------------------------------------------------------------------------


class Scripted:
    """Stands for ``step``: raises the errors given, in turn, then succeeds; records what
    the thread's error was when each step began."""

    def __init__(self, m: Membership, errors: list[Exception | None]) -> None:
        self.m = m
        self.errors = list(errors)
        self.seen: list[str | None] = []
        self.done = threading.Event()

    def __call__(self) -> None:
        self.seen.append(self.m.error)
        if not self.errors:
            self.done.set()
            return
        error = self.errors.pop(0)
        if error is not None:
            raise error


def test_the_thread_outlives_etcd_failures_and_bugs_and_says_so_once(etcd, caplog):
    caplog.set_level(logging.INFO, logger="snowfence.broker")
    m = member(etcd, "a")
    m.interval_s = 0.001
    down = EtcdUnavailable("etcd call nodes failed: UNAVAILABLE")
    script = Scripted(m, [None, down, down, None, RuntimeError("a bug"), None])
    m.step = script
    m.start()
    try:
        assert script.done.wait(5)
    finally:
        m.stop()
    assert not m.is_alive()
    assert script.seen[:7] == [None, None, str(down), str(down), None, "RuntimeError('a bug')", None]
    events = [r.event for r in caplog.records if getattr(r, "event", None)]
    assert events == ["membership_failed", "membership_restored", "membership_restored"]
    assert any(r.exc_info and "membership step failed" in r.getMessage() for r in caplog.records)


def test_stopping_ends_the_thread_at_once_and_removes_the_entry(etcd):
    a, b = member(etcd, "a"), member(etcd, "b")
    a.interval_s = 30.0  # stopping does not wait out the interval
    a.start()
    try:
        assert a.daemon
        for _ in range(500):
            if a.read_ns is not None:
                break
            threading.Event().wait(0.01)
        b.step()
        lease = a.lease_id
        assert lease is not None and etcd.value("nodes/a") is not None
        client = a.cluster.client
    finally:
        a.stop()
    assert not a.is_alive()
    assert etcd.value("nodes/a") is None and lease not in etcd.server.leases
    assert client.closed
    b.step()
    assert names(b) == ["b"]


def test_a_stop_when_etcd_is_down_raises_nothing_and_the_entry_lapses_with_its_lease(etcd):
    a = member(etcd, "a")
    a.step()
    client = a.cluster.client
    client.fail(RpcError("UNAVAILABLE"), on="delete_range")
    a.stop()
    assert client.closed
    assert etcd.value("nodes/a") is not None
    etcd.elapse_s(TTL_S + 1)
    assert etcd.value("nodes/a") is None


def test_a_node_never_registered_stops_without_calling_etcd(etcd):
    a = member(etcd, "a")
    a.stop()
    assert a.cluster._client is None  # no client was ever built


# -- endpoints, names and bounds -------------------------------------------------------------------


def test_the_advertised_endpoints_are_the_configured_ones_else_the_bound_one_unless_a_wildcard():
    assert advertised_endpoints(config(advertise=("tcp://h:1", "tcp://h:2")), "tcp://*:5555") == [
        "tcp://h:1",
        "tcp://h:2",
    ]
    for wildcard in ("*", "0.0.0.0", "[::]"):
        assert advertised_endpoints(config(), f"tcp://{wildcard}:5555") == []
    assert advertised_endpoints(config(), "tcp://10.0.0.7:5555") == ["tcp://10.0.0.7:5555"]
    assert advertised_endpoints(config(), "ipc:///run/sf.sock") == ["ipc:///run/sf.sock"]


def test_a_node_is_named_by_its_setting_else_its_first_endpoint():
    assert node_name(config(node_name="n1"), ["tcp://h:1"]) == "n1"
    assert node_name(config(), ["tcp://h:1", "tcp://h:2"]) == "tcp://h:1"
    assert node_name(config(), []).endswith(config().bind)


def bounds(**values) -> dict:
    base = dict(
        reservation_window_ms=5000,
        max_reservation_window_ms=10000,
        max_ahead_ms=1000,
        max_clock_skew_ms=1000,
        max_peer_offset_ms=500,
    )
    return {**base, **values}


def test_every_shared_bound_not_set_alike_is_named_in_order():
    members = [
        {"node": "c", "bounds": bounds(max_peer_offset_ms=400, max_ahead_ms=900)},
        {"node": "a", "bounds": bounds()},
        {"node": "b", "bounds": bounds(max_peer_offset_ms=300)},
    ]
    assert bounds_differ(members) == [
        "max_ahead_ms is not set alike: 1000 on a, b; 900 on c",
        "max_peer_offset_ms is not set alike: 300 on b; 400 on c; 500 on a",
    ]


def test_bounds_alike_a_node_s_own_window_and_entries_without_bounds_name_nothing():
    assert bounds_differ([]) == []
    assert bounds_differ([{"node": "a", "bounds": bounds(max_clock_skew_ms=1)}]) == []
    members = [
        {"node": "a", "bounds": bounds(reservation_window_ms=1)},
        {"node": "b", "bounds": bounds(reservation_window_ms=2)},
        {"node": "c", "bounds": "not a dict"},
        {"node": "d", "bounds": None},
        {"node": "e"},
        {"node": "f", "bounds": {"max_ahead_ms": 1000}},  # only some bounds: compared on those
    ]
    assert bounds_differ(members) == []


def test_odd_bounds_from_etcd_are_named_without_raising():
    members = [
        {"node": "a", "bounds": bounds(max_clock_skew_ms="1000")},
        {"bounds": bounds(max_clock_skew_ms=1000)},
        {"node": 7, "bounds": bounds(max_clock_skew_ms=None)},
    ]
    assert bounds_differ(members) == [
        "max_clock_skew_ms is not set alike: 1000 on a; 1000 on None; None on 7"  # the text "1000", then the number
    ]


def test_a_membership_talks_to_the_cluster_its_config_names():
    m = Membership(config(cluster="west"), "a", {"node": "a"})
    assert m.cluster.prefix.rstrip("/").endswith("west") and m.cluster.config.cluster == "west"
    assert m.interval_s == config().keepalive_interval_s
    m.cluster.close()
