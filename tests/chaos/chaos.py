"""A Jepsen-style fault run: real etcd, real nodes, real faults, one checker.

The world: a 3-member etcd cluster on loopback; several snowfence nodes in one
region, each reaching etcd only through TCP proxies of its own (so one node can
be cut off from etcd while clients still reach it) and each running under the
clock shim (so one worker process's wall clock can be stepped while the
monotonic clock stays honest); client processes that call `reserve` without
retries and record every outcome.

The nemesis applies faults one at a time and records when each began and
ended, then waits for full service before the next. The checker then proves,
from the clients' records and the nodes' logs:

* every acknowledged ID is unique;
* the IDs of one worker ID increase in real time, across owners: a block whose
  reply arrived before another block's request was sent has smaller IDs;
* every block decodes to a worker ID that the node which answered held at the
  time (claim and release events in the nodes' JSON logs, on the shared
  monotonic clock);
* no block asked for after a watermark reply was received carries a millisecond
  below that watermark (any node's block, any node's watermark);

and reports availability: the share of calls answered during each fault, and
the time from each fault's end to full service.
"""

from __future__ import annotations

import bisect
import heapq
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

HARNESS = Path(__file__).resolve().parent.parent / "harness"
sys.path.insert(0, str(HARNESS))

import recorder  # noqa: E402
from clock import ClockTable, build_clockshim  # noqa: E402
from etcdharness import EtcdCluster  # noqa: E402
from netproxy import Proxy  # noqa: E402
from nodes import FAST_LEASES, Node, wait_for  # noqa: E402

from snowfence.errors import SnowfenceError  # noqa: E402
from snowfence.ids import Layout  # noqa: E402

#: A region of 8 worker IDs and 16-bit sequences: 3 nodes x 2 workers leave two
#: worker IDs free, so killed and partitioned nodes' worker IDs change hands.
LAYOUT = Layout(time_bits=41, region_bits=3, worker_bits=3, sequence_bits=16)
LAYOUT_ARGS = ["--worker-bits", "3", "--sequence-bits", "16"]

#: The harness's scaled lease timing, and a short heartbeat timeout so a paused
#: worker leaves rotation quickly.
TIMING_ARGS = [*FAST_LEASES, "--heartbeat-timeout-s", "1.5"]
LONG_PAUSE_S = 6.0  # longer than the lease TTL
SHORT_PAUSE_S = 1.0


def mono_ns() -> int:
    return time.monotonic_ns()


@dataclass
class FaultRecord:
    kind: str
    target: str
    start_ns: int
    end_ns: int = 0
    full_service_ns: int = 0


@dataclass
class World:
    root: Path
    nodes_count: int = 3
    workers: int = 2
    clients: int = 2
    client_pause_s: float = 0.002
    pythonpath: str | None = None  # run the nodes from another copy of the package (to break a guard)
    layout: Layout = LAYOUT
    layout_args: list = field(default_factory=lambda: list(LAYOUT_ARGS))
    #: Embedded mode: no etcd; every node on one shared state directory.
    embedded: bool = False
    tampered: int = 0

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    def start(self) -> World:
        """etcd, the clock table, and ``nodes_count`` nodes, each with all workers ready."""
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.embedded:
            self.etcd = EtcdCluster(self.root / "etcd", size=3).start()
        self.clock = ClockTable(self.root / "clock-table", build_clockshim(self.root))
        self.proxies: dict[str, list[Proxy]] = {}
        self.nodes: dict[str, Node] = {}
        self.kills: list[tuple[str, int]] = []  # (node, mono_ns) when a whole node was killed
        self.recorders: list[tuple[subprocess.Popen, Path]] = []
        for i in range(self.nodes_count):
            self.add_node(f"n{i}").wait_ready(timeout_s=30)
        return self

    def _env(self) -> dict:
        return {**self.clock.env(), **({"PYTHONPATH": self.pythonpath} if self.pythonpath else {})}

    def add_node(self, name: str) -> Node:
        """Start a node that reaches etcd only through proxies of its own (or, embedded,
        one on the shared state directory)."""
        if self.embedded:
            self.proxies[name] = []
            store_args, state_dir = [], self.state_dir
        else:
            self.proxies[name] = [Proxy("127.0.0.1", m.client_port) for m in self.etcd.members]
            store_args = ["--etcd", ",".join(p.url for p in self.proxies[name]), "--cluster", "chaos"]
            state_dir = None
        args = [*store_args, "--log-format", "json", *self.layout_args, *TIMING_ARGS]
        node = self.nodes[name] = Node(
            self.root, name, workers=self.workers, state_dir=state_dir, args=tuple(args), env=self._env()
        )
        return node.start()

    def start_recorders(self) -> None:
        """Client processes that ask every node in turn (endpoint index = node order)."""
        endpoints = [n.endpoint for n in self.nodes.values()]
        env = {**os.environ, **({"PYTHONPATH": self.pythonpath} if self.pythonpath else {})}
        for i in range(self.clients):
            out = self.root / f"client{i}.bin"
            cmd = [sys.executable, str(HARNESS / "recorder.py"), str(out), str(i), str(self.client_pause_s), *endpoints]
            self.recorders.append((subprocess.Popen(cmd, env=env), out))

    # -- observing ------------------------------------------------------------------------

    def full_service(self) -> bool:
        """Every node answers and has all its workers in rotation."""
        for node in self.nodes.values():
            try:
                ready = node.ready_workers()
            except (SnowfenceError, OSError):
                return False
            if len(ready) < self.workers:
                return False
        return True

    def live_nodes(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.proc is not None and n.proc.poll() is None]

    def worker_pid(self, rng: random.Random) -> tuple[Node, int]:
        node = rng.choice(self.live_nodes())
        pids = wait_for(node.worker_pids, 10, what=f"worker pids of {node.name}")
        return node, rng.choice(pids)

    # -- stopping ---------------------------------------------------------------------------

    def stop_clients(self) -> list[Path]:
        for proc, _ in self.recorders:
            proc.send_signal(signal.SIGTERM)
        for proc, _ in self.recorders:
            proc.wait(30)
        return [out for _, out in self.recorders]

    def close(self) -> None:
        for proc, _ in getattr(self, "recorders", []):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        for node in getattr(self, "nodes", {}).values():
            node.close()
        for proxies in getattr(self, "proxies", {}).values():
            for p in proxies:
                p.close()
        if hasattr(self, "etcd"):
            self.etcd.stop()
        if hasattr(self, "clock"):
            self.clock.close()


# -- the nemesis -----------------------------------------------------------------------------


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def fault_kill_worker(w: World, rng: random.Random) -> str:
    node, pid = w.worker_pid(rng)
    os.kill(pid, signal.SIGKILL)
    # The fault lasts until the node has noticed (reaped the worker): only then
    # does waiting for full service mean waiting for the restarted worker.
    wait_for(lambda: pid not in node.worker_pids(), 10, what=f"{node.name} to reap worker {pid}")
    return f"{node.name} worker {pid}"


def fault_kill_node(w: World, rng: random.Random) -> str:
    node = rng.choice(w.live_nodes())
    w.kills.append((node.name, mono_ns()))
    node.kill()
    _sleep(2.0)
    node.start()
    return node.name


def _pause_worker(w: World, rng: random.Random, seconds: float) -> str:
    node, pid = w.worker_pid(rng)
    os.kill(pid, signal.SIGSTOP)
    try:
        _sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)
    return f"{node.name} worker {pid}"


def fault_pause_worker_short(w, rng):
    return _pause_worker(w, rng, SHORT_PAUSE_S)


def fault_pause_worker_long(w, rng):
    return _pause_worker(w, rng, LONG_PAUSE_S)


def _pause_node(w: World, rng: random.Random, seconds: float) -> str:
    node = rng.choice(w.live_nodes())
    os.killpg(node.pgid, signal.SIGSTOP)
    try:
        _sleep(seconds)
    finally:
        os.killpg(node.pgid, signal.SIGCONT)
    return node.name


def fault_pause_node_short(w, rng):
    return _pause_node(w, rng, SHORT_PAUSE_S)


def fault_pause_node_long(w, rng):
    return _pause_node(w, rng, LONG_PAUSE_S)


def _kill_member(w: World, member) -> None:
    member.kill()
    _sleep(3.0)
    w.etcd.restart_member(member)
    w.etcd.wait_healthy(20)


def fault_kill_etcd_leader(w: World, rng: random.Random) -> str:
    leader = wait_for(w.etcd.leader, 10, what="an etcd leader")
    _kill_member(w, leader)
    return leader.name


def fault_kill_etcd_follower(w: World, rng: random.Random) -> str:
    leader = wait_for(w.etcd.leader, 10, what="an etcd leader")
    follower = rng.choice([m for m in w.etcd.members if m is not leader])
    _kill_member(w, follower)
    return follower.name


def fault_etcd_outage(w: World, rng: random.Random) -> str:
    for m in w.etcd.members:
        m.kill()
    _sleep(4.0)  # past the fence, short of the lease TTL: leases survive an etcd restart
    for m in w.etcd.members:
        w.etcd.restart_member(m)
    w.etcd.wait_healthy(30)
    return "all members"


def _clock_step(w: World, rng: random.Random, step_ms: float, hold_s: float) -> str:
    node, pid = w.worker_pid(rng)
    w.clock.shift_pid(pid, step_ms)
    try:
        _sleep(hold_s)
    finally:
        w.clock.shift_pid(pid, 0)
    return f"{node.name} worker {pid}"


def fault_clock_back_5ms(w, rng):
    return _clock_step(w, rng, -5, 2.0)


def fault_clock_back_40ms(w, rng):
    return _clock_step(w, rng, -40, 2.0)


def fault_clock_back_2s(w, rng):
    return _clock_step(w, rng, -2000, 3.0)


def fault_clock_forward_2s(w, rng):
    return _clock_step(w, rng, 2000, 3.0)


def fault_clock_strobe(w: World, rng: random.Random) -> str:
    node, pid = w.worker_pid(rng)
    try:
        for i in range(40):  # 4 s of +-30 ms every 100 ms
            w.clock.shift_pid(pid, 30 if i % 2 else -30)
            _sleep(0.1)
    finally:
        w.clock.shift_pid(pid, 0)
    return f"{node.name} worker {pid}"


def fault_partition_node(w: World, rng: random.Random) -> str:
    node = rng.choice(w.live_nodes())
    for p in w.proxies[node.name]:
        p.sever()
    try:
        _sleep(LONG_PAUSE_S)  # past the lease TTL: its worker IDs may change hands
    finally:
        for p in w.proxies[node.name]:
            p.heal()
    return node.name


def held_worker_ids(w: World) -> list[int]:
    return sorted(
        h["worker_id"]
        for node in w.live_nodes()
        for h in node.status()["workers"]
        if h.get("worker_id") is not None and h.get("in_rotation")
    )


def fault_state_dir_tampered(w: World, rng: random.Random) -> str:
    """Embedded mode: a cleanup job or an operator changes the state directory under running nodes.

    Its lock files removed (then another node could lock new ones at the same paths),
    or a held worker ID's mark removed, damaged, or put back to an older copy of itself.
    """
    region = w.state_dir / "regions" / "0"
    wid = rng.choice(wait_for(lambda: held_worker_ids(w), 10, what="a held worker ID"))
    mark = region / f"worker-{wid}.mark"
    how = TAMPERINGS[w.tampered % len(TAMPERINGS)]  # each kind in turn
    w.tampered += 1
    lost_before = sum(n.log().count('"lease_exclusivity_lost"') for n in w.nodes.values())
    if how == "locks_removed":
        for lock in region.glob("*.lock"):
            lock.unlink()
    elif how == "mark_removed":
        mark.unlink()
    elif how == "mark_damaged":
        mark.write_bytes(mark.read_bytes()[:-7])
    else:
        older = mark.read_bytes()
        _sleep(1.0)  # the holder extends past this copy meanwhile
        mark.write_bytes(older)
    _sleep(1.5)  # longer than the keepalive interval: every holder has checked
    lost = sum(n.log().count('"lease_exclusivity_lost"') for n in w.nodes.values()) - lost_before
    return f"{how if how == 'locks_removed' else f'{how} of {wid}'}: {lost} let go"


TAMPERINGS = ("locks_removed", "mark_removed", "mark_damaged", "mark_set_back")


#: Faults that apply to embedded mode (a shared state directory, no etcd).
EMBEDDED_FAULTS = {
    "state_dir_tampered": fault_state_dir_tampered,
    "kill_node": fault_kill_node,
    "kill_worker": fault_kill_worker,
}


FAULTS = {
    "kill_worker": fault_kill_worker,
    "kill_node": fault_kill_node,
    "pause_worker_short": fault_pause_worker_short,
    "pause_worker_long": fault_pause_worker_long,
    "pause_node_short": fault_pause_node_short,
    "pause_node_long": fault_pause_node_long,
    "kill_etcd_leader": fault_kill_etcd_leader,
    "kill_etcd_follower": fault_kill_etcd_follower,
    "etcd_outage": fault_etcd_outage,
    "clock_back_5ms": fault_clock_back_5ms,
    "clock_back_40ms": fault_clock_back_40ms,
    "clock_back_2s": fault_clock_back_2s,
    "clock_forward_2s": fault_clock_forward_2s,
    "clock_strobe": fault_clock_strobe,
    "partition_node": fault_partition_node,
}


def run_faults(
    w: World,
    kinds: Iterable[str],
    rng: random.Random,
    *,
    settle_s: float = 1.0,
    full_service_timeout_s: float = 40.0,
    log=print,
) -> list[FaultRecord]:
    """Apply faults one after another; after each, wait for full service."""
    records = []
    faults = EMBEDDED_FAULTS if w.embedded else FAULTS
    for kind in kinds:
        start = mono_ns()
        target = faults[kind](w, rng)
        rec = FaultRecord(kind, target, start, mono_ns())
        try:
            wait_for(w.full_service, full_service_timeout_s, interval_s=0.1, what=f"full service after {kind}")
        except AssertionError:
            rec.full_service_ns = -1
        else:
            rec.full_service_ns = mono_ns()
        records.append(rec)
        log(
            f"  {kind:20s} {target:28s} {(rec.end_ns - rec.start_ns) / 1e9:5.1f} s, full service after "
            + ("NEVER" if rec.full_service_ns < 0 else f"{(rec.full_service_ns - rec.end_ns) / 1e9:.2f} s")
        )
        time.sleep(settle_s)
    return records


# -- the checker ---------------------------------------------------------------------------------


@dataclass
class Verdict:
    ids: int = 0
    blocks: int = 0
    calls: int = 0
    violations: list[str] = field(default_factory=list)
    outcomes: Counter = field(default_factory=Counter)
    faults: list[dict] = field(default_factory=list)
    duration_s: float = 0.0
    #: Watermarks the clients were answered, and how far each was behind the wall clock.
    watermarks: int = 0
    watermark_lag_ms: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def ownership(w: World) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """(node, worker ID) -> [(start_ns, end_ns)] from the nodes' JSON logs."""
    intervals: dict[tuple[str, int], list[list[int]]] = defaultdict(list)
    kills = defaultdict(list)
    for name, at in w.kills:
        kills[name].append(at)
    for name, node in w.nodes.items():
        open_by_pid: dict[tuple[int, int], list[int]] = {}
        for line in node.log().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            ev, at = e.get("event"), int(e.get("mono_s", 0) * 1e9)
            if ev == "claimed":
                iv = [at, 1 << 62]
                intervals[(name, e["worker_id"])].append(iv)
                open_by_pid[(e["pid"], e["worker_id"])] = iv
            elif ev in ("released", "reclaiming"):
                iv = open_by_pid.pop((e["pid"], e["worker_id"]), None)
                if iv is not None:
                    iv[1] = at
            elif ev == "worker_exited":
                # Logged by the broker: the exited worker's pid is a field of the event,
                # which the JSON log keeps under "fields" (the top-level "pid" is the
                # broker's, whose own worker ID lives on).
                exited = (e.get("fields") or {}).get("pid", e.get("pid"))
                for (pid, wid), iv in list(open_by_pid.items()):
                    if pid == exited:
                        iv[1] = min(iv[1], at)
                        del open_by_pid[(pid, wid)]
        for at in kills[name]:
            for iv in open_by_pid.values():
                if iv[0] <= at:
                    iv[1] = min(iv[1], at)
    return {k: [tuple(iv) for iv in v] for k, v in intervals.items()}


def check(w: World, outs: list[Path], faults: list[FaultRecord]) -> Verdict:
    v = Verdict()
    names = list(w.nodes)
    blocks = []
    calls = []  # (send_ns, ok), one per call
    for out in outs:
        previous = None
        for r in recorder.read(str(out)):
            key = (r[0], r[1], r[2], r[3])
            if key != previous:  # the rows of one call are consecutive and share these fields
                calls.append((r[0], r[3] == 0))
                v.outcomes[recorder.OUTCOMES[r[3]]] += 1
                previous = key
            if r[3] == 0:
                blocks.append(r)
    v.calls = len(calls)
    v.blocks = len(blocks)
    v.ids = sum(r[5] for r in blocks)
    marks = sorted(m for out in outs for m in recorder.read_watermarks(str(out)))
    v.watermarks = len(marks)
    v.watermark_lag_ms = sorted(m[4] - m[3] for m in marks)

    # 1. Every acknowledged ID is unique.
    spans = sorted((r[4], r[4] + r[5] - 1) for r in blocks)
    for (f1, l1), (f2, l2) in zip(spans, spans[1:], strict=False):
        if f2 <= l1:
            v.violations.append(f"duplicate IDs: blocks [{f1}, {l1}] and [{f2}, {l2}] overlap")

    # 2. Per worker ID, IDs increase in real time across owners.
    by_worker = defaultdict(list)
    for r in blocks:
        by_worker[w.layout.decompose(r[4]).worker].append(r)
    for wid, rs in by_worker.items():
        rs.sort(key=lambda r: r[0])  # by send time
        done: list[tuple[int, int]] = []  # heap of (recv_ns, last_id)
        highest = -1
        for r in rs:
            while done and done[0][0] < r[0]:
                highest = max(highest, heapq.heappop(done)[1])
            if r[4] <= highest:
                v.violations.append(
                    f"worker ID {wid}: block {r[4]} (sent {r[0]}) is not above {highest}, "
                    "acknowledged before it was asked for"
                )
            heapq.heappush(done, (r[1], r[4] + r[5] - 1))

    # 3. The answering node held the worker ID at the time.
    owned = ownership(w)
    slack = 50_000_000
    for r in blocks:
        node, wid = names[r[2]], w.layout.decompose(r[4]).worker
        if not any(s - slack <= r[1] and r[0] <= e + slack for s, e in owned.get((node, wid), ())):
            v.violations.append(f"{node} answered with worker ID {wid} at {r[0]}-{r[1]} ns without holding it")

    # 4. No block asked for after a watermark was answered is below it.
    by_reply = sorted((m[1], m[3], m[2]) for m in marks)  # (received, unix ms, node index)
    received = [m[0] for m in by_reply]
    highest = []  # the highest watermark answered by each moment, and which reply
    for m in by_reply:
        highest.append(m if not highest or m[1] > highest[-1][1] else highest[-1])
    epoch = w.layout.epoch_ms
    for r in blocks:
        i = bisect.bisect_left(received, r[0]) - 1  # replies received before this call was sent
        if i < 0:
            continue
        at, mark, by = highest[i]
        minted = w.layout.ms_of(r[4]) + epoch
        if minted < mark:
            v.violations.append(
                f"block {r[4]} from {names[r[2]]} (sent {r[0]}) carries {minted} ms, below the watermark "
                f"{mark} ms that {names[by] if by < len(names) else by} answered at {at}"
            )

    # Availability during each fault, and recovery.
    calls.sort()
    sends = [c[0] for c in calls]
    answered = [0]
    for _, ok in calls:
        answered.append(answered[-1] + ok)
    for f in faults:
        lo, hi = bisect.bisect_left(sends, f.start_ns), bisect.bisect_right(sends, f.end_ns)
        n = hi - lo
        v.faults.append(
            {
                "kind": f.kind,
                "target": f.target,
                "seconds": round((f.end_ns - f.start_ns) / 1e9, 2),
                "calls": n,
                "answered": round((answered[hi] - answered[lo]) / n, 3) if n else None,
                "to_full_service_s": None if f.full_service_ns < 0 else round((f.full_service_ns - f.end_ns) / 1e9, 2),
            }
        )
    if len(v.violations) > 50:
        v.violations = v.violations[:50] + [f"... {len(v.violations) - 50} more"]
    return v


def report(v: Verdict) -> str:
    lines = [
        f"faults applied for {v.duration_s / 60:.1f} min; "
        f"IDs checked {v.ids:,} in {v.blocks:,} blocks from {v.calls:,} calls; outcomes "
        + ", ".join(f"{k} {n:,}" for k, n in v.outcomes.most_common())
    ]
    kinds = Counter(f["kind"] for f in v.faults)
    lines.append("faults: " + ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())))
    lines.append("| fault | target | s | calls | answered | to full service s |")
    lines.append("|---|---|---|---|---|---|")
    for f in v.faults:
        answered = "-" if f["answered"] is None else f"{f['answered']:.1%}"
        lines.append(
            f"| {f['kind']} | {f['target']} | {f['seconds']} | {f['calls']} | {answered} | "
            f"{'never' if f['to_full_service_s'] is None else f['to_full_service_s']} |"
        )
    if v.watermarks:
        lags = v.watermark_lag_ms
        lines.append(
            f"watermarks answered {v.watermarks:,}; lag behind the wall clock p50 {lags[len(lags) // 2]} ms, "
            f"p99 {lags[min(len(lags) - 1, len(lags) * 99 // 100)]} ms, max {lags[-1]} ms"
        )
    lines.append(f"violations: {len(v.violations)}")
    lines.extend(f"  {x}" for x in v.violations)
    return "\n".join(lines)


# -- a copy of the package with one guard broken, to show the checker can fail --------------


def broken_copy(root: Path, guard: str) -> str:
    """A PYTHONPATH under which `snowfence` has ``guard`` disabled."""
    import snowfence

    src = Path(snowfence.__file__).parent
    dst = root / "broken" / "snowfence"
    shutil.copytree(src, dst)
    if guard == "mark-wait":
        # The new owner of a worker ID no longer waits for the previous owner's mark.
        edits = {
            dst / "workers" / "minter.py": [("        if mark_ms >= self.last_ms:", "        if False:")],
            dst / "workers" / "states.py": [("    if now_ms <= mark_ms:", "    if False:")],
        }
    elif guard == "watermark-claim":
        # A claim no longer starts above the watermark record it read.
        edits = {
            dst / "workers" / "core.py": [
                (
                    "minter.start_after(max(lease.claimed_mark_ms, lease.watermark_ms - 1))",
                    "minter.start_after(lease.claimed_mark_ms)",
                )
            ]
        }
    else:
        raise ValueError(f"unknown guard {guard!r}")
    for path, pairs in edits.items():
        text = path.read_text()
        for old, new in pairs:
            assert old in text, f"{path}: {old!r} not found; the breakage is out of date"
            text = text.replace(old, new)
        path.write_text(text)
    return str(dst.parent)


# -- profiles ---------------------------------------------------------------------------------------

SHORT = [
    "kill_worker",
    "clock_back_5ms",
    "clock_back_40ms",
    "kill_etcd_leader",
    "pause_worker_short",
    "clock_back_2s",
    "clock_forward_2s",
    "clock_strobe",
    "pause_node_long",
    "kill_etcd_follower",
    "partition_node",
    "kill_node",
    "pause_node_short",
    "pause_worker_long",
    "etcd_outage",
]


#: Embedded mode's short profile: each kind of tampering with the state directory in
#: turn, and a node killed and restarted on it.
EMBEDDED_SHORT = ["state_dir_tampered", "state_dir_tampered", "kill_node", "state_dir_tampered", "state_dir_tampered"]


def long_schedule(rng: random.Random, minutes: float, faults: dict | None = None):
    """Every kind once, in random order, then random faults until ``minutes`` have passed."""
    faults = FAULTS if faults is None else faults
    deadline = time.monotonic() + minutes * 60
    kinds = list(faults)
    rng.shuffle(kinds)
    yield from kinds
    while time.monotonic() < deadline:
        yield rng.choice(list(faults))


def run(root: Path, kinds, seed: int = 1, log=print, **world_kw) -> Verdict:
    """Start the world, apply ``kinds`` (a list, or an iterator such as long_schedule), check."""
    rng = random.Random(seed)
    w = World(root, **world_kw)
    try:
        w.start()
        w.start_recorders()
        store = "one shared state directory" if w.embedded else "3 etcd members"
        log(f"world up: {store}, {w.nodes_count} nodes x {w.workers} workers, {w.clients} clients")
        time.sleep(1.0)
        started = time.monotonic()
        faults = run_faults(w, kinds, rng, log=log)
        duration_s = time.monotonic() - started
        time.sleep(1.0)
        outs = w.stop_clients()
        verdict = check(w, outs, faults)
        verdict.duration_s = duration_s
        return verdict
    finally:
        w.close()


def skewed_takeover(root: Path, pythonpath: str | None = None, log=print) -> Verdict:
    """A node paused past its lease, taken over by a node whose clock is 8 s behind.

    Only the time high-water mark stops the new owner from minting the old
    owner's timestamps again: with it, the new owner waits until its clock has
    passed the mark; without it, IDs repeat.
    """
    layout = Layout(time_bits=41, region_bits=3, worker_bits=1, sequence_bits=18)
    w = World(
        root,
        nodes_count=1,
        workers=2,
        clients=2,
        client_pause_s=0.001,
        pythonpath=pythonpath,
        layout=layout,
        layout_args=["--worker-bits", "1", "--sequence-bits", "18"],
    )
    try:
        w.start()  # n0 holds both worker IDs of the region
        n1 = w.add_node("n1")
        pids = wait_for(lambda: (lambda p: p if len(p) == 2 else None)(n1.worker_pids()), 20, what="n1's workers")
        for pid in pids:
            w.clock.shift_pid(pid, -8000)
        w.start_recorders()
        time.sleep(1.5)
        start = mono_ns()
        os.killpg(w.nodes["n0"].pgid, signal.SIGSTOP)
        try:
            wait_for(lambda: len(n1.ready_workers()) >= 1, 30, what="n1 to take over")
            time.sleep(2.0)
        finally:
            os.killpg(w.nodes["n0"].pgid, signal.SIGCONT)
        end = mono_ns()
        time.sleep(1.0)
        outs = w.stop_clients()
        verdict = check(w, outs, [FaultRecord("skewed_takeover", "n0 paused, n1 8 s behind", start, end, end)])
        log(report(verdict))
        return verdict
    finally:
        w.close()


def watermark_behind(root: Path, pythonpath: str | None = None, log=print) -> Verdict:
    """Clients learn the watermark from n0; then n1 claims worker IDs never used before,
    with its workers' clocks 4 s behind (its broker's honest, so its peers vouch for it).

    Nothing but the watermark record stops n1 from minting below a watermark already
    answered: such a worker ID's mark is long past. With the record, n1's minters start
    above it (and wait for their clocks to pass it); without it, n1 mints 4 s in the past.
    """
    layout = Layout(time_bits=41, region_bits=3, worker_bits=2, sequence_bits=17)
    w = World(
        root,
        nodes_count=1,
        workers=1,
        clients=2,
        client_pause_s=0.001,
        pythonpath=pythonpath,
        layout=layout,
        layout_args=["--worker-bits", "2", "--sequence-bits", "17"],
    )
    behind = None
    try:
        w.start()  # n0: one worker ID, and its broker's own
        w.start_recorders()
        wait_for(lambda: _watermarks_answered(w) or None, 30, what="watermarks from n0")
        time.sleep(1.0)
        behind = ClockTable(w.root / "clock-table-behind", w.clock.library)
        behind.shift_all(-4000)
        env = {**behind.env(), **({"PYTHONPATH": pythonpath} if pythonpath else {})}
        w.proxies["n1"] = [Proxy("127.0.0.1", m.client_port) for m in w.etcd.members]
        store_args = ["--etcd", ",".join(p.url for p in w.proxies["n1"]), "--cluster", "chaos"]
        args = [*store_args, "--log-format", "json", *w.layout_args, *TIMING_ARGS, "--broker-mint-max-ids", "0"]
        n1 = w.nodes["n1"] = Node(w.root, "n1", workers=2, args=tuple(args), env=env)
        start = mono_ns()
        n1.start()
        behind.shift_pid(n1.pid, 4000)  # the broker's clock is honest: only its workers' are behind
        n1.wait_ready(timeout_s=30)
        endpoints = [n.endpoint for n in w.nodes.values()]
        out = w.root / "client-late.bin"
        cmd = [sys.executable, str(HARNESS / "recorder.py"), str(out), "7", "0.001", *endpoints]
        w.recorders.append((subprocess.Popen(cmd, env={**os.environ, **env}), out))
        time.sleep(4.0)
        end = mono_ns()
        outs = w.stop_clients()
        verdict = check(w, outs, [FaultRecord("watermark_behind", "n1's workers 4 s behind", start, end, end)])
        log(report(verdict))
        return verdict
    finally:
        w.close()
        if behind is not None:
            behind.close()


def _watermarks_answered(w: World) -> bool:
    """Whether n0 promises a watermark yet (its STATUS says)."""
    try:
        return bool((w.nodes["n0"].status()["broker"].get("watermark") or {}).get("unix_ms"))
    except SnowfenceError:
        return False
