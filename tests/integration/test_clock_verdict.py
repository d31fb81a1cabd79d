"""The clock verdict comes before the first claim, with real nodes, a real etcd and real
clock offsets (the clock shim): a node claims nothing until a majority of the cluster's
members answered it and vouched for its clock; one whose clock no majority vouches for
is refused by name, leaves rotation and lets its worker IDs go. Two nodes whose clocks
disagree past the bound are both refused: nobody can tell which clock is wrong."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from clock import ClockTable
from nodes import FAST_LEASES, etcd_args, wait_for
from test_operations import get, health, metric

from snowfence.errors import SnowfenceError

WORKERS_PREFIX = "/snowfence/test/workers/"


def common(etcd) -> tuple:
    # The default bounds: clocks within 1 s, a node within 500 ms of a majority of its peers.
    return (*etcd_args(etcd, "test", *FAST_LEASES), "--max-clock-skew-ms", "1000", "--metrics-bind", "127.0.0.1:0")


def verdict(node) -> dict:
    return node.status()["broker"]["clock"]


def status_json(node) -> dict:
    shown = subprocess.run(
        [sys.executable, "-m", "snowfence", "status", "--connect", node.endpoint, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def claimed(node) -> list[str]:
    return re.findall(r"claimed worker ID \d+", node.log())


def test_a_node_10_s_behind_joining_a_healthy_cluster_claims_nothing_and_is_refused_by_name(
    nodes, etcd, tmp_path, clockshim_library
):
    a = nodes.start("a", workers=1, args=common(etcd))
    b = nodes.start("b", workers=1, args=common(etcd))
    for node in (a, b):
        node.wait_ready(timeout_s=30)
    wait_for(lambda: all(verdict(n)["state"] == "vouched" for n in (a, b)), 15, what="a and b to vouch for each other")
    skew = ClockTable(tmp_path / "c-clock", clockshim_library)
    skew.shift_all(-10_000)
    c = nodes.start("c", workers=2, args=common(etcd), env=skew.env())
    got = wait_for(
        lambda: (lambda v: v if v["state"] == "vetoed" else None)(verdict(c)), 20, what="c's clock to be vetoed"
    )
    assert got["refusal"].startswith("clock disagrees with 2 of 2 peers by more than 500 ms")
    ahead_ms = float(re.search(r": \+(\d+\.\d) ms\)$", got["refusal"]).group(1))
    assert 9_500 < ahead_ms < 10_500  # the worst peer, about 10 s ahead, named
    assert (got["members"], got["answered"], got["vouching"]) == (2, 2, 0)
    # Refused by name: the log, the metrics, STATUS (and so status --json), readiness.
    assert "leaving rotation, claiming no worker ID and letting those held go: clock disagrees" in c.log()
    addr = health(c)
    wait_for(lambda: metric(addr, "snowfence_clock_verdict", 'verdict="vetoed"') == 1, 5, what="the metrics snapshot")
    assert metric(addr, "snowfence_clock_verdict", 'verdict="vouched"') == 0
    assert status_json(c)["broker"]["clock"]["state"] == "vetoed"
    code, why = get(addr, "/readyz")
    assert code == 503 and "clock disagrees with 2 of 2 peers" in why
    # It claimed nothing, not even before its verdict: its workers and its broker's own
    # worker ID wait for the clock to be vouched for, and say so.
    wait_for(
        lambda: all("until the clock is vouched for" in (w.get("reason") or "") for w in c.status()["workers"]),
        10,
        what="c's workers to say why they claim nothing",
    )
    assert claimed(c) == [] and c.all_worker_ids() == set()
    assert len(etcd.get_prefix(WORKERS_PREFIX)) == len(a.all_worker_ids() | b.all_worker_ids())
    with pytest.raises(SnowfenceError), c.client(retries=0, timeout_s=1.0) as client:
        client.reserve(1)
    # The healthy nodes keep serving, their clocks vouched for.
    for node in (a, b):
        assert verdict(node)["state"] == "vouched"
        with node.client() as client:
            assert sum(len(block) for block in client.reserve(10)) == 10
    skew.close()


def test_two_nodes_whose_clocks_disagree_past_the_bound_both_stop_and_say_why(nodes, etcd, tmp_path, clockshim_library):
    # Nobody can tell which of two clocks is wrong: neither keeps minting. Each leaves
    # rotation, lets its worker IDs go and names why; when one of them stops, the other
    # is alone again (not judged) and serves.
    a = nodes.start("a", workers=1, args=common(etcd))
    a.wait_ready(timeout_s=30)
    assert verdict(a)["state"] == "alone"
    assert "clock_alone" in a.log() and "no other member is registered" in a.log()
    held_before = a.all_worker_ids()
    assert held_before
    skew = ClockTable(tmp_path / "b-clock", clockshim_library)
    skew.shift_all(-900)
    b = nodes.start("b", workers=1, args=common(etcd), env=skew.env())
    for node in (a, b):
        got = wait_for(
            lambda node=node: (lambda v: v if v["state"] == "vetoed" else None)(verdict(node)),
            20,
            what=f"{node.name}'s clock to be refused",
        )
        assert got["refusal"].endswith("no majority of the cluster vouches for this clock (nor for the others)")
        assert "claims_vetoed" in node.log()
    # a let its worker IDs go, and b never claimed one: nothing is minted on either clock.
    wait_for(lambda: a.all_worker_ids() == set(), 10, what="a to let its worker IDs go")
    assert "clock_let_go" in a.log()
    wait_for(lambda: etcd.get_prefix(WORKERS_PREFIX) == {}, 10, what="no worker ID held in the cluster")
    assert claimed(b) == []
    for node in (a, b):
        wait_for(lambda node=node: get(health(node), "/readyz")[0] == 503, 5, what=f"{node.name} not ready")
        with pytest.raises(SnowfenceError), node.client(retries=0, timeout_s=1.0) as client:
            client.reserve(1)
    wait_for(lambda: metric(health(a), "snowfence_clock_releases_total") >= 1, 5, what="the releases counted")
    # The way out: stop one of them (or set its clock right). a is alone again and serves.
    assert b.stop() == 0
    wait_for(lambda: verdict(a)["state"] == "alone", 15, what="a to be alone once b's entry is gone")
    a.wait_ready(timeout_s=30)
    with a.client() as client:
        assert sum(len(block) for block in client.reserve(10)) == 10
    skew.close()
