"""A fleet that finds itself, with real nodes and a real etcd: every node keeps
an entry in the cluster's membership, any broker answers NODES with the live
nodes, and brokers measure their clocks against every registered node without
a --peers list."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from nodes import FAST_LEASES, etcd_args, wait_for
from test_operations import get, health, metric

from snowfence import Client
from snowfence.errors import SnowfenceError

NODES_PREFIX = "/snowfence/test/nodes/"


def names(client_or_node) -> list[str]:
    with Client(client_or_node.endpoint, timeout_s=1.0, retries=0) as c:
        return [n["node"] for n in c.nodes()["nodes"]]


def test_every_node_registers_and_any_broker_lists_the_live_ones(nodes, etcd):
    made = [nodes.start(name, workers=1, args=etcd_args(etcd, "test", *FAST_LEASES)) for name in "abc"]
    for node in made:
        node.wait_ready()
    expected = sorted(n.endpoint for n in made)
    wait_for(lambda: all(sorted(names(n)) == expected for n in made), 15, what="each broker to see all three")
    with Client(made[0].endpoint, timeout_s=1.0) as c:
        # Entries are rewritten every renewal interval: wait for them to say the nodes serve.
        answer = wait_for(lambda: (lambda a: a if all(n["in_rotation"] for n in a["nodes"]) else None)(c.nodes()), 10)
    assert answer["cluster"] == "test"
    by_name = {n["node"]: n for n in answer["nodes"]}
    for node in made:
        entry = by_name[node.endpoint]
        assert entry["endpoints"] == [node.endpoint]
        assert entry["region"] == 0 and entry["in_rotation"] is True
        assert entry["worker_ids"] == sorted(node.all_worker_ids())  # its workers' and its broker's own
    assert len({n["layout_hash"] for n in answer["nodes"]}) == 1
    assert len({n["version"] for n in answer["nodes"]}) == 1
    assert len(etcd.get_prefix(NODES_PREFIX)) == 3

    a, b, c = made
    assert c.stop(signal.SIGTERM) == 0  # a clean stop removes its entry at once
    assert len(etcd.get_prefix(NODES_PREFIX)) == 2
    wait_for(lambda: sorted(names(a)) == sorted([a.endpoint, b.endpoint]), 10, what="a to forget c")
    b.kill()  # a dead node's entry lapses with its lease (4 s here)
    wait_for(lambda: names(a) == [a.endpoint], 15, what="b's entry to lapse")
    assert list(etcd.get_prefix(NODES_PREFIX)) == [NODES_PREFIX + a.endpoint.replace("/", "%2F").replace(":", "%3A")]


def test_an_embedded_node_answers_nodes_with_itself(nodes):
    node = nodes.start(workers=1)
    node.wait_ready()
    with Client(node.endpoint, timeout_s=1.0) as c:
        answer = c.nodes()
    assert answer["cluster"] is None
    [entry] = answer["nodes"]
    assert entry["endpoints"] == [node.endpoint] and entry["node"] == node.endpoint


def test_advertised_endpoints_are_what_others_are_told(nodes, etcd):
    node = nodes.start(
        workers=1,
        args=(*etcd_args(etcd, "test", *FAST_LEASES), "--advertise", "tcp://10.1.2.3:5555", "--node-name", "n1"),
    )
    node.wait_ready()
    with Client(node.endpoint, timeout_s=1.0) as c:
        [entry] = wait_for(lambda: c.nodes()["nodes"], 5)
    assert entry["node"] == "n1" and entry["endpoints"] == ["tcp://10.1.2.3:5555"]


def test_brokers_measure_every_registered_node_and_the_one_whose_clock_is_off_leaves_rotation(
    nodes, etcd, tmp_path, clockshim_library
):
    from clock import ClockTable

    skew = ClockTable(tmp_path / "c-clock", clockshim_library)
    skew.shift_all(+300)
    common = (*etcd_args(etcd, "test", *FAST_LEASES), "--max-peer-offset-ms", "100", "--metrics-bind", "127.0.0.1:0")
    made = {name: nodes.start(name, workers=1, args=common, env=skew.env() if name == "c" else None) for name in "abc"}
    a, c = made["a"], made["c"]
    addr_a, addr_c = health(a), health(c)
    # No --peers anywhere: each broker finds the others in the membership.
    wait_for(
        lambda: (lambda r: r if r[0] == 503 and "disagrees" in r[1] else None)(get(addr_c, "/readyz")),
        30,
        what="the skewed node to leave rotation",
    )
    for name in "ab":
        made[name].wait_ready()
    # A worker's state reaches STATUS a heartbeat before the broker's rotation does.
    wait_for(lambda: get(addr_a, "/readyz")[0] == 200 or None, 5, what="a in rotation")
    offset = wait_for(
        lambda: metric(addr_a, "snowfence_peer_clock_offset_seconds", f'peer="{c.endpoint}"') or None,
        10,
        what="a's offset to c",
    )
    assert 0.25 < offset < 0.35

    def cluster_rows():
        shown = subprocess.run(
            [sys.executable, "-m", "snowfence", "status", "--etcd", ",".join(etcd.endpoints), "--cluster", "test"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert shown.returncode == 0, shown.stderr
        assert "3 nodes" in shown.stdout
        return {line.split()[0]: line.split() for line in shown.stdout.splitlines() if line.startswith("ipc://")}

    # Entries are rewritten every renewal interval: the status catches up within a few.
    rows = wait_for(
        lambda: (lambda r: r if r[c.endpoint][2] == "no" and r[a.endpoint][2] == "yes" else None)(cluster_rows()), 10
    )
    offsets_a = dict(re.findall(r"(\S+) ([+-]\d+\.\d)", " ".join(rows[a.endpoint][4:])))
    assert 250 < float(offsets_a[c.endpoint]) < 350, rows[a.endpoint]  # about +300 ms
    skew.shift_all(0)
    wait_for(lambda: get(addr_c, "/readyz")[0] == 200, 30, what="the node to rejoin once its clock is back")
    skew.close()


def test_by_default_a_node_whose_clock_disagrees_claims_no_worker_id(nodes, etcd, tmp_path, clockshim_library):
    # Every claim counts on the clock-skew bound (the quarantine of a worker ID whose state
    # was lost, a mark an etcd restore took back), so with the defaults (1 s skew, 500 ms
    # to the peers) a node 900 ms off leaves rotation and claims no worker ID at all.
    from clock import ClockTable

    skew = ClockTable(tmp_path / "c-clock", clockshim_library)
    common = (
        *etcd_args(etcd, "test", *FAST_LEASES),
        *("--max-clock-skew-ms", "1000", "--worker-bits", "3", "--sequence-bits", "16", "--broker-mint-max-ids", "0"),
        *("--metrics-bind", "127.0.0.1:0"),
    )
    # Eight worker IDs: a holds four, b and e one each, c two; c's clock disagrees with
    # a majority of its peers (a and e) even once b has gone.
    a = nodes.start("a", workers=1, args=(*common, "--ids-per-worker", "4"))
    b = nodes.start("b", workers=1, args=common)
    e = nodes.start("e", workers=1, args=common)
    c = nodes.start("c", workers=2, args=common, env=skew.env())
    for node in (a, b, e, c):
        node.wait_ready(timeout_s=30)
    skew.shift_all(+900)
    wait_for(
        lambda: (lambda r: r if r[0] == 503 and "disagrees" in r[1] else None)(get(health(c), "/readyz")),
        30,
        what="the skewed node to leave rotation",
    )
    # b's worker ID loses its state: released, then its mark deleted (used, no mark: unknown).
    [lost] = [w["worker_id"] for w in b.status()["workers"]]
    b.stop()
    assert etcd.ctl("del", f"/snowfence/test/marks/0/{lost}").returncode == 0
    # One of c's workers dies; its successor claims nothing, neither the unknown worker ID
    # nor, once the dead one's lease lapses (4 s here), its own.
    victim = c.status()["workers"][0]
    os.kill(victim["pid"], signal.SIGKILL)
    vetoed = "claiming no worker ID until the clock is vouched for: clock disagrees with 2 of 2 peers"
    wait_for(
        lambda: any(vetoed in (w.get("reason") or "") for w in c.status()["workers"]),
        20,
        what="c's new worker to wait for its clock to be vouched for",
    )
    assert "claims_vetoed" in c.log()
    wait_for(
        lambda: f"/snowfence/test/workers/0/{victim['worker_id']}" not in etcd.get_prefix("/snowfence/test/workers/"),
        20,
        what="the dead worker's lease to lapse",
    )
    time.sleep(2)  # a claim would come within the back-off (at most 2 s here)
    held = etcd.get_prefix("/snowfence/test/workers/")
    assert f"/snowfence/test/workers/0/{lost}" not in held
    assert f"/snowfence/test/workers/0/{victim['worker_id']}" not in held
    # Its other worker let its worker ID go when the clock was refused: c holds none.
    assert c.all_worker_ids() == set() and c.ready_workers() == []
    # Once the clock agrees again, c claims at once, and the unknown worker ID is claimed
    # with its quarantine.
    skew.shift_all(0)
    wait_for(lambda: get(health(c), "/readyz")[0] == 200, 30, what="c to rejoin once its clock is back")
    wait_for(lambda: len(c.ready_workers()) == 2, 30, what="c's worker to claim once vouched for")
    d = nodes.start("d", workers=1, args=common)
    d.wait_ready(timeout_s=30)
    [got] = [w["worker_id"] for w in d.status()["workers"]] + [
        w["worker_id"] for w in c.status()["workers"] if w["worker_id"] == lost
    ]
    assert got == lost
    assert f"worker ID {lost}: it has no mark, but it was used; its claim mints nothing for 3000 ms" in (
        d.log() + c.log()
    )
    skew.close()


class Steady(threading.Thread):
    """One client, given one seed endpoint, reserving in a loop and keeping every ID."""

    def __init__(self, seed: str) -> None:
        super().__init__(daemon=True)
        self.client = Client(seed, timeout_s=1.0, retries=20)
        self.blocks: list = []
        self.errors: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self.blocks.extend(self.client.reserve(2000))
            except SnowfenceError as exc:
                self.errors.append(repr(exc))
            time.sleep(0.005)

    def stop(self) -> list[int]:
        self.halt.set()
        self.join(30)
        self.client.close()
        ids = [i for b in self.blocks for i in b]
        assert len(ids) == len(set(ids)), "an ID was issued twice"
        return ids


def served(node) -> int:
    """RESERVE requests a node's workers answered (STATUS and peers' TIME requests are not counted)."""
    return node.status()["broker"]["counters"]["replies"]


def test_a_client_given_one_node_rides_through_its_death_a_rolling_restart_and_uses_a_new_node(nodes, etcd):
    args = etcd_args(etcd, "test", *FAST_LEASES)
    a, b, c = (nodes.start(name, workers=1, args=args) for name in "abc")
    for node in (a, b, c):
        node.wait_ready()
    wait_for(lambda: len(names(a)) == 3, 15, what="a to see the cluster")
    load = Steady(a.endpoint)
    load.start()
    try:
        wait_for(lambda: len(load.client.endpoints) == 3, 15, what="the client to learn the cluster")
        a.kill()
        time.sleep(3)
        for node in (b, c):  # a rolling restart of the others
            assert node.stop(signal.SIGTERM) == 0
            node.start()
            node.wait_ready()
            time.sleep(1)
        d = nodes.start("d", workers=1, args=args)
        d.wait_ready()
        t0 = time.monotonic()
        wait_for(lambda: served(d) > 0, 15, what="the new node to get requests from the client")
        assert time.monotonic() - t0 < 10 + 2  # its entry takes a renewal interval to appear
        before = len(load.blocks)
        wait_for(lambda: len(load.blocks) > before, 10, what="more IDs after the new node joined")
    finally:
        ids = load.stop()
    assert load.errors == [], load.errors
    assert len(ids) > 100_000


def two_nodes_serving(nodes, etcd):
    """Nodes a and b of one cluster, one worker each, once a lists both in rotation."""
    args = etcd_args(etcd, "test", *FAST_LEASES)
    a, b = (nodes.start(name, workers=1, args=args) for name in "ab")
    for node in (a, b):
        node.wait_ready()
    with Client(a.endpoint, timeout_s=1.0) as c:
        wait_for(lambda: sum(n["in_rotation"] for n in c.nodes()["nodes"]) == 2, 15, what="a to see b serving")
    return a, b


def test_bench_given_one_node_spreads_its_clients_over_the_cluster(nodes, etcd):
    a, b = two_nodes_serving(nodes, etcd)
    before = {n.name: served(n) for n in (a, b)}
    run = subprocess.run(
        [sys.executable, "-m", "snowfence", "bench", "--connect", a.endpoint, "--duration", "1", "--warmup", "0.2",
         "--batch", "4096", "--clients", "2", "--depth", "2", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["check"]["unique"] and sum(result["errors"].values()) == 0
    assert all(served(n) - before[n.name] > 10 for n in (a, b)), (before, served(a), served(b))
    b_before = served(b)
    pinned = subprocess.run(
        [sys.executable, "-m", "snowfence", "bench", "--connect", a.endpoint, "--no-discover", "--duration", "0.5",
         "--warmup", "0.1", "--batch", "4096", "--clients", "2", "--depth", "2", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert pinned.returncode == 0, pinned.stderr
    assert served(b) == b_before  # with the list pinned nothing reaches b


def test_two_regions_on_two_etcd_clusters_need_nothing_of_each_other_and_a_shared_region_is_flagged(nodes, tmp_path):
    from etcdharness import EtcdCluster

    one = EtcdCluster(tmp_path / "etcd-r1", size=1).start()
    two = EtcdCluster(tmp_path / "etcd-r2", size=1).start()
    try:
        r1 = nodes.start("r1", workers=1, args=(*etcd_args(one, "r1", *FAST_LEASES), "--region", "1"))
        r2 = nodes.start("r2", workers=1, args=(*etcd_args(two, "r2", *FAST_LEASES), "--region", "2"))
        r1.wait_ready()
        r2.wait_ready()

        def status(*clusters):
            argv = [sys.executable, "-m", "snowfence", "status"]
            for cluster, name in clusters:
                argv += ["--etcd", ",".join(cluster.endpoints), "--cluster", name]
            return subprocess.run(argv, capture_output=True, text=True, timeout=30)

        fine = wait_for(lambda: (lambda p: p if "r2" in p.stdout and p.returncode == 0 else None)(
            status((one, "r1"), (two, "r2"))), 10)  # fmt: skip
        assert "no region number is used by two clusters" in fine.stdout
        # A mistyped cluster name is not a quiet cluster: it is named, and the exit status says so.
        typo = status((one, "r1"), (two, "r22"))
        assert typo.returncode == 1, typo.stdout
        assert "UNKNOWN: cluster 'r22' is unknown to etcd at" in typo.stdout and "--cluster right?" in typo.stdout
        # Region 1's etcd goes away for good: region 2 does not notice.
        one.stop()
        with r2.client() as c:
            deadline = time.monotonic() + 6  # past the fence window (2 s here) and a lease TTL
            while time.monotonic() < deadline:
                assert sum(b.count for b in c.reserve(4096)) == 4096
                time.sleep(0.1)
        assert all(w["state"] == "ready" for w in r2.status()["workers"])
        # A node of region 2's cluster configured with region 1's number: a conflict.
        one.start()
        wrong = nodes.start("wrong", workers=1, args=(*etcd_args(two, "r2", *FAST_LEASES), "--region", "1"))
        wrong.wait_ready()
        r1b = nodes.start("r1b", workers=1, args=(*etcd_args(one, "r1", *FAST_LEASES), "--region", "1"))
        r1b.wait_ready()
        clash = wait_for(lambda: (lambda p: p if p.returncode == 1 else None)(
            status((one, "r1"), (two, "r2"))), 10)  # fmt: skip
        assert "CONFLICT: region 1 is used by clusters r1, r2" in clash.stdout, clash.stdout
    finally:
        one.stop()
        two.stop()


def test_the_asyncio_client_discovers_too(nodes, etcd):
    import asyncio

    from snowfence import AsyncClient

    a, b = two_nodes_serving(nodes, etcd)

    async def main():
        async with AsyncClient(a.endpoint, timeout_s=1.0, retries=10) as client:
            ids = [i for b_ in await client.reserve(1000) for i in b_]
            ids += [i for b_ in await client.reserve(1000) for i in b_]  # the second call asks for the nodes
            assert sorted(client.endpoints) == sorted([a.endpoint, b.endpoint])
            a.kill()
            for _ in range(5):
                ids += [i for b_ in await client.reserve(1000) for i in b_]
            return ids

    ids = asyncio.run(main())
    assert len(ids) == 7000 == len(set(ids))


def test_a_malformed_membership_entry_in_etcd_changes_nothing(nodes, etcd):
    a = nodes.start("a", workers=1, args=etcd_args(etcd, "test", *FAST_LEASES))
    a.wait_ready()
    for key, value in (
        ("bad1", '{"node": "bad1", "endpoints": [42]}'),
        ("bad2", '{"node": "bad2", "endpoints": ["no-scheme"]}'),
        ("bad3", "not json"),
        ("bad4", '{"node": "bad4", "endpoints": "tcp://x:1"}'),
    ):
        p = etcd.ctl("put", NODES_PREFIX + key, value)
        assert p.returncode == 0, p.stderr
    time.sleep(3)  # a few membership rounds and peer updates
    with Client(a.endpoint, timeout_s=1.0, retries=0) as c:
        assert sum(b.count for b in c.reserve(5000)) == 5000
        listed = {n["node"] for n in c.nodes()["nodes"]}
    assert a.endpoint in listed and "bad3" not in listed
    assert a.proc.poll() is None and "Traceback" not in a.log()


def test_bench_against_a_server_that_does_not_answer_nodes_uses_the_endpoints_given(tmp_path):
    relay_script = Path(__file__).resolve().parents[2] / "benchmarks" / "relay.py"
    endpoint = f"ipc://{tmp_path}/relay.sock"
    relay_tmp = tmp_path / "relay-tmp"
    relay_tmp.mkdir()
    relay = subprocess.Popen([sys.executable, str(relay_script), "--bind", endpoint, "--workers", "1"],
                             start_new_session=True, env={**os.environ, "TMPDIR": str(relay_tmp)})  # fmt: skip
    try:
        # Bound before the bench starts: a client told the endpoint refuses connections says so.
        wait_for(lambda: (tmp_path / "relay.sock").exists(), 30, what="the relay to bind")
        run = subprocess.run(
            [sys.executable, "-m", "snowfence", "bench", "--connect", endpoint, "--duration", "0.5", "--warmup",
             "0.1", "--batch", "4096", "--clients", "1", "--depth", "2", "--json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        os.killpg(relay.pid, signal.SIGTERM)
        try:
            relay.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(relay.pid, signal.SIGKILL)
            relay.wait(10)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["ids_per_s"] > 0
    assert relay.returncode == 0 and list(relay_tmp.iterdir()) == [], "the relay cleaned up after itself"
