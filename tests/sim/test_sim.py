"""The simulator in CI: the real code is clean over its schedules, every known-bad
mutation of it is caught (and its failing schedule replays exactly), and a
mutation that no longer matches the code fails loudly instead of testing nothing.

Each run is ``python tests/sim/run.py`` in its own process, the command a person
runs by hand; mutant runs stop at their first violation.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from snowfence.errors import Fenced

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import mutants  # noqa: E402
import sim  # noqa: E402

#: The clean run: how many schedules CI runs against the real code (see docs/RELIABILITY.md),
#: a count rather than a time, so that a loaded machine covers what a quiet one does (every
#: fault kind, both stores); the time is only a bound on a run that hangs.
CLEAN_SCHEDULES = 40
#: A mutant must be caught within this many schedules of its search's start.
MUTANT_SCHEDULES = 20
#: The bound on either run's time, however loaded the machine.
RUN_BOUND_S = 300


def run(*args: str, timeout_s: float) -> tuple[int, str, dict]:
    proc = subprocess.run(
        [sys.executable, str(HERE / "run.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output; stderr: {proc.stderr[-2000:]}"
    return proc.returncode, proc.stdout, json.loads(lines[-1])


def test_the_real_code_shows_no_violation_in_the_ci_budget():
    code, out, summary = run(
        "--schedules", str(CLEAN_SCHEDULES), "--budget-s", str(RUN_BOUND_S), "--seed", "1", timeout_s=RUN_BOUND_S + 120
    )
    print(out)
    assert code == 0 and summary["violations"] == 0, out
    for key in ("schedules", "faults", "mints", "violations", "seed"):
        assert key in summary
    # What the schedules covered: both stores, every kind of fault.
    assert set(summary["schedules_by_store"]) == {"etcd", "embedded"}
    assert summary["schedules_minting_through_partitions"] > 0
    kinds = {"journal_lost", sim.LATE_HOST} | sim.COMBINED_FAULTS | set(sim.WATERMARK_FAULTS) | set(sim.BROKER_FAULTS)
    for kind in ("etcd", "embedded"):
        kinds |= set(sim.FAULT_KINDS[kind]) | set(sim.STORE_FAULT_KINDS[kind])
    assert set(summary["faults_by_kind"]) == kinds, kinds - set(summary["faults_by_kind"])
    assert summary["mints"] > 0 and summary["refusals"] > 0 and summary["claims"] > summary["schedules"]
    # The heterogeneous cluster: hosts with flags of their own, and a second cluster refused.
    assert summary["schedules_with_mixed_flags"] > 0 and summary["second_cluster_refused"] > 0
    assert summary["second_home_refused"] > 0
    # The clock verdict: brokers refused claims on clocks no majority vouched for (the late
    # host's, steps). Per store, the broker's own worker ID minted: in etcd schedules only
    # once the node's core hands it the verdict (a store never told stays pending and never
    # claims), in embedded ones with no verdict to wait for. A node's core said it had
    # stopped (the supervisor's halt) and the node started again.
    assert summary["clock_refusals"] > 0
    assert summary["own_mints_etcd"] > 0 and summary["own_mints_embedded"] > 0
    assert summary["node_halts"] > 0
    # The watermark: promised, checked against every later mint, and advancing with time
    # (one that never advanced would pass the checker trivially), a few seconds behind the
    # wall clock at the median (the skew bound and the floors' renewal interval).
    assert summary["watermarks"] > 100 and summary["watermark_advances"] > summary["schedules"]
    assert summary["schedules_with_watermark_advancing"] > summary["schedules"] // 4
    assert 0 < summary["watermark_lag_ms_p50"] < 10_000


#: Where each mutant's search starts: the seed that last caught it, searching from seed 1
#: (docs/RELIABILITY.md has the table). The search is deterministic, so from seed 1 it
#: would find the same schedule, only later (fence-from-reply after about 1,300 schedules);
#: when the simulator draws differently, the search goes on from there for MUTANT_SCHEDULES
#: schedules, and a mutant not caught within them fails the test.
SEARCH_FROM = {
    "mark-wait": 486,
    "reserve-before-confirm": 39,
    "fence-from-reply": 373,
    "release-below-last-used-etcd": 14,
    "release-below-last-used-embedded": 1,
    "hlc-past-reservation": 6,
    "unguarded-mark-write": 497,
    "unguarded-release": 70,
    "no-fence-check": 1,
    "sequence-restart": 1,
    "refusal-commits": 1,
    "lease-lost-not-fenced": 28,
    "embedded-lock-not-rechecked": 2,
    "renewal-confirms-lease-only": 70,
    "dropped-id-left-in-rotation": 32,
    "refusal-left-in-rotation": 1,
    "claim-backoff-skipped": 8,
    "release-to-claimed-mark": 1,
    "causal-token-ignored": 14,
    "retry-to-refuser": 43,
    "silent-worker-in-rotation": 499,
    "no-overload-bound": 1,
    "credits-ignored": 1,
    "regions-not-claimed": 55,
    "new-embedded-store-no-wait": 221,
    "second-home-admitted": 4,
    "journal-floor-ignored": 113,
    "own-minter-may-wait": 28,
    "own-never-gives-back": 113,
    "intake-token-as-plain": 129,
    "supervisor-never-kills": 38,
    "supervisor-restarts-boot-errors": 1,
    "loop-turn-deaf": 1,
    "claim-ignores-watermark": 28,
    "floor-above-last-minted": 321,
    "clock-vouched-unheard": 87,
    "claims-before-verdict": 1,
    "verdict-followed-once": 1,
    "membership-read-as-complete": 4,
}


@pytest.mark.parametrize("name", [m.name for m in mutants.MUTANTS])
def test_each_known_bad_mutation_is_caught_and_its_schedule_replays(name):
    mutant = mutants.BY_NAME[name]
    assert mutant.available(), f"{name}: {mutant.requires} is missing from the code"
    start = str(SEARCH_FROM.get(name, 1))
    code, out, summary = run(
        *("--seed", start, "--schedules", str(MUTANT_SCHEDULES), "--budget-s", str(RUN_BOUND_S), "--mutant", name),
        timeout_s=RUN_BOUND_S + 120,
    )
    print(out)
    assert code == 1 and summary["violations"] >= 1, f"mutant {name} was not caught:\n{out}"
    seed = summary["failing_seed"]
    print(f"mutant {name}: caught in schedule seed {seed}: {summary['violation']}")
    # The printed replay command reproduces exactly that violation, alone.
    _, again_out, again = run(*summary["replay"].split()[2:], timeout_s=120)
    assert again["violations"] == 1 and again["failing_seed"] == seed, again_out
    assert again["violation"] == summary["violation"]


#: What the service runs and the simulator must run too: a mutant of each is caught by
#: the simulator (test_each_known_bad_mutation_is_caught_...), which proves the simulator
#: runs that very code and not a copy of it.
SERVICE_STEPS = {
    "snowfence.broker.routing:Routing.requests": "the intake the ZeroMQ frontend and the fast port call",
    "snowfence.workers.core:WorkerCore.turn": "a turn of the worker process's loop",
    "snowfence.workers.keeper:Keeper.step": "a turn of the keeper's thread",
    "snowfence.broker.routing:Routing.tick": "the routing core's timers, every HOUSEKEEPING_NS",
    "snowfence.broker.own:OwnWorkerId.__init__": "the broker's own worker ID's minter",
    "snowfence.broker.own:spare_rule": "the broker's own worker ID's give-back",
    "snowfence.broker.supervisor:Supervisor.watch_silence": "the supervisor's kill of a silent worker",
    "snowfence.broker.supervisor:Supervisor.reap": "the supervisor's halt on a boot error",
    "snowfence.broker.nodecore:NodeCore.housekeeping": "the broker's timers and the clock verdict's hand-off",
    "snowfence.broker.nodecore:NodeCore.follow_membership": "the membership's turn: which peers are measured",
}


def test_a_mutant_of_every_step_the_service_runs_is_in_the_list():
    targets = {edit.target for m in mutants.MUTANTS for edit in m.edits}
    missing = {t: why for t, why in SERVICE_STEPS.items() if t not in targets}
    assert not missing, missing


def test_there_are_at_least_ten_mutants_and_the_list_command_names_them():
    proc = subprocess.run(
        [sys.executable, str(HERE / "run.py"), "--list-mutants"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0
    listed = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    assert listed == [m.name for m in mutants.MUTANTS] and len(listed) >= 10


def test_a_schedule_replays_exactly():
    _, _, first = run("--seed", "40", "--schedules", "4", "--jobs", "1", timeout_s=120)
    _, _, second = run("--seed", "40", "--schedules", "4", "--jobs", "1", timeout_s=120)
    first.pop("elapsed_s")
    second.pop("elapsed_s")
    assert first == second and first["schedules"] == 4


def test_a_mutation_that_no_longer_matches_the_code_fails_loudly_and_changes_nothing():
    from snowfence.workers.minter import Minter

    before = Minter.reserve, Minter.start_after
    stale = mutants.Mutant(
        "stale",
        "two edits, the second of which matches nothing",
        (
            mutants.Edit("snowfence.workers.minter:Minter.start_after", "if mark_ms >= self.last_ms:", "if False:"),
            mutants.Edit("snowfence.workers.minter:Minter.reserve", "this text is not in reserve", "x"),
        ),
    )
    with pytest.raises(mutants.StaleMutant, match="update tests/sim/mutants.py"):
        mutants.apply(stale)
    assert (Minter.reserve, Minter.start_after) == before


# -- regression scenarios: what a seed once found, scripted so it keeps its meaning ------


def _ready_world(kind: str):
    """A world of one process that holds one ready worker ID, with no random faults."""
    world = sim.World(11, kind=kind, policy="wait")
    p = world.procs[0]
    world.procs = [p]
    p.node.procs = [p]
    world.nodes = [p.node]
    p.config = world.config = sim.Config(**{**world.config_kwargs, "ids_per_worker": 1})
    world.request_gap_ns = 10**12  # requests only when the test makes them
    world.last_ids = []
    world.request_id = 0
    world.counts.update(refused=0, claims=0)
    world.start(p)
    world.at(world.T + 1, None, p.node.broker.tick)  # the broker's loop, with no clients
    for _ in range(400):
        world.run_until(world.T + 50 * sim.MS)
        if p.core.ready:
            return world, p, p.core.ready[0]
    raise AssertionError("the process never became ready")


def _mint_now(world, p):
    """One request from the process's loop, as the simulator makes them (no timer turn after)."""
    p.core.state_dirty, p.core.next_turn_ns = False, p.node.clock.mono() + 10**12
    world.current = p.loop
    try:
        world.work_now(p)
    finally:
        world.current = None


def test_a_mint_paused_after_its_checks_while_its_lock_file_is_removed_is_judged_when_it_started():
    # Seeds 20261746 and 3000387 (embedded): a mint passed its fence check, its
    # process was paused inside the call (before the wall-clock read), the lock
    # file was removed and the keeper found the lease lost before the mint
    # returned. The checker judged that mint by the state at its end and called
    # it stale; what it minted lies inside the reservation it had, which any next
    # owner waits out. A mint that starts after the loss is refused by the minter.
    try:
        world, p, h = _ready_world("embedded")
        wid = h.lease.worker_id
        mints = world.checker.mints
        # Longer than a keep-alive interval, shorter than the reservation window.
        cfg = world.config
        p.pause_in_call = int((cfg.keepalive_interval_s + cfg.reservation_window_s) / 2 * sim.NS)
        lock = Path(world.tmp) / "regions" / str(world.region) / f"worker-{wid}.lock"
        world.at(world.T + sim.NS, None, lambda: (lock.unlink(), setattr(h.keeper, "doomed", True)))
        _mint_now(world, p)
        assert world.checker.mints == mints + 1  # it minted, and that is no violation
        assert h.keeper.lost is not None and "lock file" in str(h.keeper.lost)
        before = (h.minter.last_ms, h.minter.seq)
        p.request_id += 1  # the next request
        with pytest.raises(Fenced):
            h.minter.reserve(1)  # the next call, started after the loss, is refused
        assert (h.minter.last_ms, h.minter.seq) == before
    finally:
        world.close()


def test_a_renewal_that_succeeds_after_the_lock_file_was_removed_is_a_violation():
    # The other half of the judgement: a check that misses the removal is caught
    # at the next mint (the embedded-lock-not-rechecked mutant, scripted).
    try:
        world, p, h = _ready_world("embedded")
        h.keeper.lease.check = lambda: None  # the holder no longer re-checks its lock
        lock = Path(world.tmp) / "regions" / str(world.region) / f"worker-{h.lease.worker_id}.lock"
        lock.unlink()
        h.keeper.doomed = True
        world.run_until(world.T + 3 * sim.NS)  # keep-alives run, and succeed
        with pytest.raises(sim.Violation, match="a renewal of its lease succeeded since"):
            for _ in range(50):
                _mint_now(world, p)
                world.run_until(world.T + 10 * sim.MS)
    finally:
        world.close()


def _two_node_world():
    """Two hosts of one process each (holding one worker ID when started), no random faults;
    both brokers judge their clocks against each other's."""
    import dataclasses

    seed = 12
    world = sim.World(seed, kind="etcd", policy="wait")
    while world.mixed:  # the same flags on both hosts
        world.close()
        seed += 1
        world = sim.World(seed, kind="etcd", policy="wait")
    world.nodes = world.nodes[:2]
    world.procs = []
    for node in world.nodes:
        p = node.procs[0]
        p.config = dataclasses.replace(p.config, ids_per_worker=1)
        node.procs = [p]
        world.procs.append(p)
        node.clock.set_drift(0)
        node.clock.off += world.nodes[0].clock.wall() - node.clock.wall()  # the same time, to start with
        world.at(world.T + 1, None, node.broker.tick)
    world.request_gap_ns = 10**12
    world.last_ids = []
    world.request_id = 0
    world.counts.update(refused=0, claims=0)
    return world


def test_a_restore_no_journal_saw_and_a_clock_behind_by_more_than_the_bound_claim_nothing():
    # Seed 463196533483 (etcd, two hosts): etcd was restored from a snapshot taken before
    # host 0's last claims, and host 1, whose journal had seen none of them, had stepped its
    # clock back by more than the skew bound; its claim took the restored mark, which looked
    # current, and minted below what host 0 had minted. Only the clock bound guards that
    # claim, and with two hosts nobody can tell which clock is wrong: neither claims.
    try:
        world = _two_node_world()
        p0, p1 = world.procs
        window_ns = world.window_ms * sim.MS
        world.start(p0)
        for _ in range(200):
            world.run_until(world.T + 50 * sim.MS)
            if p0.core.ready:
                break
        assert p0.core.ready, "host 0 never became ready"
        snapshot = world.etcd.snapshot()
        end = world.T + 2 * window_ns  # host 0 mints on, its mark moving past the snapshot's
        while world.T < end:
            p0.node.broker.send(sim.CONNECTIONS[0])
            world.run_until(world.T + 100 * sim.MS)
        wid = p0.core.ready[0].lease.worker_id
        minted = world.checker.max_ms[wid]
        assert minted > sim.orjson.loads(snapshot[1][f"/snowfence/sim/marks/1/{wid}"].value)["reserved_until_ms"]
        world.crash(p0)
        # etcdutl snapshot restore: the cluster down for the window and the skew bound.
        for m in range(sim.EtcdServer.MEMBERS):
            world.etcd.member_down(m)
        down = window_ns + world.config.max_clock_skew_ms * sim.MS + sim.NS
        world.run_until(world.T + down)
        world._restored(snapshot, 0)
        for other in range(world.layout.max_worker + 1):  # the other worker IDs are held elsewhere
            if other != wid:
                world.etcd.put_key(f"/snowfence/sim/workers/1/{other}", b'{"holder": "elsewhere"}')
        key = f"/snowfence/sim/workers/1/{wid}"
        for _ in range(600):  # the restore renewed host 0's lease: it lapses
            world.run_until(world.T + 100 * sim.MS)
            world.etcd.expire()
            if key not in world.etcd.kv:
                break
        assert key not in world.etcd.kv
        # Host 1's clock set between the restored mark and what host 0 minted last (as
        # host 1 starts, two peer rounds from now): far behind host 0's.
        wanted = (minted + world.layout.epoch_ms) * sim.MS - window_ns // 2 - 2 * sim.NS
        p1.node.clock.off += wanted - p1.node.clock.wall()
        world.run_until(world.T + 2 * sim.NS)  # its broker has judged the clocks
        world.start(p1)
        for _ in range(100):
            world.run_until(world.T + 100 * sim.MS)
            p1.node.broker.send(sim.CONNECTIONS[0])
        assert not p1.core.held, "host 1 claimed a worker ID on a clock nobody vouches for"
        assert "until the clock is vouched for" in p1.core.reason
        assert world.checker.max_ms[wid] == minted  # nothing minted since, below or above
    finally:
        world.close()


#: Seeds whose schedule once showed a violation (kept: a seed that fails in CI is added here).
#: A seed's schedule changes whenever the simulator draws differently (the broker's
#: routing core joined it), so what each once found is also a scripted test above; the
#: seed stays as one more schedule, which must be clean and must have been exercised.
KEPT_SEEDS = [
    (20261746, None),
    # A second home let in while the first node was down between a stop and its start (the
    # first node's start, refused then, is not modelled): the fault waits for the node now.
    (680120256489, "embedded"),
    (3000387, "embedded"),
    (7104997, "embedded"),
    (7314336, "embedded"),
    (7733357, "embedded"),
    (7210280, "etcd"),
    (7316429, "etcd"),
    # An older mark put back (etcdctl put) was read as the floor by a node that had not seen the
    # later one (test_etcd_store.py::test_an_older_mark_put_back_by_hand_is_passed_over_...).
    (106634822, None),
    # An etcd restore no journal of host 1 saw, and host 1's clock stepped back past the bound,
    # on a cluster of two (test_a_restore_no_journal_saw_and_a_clock_behind_...).
    (463196533483, "etcd"),
]
#: Each CI run also tries seeds no run tried before, for this long.
NEW_SEEDS_BUDGET_S = 10


@pytest.mark.parametrize("seed,kind", KEPT_SEEDS)
def test_seeds_that_once_found_a_violation_stay_clean(seed, kind):
    result = sim.run_schedule(seed, kind=kind)
    assert result["violation"] is None and result["faults"] > 0, result
    assert result["mints"] > 0 or result["broker"].get("requests", 0) > 0, result


def test_seeds_no_run_tried_before_show_no_violation():
    """Coverage grows run by run: a first seed drawn from the time (or SNOWFENCE_SIM_SEED),
    printed, so that a failure here is replayed and its seed kept in KEPT_SEEDS."""
    import os
    import time

    seed = int(os.environ.get("SNOWFENCE_SIM_SEED") or (time.time_ns() // 1000) % 10**12 + 10**9)
    print(f"new seeds from {seed}: python tests/sim/run.py --seed {seed} --budget-s {NEW_SEEDS_BUDGET_S}")
    code, out, summary = run(
        "--budget-s", str(NEW_SEEDS_BUDGET_S), "--seed", str(seed), timeout_s=NEW_SEEDS_BUDGET_S + 120
    )
    print(out)
    assert summary["schedules"] > 0
    assert code == 0 and summary["violations"] == 0, (
        f"a new seed found a violation: replay with `{summary.get('replay')}`, fix it, and keep "
        f"({summary.get('failing_seed')}, kind) in KEPT_SEEDS\n{out}"
    )
