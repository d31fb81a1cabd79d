"""The store forgets, or goes back: real nodes, a real etcd, every block kept and compared.

Each test is one of the operator's faults that once made two nodes issue the same IDs
(an etcd prefix deleted, a state directory wiped, a layout record deleted, etcd restored
from a snapshot, a mark file put back from an older copy, the last two with a clock set
behind). Each asserts that no ID is issued twice and no worker ID goes below an earlier
ID of its own, and that what can be detected is refused with a message that names it,
which ``snowfence status`` shows.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time

from checks import check_blocks
from clock import ClockTable
from nodes import FAST_LEASES, etcd_args, wait_for

from snowfence.errors import SnowfenceError
from snowfence.ids import Layout

#: Two worker IDs per region: a second node has to wait for one of the first node's.
TWO = ("--worker-bits", "1", "--sequence-bits", "18")
TWO_LAYOUT = Layout(time_bits=41, region_bits=3, worker_bits=1, sequence_bits=18)
OTHER = ("--worker-bits", "2", "--sequence-bits", "17")


class Load:
    """One client thread reserving from a node until stopped, keeping every block."""

    def __init__(self, node, n: int = 1000) -> None:
        self.node, self.n = node, n
        self.blocks: list[tuple[int, int]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self.node.client(timeout_s=0.5, retries=0) as c:
            while not self._stop.is_set():
                try:
                    self.blocks.extend((b.first, b.count) for b in c.reserve(self.n))
                except SnowfenceError as exc:
                    self.errors.append(str(exc))
                    time.sleep(0.02)

    def ids(self) -> int:
        return sum(count for _, count in self.blocks)

    def stop(self) -> list[tuple[int, int]]:
        self._stop.set()
        self._thread.join(10)
        return self.blocks


def cli(*args: str, env: dict | None = None, timeout_s: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snowfence", *args], capture_output=True, text=True, timeout=timeout_s, env=env
    )


def problems(node) -> list[str]:
    return [w.get("store_problem") for w in node.status()["workers"] if w.get("store_problem")]


def passed_over(node) -> list[str]:
    return [p["reason"] for w in node.status()["workers"] for p in w.get("passed_over") or []]


def grows(load: Load, by: int = 10_000, timeout_s: float = 20) -> None:
    start = load.ids()
    wait_for(lambda: load.ids() >= start + by, timeout_s, what=f"{by} more IDs from {load.node.name}")


def test_etcdctl_del_prefix_under_holders_and_a_waiting_node(nodes, etcd):
    common = (*etcd_args(etcd, "forget", *FAST_LEASES), *TWO)
    a = nodes.start("a", workers=2, args=common)
    a.wait_ready()
    b = nodes.start("b", workers=1, args=common)
    wait_for(lambda: b.status()["workers"], 10, what="b's worker to report")
    load_a, load_b = Load(a), Load(b)
    grows(load_a)
    p = etcd.ctl("del", "--prefix", "/snowfence/forget/")
    assert p.returncode == 0, p.stderr
    # Every node saw this store: each refuses the empty prefix and says so.
    wait_for(lambda: problems(a) and problems(b), 20, what="both nodes to refuse the emptied store")
    text = cli("status", "--connect", a.endpoint)
    assert "STORE WENT BACK" in text.stdout and "layout record" in text.stdout, text.stdout
    time.sleep(1.0)  # the refusals hold
    assert not a.ready_workers() and not b.ready_workers()
    # The operator says it was on purpose: both mint again, after the quarantine.
    p = cli("accept-restore", "--reason", "prefix deleted by hand", *common)
    assert p.returncode == 0 and "accepted restore" in p.stdout, p.stdout + p.stderr
    grows(load_a, timeout_s=30)
    blocks = [load_a.stop(), load_b.stop()]
    assert not problems(a)
    figures = check_blocks(blocks, TWO_LAYOUT)
    assert figures["ids"] > 20_000


def test_an_older_mark_put_back_with_etcdctl_is_passed_over_by_a_node_that_never_saw_the_later_one(nodes, etcd):
    # Node a reserves ahead and mints; an operator puts an older value of its mark back
    # (etcdctl put); node b, whose journal never saw a's later marks, must not take that
    # value as the worker ID's floor: it names a version etcd no longer holds.
    common = (*etcd_args(etcd, "putback", *FAST_LEASES), *TWO)
    a = nodes.start("a", workers=1, args=common)
    a.wait_ready()
    (held,) = [w["worker_id"] for w in a.status()["workers"] if w.get("worker_id") is not None]
    key = f"/snowfence/putback/marks/0/{held}"
    load = Load(a)
    grows(load)
    older = etcd.get_prefix(key)[key]
    wait_for(lambda: etcd.get_prefix(key)[key] != older, 10, what="a's mark to move on")
    grows(load)
    blocks_a = load.stop()
    assert a.stop() == 0  # released: its mark lowered to the last millisecond it used
    p = etcd.ctl("put", key, older)
    assert p.returncode == 0, p.stderr
    b = nodes.start("b", workers=1, args=common)
    b.wait_ready()
    assert [w["worker_id"] for w in b.status()["workers"]] == [1 - held]
    reasons = passed_over(b)
    assert any(f"worker ID {held}" in r and "by hand" in r for r in reasons), reasons
    load = Load(b)
    grows(load)
    figures = check_blocks([blocks_a, load.stop()], TWO_LAYOUT)
    assert figures["ids"] > 20_000 and figures["workers"] == 2


def test_embedded_state_dir_wiped_under_live_holders_while_a_second_node_waits(nodes, tmp_path):
    state = tmp_path / "state"
    a = nodes.start("a", workers=2, state_dir=state, args=TWO)
    a.wait_ready()
    b = nodes.start("b", workers=1, state_dir=state, args=TWO)
    wait_for(lambda: b.status()["workers"], 10, what="b's worker to report")
    load_a, load_b = Load(a), Load(b)
    grows(load_a)
    for entry in state.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    # A's holders see their lock files gone and stop; both nodes' journals (in memory,
    # and written back) remember the store: neither takes the empty directory for new.
    wait_for(lambda: problems(a), 20, what="a to refuse the wiped directory")
    time.sleep(1.5)
    assert "layout record is gone" in problems(a)[0] or "is not the one" in problems(a)[0], problems(a)
    assert "STORE WENT BACK" in cli("status", "--connect", a.endpoint).stdout
    p = cli("accept-restore", "--reason", "wiped by hand", "--state-dir", str(state), *TWO)
    assert p.returncode == 0, p.stdout + p.stderr
    grows(load_a, timeout_s=30)
    check_blocks([load_a.stop(), load_b.stop()], TWO_LAYOUT)


def test_embedded_layout_deleted_then_a_node_of_other_widths_refuses_to_start(nodes, tmp_path):
    state = tmp_path / "state"
    a = nodes.start("a", workers=2, state_dir=state, args=TWO)
    a.wait_ready()
    load_a = Load(a)
    grows(load_a)
    (state / "layout.json").unlink()
    other = nodes.start("other", workers=1, state_dir=state, args=OTHER)
    assert other.proc.wait(20) == 73
    log = other.log()
    assert "layout.json is missing, but" in log and "mark files remain" in log, log
    grows(load_a, by=5000)  # the node that had it still serves, under its own layout
    check_blocks([load_a.stop()], TWO_LAYOUT)


def test_etcd_layout_key_deleted_then_a_node_of_other_widths_refuses(nodes, etcd):
    common = (*etcd_args(etcd, "forget", *FAST_LEASES),)
    a = nodes.start("a", workers=1, args=(*common, *TWO))
    a.wait_ready()
    load_a = Load(a)
    grows(load_a)
    p = etcd.ctl("del", "/snowfence/forget/layout")
    assert p.returncode == 0, p.stderr
    other = nodes.start("other", workers=1, args=(*common, *OTHER))
    code = other.proc.wait(20)
    log = other.log()
    # Refused before it serves: by the region claims of the other widths (read first), or by
    # the layout record, whichever it reads first.
    assert code == 78 and ("layout record" in log or "claimed by clusters of another layout" in log), log
    assert "will not start" in log, log
    blocks = [load_a.stop()]
    check_blocks(blocks, TWO_LAYOUT)


def test_etcd_restored_from_an_older_snapshot_and_a_node_restarted_with_its_clock_behind(
    nodes, etcd, tmp_path, clockshim_library
):
    skew = ClockTable(tmp_path / "skew", clockshim_library)
    try:
        common = (*etcd_args(etcd, "forget", *FAST_LEASES), *TWO)
        a = nodes.start("a", workers=2, args=common, env=skew.env())
        a.wait_ready()
        load = Load(a)
        grows(load)
        snapshot = tmp_path / "snap.db"
        p = etcd.ctl("snapshot", "save", str(snapshot))
        assert p.returncode == 0, p.stderr
        grows(load, by=50_000)
        time.sleep(2.5)  # marks well past the snapshot's
        before = load.stop()
        assert a.stop() == 0
        etcd.restore_snapshot(snapshot)
        skew.shift_all(-18_500)
        a2 = nodes.start("a2", workers=2, state_dir=a.state_dir, args=common, env=skew.env())
        wait_for(lambda: problems(a2), 20, what="the restarted node to refuse the restored etcd")
        assert "restored" in problems(a2)[0] or "went back" in problems(a2)[0], problems(a2)
        assert "STORE WENT BACK" in cli("status", "--connect", a2.endpoint).stdout
        # Accepted: claims take the journal's floors, so the node waits for its clock
        # to pass what it minted before the restore instead of minting below it.
        p = cli("accept-restore", "--reason", "snapshot restored on purpose", *common)
        assert p.returncode == 0, p.stdout + p.stderr
        load2 = Load(a2)
        time.sleep(4)
        assert not problems(a2)
        assert load2.ids() == 0, "minted with the clock 18.5 s behind what it had minted"
        skew.shift_all(0)
        grows(load2, timeout_s=30)
        check_blocks([before + load2.stop()], TWO_LAYOUT)
    finally:
        skew.close()


def test_embedded_older_mark_copy_put_back_after_a_crash_and_a_restart_with_the_clock_behind(
    nodes, tmp_path, clockshim_library
):
    skew = ClockTable(tmp_path / "skew", clockshim_library)
    try:
        state = tmp_path / "state"
        a = nodes.start("a", workers=2, state_dir=state, args=TWO, env=skew.env())
        a.wait_ready()
        load = Load(a)
        grows(load)
        marks = sorted((state / "regions" / "0").glob("worker-*.mark"))
        assert marks
        copies = {m: m.read_bytes() for m in marks}
        grows(load, by=50_000)
        time.sleep(2.5)
        before = load.stop()
        a.kill()
        for mark, old in copies.items():
            mark.write_bytes(old)
        skew.shift_all(-10_000)
        a2 = nodes.start("a2", workers=2, state_dir=state, args=TWO, env=skew.env())
        wait_for(lambda: passed_over(a2), 20, what="the restarted node to pass over the marks put back")
        reasons = passed_over(a2)
        assert all("went back" in r for r in reasons), reasons
        load2 = Load(a2)
        time.sleep(3)
        assert load2.ids() == 0
        skew.shift_all(0)
        time.sleep(1)
        p = cli("accept-restore", "--reason", "marks restored from a backup", "--state-dir", str(state), *TWO)
        assert p.returncode == 0, p.stdout + p.stderr
        grows(load2, timeout_s=30)
        check_blocks([before + load2.stop()], TWO_LAYOUT)
    finally:
        skew.close()
