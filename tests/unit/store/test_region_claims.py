"""Regions are claimed per etcd, not assumed: two clusters of one etcd never share one."""

from __future__ import annotations

import orjson
import pytest
from etcdrig import NOW_MS, claim

from snowfence.errors import ConfigError, LayoutMismatch, LeaseLost
from snowfence.etcd import keys, regions
from snowfence.ids import Layout


def claims(etcd) -> dict | None:
    etcd.server.expire()
    kv = etcd.server.kv.get(keys.REGION_CLAIMS)
    return None if kv is None else orjson.loads(kv.value)


def put_claims(etcd, value: bytes) -> None:
    from pyetcd.client import Transactions

    etcd.server.txn([], [Transactions().put(keys.REGION_CLAIMS, value)], [])


def test_a_new_clusters_genesis_and_its_region_claim_are_written_together(etcd):
    store = etcd.store(cluster="blue", region=2)
    store.check_layout(store.layout)
    doc = claims(etcd)
    assert doc["regions"]["2"]["cluster"] == "blue"
    assert doc["regions"]["2"]["window_ms"] == 5_000
    assert doc["widths"] == regions.widths(store.layout)
    genesis = etcd.server.kv["/snowfence/blue/layout"]
    assert genesis.mod_revision == etcd.server.kv[keys.REGION_CLAIMS].mod_revision  # one transaction


def test_a_second_cluster_in_a_claimed_region_is_refused_by_name_and_writes_nothing(etcd):
    first = etcd.store()
    first.check_layout(first.layout)
    assert claim(first) is not None
    before = dict(etcd.server.kv)
    typo = etcd.store(cluster="unti")  # the same region, another cluster: a typo in --cluster
    with pytest.raises(LayoutMismatch, match=r"region 1 of this etcd is claimed by cluster 'unit', not 'unti'"):
        typo.check_layout(typo.layout)
    assert "/snowfence/unti/layout" not in etcd.server.kv
    assert {k: v.mod_revision for k, v in etcd.server.kv.items()} == {k: v.mod_revision for k, v in before.items()}


def test_clusters_of_one_etcd_in_different_regions_both_start(etcd):
    blue, green = etcd.store(cluster="blue", region=1), etcd.store(cluster="green", region=2)
    blue.check_layout(blue.layout)
    green.check_layout(green.layout)
    assert claim(blue) is not None and claim(green) is not None
    assert {r: c["cluster"] for r, c in claims(etcd)["regions"].items()} == {"1": "blue", "2": "green"}


def test_a_cluster_of_other_widths_is_refused_whatever_its_region(etcd):
    blue = etcd.store(cluster="blue", region=1)
    blue.check_layout(blue.layout)
    wide = etcd.store(cluster="wide", region=2, worker_bits=1, sequence_bits=7)
    with pytest.raises(LayoutMismatch, match="claimed by clusters of another layout.*blue"):
        wide.check_layout(wide.layout)


def test_a_claim_pass_refuses_a_region_given_to_another_cluster_since(etcd):
    store = etcd.store()
    store.check_layout(store.layout)
    doc = claims(etcd)
    doc["regions"]["1"]["cluster"] = "intruder"
    put_claims(etcd, orjson.dumps(doc))
    with pytest.raises(LayoutMismatch, match="claimed by cluster 'intruder'"):
        claim(store)
    assert etcd.claimed() == set()


def test_a_region_claim_deleted_by_hand_is_claimed_again_at_the_next_claim(etcd):
    store = etcd.store()
    store.check_layout(store.layout)
    assert etcd.server.delete_key(keys.REGION_CLAIMS)
    assert claim(store) is not None
    assert claims(etcd)["regions"]["1"]["cluster"] == "unit"


@pytest.mark.parametrize("change", ["deleted", "another cluster", "unreadable"])
def test_a_holder_whose_region_is_no_longer_its_clusters_fences_at_its_next_renewal(etcd, change):
    store = etcd.store()
    store.check_layout(store.layout)
    lease = claim(store)
    lease.extend(NOW_MS + 100)
    if change == "deleted":
        assert etcd.server.delete_key(keys.REGION_CLAIMS)
    elif change == "another cluster":
        doc = claims(etcd)
        doc["regions"]["1"]["cluster"] = "intruder"
        put_claims(etcd, orjson.dumps(doc))
    else:
        put_claims(etcd, b"{not json")
    with pytest.raises(LeaseLost, match="region 1|region claims"):
        lease.extend(NOW_MS + 200)
    with pytest.raises(LeaseLost):
        lease.confirm()


def test_unreadable_region_claims_refuse_a_start_and_are_left_as_they_were(etcd):
    put_claims(etcd, b'{"version": 1, "widths": null, "regions": {"x": 1}}')
    before = etcd.server.kv[keys.REGION_CLAIMS].mod_revision
    store = etcd.store()
    with pytest.raises(LayoutMismatch, match="region claims /snowfence/region-claims are unreadable"):
        store.check_layout(store.layout)
    assert etcd.server.kv[keys.REGION_CLAIMS].mod_revision == before


def test_a_store_that_looks_new_waits_out_the_longest_window_its_regions_claim_recorded(etcd):
    # A node allowed a 30 s window claimed the region; then the cluster's keys were
    # deleted (the claim, outside the prefix, stays). A node with the default bound
    # starts a new store: its quarantine covers the 30 s node, not only itself.
    long = etcd.store(reservation_window_s=30.0, max_reservation_window_s=30.0, max_clock_skew_ms=1000)
    long.check_layout(long.layout)
    assert claims(etcd)["regions"]["1"]["window_ms"] == 30_000
    for key in list(etcd.server.kv):
        if key.startswith("/snowfence/unit/"):
            etcd.server.delete_key(key)
    fresh = etcd.store(max_clock_skew_ms=1000)
    fresh.check_layout(fresh.layout)
    assert fresh.genesis.quarantine_until_ms >= fresh._now_ms() + 31_000 - 50
    assert claims(etcd)["regions"]["1"]["window_ms"] == 30_000  # never lowered


def test_the_quarantine_is_the_bound_every_node_is_held_to_not_the_nodes_own_window(etcd):
    store = etcd.store(reservation_window_s=3.0, max_reservation_window_s=12.0, max_clock_skew_ms=500)
    assert store.quarantine_ms() >= 12_500


def test_a_node_whose_window_is_past_the_bound_does_not_start(etcd):
    with pytest.raises(ConfigError, match="reservation_window_s 30 is above max_reservation_window_s 5"):
        etcd.store(reservation_window_s=30.0)


@pytest.mark.parametrize(
    "value",
    [
        b"[]",
        b'{"version": 2, "widths": null, "regions": {}}',
        b'{"version": 1, "widths": {"time_bits": 41}, "regions": {}}',
        b'{"version": 1, "widths": null, "regions": {"1": {"cluster": "a", "since_unix_ms": 0, "window_ms": 1}}}',
        b'{"version": 1, "widths": null, "regions": {"1": {"cluster": "", "since_unix_ms": 0, "window_ms": 1}}}',
        b'{"version": 1, "widths": null, "regions": {"1": {"cluster": "a", "since_unix_ms": -1, "window_ms": 1}}}',
    ],
)
def test_region_claims_snowfence_could_not_have_written_are_unreadable(value):
    with pytest.raises(LayoutMismatch, match="unreadable"):
        regions.parse(value)


def test_region_claims_read_back_as_written():
    layout = Layout()
    written = regions.RegionClaims().claimed(3, "a", layout, window_ms=5000, now_unix_ms=7)
    assert regions.parse(written.to_bytes()) == written
    assert written.claimed(3, "a", layout, window_ms=4000, now_unix_ms=9) == written  # a window is never lowered
    assert written.released("a") == regions.RegionClaims()


def test_the_claims_key_is_under_no_clusters_prefix():
    for cluster in ("region-claims", "snowfence", "a"):
        assert not keys.REGION_CLAIMS.startswith(keys.prefix(cluster))
        assert not (keys.prefix(cluster) <= keys.REGION_CLAIMS < keys.range_end(keys.prefix(cluster)))


def test_accept_restore_counts_the_region_claims_window(etcd):
    long = etcd.store(reservation_window_s=20.0, max_reservation_window_s=20.0, max_clock_skew_ms=0)
    long.check_layout(long.layout)
    for key in list(etcd.server.kv):
        if key.startswith("/snowfence/unit/"):
            etcd.server.delete_key(key)
    operator = etcd.store(max_clock_skew_ms=0)
    genesis = operator.accept_restore("test")
    assert genesis.quarantine_until_ms >= operator._now_ms() + 20_000 - 50


def test_a_claim_is_guarded_on_the_region_claim_it_read(etcd, monkeypatch):
    # Between the pass's read and its claim, the region's claim is deleted and another
    # cluster claims the region: the claim must not go through.
    store = etcd.store()
    store.check_layout(store.layout)
    floor = store._floor

    def meanwhile(worker_id, now_ms):
        if etcd.server.kv.get(keys.REGION_CLAIMS) is not None and claims(etcd)["regions"]["1"]["cluster"] == "unit":
            etcd.server.delete_key(keys.REGION_CLAIMS)
            other = regions.RegionClaims().claimed(1, "intruder", store.layout, window_ms=5000, now_unix_ms=1)
            put_claims(etcd, other.to_bytes())
        return floor(worker_id, now_ms)

    monkeypatch.setattr(store, "_floor", meanwhile)
    assert claim(store) is None
    assert etcd.claimed() == set()
    with pytest.raises(LayoutMismatch, match="claimed by cluster 'intruder'"):
        claim(store)  # the next pass reads the region's claim again
