"""The simulator's etcd answers the real store code as a real etcd does.

One script of claims, extensions, a claim deleted underneath its owner and
claimed anew, releases and a lease left to lapse is run by the real
``EtcdStore``/``EtcdLease`` three times: against a real etcd member, against
the simulated one through the simulator's client (``tests/sim/sim.py``), and
through the unit tests' direct client (``tests/harness/fake_etcd.py``). What
the store code sees (worker IDs, marks, which calls raise what, whether fencing
tokens grew) must be the same. The real member and the direct client also run
the cluster's census and its membership calls.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import orjson
from etcdharness import EtcdCluster
from fake_etcd import DirectClient, EtcdServer, ServerTime

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sim  # noqa: E402

from snowfence.config import Config  # noqa: E402
from snowfence.errors import SnowfenceError  # noqa: E402
from snowfence.etcd.cluster import Cluster  # noqa: E402
from snowfence.store.etcd import EtcdStore  # noqa: E402

TTL_S = 2
#: The wall clock the script's watermark rounds read (ms since the epoch): long past every mark,
#: and past the store's new-store window whichever day the test runs.
NOW_MS = 10**12
LAYOUT = dict(time_bits=53, region_bits=2, worker_bits=2, sequence_bits=6)


def script(stores, mark_of, delete_claim, lapse) -> list:
    """Run the script; return what the store code observed."""
    a_store, b_store, c_store = stores
    seen = []

    def call(what, fn):
        try:
            out = fn()
        except SnowfenceError as exc:
            seen.append((what, type(exc).__name__))
            return None
        seen.append((what, "ok"))
        return out

    call("layout", lambda: a_store.check_layout(a_store.layout))
    a = call("claim a", lambda: a_store.claim(None, "a", 1000, 10_000))
    b = call("claim b", lambda: b_store.claim(None, "b", 1000, 10_000))
    seen.append(("ids", a.worker_id, b.worker_id, a.claimed_mark_ms, b.claimed_mark_ms))
    call("a refresh", a.refresh)
    a.floor_ms, b.floor_ms = 3000, 2000  # what their keepers would publish: they never mint below
    call("a extend", lambda: a.extend(5000))
    call("b extend", lambda: b.extend(2500))
    seen.append(("mark a", mark_of(a.worker_id)))
    delete_claim(a.worker_id)
    c = call("claim c", lambda: c_store.claim(a.worker_id, "c", 6000, 10_000))  # past a's mark
    seen.append(("c took a's worker ID", c.worker_id == a.worker_id, c.token > a.token, c.claimed_mark_ms))
    call("a extend after losing it", lambda: a.extend(6000))
    seen.append(("mark after a's refused extension", mark_of(a.worker_id)))
    call("a refresh after losing it", a.refresh)  # its lease still lives
    c.floor_ms = 6500
    call("c extend", lambda: c.extend(7000))
    # The watermark: a round reads every mark, raises the record (value < candidate, or a
    # record not there yet) and reads them again in the same transaction.
    seen.append(("watermark while held", call("round", lambda: a_store.watermark_round(NOW_MS, 0))))
    seen.append(("watermark again", call("round again", lambda: a_store.watermark_round(NOW_MS, 0))))
    call("a release after losing it", lambda: a.release(5500))
    seen.append(("mark after a's refused release", mark_of(a.worker_id)))
    call("c release", lambda: c.release(6000))
    seen.append(("mark after c's release", mark_of(c.worker_id)))
    lapse()
    call("b refresh after its lease lapsed", b.refresh)
    call("b extend after its lease lapsed", lambda: b.extend(9000))
    d = call("claim d", lambda: c_store.claim(b.worker_id, "d", 1000, 10_000))
    seen.append(("d took b's worker ID", d.worker_id == b.worker_id, d.token > b.token, d.watermark_ms))
    seen.append(("watermark after releases", call("round after", lambda: a_store.watermark_round(NOW_MS, 0))))
    return seen


def membership(store) -> list:
    """The census after the script, and a node's entry, its lease and region records."""
    cluster = Cluster(store.config)
    cluster._build_client = store.connection._build_client  # the same etcd as the store's
    seen = [
        (
            e["region"],
            e["worker_id"],
            e["state"],
            e["mark_ms"],
            e.get("holder"),
            e.get("last_holder"),
            e.get("lease_remaining_s") is not None,
            e.get("renewed_ago_s") is not None,
        )
        for e in cluster.census()
    ]
    lease = cluster.grant_lease(TTL_S)
    cluster.put_node("tcp://n:1/a b", {"node": "tcp://n:1/a b", "endpoints": ["tcp://n:1"]}, lease)
    seen.append(("nodes", cluster.nodes(), cluster.refresh_lease(lease)))
    cluster.record_region(1, "first")
    cluster.record_region(1, "second")
    cluster.record_region(3, "other")
    seen.append(("regions", cluster.regions()))
    cluster.remove_node("tcp://n:1/a b", lease)
    seen.append(("nodes after removal", cluster.nodes(), cluster.refresh_lease(lease)))
    cluster.close()
    return seen


def config(endpoints) -> Config:
    return Config(
        etcd=tuple(endpoints),
        cluster="fake-check",
        region=1,
        lease_ttl_s=TTL_S,
        keepalive_interval_s=0.5,
        fence_after_s=1.0,
        reservation_window_s=1.0,
        max_ahead_ms=500,
        etcd_timeout_s=0.5,
        workers=1,
        **LAYOUT,
    )


def test_the_simulated_etcd_answers_as_a_real_one(tmp_path):
    cluster = EtcdCluster(tmp_path / "etcd", size=1).start()
    try:
        cfg = config(cluster.endpoints)
        stores = [EtcdStore(cfg) for _ in range(3)]
        prefix = "/snowfence/fake-check/"

        def mark_of(wid):
            value, _ = stores[0].client.get(f"{prefix}marks/1/{wid}")
            return orjson.loads(value)["reserved_until_ms"]

        # An older release's layout record, upgraded at the first claim: no new-store
        # quarantine, so the marks the script sees do not depend on either wall clock.
        stores[0].client.put(prefix + "layout", orjson.dumps(cfg.layout.to_dict()))
        real = script(
            stores,
            mark_of,
            lambda wid: stores[0].client.delete(f"{prefix}workers/1/{wid}"),
            lambda: time.sleep(TTL_S + 1.5),
        )
        real_membership = membership(stores[0])
        regions_recorded = orjson.loads(stores[0].client.get(f"{prefix}regions/1")[0])
        for s in stores:
            s.close()
    finally:
        cluster.stop()

    world = sim.World(7, kind="etcd")
    world.config = cfg = config(["http://127.0.0.1:2379", "http://127.0.0.1:2380", "http://127.0.0.1:2381"])
    proc = world.procs[0]
    proc.up = True
    proc.loop = world.current = sim.Thread(proc, "loop")
    stores = []
    for _ in range(3):
        store = EtcdStore(cfg)
        store.connection._build_client = lambda: sim.FakeClient(
            world, proc, [f"127.0.0.1:{2379 + i}" for i in range(3)], 0.5
        )
        stores.append(store)

    def fake_mark(wid):
        return orjson.loads(world.etcd.kv[f"/snowfence/fake-check/marks/1/{wid}"].value)["reserved_until_ms"]

    world.etcd.put_key("/snowfence/fake-check/layout", orjson.dumps(cfg.layout.to_dict()))
    simulated = script(
        stores,
        fake_mark,
        lambda wid: world.etcd.delete_key(f"/snowfence/fake-check/workers/1/{wid}"),
        lambda: world.run_until(world.T + (TTL_S + 1) * sim.NS),
    )
    assert simulated == real

    now = [0]
    server = EtcdServer(ServerTime(lambda: now[0], seed=7))
    stores = []
    for _ in range(3):
        store = EtcdStore(cfg)
        store.connection._build_client = lambda: DirectClient(server)
        stores.append(store)

    def lapse():
        now[0] += (TTL_S + 1) * sim.NS

    server.put_key("/snowfence/fake-check/layout", orjson.dumps(cfg.layout.to_dict()))

    direct = script(
        stores,
        lambda wid: orjson.loads(server.kv[f"/snowfence/fake-check/marks/1/{wid}"].value)["reserved_until_ms"],
        lambda wid: server.delete_key(f"/snowfence/fake-check/workers/1/{wid}"),
        lapse,
    )
    assert direct == real
    assert membership(stores[0]) == real_membership
    recorded = orjson.loads(server.kv["/snowfence/fake-check/regions/1"].value)
    assert recorded == regions_recorded == {"first_node": "first"}
    # The census saw held and retired worker IDs; the node's entry went with its removal.
    states = {entry[2] for entry in real_membership if isinstance(entry[0], int)}
    assert states == {"held", "retired"}
    assert real_membership[-1] == ("nodes after removal", [], False)
    # The script reached what it is about: a refused extension, a lapsed lease.
    assert ("a extend after losing it", "LeaseLost") in real
    assert ("b refresh after its lease lapsed", "LeaseLost") in real
    assert ("c took a's worker ID", True, True, 5000) in real
