"""Run the deterministic simulator for a time budget and report what it checked.

    python tests/sim/run.py --budget-s 60                  # what CI runs
    python tests/sim/run.py --budget-s 60 --mutant fence-from-reply
    python tests/sim/run.py --list-mutants
    python tests/sim/run.py --seed 1234 --schedules 1      # replay one schedule exactly
    python tests/sim/run.py --long                         # the long profile (10 minutes, longer schedules)

Schedule ``k`` of a run started with ``--seed N`` has seed ``N + k``; every
choice in it (cluster shape, timings, requests, faults, latencies) comes from
that seed, so ``--seed S --schedules 1`` (with the same ``--mutant``) replays a
failing schedule exactly. The run stops at the first violation. The last line
of output is one JSON object: schedules, faults, mints (blocks), ids,
violations, seed, and on a violation the failing seed and what broke.
Exit status: 0 clean, 1 a violation, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mutants  # noqa: E402
import sim  # noqa: E402


def _shm() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def work(job: int, jobs: int, args, deadline: float, stop, out) -> None:
    """One process's share: seeds seed+job, seed+job+jobs, ... until the deadline or a violation."""
    totals = {"schedules": 0, "faults": 0, "mints": 0, "ids": 0, "refused": 0, "claims": 0, "sim_s": 0.0}
    totals["partition_minting"] = totals["mixed"] = totals["region_refused"] = totals["home_refused"] = 0
    totals["watermarks"] = totals["watermark_advances"] = totals["watermark_schedules"] = 0
    totals["own_mints_etcd"] = totals["own_mints_embedded"] = totals["clock_refused"] = totals["node_halts"] = 0
    lags: list[int] = []
    kinds: dict[str, int] = {}
    fault_kinds: dict[str, int] = {}
    broker: dict[str, int] = {}
    failure = None
    mutant = mutants.BY_NAME[args.mutant] if args.mutant else None
    forced_kind = args.kind
    if forced_kind is None and mutant is not None and len(mutant.kinds) == 1:
        forced_kind = mutant.kinds[0]
    policy = mutant.extra.get("policy") if mutant is not None else None
    shm = _shm()
    k = job
    while not stop.is_set() and time.monotonic() < deadline:
        if args.schedules is not None and k >= args.schedules:
            break
        seed = args.seed + k
        k += jobs
        # A mutant's search runs the schedules its recorded seed was found in: without the
        # broker's own faults, which every other run has.
        result = sim.run_schedule(seed, shm, forced_kind, policy, long=args.long, broker_faults=mutant is None)
        totals["schedules"] += 1
        for key in ("faults", "mints", "ids", "refused", "claims", "sim_s"):
            totals[key] += result[key]
        kinds[result["kind"]] = kinds.get(result["kind"], 0) + 1
        totals["partition_minting"] += result["partition_minting"]
        totals["mixed"] += result["mixed"]
        totals["region_refused"] += result["region_refused"]
        totals["home_refused"] += result["home_refused"]
        totals["watermarks"] += result["watermarks"]
        totals["watermark_advances"] += result["watermark_advances"]
        totals["watermark_schedules"] += result["watermark_advances"] > 0
        totals[f"own_mints_{result['kind']}"] += result["own_mints"]
        totals["node_halts"] += result["node_halts"]
        totals["clock_refused"] += result["clock_refused"]
        lags += result["watermark_lags_ms"]
        for _, kind in result["fault_log"]:
            fault_kinds[kind] = fault_kinds.get(kind, 0) + 1
        for name, n in result["broker"].items():
            broker[name] = broker.get(name, 0) + n
        if result["violation"]:
            failure = result
            stop.set()
            break
    out.put((totals, kinds, fault_kinds, broker, failure, lags))


def _lag_summary(lags: list[int]) -> dict:
    if not lags:
        return {"watermark_lag_ms_p50": None, "watermark_lag_ms_p99": None, "watermark_lag_ms_max": None}
    lags.sort()
    return {
        "watermark_lag_ms_p50": lags[len(lags) // 2],
        "watermark_lag_ms_p99": lags[len(lags) * 99 // 100],
        "watermark_lag_ms_max": lags[-1],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=60.0, help="stop starting schedules after this long")
    parser.add_argument("--seed", type=int, default=1, help="seed of the first schedule")
    parser.add_argument("--schedules", type=int, help="run at most this many schedules")
    parser.add_argument("--mutant", help="run against the real code with this known-bad mutation")
    parser.add_argument("--list-mutants", action="store_true", help="list the mutants and exit")
    parser.add_argument("--kind", choices=["etcd", "embedded"], help="only schedules with this store")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes")
    parser.add_argument("--long", action="store_true", help="the long profile: longer schedules, 600 s budget")
    args = parser.parse_args()
    # The real code logs every lease lost, fence and refusal; thousands of
    # schedules would drown the one line that matters.
    logging.disable(logging.CRITICAL)
    if args.list_mutants:
        for m in mutants.MUTANTS:
            note = "" if m.available() else f"  [not available: {m.requires}]"
            print(f"{m.name:32} {'/'.join(m.kinds):15} {m.what}{note}")
        return 0
    if args.long and "--budget-s" not in sys.argv:
        args.budget_s = 600.0
    if args.mutant:
        if args.mutant not in mutants.BY_NAME:
            print(f"unknown mutant {args.mutant!r}; --list-mutants lists them", file=sys.stderr)
            return 2
        try:
            mutants.apply(mutants.BY_NAME[args.mutant])
        except mutants.StaleMutant as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    start = time.monotonic()
    deadline = start + args.budget_s
    ctx = multiprocessing.get_context("fork")  # the children inherit the mutated code
    stop = ctx.Event()
    out = ctx.Queue()
    jobs = max(1, args.jobs)
    if args.schedules is not None:
        jobs = min(jobs, args.schedules)
    procs = [ctx.Process(target=work, args=(j, jobs, args, deadline, stop, out), daemon=True) for j in range(jobs)]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    elapsed = time.monotonic() - start
    totals = {"schedules": 0, "faults": 0, "mints": 0, "ids": 0, "refused": 0, "claims": 0, "sim_s": 0.0}
    totals["partition_minting"] = totals["mixed"] = totals["region_refused"] = totals["home_refused"] = 0
    totals["watermarks"] = totals["watermark_advances"] = totals["watermark_schedules"] = 0
    totals["own_mints_etcd"] = totals["own_mints_embedded"] = totals["clock_refused"] = totals["node_halts"] = 0
    lags: list[int] = []
    kinds: dict[str, int] = {}
    fault_kinds: dict[str, int] = {}
    broker: dict[str, int] = {}
    failures = []
    for t, kd, fk, br, failure, lg in results:
        lags += lg
        for name, n in br.items():
            broker[name] = broker.get(name, 0) + n
        for key in totals:
            totals[key] += t[key]
        for name, n in kd.items():
            kinds[name] = kinds.get(name, 0) + n
        for name, n in fk.items():
            fault_kinds[name] = fault_kinds.get(name, 0) + n
        if failure:
            failures.append(failure)
    failures.sort(key=lambda f: f["seed"])
    summary = {
        "schedules": totals["schedules"],
        "faults": totals["faults"],
        "mints": totals["mints"],
        "ids": totals["ids"],
        "violations": len(failures),
        "seed": args.seed,
        "mutant": args.mutant,
        "elapsed_s": round(elapsed, 1),
        "jobs": jobs,
        "simulated_s": round(totals["sim_s"], 1),
        "refusals": totals["refused"],
        "claims": totals["claims"],
        "schedules_by_store": kinds,
        "schedules_minting_through_partitions": totals["partition_minting"],
        "schedules_with_mixed_flags": totals["mixed"],
        "second_cluster_refused": totals["region_refused"],
        "second_home_refused": totals["home_refused"],
        # The broker's own worker ID's mints by store (in etcd schedules its store is told the
        # clock verdict by the node's core, as in the service), how often a broker's verdict
        # refused claims, and how often a node's core said it had stopped (a halt).
        "own_mints_etcd": totals["own_mints_etcd"],
        "own_mints_embedded": totals["own_mints_embedded"],
        "clock_refusals": totals["clock_refused"],
        "node_halts": totals["node_halts"],
        "faults_by_kind": dict(sorted(fault_kinds.items())),
        "brokers": dict(sorted(broker.items())),
        # The watermark: WATERMARK replies checked against every later mint, how often the
        # highest answered rose, in how many schedules it rose, and how far each reply's W was
        # behind its node's wall clock.
        "watermarks": totals["watermarks"],
        "watermark_advances": totals["watermark_advances"],
        "schedules_with_watermark_advancing": totals["watermark_schedules"],
        **_lag_summary(lags),
    }
    if failures:
        f = failures[0]
        replay = (
            f"python tests/sim/run.py --seed {f['seed']} --schedules 1"
            + (f" --mutant {args.mutant}" if args.mutant else "")
            + (f" --kind {args.kind}" if args.kind else "")
        )  # a forced kind draws the schedule differently
        print(f"VIOLATION in schedule seed {f['seed']} ({f['kind']}): {f['violation']}")
        print("faults before it (simulated s, kind): " + ", ".join(f"{t:.3f} {k}" for t, k in f["fault_log"]))
        print(f"replay: {replay}")
        summary.update(failing_seed=f["seed"], violation=f["violation"], replay=replay)
    else:
        print(
            f"{totals['schedules']} schedules, {totals['faults']} faults, {totals['mints']} mints "
            f"({totals['ids']} IDs), no violation, in {elapsed:.1f} s"
        )
    print(json.dumps(summary))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
