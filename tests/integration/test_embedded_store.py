"""The embedded store under an adversary: real `snowfence serve` processes on one
state directory that is tampered with, raced on, or whose disk fails.

Each scenario once issued IDs twice or below a worker ID's earlier IDs; each test
fails if it does so again.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from checks import check_blocks, repeated_ids
from disk import NFS_MAGIC, Tmpfs, build_fsshim, is_root, shim_env
from nodes import FAST_LEASES, TWO_HOPS, wait_for

from snowfence.errors import SnowfenceError
from snowfence.ids import DEFAULT_LAYOUT, Layout

SMALL = Layout(time_bits=41, region_bits=3, worker_bits=1, sequence_bits=18)
SMALL_ARGS = ("--worker-bits", "1", "--sequence-bits", "18")


@pytest.fixture(scope="module")
def fsshim(tmp_path_factory):
    return build_fsshim(tmp_path_factory.mktemp("fsshim"))


class Load:
    """Client threads that reserve from one node until stopped, keeping every block."""

    def __init__(self, node, threads: int = 1, n: int = 2000) -> None:
        self.node, self.n = node, n
        self.blocks: list[list[tuple[int, int]]] = [[] for _ in range(threads)]
        self.errors = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]
        for t in self._threads:
            t.start()

    def _run(self, i: int) -> None:
        out = self.blocks[i]
        with self.node.client(timeout_s=0.5, retries=0) as c:
            while not self._stop.is_set():
                try:
                    out.extend((b.first, b.count) for b in c.reserve(self.n))
                except SnowfenceError:
                    self.errors += 1
                    time.sleep(0.01)

    def stop(self) -> list[list[tuple[int, int]]]:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        return self.blocks

    def ids(self) -> int:
        return sum(c for client in self.blocks for _, c in client)


def worker_ids_of(blocks, layout=DEFAULT_LAYOUT) -> set[int]:
    return {layout.decompose(f).worker for client in blocks for f, _ in client}


def highest_by_worker(blocks, layout=DEFAULT_LAYOUT) -> dict[int, int]:
    out: dict[int, int] = {}
    for client in blocks:
        for f, c in client:
            w = layout.decompose(f).worker
            out[w] = max(out.get(w, -1), f + c - 1)
    return out


def lowest_by_worker(blocks, layout=DEFAULT_LAYOUT) -> dict[int, int]:
    out: dict[int, int] = {}
    for client in blocks:
        for f, _ in client:
            w = layout.decompose(f).worker
            out[w] = min(out.get(w, 1 << 63), f)
    return out


def serving(node) -> int:
    """How many workers of ``node`` are in rotation; 0 if it does not answer."""
    try:
        return len(node.ready_workers())
    except (SnowfenceError, OSError):
        return 0


def passed_over(node) -> dict[int, str]:
    out = {}
    for w in node.status()["workers"]:
        for p in w.get("passed_over") or ():
            out[p["worker_id"]] = p["reason"]
    return out


def test_lock_files_removed_under_a_running_node_never_give_one_worker_id_to_two_nodes(nodes):
    args = (*SMALL_ARGS, *FAST_LEASES, *TWO_HOPS)  # the two worker IDs are the workers' alone
    a = nodes.start("a", workers=2, args=args)
    a.wait_ready()
    load_a = Load(a)
    region = a.state_dir / "regions" / "0"
    for lock in region.glob("*.lock"):
        lock.unlink()  # a cleanup job, a tmpfiles rule
    b = nodes.start("b", workers=1, state_dir=a.state_dir, args=args)
    load_b = Load(b)
    # The second node claims a worker ID (and waits out its mark) or finds both held
    # again; either way both nodes are loaded for a while after.
    wait_for(
        lambda: "claimed worker ID" in b.log() or "cannot claim a worker ID" in b.log(), 15, what="b to try a claim"
    )
    if "claimed worker ID" in b.log():
        wait_for(lambda: serving(b), 10, what=f"b to serve; log:\n{b.log_tail()}")
    time.sleep(2.0)
    blocks = load_a.stop() + load_b.stop()
    assert load_a.ids() > 10_000, a.log_tail()
    assert repeated_ids(blocks) == 0, f"{repeated_ids(blocks)} IDs issued twice"
    check_blocks(blocks, SMALL)  # no ID twice: each worker ID served by one node at a time
    log = a.log()
    assert "lease_exclusivity_lost" in log and "claiming a worker ID again" in log, a.log_tail()
    assert sum(w["counters"].get("leases_lost", 0) for w in a.status()["workers"]) >= 1
    # Service continues: the worker IDs are held again, each by one node.
    wait_for(lambda: serving(a) + serving(b) == 2, 15, what="both worker IDs in service")


@pytest.mark.parametrize("how", ["deleted", "rolled_back"])
def test_a_worker_id_whose_mark_is_missing_or_stale_is_passed_over_not_reused_below_its_ids(nodes, clock, how):
    first = nodes.start("a", workers=2, env=clock.env())
    first.wait_ready()
    region = first.state_dir / "regions" / "0"
    saved = region.parent / "saved"
    if how == "rolled_back":
        # An older copy of the marks (a backup, a snapshot) that will be put back.
        assert first.stop() == 0
        saved.mkdir()
        for mark in region.glob("*.mark"):
            shutil.copy(mark, saved / mark.name)
        first = nodes.start("a", workers=2, state_dir=first.state_dir, env=clock.env())
        first.wait_ready()
    with first.client() as c:
        before = [[(b.first, b.count) for _ in range(30) for b in c.reserve(4000)]]
    used = worker_ids_of(before)
    first.kill()  # a crash: no release
    if how == "deleted":
        for mark in region.glob("*.mark"):
            mark.unlink()
    else:
        for copy in saved.iterdir():
            shutil.copy(copy, region / copy.name)
    clock.shift_all(-4_000)
    again = nodes.start("a", workers=2, state_dir=first.state_dir, env=clock.env())
    again.wait_ready(timeout_s=20)
    with again.client() as c:
        after = [[(b.first, b.count) for _ in range(30) for b in c.reserve(4000)]]
    assert repeated_ids(before + after) == 0, f"{repeated_ids(before + after)} IDs issued twice"
    check_blocks(before + after)
    high, low = highest_by_worker(before), lowest_by_worker(after)
    below = {w: (low[w], high[w]) for w in low if w in high and low[w] <= high[w]}
    assert not below, f"worker IDs minted below their earlier IDs: {below}"
    skipped = passed_over(again)
    assert used <= set(skipped), (skipped, again.log_tail())
    reason = "without a mark" if how == "deleted" else "below token"
    assert all(reason in skipped[w] for w in used), skipped
    assert "worker_id_passed_over" in again.log()
    shown = subprocess.run(
        [sys.executable, "-m", "snowfence", "status", "--connect", again.endpoint],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert shown.returncode == 0, shown.stderr
    for w in used:
        assert f"passed over worker ID {w}: " in shown.stdout and reason in shown.stdout, shown.stdout


def test_two_nodes_starting_at_once_with_different_layouts_cannot_both_serve(nodes, fsshim, tmp_path):
    # A slow disk widens the moment between reading "no layout yet" and recording one.
    env = shim_env(fsshim, fsync_ms=400)
    state = tmp_path / "shared-state"
    a = nodes.new("a", workers=1, state_dir=state, env=env)
    b = nodes.new("b", workers=1, state_dir=state, env=env, args=("--worker-bits", "6", "--sequence-bits", "13"))
    a.start()
    b.start()
    exits: dict[str, int] = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not exits and not (serving(a) and serving(b)):
        exits = {n.name: n.proc.returncode for n in (a, b) if n.proc.poll() is not None}
        time.sleep(0.1)
    assert not (serving(a) and serving(b)), "two layouts serve from one state directory"
    assert list(exits.values()) == [78], (exits, a.log_tail(), b.log_tail())
    loser = a if "a" in exits else b
    winner = b if loser is a else a
    assert "will not start" in loser.log()
    winner.wait_ready(timeout_s=15)
    assert winner.proc.poll() is None


def test_each_node_on_one_state_dir_keeps_its_own_preferred_worker_ids(nodes, tmp_path):
    state = tmp_path / "shared-state"
    a = nodes.start("a", workers=1, state_dir=state)
    a.wait_ready()
    b = nodes.start("b", workers=1, state_dir=state)
    b.wait_ready()
    mine = {n.name: {w["worker_id"] for w in n.status()["workers"]} for n in (a, b)}
    assert mine["a"].isdisjoint(mine["b"])
    assert a.stop() == 0 and b.stop() == 0
    # The node that ran first comes back alone: it asks for its own worker ID, not
    # for the one the other node recorded last.
    again = nodes.start("a", workers=1, state_dir=state)
    again.wait_ready()
    assert {w["worker_id"] for w in again.status()["workers"]} == mine["a"]


def test_a_state_dir_on_nfs_is_refused_unless_allowed(nodes, fsshim):
    env = shim_env(fsshim, fstype=NFS_MAGIC)
    node = nodes.start("nfs", workers=1, env=env)
    assert node.proc.wait(15) == 78
    log = node.log()
    assert "nfs" in log.lower() and "--allow-unsafe-filesystem" in log, node.log_tail()
    assert log.count("Traceback") == 0
    allowed = nodes.start("allowed", workers=1, env=env, args=("--allow-unsafe-filesystem", "true"))
    allowed.wait_ready()
    assert "unsafe_filesystem_allowed" in allowed.log()


def test_accept_restore_takes_the_store_settings_serve_takes(nodes, fsshim, tmp_path):
    """accept-restore opens the store as serve does: a state directory serve accepts
    with --allow-unsafe-filesystem is one accept-restore accepts with it too."""
    env = {**os.environ, **shim_env(fsshim, fstype=NFS_MAGIC)}
    state = tmp_path / "state"
    common = ("accept-restore", "--reason", "restored on purpose", "--state-dir", str(state))
    refused = subprocess.run([sys.executable, "-m", "snowfence", *common], capture_output=True, text=True, env=env)
    assert refused.returncode == 78 and "--allow-unsafe-filesystem" in refused.stderr, refused.stderr
    assert not (state / "layout.json").exists()
    allowed = subprocess.run(
        [sys.executable, "-m", "snowfence", *common, "--allow-unsafe-filesystem", "true"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "accepted restore" in allowed.stdout and "Traceback" not in allowed.stderr
    node = nodes.start("after", workers=1, state_dir=state, env=env, args=("--allow-unsafe-filesystem", "true"))
    node.wait_ready()


def test_a_layout_file_that_leaves_fields_out_stops_the_node_and_changes_nothing(nodes, tmp_path):
    state = tmp_path / "partial-layout"
    state.mkdir()
    (state / "layout.json").write_text('{"epoch_ms": 1767225600000}')
    node = nodes.start("partial", workers=1, state_dir=state)
    assert node.proc.wait(15) == 73
    log = node.log()
    assert "layout.json is unreadable: layout fields missing: time_bits" in log, node.log_tail()
    assert "Traceback" not in log
    assert (state / "layout.json").read_text() == '{"epoch_ms": 1767225600000}'


# -- the disk itself fails ------------------------------------------------------------------------

needs_root = pytest.mark.skipif(not is_root(), reason="mounting a tmpfs needs root (CI runs as root)")


@pytest.fixture
def tmpfs(tmp_path):
    mounts = []

    def make(name="disk", size="4m"):
        m = Tmpfs(tmp_path / name, size)
        mounts.append(m)
        return m

    yield make
    for m in mounts:
        m.unmount()


def refusals_then_recovery(node, fault, repair) -> tuple[set[str], list]:
    """Apply ``fault``; collect the error codes clients see; ``repair``; IDs again."""
    codes: set[str] = set()
    with node.client(timeout_s=0.5, retries=0) as c:
        before = [(b.first, b.count) for b in c.reserve(100)]
        fault()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not codes:
            try:
                before.extend((b.first, b.count) for b in c.reserve(100))
            except SnowfenceError as exc:
                codes.add(exc.code)
            time.sleep(0.02)
        repair()
        node.wait_ready(timeout_s=15)
        after = [(b.first, b.count) for b in c.reserve(100)]
    return codes, [before + after]


@needs_root
def test_a_full_state_dir_refuses_with_reservation_expired_and_recovers(nodes, tmpfs):
    disk = tmpfs()
    node = nodes.start("full", workers=1, state_dir=disk.path / "state", args=FAST_LEASES)
    node.wait_ready()
    filler = []
    codes, blocks = refusals_then_recovery(node, lambda: filler.append(disk.fill()), lambda: filler[0].unlink())
    assert codes and codes <= {"reservation_expired", "unavailable"}, codes
    check_blocks(blocks)
    assert "renewal_failed" in node.log() and "No space left" in node.log()
    assert node.proc.poll() is None


@needs_root
def test_a_read_only_state_dir_refuses_with_reservation_expired_and_recovers(nodes, tmpfs):
    disk = tmpfs()
    node = nodes.start("ro", workers=1, state_dir=disk.path / "state", args=FAST_LEASES)
    node.wait_ready()
    codes, blocks = refusals_then_recovery(node, lambda: disk.remount("ro"), lambda: disk.remount("rw"))
    assert codes and codes <= {"reservation_expired", "unavailable"}, codes
    check_blocks(blocks)
    assert "Read-only file system" in node.log()
    assert node.proc.poll() is None
    assert node.stop(signal.SIGTERM) == 0
