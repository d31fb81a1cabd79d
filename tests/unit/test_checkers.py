"""Every checker the tests use as evidence, fed a planted violation: each must report it,
by name, and pass the same input without it. A checker that cannot fail proves nothing.

The checkers: ``tests/harness/checks.py`` (``check_blocks``, ``repeated_ids``,
``below_earlier``, which the integration tests run over every block their clients
received) and the fault run's ``check`` (``tests/chaos/chaos.py``: uniqueness, order
across owners in real time, the answering node's hold of the worker ID, the watermark),
here over recorder files written by hand. ``snowfence verify`` has its own in
``tests/unit/test_verify.py``; the simulator's invariants are tripped by its mutants
(``tests/sim/test_sim.py``). docs/ASSURANCE.md lists them all.
"""

from __future__ import annotations

import array
import json
import struct
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from checks import below_earlier, check_blocks, repeated_ids

from snowfence.ids import DEFAULT_LAYOUT, Layout

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chaos"))
import chaos  # noqa: E402

L = DEFAULT_LAYOUT
MS = 1_000_000  # a millisecond since the epoch, far from its ends


def block(ms: int, worker: int, seq: int = 0, count: int = 1, layout: Layout = L) -> tuple[int, int]:
    return layout.compose(ms, 0, worker, seq), count


# -- tests/harness/checks.py ------------------------------------------------------------------


def good_clients() -> list[list[tuple[int, int]]]:
    return [
        [block(MS, 1, 0, 10), block(MS, 1, 10, 5), block(MS + 1, 2, 0, 4096)],
        [block(MS, 2, 0, 7), block(MS + 2, 1, 0, 3)],
    ]


def test_check_blocks_passes_distinct_ordered_blocks_and_counts_them():
    assert check_blocks(good_clients()) == {"ids": 10 + 5 + 4096 + 7 + 3, "blocks": 5, "workers": 2}


def test_check_blocks_names_ids_issued_twice_across_clients():
    clients = good_clients()
    clients.append([block(MS, 1, 9, 2)])  # IDs 9 and 10 of worker 1 in MS: the first client had them
    with pytest.raises(AssertionError, match="IDs issued twice"):
        check_blocks(clients)


def test_check_blocks_names_a_block_of_one_worker_id_below_its_last_in_one_client():
    clients = good_clients()
    clients[1].append(block(MS + 1, 1, 0, 1))  # worker 1 went back from MS + 2 to MS + 1
    with pytest.raises(AssertionError, match="per-worker order broken"):
        check_blocks(clients)


def test_check_blocks_names_a_block_that_crosses_a_millisecond():
    first, _ = block(MS, 3, L.max_sequence)
    with pytest.raises(AssertionError, match="crosses a millisecond"):
        check_blocks([[(first, 2)]])


def test_check_blocks_names_a_block_that_crosses_a_worker_id():
    # The last sequence of worker 3's millisecond and the next ID, worker 4's first.
    first, _ = block(MS, 3, L.max_sequence)
    assert L.decompose(first + 1).worker == 4
    with pytest.raises(AssertionError, match="crosses a millisecond or a worker"):
        check_blocks([[(first, 2)]])


def test_repeated_ids_counts_each_id_issued_more_than_once_and_none_in_a_clean_set():
    assert repeated_ids(good_clients()) == 0
    clients = good_clients()
    clients[1].append(block(MS, 1, 8, 4))  # 8..11 of worker 1: 8 and 9 in one block, 10 and 11 in the next
    assert repeated_ids(clients) == 4
    clients[0].append(block(MS, 1, 0, 1))  # ID 0 a third time: counted once more
    assert repeated_ids(clients) == 5


def test_below_earlier_names_each_worker_id_that_went_at_or_below_an_earlier_id_of_its_own():
    before = [[block(MS, 1, 0, 10), block(MS, 2, 0, 5)]]
    assert below_earlier(before, [[block(MS + 1, 1), block(MS, 2, 5)]], L) == {}
    low1, _ = block(MS, 1, 9)  # the last ID worker 1 gave before: at, not above
    low2, _ = block(MS - 1, 2)  # a millisecond below
    got = below_earlier(before, [[block(MS, 1, 9), block(MS - 1, 2), block(MS - 5, 3)]], L)
    assert got == {1: (low1, L.compose(MS, 0, 1, 9)), 2: (low2, L.compose(MS, 0, 2, 4))}


# -- tests/chaos/chaos.py: check ----------------------------------------------------------------

CL = chaos.LAYOUT
SEC = 1_000_000_000


class Log:
    """A node whose JSON log says it held ``held`` worker IDs from 0 on, never released."""

    def __init__(self, held: list[int]) -> None:
        self.lines = [json.dumps({"event": "claimed", "worker_id": w, "pid": 100 + w, "mono_s": 0.0}) for w in held]

    def log(self) -> str:
        return "\n".join(self.lines)


def chaos_world(held_by_a=(1, 2), held_by_b=(3,)) -> SimpleNamespace:
    return SimpleNamespace(nodes={"a": Log(list(held_by_a)), "b": Log(list(held_by_b))}, kills=[], layout=CL)


def cid(ms: int, worker: int, seq: int = 0) -> int:
    return CL.compose(ms, 0, worker, seq)


def write_run(tmp_path: Path, rows, marks=()) -> list[Path]:
    """One recorder file: rows of (send_ns, recv_ns, node index, outcome, first, count) and
    watermark rows of (send_ns, recv_ns, node index, unix_ms, recv_wall_ms)."""
    out = tmp_path / "client-0.bin"
    out.write_bytes(array.array("q", [v for r in rows for v in r]).tobytes())
    Path(str(out) + ".wm").write_bytes(array.array("q", [v for m in marks for v in m]).tobytes())
    return [out]


def good_rows() -> list[tuple[int, ...]]:
    return [
        (1 * SEC, 1 * SEC + 10, 0, 0, cid(MS, 1), 100),
        (2 * SEC, 2 * SEC + 10, 0, 0, cid(MS + 5, 1), 100),
        (2 * SEC, 2 * SEC + 10, 0, 0, cid(MS + 5, 2), 10),
        (3 * SEC, 3 * SEC + 10, 1, 0, cid(MS + 6, 3), 1),
        (4 * SEC, 4 * SEC + 10, 1, 1, 0, 0),  # a timeout: no block
    ]


def watermark_at(ms: int, received_ns: int) -> tuple[int, ...]:
    return (received_ns - 5, received_ns, 0, CL.epoch_ms + ms, CL.epoch_ms + ms + 3)


def test_chaos_check_passes_a_clean_run_and_counts_it(tmp_path):
    v = chaos.check(chaos_world(), write_run(tmp_path, good_rows(), [watermark_at(MS + 2, SEC + 500)]), [])
    assert v.ok, v.violations
    assert (v.ids, v.blocks, v.calls, v.watermarks) == (211, 4, 4, 1)
    assert v.outcomes == {"ok": 3, "timeout": 1}


def test_chaos_check_names_ids_issued_twice(tmp_path):
    rows = good_rows() + [(5 * SEC, 5 * SEC + 10, 0, 0, cid(MS + 5, 2, 9), 1)]
    v = chaos.check(chaos_world(), write_run(tmp_path, rows), [])
    assert [x for x in v.violations if x.startswith("duplicate IDs")], v.violations


def test_chaos_check_names_a_block_not_above_one_acknowledged_before_it_was_asked_for(tmp_path):
    # Worker 1 answered MS + 5 at 2 s; a call sent at 5 s gets MS + 4 (no ID repeated).
    rows = good_rows() + [(5 * SEC, 5 * SEC + 10, 0, 0, cid(MS + 4, 1), 1)]
    v = chaos.check(chaos_world(), write_run(tmp_path, rows), [])
    assert v.violations == [
        f"worker ID 1: block {cid(MS + 4, 1)} (sent {5 * SEC}) is not above {cid(MS + 5, 1, 99)}, "
        "acknowledged before it was asked for"
    ]


def test_chaos_check_lets_calls_in_flight_together_answer_in_any_order(tmp_path):
    # Sent before the other was acknowledged: no real-time order between them.
    rows = [(1 * SEC, 3 * SEC, 0, 0, cid(MS + 5, 1), 1), (2 * SEC, 2 * SEC + 10, 0, 0, cid(MS + 4, 1), 1)]
    assert chaos.check(chaos_world(), write_run(tmp_path, rows), []).ok


def test_chaos_check_names_a_node_that_answered_with_a_worker_id_it_did_not_hold(tmp_path):
    rows = good_rows() + [(5 * SEC, 5 * SEC + 10, 1, 0, cid(MS + 9, 1), 1)]  # b answers with a's worker ID 1
    v = chaos.check(chaos_world(), write_run(tmp_path, rows), [])
    assert v.violations == [f"b answered with worker ID 1 at {5 * SEC}-{5 * SEC + 10} ns without holding it"]


def test_chaos_check_names_a_worker_id_answered_after_its_release(tmp_path):
    w = chaos_world()
    w.nodes["a"].lines.append(json.dumps({"event": "released", "worker_id": 2, "pid": 102, "mono_s": 2.5}))
    rows = good_rows() + [(5 * SEC, 5 * SEC + 10, 0, 0, cid(MS + 9, 2), 1)]
    v = chaos.check(w, write_run(tmp_path, rows), [])
    assert v.violations == [f"a answered with worker ID 2 at {5 * SEC}-{5 * SEC + 10} ns without holding it"]


def test_chaos_check_ends_a_hold_when_the_worker_exits_or_the_node_is_killed(tmp_path):
    # a's worker holding worker ID 1 (pid 101) exited at 2.5 s, as its broker logged; node b
    # was killed at 2.5 s. Blocks of either answered at 5 s were minted without a hold.
    w = chaos_world()
    exited = {"event": "worker_exited", "pid": 1, "mono_s": 2.5, "fields": {"pid": 101}}
    w.nodes["a"].lines.append(json.dumps(exited))
    w.kills.append(("b", 2 * SEC + SEC // 2))
    rows = good_rows()[:3] + [
        (5 * SEC, 5 * SEC + 10, 0, 0, cid(MS + 9, 1), 1),
        (5 * SEC, 5 * SEC + 10, 0, 0, cid(MS + 9, 2), 1),  # worker ID 2, pid 102: still held
        (5 * SEC, 5 * SEC + 10, 1, 0, cid(MS + 9, 3), 1),
    ]
    v = chaos.check(w, write_run(tmp_path, rows), [])
    assert v.violations == [
        f"a answered with worker ID 1 at {5 * SEC}-{5 * SEC + 10} ns without holding it",
        f"b answered with worker ID 3 at {5 * SEC}-{5 * SEC + 10} ns without holding it",
    ]


def test_chaos_check_names_a_block_asked_for_after_a_watermark_and_below_it(tmp_path):
    # a answered watermark MS + 6 at 2.5 s; a block of MS + 5 asked for at 3 s is below it,
    # the same block asked for at 2 s (before the reply) is not.
    rows = good_rows()[:3] + [(3 * SEC, 3 * SEC + 10, 1, 0, cid(MS + 5, 3), 1)]
    v = chaos.check(chaos_world(), write_run(tmp_path, rows, [watermark_at(MS + 6, 2 * SEC + SEC // 2)]), [])
    assert len(v.violations) == 1, v.violations
    assert v.violations[0].startswith(f"block {cid(MS + 5, 3)} from b (sent {3 * SEC}) carries ")
    assert f"below the watermark {CL.epoch_ms + MS + 6} ms that a answered at {2 * SEC + SEC // 2}" in v.violations[0]


# -- tests/sim/sim.py: the simulator's Checker.mint -------------------------------------------
#
# Its mutants prove the invariants a broken guard of the real code reaches; these plant
# each violation straight into the check a mint goes through, the shape checks (an empty
# block, one crossing a millisecond or a worker ID, one of another worker ID) among them.

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sim"))
import sim  # noqa: E402

SIM_MARK = MS + 100  # the persisted mark of every worker ID


def sim_checker(region: int = 0) -> sim.Checker:
    world = SimpleNamespace(
        layout=L,
        kind="embedded",
        region=region,
        config=SimpleNamespace(cluster="c"),
        persisted_mark=lambda wid: SIM_MARK,
    )
    return sim.Checker(world)


def holder(worker: int = 1, owner: int = 1) -> tuple[SimpleNamespace, SimpleNamespace]:
    p = SimpleNamespace(config=SimpleNamespace(cluster="c"))
    return p, SimpleNamespace(lease=SimpleNamespace(worker_id=worker, token=10 * owner), owner=owner)


def sim_mint(checker, ms, seq=0, count=1, worker=1, owner=1, minted_by=None, region=0, stale=None):
    p, h = holder(minted_by if minted_by is not None else worker, owner)
    checker.mint(p, h, stale, L.compose(ms, region, worker, seq), count)


def test_the_simulators_checker_passes_ordered_blocks_of_successive_owners():
    c = sim_checker()
    sim_mint(c, MS, 0, 10)
    sim_mint(c, MS, 10, 10)
    sim_mint(c, MS + 1, 0, 5, owner=2)
    sim_mint(c, MS, 0, 4096, worker=2)
    assert (c.mints, c.ids, c.max_ms) == (4, 4121, {1: MS + 1, 2: MS})


@pytest.mark.parametrize(
    "plant, named",
    [
        (lambda c: sim_mint(c, MS, 0, 0), "worker ID 1 minted an empty block"),
        (lambda c: sim_mint(c, MS, 0, 1, worker=2, minted_by=1), "worker ID 1 minted ID .* of worker ID 2 region 0"),
        (lambda c: sim_mint(c, MS, 0, 1, region=1), "worker ID 1 minted ID .* of worker ID 1 region 1"),
        (lambda c: sim_mint(c, MS, 0, 1, stale=("fenced owner minted", "late")), "fenced owner minted: worker ID 1"),
        (lambda c: sim_mint(c, SIM_MARK + 1), f"minted millisecond {SIM_MARK + 1} above the persisted mark"),
        (lambda c: [sim_mint(c, MS, 0, 10), sim_mint(c, MS, 9, 1, owner=2)], "ID issued twice: worker ID 1"),
        (lambda c: [sim_mint(c, MS, 10), sim_mint(c, MS, 5)], "is not above the owner's last ID"),
        (lambda c: [sim_mint(c, MS + 5), sim_mint(c, MS + 3, owner=2)], "not above the previous owner 1's ID"),
        (lambda c: [sim_mint(c, MS + 5, owner=2), sim_mint(c, MS + 6)], "not below the next owner 2's ID"),
    ],
    ids=[
        "empty",
        "other-worker",
        "other-region",
        "stale-owner",
        "above-mark",
        "issued-twice",
        "owner-back",
        "below-previous-owner",
        "above-next-owner",
    ],
)
def test_the_simulators_checker_names_each_planted_violation(plant, named):
    with pytest.raises(sim.Violation, match=named):
        plant(sim_checker())


def test_the_simulators_checker_names_a_mint_below_a_watermark_answered_before():
    c = sim_checker()
    c.watermark_ms, c.watermark_by = MS + 1, (0, 2.5)
    sim_mint(c, MS + 1)
    with pytest.raises(sim.Violation, match=f"minted millisecond {MS} below the watermark {MS + 1} node n0"):
        sim_mint(c, MS, 1)


def test_the_simulators_checker_names_a_block_that_crosses_a_millisecond():
    c = sim_checker(region=L.max_region)
    with pytest.raises(sim.Violation, match="crosses a millisecond"):
        sim_mint(c, MS, L.max_sequence, 2, worker=L.max_worker, region=L.max_region)


def test_the_simulators_checker_names_a_block_that_runs_into_the_next_worker_ids():
    # The last ID of worker 1's millisecond and the first of worker 2's: one millisecond,
    # but worker 2's IDs, which no check keyed by worker 1 would see issued twice.
    c = sim_checker()
    sim_mint(c, MS, 0, 1, worker=2)
    with pytest.raises(sim.Violation, match="crosses a worker ID"):
        sim_mint(c, MS, L.max_sequence, 2)


# -- tests/conformance/sfwire.py: the conformance suite's watermark check ---------------------

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
import sfwire  # noqa: E402

WL = sfwire.Layout(L.epoch_ms, L.time_bits, L.region_bits, L.worker_bits, L.sequence_bits)
WS = sfwire.Layout(L.epoch_ms, L.time_bits - 2, L.region_bits, L.worker_bits, L.sequence_bits, shard_bits=2)
W_MS = L.epoch_ms + MS  # the watermark, unix ms


def test_the_conformance_watermark_check_passes_a_kept_promise():
    lowest = WL.compose(0, W_MS, 0, 0)
    assert lowest == (W_MS - L.epoch_ms) << L.time_shift
    later = [WL.compose(0, W_MS, 0, 3), WL.compose(0, W_MS + 9, 1, 0)]
    assert sfwire.watermark_breaches(WL, W_MS, lowest, later) == []
    # Shards: an ID of shard 3 at the watermark's millisecond keeps it too.
    assert sfwire.watermark_breaches(WS, W_MS, WS.compose(0, W_MS, 0, 0), [WS.compose(3, W_MS, 0, 1)]) == []


def test_the_conformance_watermark_check_names_an_id_below_the_watermark():
    lowest = WL.compose(0, W_MS, 0, 0)
    below = WL.compose(0, W_MS - 1, 0, 7)
    assert sfwire.watermark_breaches(WL, W_MS, lowest, [WL.compose(0, W_MS, 0, 3), below]) == [
        f"ID {below} ({W_MS - 1} ms) reserved after the watermark {W_MS} ms (lowest {lowest}) is below it"
    ]


def test_the_conformance_watermark_check_names_an_id_of_a_higher_shard_from_an_earlier_millisecond():
    # Above lowest (its shard bits are higher), yet minted a millisecond before the watermark.
    lowest = WS.compose(0, W_MS, 0, 0)
    early = WS.compose(2, W_MS - 1, 0, 0)
    assert early > lowest
    assert sfwire.watermark_breaches(WS, W_MS, lowest, [early]) == [
        f"ID {early} ({W_MS - 1} ms) reserved after the watermark {W_MS} ms (lowest {lowest}) is below it"
    ]


def test_the_conformance_watermark_check_names_a_lowest_that_is_not_the_watermarks_first_id():
    wrong = WL.compose(0, W_MS - 5, 0, 0)  # a lowest this low would let IDs below the watermark through
    (line,) = sfwire.watermark_breaches(WL, W_MS, wrong, [])
    assert line.startswith(f"lowest {wrong} is not the first ID of {W_MS} ms")


# -- the conformance suite's block and ID checks ----------------------------------------------

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
import test_conformance_reserve as conf_reserve  # noqa: E402
import test_driven_clients as conf_driven  # noqa: E402


def now_ms() -> int:
    return int(time.time() * 1000)


def block_reply(first: int, count: int, request_id: int = 7) -> sfwire.Reply:
    return sfwire.Reply(1, sfwire.BLOCK, 0, request_id, struct.pack("!QI", first, count))


def test_the_conformance_block_check_passes_a_block_the_document_allows():
    first = WL.compose(0, now_ms(), 0, 2, 10)
    assert conf_reserve.check_block(block_reply(first, 100), 7, 100, WL, {1, 2}) == (first, 100)


@pytest.mark.parametrize(
    "reply, named",
    [
        (lambda f: block_reply(f, 101), "count 101 outside 1..100"),
        (lambda f: block_reply(f, 1, request_id=8), "request_id=8"),
        (lambda f: block_reply(WL.compose(0, now_ms(), 0, 5), 1), r"worker 5 not in the status list \[1, 2\]"),
        (lambda f: block_reply(f | 1 << 63, 1), "bit 63 of"),
        (lambda f: block_reply(WL.compose(0, now_ms(), 0, 2, L.max_sequence), 2), "Decoded"),
        (lambda f: block_reply(WL.compose(0, now_ms() - 3_600_000, 0, 2), 1), "layout/byte order"),
    ],
    ids=["count", "request-id", "worker-not-held", "bit-63", "crosses-a-worker-id", "far-from-now"],
)
def test_the_conformance_block_check_names_each_planted_violation(reply, named):
    with pytest.raises(AssertionError, match=named):
        conf_reserve.check_block(reply(WL.compose(0, now_ms(), 0, 2)), 7, 100, WL, {1, 2})


def test_the_conformance_disjointness_check_names_an_id_granted_twice():
    conf_reserve.assert_disjoint([(100, 10), (110, 5), (0, 100)])
    with pytest.raises(AssertionError, match=r"block \(109, 2\) overlaps \(100, 10\): an ID was granted twice"):
        conf_reserve.assert_disjoint([(100, 10), (109, 2)])


def driven_status() -> dict:
    return {"region": 0, "layout": WL.__dict__ | {"shard_bits": 0}, "workers": []}


def test_the_driven_clients_id_check_names_a_duplicate_and_an_id_of_a_worker_id_not_held(monkeypatch):
    monkeypatch.setattr(sfwire, "held_worker_ids", lambda status: {1, 2})
    ids = [str(WL.compose(0, now_ms(), 0, 1, s)) for s in range(3)]
    assert conf_driven.check_ids(ids, 3, driven_status()) == [int(i) for i in ids]
    with pytest.raises(AssertionError, match="IDs are distinct"):
        conf_driven.check_ids(ids[:2] + ids[:1], 3, driven_status())
    with pytest.raises(AssertionError, match="worker=5"):
        conf_driven.check_ids(ids[:2] + [str(WL.compose(0, now_ms(), 0, 5))], 3, driven_status())
