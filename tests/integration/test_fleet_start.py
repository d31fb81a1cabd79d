"""A fleet started at once on a healthy three-member etcd, under CPU load: nothing looks restored.

A node's processes (its broker and its workers, each worker with a keeper per
worker ID) share one journal of what they saw etcd hold, and record revisions
while the others' reads are on their way. A read is compared only with what its
process knew before sending it (see ``workers/journal.py``): a healthy etcd
never looks restored, however the reads and writes of a node interleave.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import leftovers
from nodes import FAST_LEASES, etcd_args, wait_for

#: Sized for a small machine: 6 nodes x 2 workers x 8 worker IDs (and each broker's own), 102
#: of the default layout's 128 worker IDs, 18 processes recording into 6 journals.
NODES, WORKERS, IDS_PER_WORKER = 6, 2, 8
#: How long every worker ID of the fleet may take to come up, under the load.
READY_WITHIN_S = 45.0


@contextlib.contextmanager
def cpu_load(seconds: float):
    """A busy loop per core for the duration, each ending by itself after ``seconds`` at the latest."""
    code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
    burners = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(os.cpu_count() or 1)]
    for burner in burners:
        leftovers.register_process(burner.pid, what="CPU load")
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait(10)


def test_a_fleet_started_at_once_under_cpu_load_never_looks_restored(nodes, etcd3):
    args = (*etcd_args(etcd3, "fleet", *FAST_LEASES), "--ids-per-worker", str(IDS_PER_WORKER))
    with cpu_load(READY_WITHIN_S + 5):
        deadline = time.monotonic() + READY_WITHIN_S
        fleet = [nodes.start(f"n{i}", workers=WORKERS, args=args) for i in range(NODES)]

        def never_restored() -> None:
            for node in fleet:
                log = node.log()
                assert "store_went_back" not in log and "went back" not in log, f"{node.name}:\n{node.log_tail()}"

        def all_up() -> bool:
            never_restored()  # a refusal fails the test at once: only an operator would lift it
            return all(len(node.ready_workers()) == WORKERS * IDS_PER_WORKER for node in fleet)

        wait_for(all_up, READY_WITHIN_S, interval_s=0.2, what="every worker ID of the fleet to be ready")
        for node in fleet:
            node.wait_ready(WORKERS * IDS_PER_WORKER, timeout_s=max(0.1, deadline - time.monotonic()))
        statuses = [node.status() for node in fleet]
    never_restored()
    for status in statuses:
        assert not [w for w in status["workers"] if w.get("store_problem")], status["workers"]
    held = [node.all_worker_ids() for node in fleet]
    assert all(len(h) >= WORKERS * IDS_PER_WORKER for h in held)
    assert sum(len(h) for h in held) == len(set().union(*held)), "a worker ID held by two nodes"
    assert etcd3.healthy()
