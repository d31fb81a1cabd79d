"""`snowfence status` tells the truth about a real node: the broker's own worker ID and its
doors' ports in the table, one reason per worker ID, --connect over SNOWFENCE_ETCD in the
environment; and `status --etcd` of a cluster etcd does not know says so, non-zero."""

from __future__ import annotations

import os
import subprocess
import sys

from nodes import own_settled, wait_for


def snowfence(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snowfence", *args], capture_output=True, text=True, timeout=30, env=env
    )


def test_the_node_s_table_has_its_own_worker_id_its_ports_and_a_reason_per_worker_id(nodes):
    node = nodes.start(workers=1, bind="tcp://127.0.0.1:0", args=("--ids-per-worker", "3"))
    node.wait_bound()
    node.wait_ready()
    status = wait_for(lambda: (lambda s: s if own_settled(s) else None)(node.status()), 15, what="own worker ID")
    broker = status["broker"]
    own_id = broker["own_worker_id"]["held"][0]["worker_id"]
    # The Kubernetes manifest sets SNOWFENCE_ETCD in every pod: --connect still asks the node.
    env = {**os.environ, "SNOWFENCE_ETCD": "http://127.0.0.1:9", "SNOWFENCE_CLUSTER": "test"}
    p = snowfence("status", "--connect", node.endpoint, env=env)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert f"fast port {broker['fast_port']['port']}, HTTP port {broker['http_port']['port']}" in lines, p.stdout
    rows = [line.split() for line in lines if line.split()[:1] in (["0"], ["own"])]
    ids = [w["worker_id"] for w in status["workers"]]
    assert len(ids) == 3
    for worker_id in ids:
        (row,) = [r for r in rows if r[0] == "0" and r[2] == str(worker_id)]
        assert " ".join(row).endswith(f"holding worker ID {worker_id}"), p.stdout
    (own,) = [r for r in rows if r[0] == "own"]
    assert own[1] == str(broker["pid"]) and own[2] == str(own_id), p.stdout


def test_status_of_a_cluster_etcd_does_not_know_says_so_and_fails(etcd):
    p = snowfence("status", "--etcd", ",".join(etcd.endpoints), "--cluster", "nosuch")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "cluster 'nosuch' is unknown to etcd" in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert p.stdout == ""
