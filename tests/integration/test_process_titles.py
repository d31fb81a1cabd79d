"""ps names a node's processes by role and endpoint, not `python3 -m snowfence.workers.main`."""

from __future__ import annotations

from nodes import wait_for


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode().strip()


def test_broker_and_workers_are_titled_by_role_and_endpoint(nodes):
    node = nodes.start(workers=2, bind="tcp://127.0.0.1:0")
    endpoint = node.wait_bound()
    node.wait_ready()
    assert _cmdline(node.proc.pid) == f"snowfence: broker {endpoint}"
    workers = wait_for(lambda: len(node.status()["workers"]) == 2 and node.status()["workers"], 10, what="workers")
    titles = sorted(_cmdline(w["pid"]) for w in workers)
    assert titles == [f"snowfence: worker 0 of {endpoint}", f"snowfence: worker 1 of {endpoint}"], titles
    # The short name (/proc/PID/comm) has no spaces: /proc/PID/stat is still split by spaces.
    for pid in (node.proc.pid, *(w["pid"] for w in workers)):
        with open(f"/proc/{pid}/comm") as f:
            assert " " not in f.read().strip()
        with open(f"/proc/{pid}/stat") as f:
            assert f.read().split()[2] in "RSD", pid
