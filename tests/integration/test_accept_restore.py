"""accept-restore on etcd: a dry run writes nothing; a store that shows no sign of going back needs --force."""

from __future__ import annotations

import subprocess
import sys

import orjson
from nodes import FAST_LEASES, etcd_args, wait_for


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snowfence", *args], capture_output=True, text=True, timeout=60)


def test_etcd_dry_run_and_a_healthy_store_refused_without_force(etcd):
    common = ("accept-restore", "--reason", "restored on purpose", *etcd_args(etcd, "healthy"))
    p = cli(*common, "--dry-run")
    assert p.returncode == 0 and "dry run" in p.stdout and "layout record is gone" in p.stdout, p.stdout + p.stderr
    assert not etcd.ctl("get", "--prefix", "/snowfence/healthy/", "--keys-only").stdout.strip()

    assert cli(*common).returncode == 0  # no layout record: accepted
    layout = etcd.ctl("get", "--prefix", "/snowfence/healthy/").stdout

    p = cli(*common)
    assert p.returncode == 78, p.stdout + p.stderr
    assert "no sign of going back" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    p = cli(*common, "--dry-run")
    assert p.returncode == 0 and "shows no sign of going back" in p.stdout, p.stdout + p.stderr
    assert etcd.ctl("get", "--prefix", "/snowfence/healthy/").stdout == layout

    p = cli(*common, "--force")
    assert p.returncode == 0 and "accepted restore" in p.stdout, p.stdout + p.stderr
    assert etcd.ctl("get", "--prefix", "/snowfence/healthy/").stdout != layout


def test_a_node_that_takes_only_curve_clients_is_heard_refusing_through_its_etcd_entry(nodes, etcd, tmp_path):
    # accept-restore asks whether live nodes refuse the store; a node with CURVE on does not
    # answer a command without a key, so the refusal travels in its membership entry.
    keys = tmp_path / "keys"
    assert cli("keygen", "server", "--dir", str(keys)).returncode == 0
    (tmp_path / "allow").mkdir()
    curve = ("--curve-secret-key", str(keys / "server.key_secret"), "--curve-allow", str(tmp_path / "allow"))
    common = etcd_args(etcd, "curved", *FAST_LEASES)
    node = nodes.start("a", workers=1, args=(*common, *curve, "--node-name", "a"))
    prefix = "/snowfence/curved/"
    # The node's STATUS takes CURVE clients only: look in etcd.
    wait_for(lambda: etcd.get_prefix(prefix + "workers/"), 30, what="a worker ID held")
    layout = etcd.get_prefix(prefix + "layout")[prefix + "layout"]
    assert etcd.ctl("del", "--prefix", prefix).returncode == 0

    def refusing():
        entry = etcd.get_prefix(prefix + "nodes/").get(prefix + "nodes/a")
        return entry and orjson.loads(entry).get("store_problem")

    wait_for(refusing, 30, interval_s=0.5, what="the node to refuse the emptied store, in its entry")
    # The layout record put back: nothing in etcd itself shows that the store went back.
    assert etcd.ctl("put", prefix + "layout", layout).returncode == 0
    p = cli("accept-restore", "--reason", "checking", "--dry-run", *common)
    assert p.returncode == 0 and "went back (node a refuses it:" in p.stdout, p.stdout + p.stderr
    assert node.group_alive()
