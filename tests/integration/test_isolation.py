"""Isolation on a shared node, with real processes: a noisy neighbour cannot make
another client wait behind its pipeline, two greedy clients share evenly, a
stopped worker is replaced, a hung minting loop gives up its worker ID, and the
default worker count follows the CPU affinity mask.

The scenarios are those of benchmarks/isolation.py, shorter; the figures are in
docs/BENCHMARKS.md. What is asserted here is behaviour with a wide margin (the
queue ahead of a newcomer is bounded), not speed.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from nodes import FAST_LEASES, etcd_args, wait_for
from test_operations import health, metric

from snowfence import Client, decode
from snowfence.errors import SnowfenceError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import isolation  # noqa: E402

CEILING_2_WORKERS = 2 * 4096 * 1000


def test_a_noisy_neighbour_keeping_1000_blocks_in_flight_barely_delays_another_client(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    r = isolation.noisy(node.endpoint, 2.0, "pipeline", depth=1000)
    # Before the queue was bounded in minting time this was 18 ms (16 blocks
    # queued at each worker); now at most about one block waits ahead.
    assert r["beside"]["calls"] > 100
    assert r["beside"]["p50_us"] < 6000, r


def test_a_neighbour_that_never_reads_its_replies_does_not_hold_the_node(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    r = isolation.noisy(node.endpoint, 2.0, "silent")
    assert r["beside"]["calls"] > 100
    assert r["beside"]["p50_us"] < 6000, r
    status = node.status()
    assert status["broker"]["counters"]["overloaded"] > 15_000  # beyond its in-flight limit, told to wait


def test_two_greedy_clients_get_even_shares_of_the_node(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    r = isolation.greedy(node.endpoint, 3.0, CEILING_2_WORKERS)
    assert r["errors"] == [0, 0] and r["overloaded"] == [0, 0]
    assert 0.4 <= r["shares"][0] <= 0.6, r
    # Together they keep the node busy; how close to the ceiling is the benchmark's
    # to say (99% on a quiet host), this machine's speed swings too much to assert it.
    assert r["of_ceiling"] >= 0.6, r


class Reserver(threading.Thread):
    """Reserves blocks in a loop, keeping every ID it gets, until stopped."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(daemon=True)
        self.endpoint = endpoint
        self.blocks = []
        self.errors = 0
        self.halt = threading.Event()

    def run(self) -> None:
        with Client(self.endpoint, timeout_s=1.0, retries=10) as client:
            while not self.halt.is_set():
                try:
                    self.blocks.extend(client.reserve(5000))
                except SnowfenceError:
                    self.errors += 1
                time.sleep(0.01)

    def stop(self) -> list:
        self.halt.set()
        self.join(20)
        ids = [i for b in self.blocks for i in b]
        assert len(ids) == len(set(ids)), "an ID was issued twice"
        return ids


def slot_pids(node) -> dict[int, int]:
    return {s["slot"]: s["pid"] for s in node.status()["broker"]["slots"]}


def test_a_stopped_worker_is_killed_and_its_slot_restarted_with_ids_unique_throughout(nodes):
    # Scaled down from the default 30 s so the test takes seconds; the rule is the same.
    node = nodes.start(workers=2, args=("--worker-kill-after-s", "5", "--metrics-bind", "127.0.0.1:0"))
    node.wait_ready()
    addr = health(node)
    before = slot_pids(node)
    load = Reserver(node.endpoint)
    load.start()
    stopped = before[0]
    os.kill(stopped, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        wait_for(lambda: slot_pids(node)[0] not in (stopped, None), 20, what="a new pid in slot 0")
        node.wait_ready(2, timeout_s=20)
    finally:
        try:
            os.kill(stopped, signal.SIGCONT)
        except ProcessLookupError:
            pass
    replaced_s = time.monotonic() - t0
    time.sleep(0.5)
    ids = load.stop()
    assert ids and replaced_s < 25
    slots = {s["slot"]: s for s in node.status()["broker"]["slots"]}
    assert slots[0]["kills"] == 1 and slots[1]["kills"] == 0
    assert "worker_killed" in node.log() or "killing it" in node.log()
    wait_for(lambda: metric(addr, "snowfence_worker_kills_total") == 1.0, 5, what="the kill counted")
    shown = subprocess.run(
        [sys.executable, "-m", "snowfence", "status", "--connect", node.endpoint],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert shown.returncode == 0 and "1 killed for silence" in shown.stdout, shown
    with pytest.raises(ProcessLookupError):
        os.kill(stopped, 0)


def lock_is_free(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # let go at once: only looking
    return True


def test_a_hung_minting_loop_lets_go_of_its_file_lock_and_is_then_replaced(nodes):
    node = nodes.start(
        workers=1,
        args=("--loop-stall-s", "2", "--worker-kill-after-s", "10"),
        env={"SNOWFENCE_FAULT_HOOKS": "1"},
    )
    [worker] = node.wait_ready()
    wid, pid = worker["worker_id"], worker["pid"]
    with node.client() as c:
        before = [i for b in c.reserve(10_000) for i in b]
    lock = next(node.state_dir.rglob(f"worker-{wid}.lock"))
    assert not lock_is_free(lock)
    os.kill(pid, signal.SIGUSR1)  # the loop hangs; the keep-alive thread runs on
    t0 = time.monotonic()
    wait_for(lambda: lock_is_free(lock), 8, what="the hung worker to let go of its lock")
    freed_s = time.monotonic() - t0
    os.kill(pid, 0)  # still alive: it let go from the inside, not by dying
    assert freed_s < 8
    # Then the supervisor finds it silent, kills it, and the slot serves again.
    wait_for(lambda: slot_pids(node).get(0) not in (pid, None), 25, what="the hung worker replaced")
    [worker] = node.wait_ready(1, timeout_s=20)
    with node.client() as c:
        after = [i for b in c.reserve(10_000) for i in b]
    assert not set(before) & set(after)
    same = [i for i in after if decode(i).worker == wid]
    assert not same or min(same) > max(before)


def test_a_hung_minting_loop_stops_renewing_so_its_etcd_lease_lapses(nodes, etcd):
    node = nodes.start(
        workers=1,
        args=(*etcd_args(etcd, "test", *FAST_LEASES), "--loop-stall-s", "1.5", "--worker-kill-after-s", "30"),
        env={"SNOWFENCE_FAULT_HOOKS": "1"},
    )
    [worker] = node.wait_ready()
    wid, pid = worker["worker_id"], worker["pid"]
    key = f"/snowfence/test/workers/0/{wid}"
    assert key in etcd.get_prefix("/snowfence/test/workers/0/")
    os.kill(pid, signal.SIGUSR1)
    # Stall bound + one renewal interval + the lease TTL (4 s here), with margin.
    wait_for(lambda: key not in etcd.get_prefix("/snowfence/test/workers/0/"), 15, what="the lease to lapse")
    os.kill(pid, 0)  # the worker was not killed for it: its lease lapsed


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset (util-linux) is not installed")
def test_one_worker_per_cpu_means_the_cpus_this_process_may_use(nodes):
    node = nodes.start(workers=0, prefix=("taskset", "-c", "0"))
    node.wait_ready(1)
    assert len(node.status()["broker"]["slots"]) == 1
