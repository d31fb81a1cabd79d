"""The cluster's records on an in-memory etcd: node entries under their leases, the
regions its nodes used, and the census of its worker IDs (``snowfence status --etcd``).

Claims are made with the real ``EtcdStore`` (see ``etcdrig``); the census reads
them through a ``Cluster``, which holds no lease store.
"""

from __future__ import annotations

import orjson
import pytest
from etcdrig import NOW_MS, PREFIX, TTL_S, claim, config
from fake_etcd import RpcError

from snowfence.errors import EtcdUnavailable

# -- the census ------------------------------------------------------------------------------------


def test_the_census_lists_held_and_retired_worker_ids_of_every_region_in_order(etcd):
    here, there = etcd.store(), etcd.store(region=2)
    retired = claim(here, preferred=3, holder="old")
    retired.extend(NOW_MS + 7)
    retired.release(NOW_MS + 5)
    held = claim(here, preferred=1, holder="a")
    held.extend(NOW_MS + 9)
    fresh = claim(there, preferred=0, holder="b")
    etcd.elapse_s(4)
    held.refresh()
    etcd.elapse_s(1.5)
    census = etcd.cluster().census()
    assert census == [
        {
            "region": 1,
            "worker_id": 1,
            "state": "held",
            "mark_ms": NOW_MS + 9,
            "mark_token": held.token,
            "last_holder": "a",
            "holder": "a",
            "token": held.token,
            "lease_id": f"{held.lease_id:x}",
            "lease_remaining_s": TTL_S - 2,
            "renewed_ago_s": 2,
        },
        {
            "region": 1,
            "worker_id": 3,
            "state": "retired",
            "mark_ms": NOW_MS + 5,
            "mark_token": retired.token,
            "last_holder": "old",
        },
        {
            "region": 2,
            "worker_id": 0,
            "state": "held",
            "mark_ms": 0,  # written by its claim
            "mark_token": None,
            "last_holder": "b",
            "holder": "b",
            "token": fresh.token,
            "lease_id": f"{fresh.lease_id:x}",
            "lease_remaining_s": TTL_S - 6,
            "renewed_ago_s": 6,
        },
    ]
    assert etcd.cluster(region=2).census() == census  # the same from any region


def test_the_census_shows_a_claim_whose_lease_is_gone_without_its_lease_times(etcd):
    store = etcd.store()
    etcd.put("workers/1/2", {"holder": "by hand"})  # no lease
    lease = claim(store, preferred=0)
    info = etcd.server.lease_info

    def lapsed(lease_id):  # etcd's answer for a lease that lapsed between the two reads
        return type("R", (), {"TTL": -1, "grantedTTL": 0})() if lease_id == lease.lease_id else info(lease_id)

    etcd.server.lease_info = lapsed
    by_id = {e["worker_id"]: e for e in etcd.cluster().census()}
    assert by_id[2]["lease_id"] == "0" and by_id[2]["lease_remaining_s"] is None and by_id[2]["renewed_ago_s"] is None
    assert by_id[2]["holder"] == "by hand" and by_id[2]["state"] == "held"
    assert by_id[0]["lease_remaining_s"] == -1 and by_id[0]["renewed_ago_s"] is None


def test_the_census_counts_a_lease_in_its_last_second_as_renewed_its_whole_ttl_ago(etcd):
    store = etcd.store()
    claim(store)
    etcd.elapse_s(TTL_S - 0.5)
    (entry,) = etcd.cluster().census()
    assert (entry["lease_remaining_s"], entry["renewed_ago_s"]) == (0, TTL_S)


LAYOUT_MAX_MS = config().layout.max_ms


def test_the_census_shows_unreadable_entries_as_such_and_changes_nothing(etcd):
    store = etcd.store()
    lease = claim(store, preferred=0, holder="a")
    lease.extend(NOW_MS)
    stray = {
        "marks/1/junk": {"reserved_until_ms": 5},
        "marks/x/1": {"reserved_until_ms": 5},
        "marks/2/1": b"{",
        "marks/2/2": {"reserved_until_ms": "soon"},
        "marks/2/3": [1, 2],
        "workers/2/3": b"not json",
        "workers/2/x": {"holder": "x"},
        "marks/3/0": {"token": 4},
        "workers/3/0": [1],
        "marks/4/1": {"reserved_until_ms": True},
        "marks/4/2": {"reserved_until_ms": 1.9},
        "marks/4/3": {"reserved_until_ms": -5},
        "marks/4/4": {"reserved_until_ms": 10**17},  # past the layout's last millisecond
        "marks/x/5/6": {"reserved_until_ms": 5},  # a path deeper than region/worker
        "workers/5/1_0": {"holder": "x"},
        "workers/5/+7": {"holder": "x"},
        "marks/6/0": {"reserved_until_ms": 0},  # the lowest a mark can be
        "marks/6/1": {"reserved_until_ms": LAYOUT_MAX_MS},  # and the highest
    }
    for key, value in stray.items():
        etcd.put(key, value)
    before = {k: v.value for k, v in etcd.server.kv.items()}
    cluster = etcd.cluster()
    census = cluster.census()
    assert [(e["region"], e["worker_id"], e["state"], e["mark_ms"]) for e in census] == [
        (1, 0, "held", NOW_MS),
        (2, 1, "unreadable", None),
        (2, 2, "unreadable", None),
        (2, 3, "held", None),
        (3, 0, "held", None),
        (4, 1, "unreadable", None),
        (4, 2, "unreadable", None),
        (4, 3, "unreadable", None),
        (4, 4, "unreadable", None),
        (6, 0, "retired", 0),
        (6, 1, "retired", LAYOUT_MAX_MS),
    ]
    held = [e for e in census if e["state"] == "held"]
    assert held[-2]["holder"] is None and held[-2]["token"] > 0 and held[-1]["holder"] is None
    assert {k: v.value for k, v in etcd.server.kv.items()} == before
    assert cluster._failures == 0  # etcd answered


# -- node entries and regions ----------------------------------------------------------------------


def test_a_node_entry_lives_under_its_lease_and_goes_with_it(etcd):
    cluster = etcd.cluster()
    lease_id = cluster.grant_lease(4)
    cluster.put_node("tcp://h:1/a b", {"node": "tcp://h:1/a b", "endpoints": ["tcp://h:1"]}, lease_id)
    assert etcd.server.kv[PREFIX + "nodes/tcp%3A%2F%2Fh%3A1%2Fa%20b"].lease == lease_id
    assert cluster.nodes() == [{"node": "tcp://h:1/a b", "endpoints": ["tcp://h:1"]}]
    etcd.elapse_s(3)
    assert cluster.refresh_lease(lease_id) is True
    etcd.elapse_s(3)
    assert cluster.nodes() != []
    etcd.elapse_s(4)
    assert cluster.nodes() == [] and cluster.refresh_lease(lease_id) is False


def test_a_node_removed_leaves_at_once_and_its_lease_is_revoked(etcd):
    cluster = etcd.cluster()
    keep, drop = cluster.grant_lease(10), cluster.grant_lease(10)
    cluster.put_node("b", {"node": "b", "endpoints": []}, keep)
    cluster.put_node("a", {"node": "a", "endpoints": ["tcp://a:1"]}, drop)
    assert [n["node"] for n in cluster.nodes()] == ["a", "b"]
    cluster.remove_node("a", drop)
    assert [n["node"] for n in cluster.nodes()] == ["b"] and drop not in etcd.server.leases
    assert keep in etcd.server.leases
    cluster.client.fail(RpcError("UNAVAILABLE"), on="lease_revoke")
    with pytest.raises(EtcdUnavailable):
        cluster.remove_node("b", keep)
    assert cluster.nodes() == [] and keep in etcd.server.leases  # gone at once; the lease lapses


def test_unreadable_node_entries_are_left_out_and_unusable_endpoints_dropped(etcd):
    cluster = etcd.cluster()
    entries = {
        "n1": b"{not json",
        "n2": orjson.dumps(["node", "x"]),
        "n3": orjson.dumps({"node": 7}),
        "n4": orjson.dumps({"endpoints": ["tcp://x:1"]}),
        "n5": orjson.dumps({"node": "e", "endpoints": "tcp://x:1"}),
        "n6": orjson.dumps({"node": "d", "endpoints": ["tcp://x:1", 3]}),
        "n7": orjson.dumps({"node": "c"}),
        "n8": orjson.dumps({"node": "b", "endpoints": ["tcp://b:1"], "region": 1}),
    }
    for name, value in entries.items():
        etcd.put(f"nodes/{name}", value)
    assert cluster.nodes() == [
        {"node": "b", "endpoints": ["tcp://b:1"], "region": 1},
        {"node": "c", "endpoints": []},
        {"node": "d", "endpoints": []},
        {"node": "e", "endpoints": []},
    ]
    assert etcd.value("nodes/n6") == entries["n6"]  # left as it was


def test_a_region_is_recorded_once_by_its_first_node_and_regions_are_listed_in_order(etcd):
    cluster = etcd.cluster()
    cluster.record_region(2, "first")
    cluster.record_region(2, "second")
    cluster.record_region(0, "other")
    etcd.put("regions/junk", {"first_node": "x"})
    etcd.put("regions/-", {"first_node": "x"})  # listed first
    etcd.put("regions/10", {"first_node": "x"})
    assert etcd.json("regions/2") == {"first_node": "first"}
    assert cluster.regions() == [0, 2, 10]
    assert etcd.server.kv[PREFIX + "regions/2"].lease == 0
