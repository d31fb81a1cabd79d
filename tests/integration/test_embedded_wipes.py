"""An embedded state directory wiped under nodes that minted from it: real `snowfence
serve` processes, every block kept and compared.

Each test is a way a wiped directory once gave the same IDs to two owners: a node on a
second path to the directory (a bind mount) while the first still held its worker IDs,
and a node killed while its logical clock ran ahead, restarted at once on its wiped
directory. Each asserts that no ID is issued twice and that no worker ID goes below an
earlier ID of its own, whichever node minted it.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time

import leftovers
import orjson
import pytest
from checks import below_earlier, check_blocks, repeated_ids
from disk import is_root
from nodes import TWO_HOPS, wait_for

from snowfence.errors import SnowfenceError
from snowfence.ids import DEFAULT_LAYOUT, Layout

#: Two worker IDs per region: the first node's two workers hold both.
TWO = ("--worker-bits", "1", "--sequence-bits", "18")
TWO_LAYOUT = Layout(time_bits=41, region_bits=3, worker_bits=1, sequence_bits=18)
#: A keep-alive long enough that a holder goes on minting for seconds after its files are
#: gone, and that a new node starts and makes its first claims before the holders look
#: again (12 s after a keep-alive: enough on a loaded machine too, where 8 s was not).
SLOW_KEEPER = (
    "--keepalive-interval-s",
    "12",
    "--fence-after-s",
    "13",
    "--lease-ttl-s",
    "14",
    "--reservation-window-s",
    "24",
    "--max-reservation-window-s",
    "24",
)
#: A third as slow, where the test needs only that a holder mints on for seconds unseen (with
#: the new store's wait shortened to the run-ahead, the test below still sees IDs issued
#: twice: it fails, as it must).
QUICKER_KEEPER = (
    "--keepalive-interval-s",
    "4",
    "--fence-after-s",
    "4.5",
    "--lease-ttl-s",
    "5",
    "--reservation-window-s",
    "10",
    "--max-reservation-window-s",
    "10",
)


class Load:
    """Client threads reserving from one node until stopped, keeping every block."""

    def __init__(self, node, threads: int = 1, n: int = 1000) -> None:
        self.node, self.n = node, n
        self.blocks: list[list[tuple[int, int]]] = [[] for _ in range(threads)]
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
                    time.sleep(0.01)

    def ids(self) -> int:
        return sum(count for client in self.blocks for _, count in client)

    def stop(self) -> list[list[tuple[int, int]]]:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        return self.blocks


@pytest.fixture
def bind_mount():
    """``bind_mount(source, target)``: ``mount --bind``, unmounted at teardown (after the
    nodes, which the test asks for after this fixture). Skips, saying why, where mounting
    is not permitted."""
    mounted = []

    def mount(source, target):
        target.mkdir(parents=True, exist_ok=True)
        p = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True, text=True)
        if p.returncode != 0:
            who = "as root" if is_root() else "without root (mount needs CAP_SYS_ADMIN)"
            pytest.skip(f"mount --bind is not permitted here, running {who}: {p.stderr.strip()}")
        leftovers.register_mount(target)
        mounted.append(target)
        return target

    yield mount
    for target in reversed(mounted):
        if subprocess.run(["umount", str(target)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(target)], check=True)


def mark_revisions(state) -> dict[str, int]:
    out = {}
    for mark in (state / "regions" / "0").glob("worker-*.mark"):
        try:
            out[mark.name] = orjson.loads(mark.read_bytes())["rev"]
        except (OSError, orjson.JSONDecodeError, KeyError):
            pass
    return out


def test_a_node_on_a_bind_mount_of_a_wiped_state_dir_never_takes_a_live_holders_worker_id(bind_mount, nodes, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    alias = bind_mount(state, tmp_path / "alias")
    args = (*TWO, *SLOW_KEEPER)
    # a's journal is kept elsewhere, as OPERATIONS.md advises: c finds no trace of a in the
    # wiped directory, and only the kernel's witness stands between them.
    a = nodes.start("a", workers=2, state_dir=state, args=(*args, "--journal-dir", str(tmp_path / "a-journal")))
    a.wait_ready(timeout_s=30)
    load_a = Load(a, threads=2)
    wait_for(lambda: load_a.ids() > 20_000, 20, what="a to serve")
    # Just after one of a's keep-alives: its holders go on minting for up to 12 s before
    # their next check can see their files gone.
    revs = mark_revisions(state)
    wait_for(lambda: mark_revisions(state) != revs, 20, interval_s=0.01, what="a keep-alive of a")
    for name in ("layout.json", "regions", "last-worker-id", "journal"):
        path = state / name
        for _ in range(20):  # a's other holders may write a file in it meanwhile: again
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            if not path.exists():
                break
    c = nodes.start("c", workers=2, state_dir=alias, args=args)
    load_c = Load(c, threads=2)
    wait_for(lambda: "cannot claim a worker ID" in c.log() or "claimed worker ID" in c.log(), 20, what="c to claim")
    # a's holders find their lock files gone at their next check, and stop.
    wait_for(lambda: a.log().count("lease_exclusivity_lost") >= 2, 30, what=f"a to fence; log:\n{a.log_tail()}")
    time.sleep(3)  # c may claim what a gave up, and mint
    before, after = load_a.stop(), load_c.stop()
    assert load_a.ids() > 20_000, a.log_tail()
    assert repeated_ids(before + after) == 0, f"{repeated_ids(before + after)} IDs issued twice"
    check_blocks(before + after, TWO_LAYOUT)
    below = below_earlier(before, after, TWO_LAYOUT)
    assert not below, f"c minted below a's IDs of the same worker ID: {below}"
    # Not by luck: c's first claims found both worker IDs held, through the other path.
    assert "every worker ID of region 0 is taken" in c.log(), c.log_tail()


@pytest.mark.parametrize("restarted_policy", ["hlc", "wait"])
def test_a_node_killed_while_its_logical_clock_ran_ahead_and_restarted_on_its_wiped_state_dir(
    nodes, tmp_path, restarted_policy
):
    state = tmp_path / "state"
    # A run-ahead longer than a restart takes: without a wait, the new node certainly
    # mints in milliseconds the killed one already used.
    common = ("--max-ahead-ms", "3000", *TWO_HOPS)
    a = nodes.start("a", workers=1, state_dir=state, args=("--clock-policy", "hlc", *common))
    a.wait_ready(timeout_s=30)
    load = Load(a, threads=3, n=4096)  # a millisecond's IDs per request: faster than the clock

    def ahead_ms() -> int:
        latest = [client[-1][0] for client in load.blocks if client]
        return max((DEFAULT_LAYOUT.decompose(f).unix_ms for f in latest), default=0) - time.time_ns() // 1_000_000

    wait_for(lambda: ahead_ms() >= 2000, 30, interval_s=0.01, what="the logical clock to run 2 s ahead")
    killed_ms = time.time_ns() // 1_000_000
    a.kill()  # the whole group: no release
    before = load.stop()
    shutil.rmtree(state)
    # Restarted at once; a node of the wait policy mints only at its wall clock, but its
    # directory's other nodes may have run ahead: it waits as long.
    again = nodes.start("again", workers=1, state_dir=state, args=("--clock-policy", restarted_policy, *common))
    load = Load(again, threads=3, n=4096)
    wait_for(lambda: load.ids() > 2_000_000, 30, what=f"the restarted node to serve; log:\n{again.log_tail()}")
    after = load.stop()
    highest_ms = max(DEFAULT_LAYOUT.decompose(f + c - 1).unix_ms for client in before for f, c in client)
    assert highest_ms >= killed_ms + 1000, "the logical clock did not run ahead of the wall clock: nothing was tested"
    assert repeated_ids(before + after) == 0, f"{repeated_ids(before + after)} IDs issued twice"
    check_blocks(before + after)
    below = below_earlier(before, after, DEFAULT_LAYOUT)
    assert not below, f"the restarted node minted below its worker IDs' earlier IDs: {below}"


def test_a_directory_made_again_under_a_live_node_another_namespace_cannot_see(nodes, tmp_path):
    """The state directory removed and made again under a live node, and a new node started on
    it from another network namespace (a container without the host's network): neither the
    region's home nor the witnesses reach it, and the new directory holds nothing of the old.
    The new store waits out the longest a holder it cannot see could still mint (the
    reservation window every node of the store keeps to) before its first ID."""
    if not is_root():
        pytest.skip("a network namespace of its own (unshare -n) needs root")
    state = tmp_path / "state"
    args = (*TWO, *QUICKER_KEEPER)
    a = nodes.start("a", workers=2, state_dir=state, args=(*args, "--journal-dir", str(tmp_path / "a-journal")))
    a.wait_ready(timeout_s=30)
    load_a = Load(a, threads=2)
    wait_for(lambda: load_a.ids() > 20_000, 20, what="a to serve")
    # Just after one of a's keep-alives: its holders go on minting for up to 4 s before
    # their next check can see their files gone.
    revs = mark_revisions(state)
    wait_for(lambda: mark_revisions(state) != revs, 20, interval_s=0.01, what="a keep-alive of a")
    state.rename(tmp_path / "state.removed")
    state.mkdir()
    shutil.rmtree(tmp_path / "state.removed")
    c = nodes.start("c", workers=2, state_dir=state, args=args, prefix=("unshare", "-n"))
    load_c = Load(c, threads=2)
    wait_for(lambda: a.log().count("lease_exclusivity_lost") >= 2, 25, what=f"a to fence; log:\n{a.log_tail()}")
    wait_for(lambda: load_c.ids() > 20_000, 40, what=f"c to serve; log:\n{c.log_tail()}")
    before, after = load_a.stop(), load_c.stop()
    assert repeated_ids(before + after) == 0, f"{repeated_ids(before + after)} IDs issued twice"
    check_blocks(before + after, TWO_LAYOUT)
    below = below_earlier(before, after, TWO_LAYOUT)
    assert not below, f"c minted below a's IDs of the same worker ID: {below}"
    assert "it mints nothing for 10000 ms" in c.log(), c.log_tail()
