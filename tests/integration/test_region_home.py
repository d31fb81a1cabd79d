"""One region, one home, per host: real `snowfence serve` processes.

Two embedded nodes on one host with different state directories, in one region, used to
lease the same worker IDs from two stores and issue millions of IDs twice in silence
(the default state directory is per user: two users each running ``snowfence serve``
were enough). Now the second is refused before it binds or creates anything, naming the
directory and the process that hold the region; nodes that share one directory, and
nodes of other regions, run on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import orjson
import pytest

from snowfence import Client
from snowfence.errors import StoreConflict

#: Four worker IDs per region: two homes in one region would certainly share some.
SMALL = ("--worker-bits", "2", "--time-bits", "46")


def refused(node, timeout_s: float = 20.0) -> str:
    """The one line a refused node printed; asserts it exited 78 having served nothing."""
    status = node.proc.wait(timeout_s)
    log = node.log()
    assert status == 78, f"exit status {status}; log:\n{log}"
    assert "serving on" not in log, log
    return log.strip().splitlines()[-1]


def test_a_second_home_of_a_region_on_one_host_is_refused_by_name(nodes, tmp_path):
    a = nodes.start("a", workers=1, state_dir=tmp_path / "A", args=SMALL)
    a.wait_ready()
    b = nodes.start("b", workers=1, state_dir=tmp_path / "B", args=SMALL)
    line = refused(b)
    assert "region 0 is already served on this host" in line, line
    # The directory by its path (cut from the front where the socket name has no room for it).
    assert f"{tmp_path.name}/A (pid {a.pid})" in line, line
    assert "--state-dir" in line and "--region N" in line, line
    assert not (tmp_path / "B").exists(), "the refused node made its state directory"
    # The node that holds the region serves on.
    with a.client() as c:
        assert sum(block.count for block in c.reserve(10_000)) == 10_000


def test_nodes_sharing_a_directory_and_nodes_of_other_regions_run_on(nodes, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    a = nodes.start("a", workers=1, state_dir=shared, args=SMALL)
    # Another path to the same directory is the same home.
    alias = tmp_path / "alias"
    alias.symlink_to(shared)
    b = nodes.start("b", workers=1, state_dir=alias, args=SMALL)
    other = nodes.start("other", workers=1, state_dir=tmp_path / "other", args=(*SMALL, "--region", "1"))
    for node in (a, b, other):
        node.wait_ready()
    seen = set()
    for node in (a, b, other):
        with node.client() as c:
            for block in c.reserve(5_000):
                ids = set(range(block.first, block.first + block.count))
                assert not ids & seen
                seen |= ids


def test_a_region_is_free_again_once_its_home_stops(nodes, tmp_path):
    a = nodes.start("a", workers=1, state_dir=tmp_path / "A", args=SMALL)
    a.wait_ready()
    a.kill()  # SIGKILL: the kernel lets the name go with the process
    b = nodes.start("b", workers=1, state_dir=tmp_path / "B", args=SMALL)
    b.wait_ready()


def test_a_directory_made_again_under_a_live_node_is_another_home(nodes, tmp_path):
    state = tmp_path / "state"
    a = nodes.start("a", workers=1, state_dir=state, args=SMALL)
    a.wait_ready()
    state.rename(tmp_path / "state.removed")
    state.mkdir()
    c = nodes.start("c", workers=1, state_dir=state, args=SMALL)
    line = refused(c)
    assert "already served on this host from state directory" in line and f"pid {a.pid}" in line, line


def test_check_config_refuses_a_second_home_too(nodes, tmp_path):
    a = nodes.start("a", workers=1, state_dir=tmp_path / "A")
    a.wait_ready()
    p = subprocess.run(
        [sys.executable, "-m", "snowfence", "check-config", "--state-dir", str(tmp_path / "B")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 78, p.stdout + p.stderr
    assert "region 0 is already served on this host" in p.stderr, p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "snowfence", "check-config", "--state-dir", str(tmp_path / "B"), "--region", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stdout + p.stderr


def two_homes_out_of_each_others_sight(nodes, tmp_path):
    """Two embedded nodes of region 0 on two state directories, each in a network namespace
    of its own (as on two hosts): no host-local guard sees the other."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces of their own (unshare -n) need root")
    a = nodes.start("a", workers=1, state_dir=tmp_path / "A", args=SMALL, prefix=("unshare", "-n"))
    b = nodes.start("b", workers=1, state_dir=tmp_path / "B", args=SMALL, prefix=("unshare", "-n"))
    a.wait_ready()
    b.wait_ready()
    return a, b


def test_status_over_several_nodes_names_two_stores_of_one_region(nodes, tmp_path):
    a, b = two_homes_out_of_each_others_sight(nodes, tmp_path)
    p = subprocess.run(
        [sys.executable, "-m", "snowfence", "status", "--connect", f"{a.endpoint},{b.endpoint}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"CONFLICT: region 0 is answered from two stores, {a.endpoint}" in p.stdout, p.stdout
    stores = {a.status()["broker"]["store_id"], b.status()["broker"]["store_id"]}
    assert len(stores) == 2 and None not in stores
    p = subprocess.run(
        [sys.executable, "-m", "snowfence", "status", "--connect", f"{a.endpoint},{a.endpoint}", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0 and orjson.loads(p.stdout)["conflicts"] == [], p.stdout + p.stderr


def test_a_client_that_hears_two_stores_for_one_region_stops_with_a_typed_error(nodes, tmp_path):
    a, b = two_homes_out_of_each_others_sight(nodes, tmp_path)
    with Client([a.endpoint, b.endpoint], timeout_s=0.5, retries=2) as client:
        for _ in range(3):  # the first call is answered before the client asks who answers
            client.reserve(10)
        first = client.endpoint
        stopped = a if first == a.endpoint else b
        os.killpg(stopped.pgid, signal.SIGSTOP)  # the client moves on to the other node
        try:
            with pytest.raises(StoreConflict) as caught:
                for _ in range(20):
                    client.reserve(10)
        finally:
            os.killpg(stopped.pgid, signal.SIGCONT)
        assert caught.value.code == "store_conflict" and not caught.value.retriable
        assert a.endpoint in str(caught.value) and b.endpoint in str(caught.value)
        with pytest.raises(StoreConflict):  # and it stays stopped
            client.reserve(10)
