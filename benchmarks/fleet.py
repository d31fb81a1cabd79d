"""The fleet: up to the default layout's 1,024 worker IDs on one real 3-member etcd, measured.

Each fleet size (worker IDs) fills ``size / 128`` regions. In each region a few real
nodes run (``snowfence serve``, one worker with one worker ID, and the broker's own worker
ID): membership, discovery, peer clocks, the watermark and the spare rule run among them
as in any fleet. The rest of the region's worker IDs are held by *holder processes*: each
runs several worker cores (``workers/core.py``'s ``WorkerCore``, each with its own
``EtcdStore`` and journal, as a worker process has), turned by a thread as a worker
process's loop turns it, with the real keepers renewing every lease; every second each
core mints a block, and every ID minted anywhere is checked for duplicates at the end.
Only the ZeroMQ socket of a worker is left out (a holder's broker is this script: it
vouches for the clock and is never silent).

For each size, in order, on a fresh etcd:

* **cold start**: every holder process and node at once; how long until every worker
  ID is claimed (counted in etcd) and ready (counted by the holders);
* **steady**: ``--steady-s`` seconds;
* **leader change**: the etcd leader is killed (SIGKILL), restarted 5 s later;
* **member restart**: a follower is stopped (SIGTERM) and started again 5 s later;
* **rolling restart**: every holder process and node in turn stops (releasing what it
  holds) and starts again; the next one when it holds all its worker IDs again.

Each phase reports the holders' renewal latency (the lease refresh and the guarded
mark write, as the keeper times it: what the fence waits for) at p50/p99/p99.9/max,
fences, lease losses, failed renewals, etcd's write and request rates and database
size, and CPU per process kind. ``--out`` writes it all as JSON.

    python benchmarks/fleet.py [--sizes 128,256,512,1024] [--steady-s 60] [--out fleet.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "harness"))

REGION_IDS = 128  # the default layout: 7 worker bits
#: Worker IDs per holder core (a worker process's --ids-per-worker) and cores per holder process.
IDS_PER_CORE = 16
CORES_PER_PROCESS = 4
MINT_EVERY_S = 1.0


# -- a holder process --------------------------------------------------------------------------


def holder_main() -> int:
    """A holder process: a JSON spec on stdin; writes its figures under ``spec["dir"]``."""
    import logging

    from snowfence.clock import HostClock
    from snowfence.config import Config
    from snowfence.logs import setup as setup_logs
    from snowfence.store import open_store
    from snowfence.workers.core import WorkerCore, preference_files
    from snowfence.workers.keeper import Keeper

    spec = json.loads(sys.stdin.read())
    out = Path(spec["dir"])
    setup_logs("warning", "text", role=spec["name"])
    log = logging.getLogger("snowfence.fleet")
    mono = time.monotonic_ns
    renewals: list[tuple[int, int]] = []  # (sent, latency) in ns
    events: list[tuple[int, str, int]] = []
    minted: list[tuple[int, int]] = []
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    class TimedKeeper(Keeper):
        def renew_once(self) -> None:
            sent = mono()
            super().renew_once()
            renewals.append((sent, mono() - sent))

    def make_keeper(lease, minter, **kw):
        inner = kw["on_event"]

        def on_event(name: str, fields: dict) -> None:
            events.append((mono(), name, fields.get("worker_id", -1)))
            inner(name, fields)

        kw["on_event"] = on_event
        return TimedKeeper(lease, minter, **kw)

    cores = []
    for slot, core_spec in enumerate(spec["cores"]):
        config = Config(**{**spec["config"], "region": core_spec["region"], "ids_per_worker": core_spec["ids"]})
        store = open_store(config, journal=spec["journal"])
        core = WorkerCore(
            config,
            slot=slot,
            pid=os.getpid(),
            holder=f"{spec['name']}:{os.getpid()}:slot{slot}",
            store=store,
            preferences=preference_files(config, slot),
            send=lambda frame: None,
            host_clock=HostClock.watching(config, log),
            now_ns=mono(),
            make_keeper=make_keeper,
        )
        core.clock_veto(None)  # the harness vouches for the clock (nodes beside run the peer checks)
        cores.append(core)

    def drive(core) -> None:
        next_mint = mono()
        while not stop.is_set():
            core.heard = True  # the harness is its broker, never silent
            now = mono()
            wait_ms = core.turn(None, now)
            if now >= next_mint and core.ready:
                got = core.mint(16)
                if isinstance(got, tuple):
                    minted.append(got)
                next_mint = now + int(MINT_EVERY_S * 1e9)
            stop.wait(wait_ms / 1000)
        core.release_all()
        core.store.close()

    threads = [threading.Thread(target=drive, args=(core,), daemon=True) for core in cores]
    for thread in threads:
        thread.start()
    name = spec["name"]
    written = [0, 0]

    def flush() -> None:
        held = sum(len(core.held) for core in cores)
        ready = sum(len(core.ready) for core in cores)
        counters: dict[str, int] = {}
        for core in cores:
            for key, value in core.counters.items():
                counters[key] = counters.get(key, 0) + value
        state = {"t": mono(), "held": held, "ready": ready, "wanted": sum(c.ids_wanted for c in cores), **counters}
        tmp = out / f"{name}.state.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(out / f"{name}.state")
        with open(out / f"{name}.renewals", "a") as f:
            n = len(renewals)
            f.writelines(f"{s} {lat}\n" for s, lat in renewals[written[0] : n])
            written[0] = n
        with open(out / f"{name}.events", "a") as f:
            n = len(events)
            f.writelines(f"{t} {e} {w}\n" for t, e, w in events[written[1] : n])
            written[1] = n

    while not stop.wait(1.0):
        flush()
    for thread in threads:
        thread.join(30)
    flush()
    with open(out / f"{name}.minted", "a") as f:
        f.writelines(f"{first} {count}\n" for first, count in minted)
    return 0


# -- the orchestra ------------------------------------------------------------------------------


class Holder:
    """One holder process (started again by :meth:`start` after a stop)."""

    def __init__(self, root: Path, name: str, spec: dict) -> None:
        self.root, self.name, self.spec = root, name, spec
        self.proc: subprocess.Popen | None = None
        #: The counts of its earlier runs (each run starts its own from 0).
        self.retired: dict[str, int] = {}

    def start(self) -> None:
        import leftovers

        log = open(self.root / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "holder"],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        leftovers.register_process(self.proc.pid, group=True, what=f"fleet holder {self.name}")
        self.proc.stdin.write(json.dumps({**self.spec, "name": self.name, "dir": str(self.root)}).encode())
        self.proc.stdin.close()

    def state(self) -> dict:
        try:
            return json.loads((self.root / f"{self.name}.state").read_text())
        except (OSError, ValueError):
            return {}

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None
        for key, value in self.counts().items():
            self.retired[key] = self.retired.get(key, 0) + value
        (self.root / f"{self.name}.state").unlink(missing_ok=True)

    def counts(self) -> dict[str, int]:
        """The counters of its current run."""
        return {k: v for k, v in self.state().items() if k not in ("t", "held", "ready", "wanted") and type(v) is int}

    @property
    def wanted(self) -> int:
        return sum(core["ids"] for core in self.spec["cores"])


def http_get(url: str, timeout_s: float = 2.0) -> str:
    """The body of a plain HTTP/1.0 GET (this directory's http.py shadows the standard library's)."""
    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout_s) as sock:
        sock.sendall(f"GET {parts.path} HTTP/1.0\r\nHost: {parts.hostname}\r\n\r\n".encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).split(b"\r\n\r\n", 1)[-1].decode()


#: What this script reads from each etcd member's /metrics: counters (deltas are taken) and gauges.
ETCD_COUNTERS = (
    "etcd_server_proposals_committed_total",
    "grpc_server_handled_total",
    "etcd_disk_wal_fsync_duration_seconds_sum",
    "etcd_disk_wal_fsync_duration_seconds_count",
)
ETCD_GAUGES = ("etcd_mvcc_db_total_size_in_bytes", "etcd_mvcc_db_total_size_in_use_in_bytes")


def etcd_metrics(cluster) -> dict[str, dict[str, float]]:
    """Per live member: the sums over label sets of the metrics this script reads."""
    out: dict[str, dict[str, float]] = {}
    for member in cluster.members:
        if member.proc is None or member.proc.poll() is not None:
            continue
        try:
            text = http_get(member.client_url + "/metrics")
        except OSError:
            continue
        seen: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in ETCD_COUNTERS or name in ETCD_GAUGES:
                seen[name] = seen.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        out[f"{member.name}:{member.proc.pid}"] = seen
    return out


def etcd_delta(before: dict, after: dict, name: str, how=sum) -> float:
    """A counter's growth, over the member processes that ran at both ends (a restarted
    member starts its counters again); proposals are counted once, by the largest."""
    return how([after[m].get(name, 0.0) - before[m].get(name, 0.0) for m in after if m in before] or [0.0])


def count_claims(cluster, cluster_name: str) -> int:
    """How many worker IDs are claimed now (keys under ``workers/``); -1 if etcd did not answer."""
    from snowfence.etcd.keys import ClusterKeys

    result = subprocess.run(
        [
            cluster.etcdctl,
            "--endpoints",
            ",".join(cluster.endpoints),
            "get",
            ClusterKeys(cluster_name).claims(),
            "--prefix",
            "--keys-only",
        ],
        capture_output=True,
        text=True,
        timeout=10,
        env={**os.environ, "ETCDCTL_API": "3"},
    )
    if result.returncode != 0:
        return -1
    return sum(1 for line in result.stdout.splitlines() if line.strip())


def cpu_of(pids: list[int]) -> dict[int, float]:
    """CPU seconds of each process tree, by its root's PID."""
    from common import children, cpu_seconds

    return {pid: cpu_seconds([pid, *children(pid)]) for pid in pids}


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used meanwhile by the trees that ran at both ends (a restarted one is left out)."""
    return sum(after[pid] - before[pid] for pid in after if pid in before)


def percentiles(values: list[int]) -> dict:
    if not values:
        return {}
    values = sorted(values)

    def q(p: float) -> float:
        return round(values[min(len(values) - 1, int(len(values) * p))] / 1e6, 2)

    return {"n": len(values), "p50_ms": q(0.5), "p99_ms": q(0.99), "p999_ms": q(0.999), "max_ms": q(1.0)}


class Fleet:
    def __init__(self, root: Path, size: int, nodes_per_region: int, etcd_cluster, journal: bool = False) -> None:
        from nodes import Node

        self.root, self.size, self.etcd = root, size, etcd_cluster
        self.name = "fleet"
        endpoints = ",".join(etcd_cluster.endpoints)
        self.config = {"etcd": tuple(etcd_cluster.endpoints), "cluster": self.name, "max_clock_skew_ms": 0}
        self.nodes, self.holders = [], []
        regions = size // REGION_IDS
        #: The fleet holds every worker ID but one per region: a broker's own worker ID gives
        #: its one back while none is free, so that a worker that lost its lease finds one.
        self.full = size - regions
        for region in range(regions):
            for k in range(nodes_per_region):
                name = f"r{region}n{k}"
                args = (
                    "--etcd",
                    endpoints,
                    "--cluster",
                    self.name,
                    "--region",
                    str(region),
                    "--ids-per-worker",
                    "1",
                    "--node-name",
                    name,
                    "--http-bind",
                    "off",
                )
                self.nodes.append(Node(root, name, workers=1, args=args))
            # Each node holds 2 (its worker's and its broker's own); holders take the rest.
            rest = REGION_IDS - 2 * nodes_per_region
            cores = []
            while rest > 0:
                ids = min(IDS_PER_CORE, rest)
                cores.append({"region": region, "ids": ids})
                rest -= ids
            for p in range(0, len(cores), CORES_PER_PROCESS):
                name = f"r{region}h{p // CORES_PER_PROCESS}"
                state_dir = root / f"{name}-state"
                spec = {
                    "journal": journal,
                    "config": {**self.config, "state_dir": str(state_dir)},
                    "cores": cores[p : p + CORES_PER_PROCESS],
                }
                self.holders.append(Holder(root, name, spec))

    # -- figures ---------------------------------------------------------------------------------

    def held_ready(self) -> tuple[int, int]:
        states = [h.state() for h in self.holders]
        held = sum(s.get("held", 0) for s in states)
        ready = sum(s.get("ready", 0) for s in states)
        return held, ready

    def counters(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for holder in self.holders:
            for counts in (holder.retired, holder.counts()):
                for key, value in counts.items():
                    total[key] = total.get(key, 0) + value
        return total

    def renewals_between(self, start: int, end: int) -> list[int]:
        out = []
        for holder in self.holders:
            try:
                lines = (self.root / f"{holder.name}.renewals").read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                sent, latency = map(int, line.split())
                if start <= sent < end:
                    out.append(latency)
        return out

    def events_between(self, start: int, end: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for holder in self.holders:
            try:
                lines = (self.root / f"{holder.name}.events").read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                t, name, _ = line.split()
                if start <= int(t) < end:
                    out[name] = out.get(name, 0) + 1
        return out

    def node_pids(self) -> list[int]:
        return [n.proc.pid for n in self.nodes if n.proc is not None]

    def holder_pids(self) -> list[int]:
        return [h.proc.pid for h in self.holders if h.proc is not None]

    def etcd_pids(self) -> list[int]:
        return [m.proc.pid for m in self.etcd.members if m.proc is not None and m.proc.poll() is None]

    def node_logs(self, *needles: str) -> dict[str, int]:
        counts = dict.fromkeys(needles, 0)
        for node in self.nodes:
            text = node.log()
            for needle in needles:
                counts[needle] += text.count(needle)
        return counts

    # -- phases ----------------------------------------------------------------------------------

    def window(self, name: str, run) -> dict:
        """Run ``run()`` and report what happened meanwhile."""
        start_ns = time.monotonic_ns()
        before = self.counters()
        etcd_before = etcd_metrics(self.etcd)
        cpu_before = {
            "nodes": cpu_of(self.node_pids()),
            "holders": cpu_of(self.holder_pids()),
            "etcd": cpu_of(self.etcd_pids()),
        }
        extra = run() or {}
        end_ns = time.monotonic_ns()
        seconds = (end_ns - start_ns) / 1e9
        after = self.counters()
        etcd_after = etcd_metrics(self.etcd)
        cpu_after = {
            "nodes": cpu_of(self.node_pids()),
            "holders": cpu_of(self.holder_pids()),
            "etcd": cpu_of(self.etcd_pids()),
        }

        def delta(key: str) -> int:
            return after.get(key, 0) - before.get(key, 0)

        def rate(key: str, how=sum) -> float:
            return round(etcd_delta(etcd_before, etcd_after, key, how) / seconds, 1)

        def gauge(key: str) -> int:
            return int(max([m.get(key, 0) for m in etcd_after.values()] or [0]))

        fsyncs = etcd_delta(etcd_before, etcd_after, "etcd_disk_wal_fsync_duration_seconds_count")
        fsync_s = etcd_delta(etcd_before, etcd_after, "etcd_disk_wal_fsync_duration_seconds_sum")
        report = {
            "phase": name,
            "seconds": round(seconds, 1),
            "renewal": percentiles(self.renewals_between(start_ns, end_ns)),
            "fenced": delta("fenced_events"),
            "leases_lost": delta("leases_lost"),
            "claims": delta("claims"),
            "holder_events": self.events_between(start_ns, end_ns),
            "etcd_proposals_per_s": rate("etcd_server_proposals_committed_total", max),
            "etcd_grpc_requests_per_s": rate("grpc_server_handled_total"),
            "etcd_fsync_mean_ms": round(fsync_s / fsyncs * 1000, 2) if fsyncs else None,
            "etcd_db_bytes": gauge("etcd_mvcc_db_total_size_in_bytes"),
            "etcd_db_in_use_bytes": gauge("etcd_mvcc_db_total_size_in_use_in_bytes"),
            "cpu_share": {k: round(cpu_delta(cpu_before[k], cpu_after[k]) / seconds, 3) for k in cpu_after},
            **extra,
        }
        print(json.dumps(report), flush=True)
        return report

    def cold_start(self, timeout_s: float) -> dict:
        t0 = time.monotonic()
        curve = []
        for holder in self.holders:
            holder.start()
        for node in self.nodes:
            node.start()
        claimed_at = ready_at = None
        while time.monotonic() - t0 < timeout_s:
            time.sleep(0.5)
            claimed = count_claims(self.etcd, self.name)
            held, ready = self.held_ready()
            t = round(time.monotonic() - t0, 1)
            curve.append((t, claimed, ready))
            if claimed_at is None and claimed >= self.full:
                claimed_at = t
            holders_ready = ready >= sum(h.wanted for h in self.holders)
            if claimed_at is not None and holders_ready:
                ready_at = t
                break
        quarter = [next((t for t, c, _ in curve if c >= self.full * f), None) for f in (0.25, 0.5, 0.75)]
        return {
            "every_id_claimed_s": claimed_at,
            "holders_ready_s": ready_at,
            "claimed_quarter_half_three_quarters_s": quarter,
            "claimed_at_end": curve[-1][1] if curve else 0,
            "node_log": self.node_logs("claim_failed", "worker_id_unknown", "went back", "lease_exclusivity_lost"),
        }

    def wait_all_held(self, timeout_s: float) -> float | None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if count_claims(self.etcd, self.name) >= self.full:
                return round(time.monotonic() - t0, 1)
            time.sleep(0.25)
        return None

    def leader_change(self) -> dict:
        leader = self.etcd.leader()
        leader.kill()
        time.sleep(5)
        leader.start(state="existing")
        self.etcd.wait_healthy(30)
        time.sleep(15)
        return {"killed": leader.name}

    def member_restart(self) -> dict:
        leader = self.etcd.leader()
        follower = next(m for m in self.etcd.members if m is not leader)
        follower.stop()
        time.sleep(5)
        follower.start(state="existing")
        self.etcd.wait_healthy(30)
        time.sleep(15)
        return {"restarted": follower.name}

    def rolling_restart(self) -> dict:
        waits = []
        for holder in self.holders:
            holder.stop()
            holder.start()
            waits.append(self.wait_all_held(120))
        for node in self.nodes:
            node.stop(signal.SIGTERM, 30)  # releases what it holds
            node.close(10)
            node.start()
            waits.append(self.wait_all_held(120))
        done = [w for w in waits if w is not None]
        return {
            "restarted": len(waits),
            "back_to_full_s_median": sorted(done)[len(done) // 2] if done else None,
            "back_to_full_s_max": max(done) if done else None,
            "never_back": len(waits) - len(done),
        }

    def stop(self) -> None:
        for holder in self.holders:
            holder.stop()
        for node in self.nodes:
            node.close(30)

    def duplicates(self) -> tuple[int, int]:
        """(IDs minted by the holders, IDs issued twice among them)."""
        blocks = []
        for holder in self.holders:
            try:
                lines = (self.root / f"{holder.name}.minted").read_text().splitlines()
            except OSError:
                continue
            blocks += [tuple(map(int, line.split())) for line in lines]
        blocks.sort()
        total = sum(count for _, count in blocks)
        twice = sum(max(0, blocks[i][0] + blocks[i][1] - blocks[i + 1][0]) for i in range(len(blocks) - 1))
        return total, twice


def run_size(size: int, args) -> dict:
    from etcdharness import EtcdCluster

    root = Path(tempfile.mkdtemp(prefix=f"snowfence-fleet-{size}-"))
    cluster = EtcdCluster(root / "etcd", size=3).start()
    fleet = Fleet(root, size, args.nodes_per_region, cluster, args.holder_journal)
    results = {"size": size, "nodes": len(fleet.nodes), "holder_processes": len(fleet.holders), "phases": []}
    try:
        results["phases"].append(fleet.window("cold start", lambda: fleet.cold_start(args.cold_timeout_s)))
        results["phases"].append(fleet.window("steady", lambda: time.sleep(args.steady_s)))
        results["phases"].append(fleet.window("leader change", fleet.leader_change))
        results["phases"].append(fleet.window("member restart", fleet.member_restart))
        if not args.skip_rolling:
            results["phases"].append(fleet.window("rolling restart", fleet.rolling_restart))
    finally:
        fleet.stop()
        minted, twice = fleet.duplicates()
        results["minted"], results["issued_twice"] = minted, twice
        cluster.stop()
        if not args.keep:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
        else:
            results["dir"] = str(root)
    print(json.dumps({"size": size, "minted": results["minted"], "issued_twice": results["issued_twice"]}), flush=True)
    return results


def main() -> int:
    if sys.argv[1:2] == ["holder"]:
        return holder_main()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="128,256,512,1024", help="fleet sizes in worker IDs, multiples of 128")
    parser.add_argument("--nodes-per-region", type=int, default=2)
    parser.add_argument("--steady-s", type=float, default=60.0)
    parser.add_argument("--cold-timeout-s", type=float, default=300.0)
    parser.add_argument("--skip-rolling", action="store_true")
    parser.add_argument(
        "--holder-journal",
        action="store_true",
        help="holders keep a node's journal too (fsynced at every renewal: about half a holder's CPU; "
        "it is each node's own cost, which does not grow with the fleet)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs and figures directory")
    parser.add_argument("--out", help="write every figure as JSON here")
    args = parser.parse_args()
    every = [run_size(int(size), args) for size in args.sizes.split(",")]
    if args.out:
        Path(args.out).write_text(json.dumps(every, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
