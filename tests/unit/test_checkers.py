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
import sys
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


def test_chaos_check_names_a_block_asked_for_after_a_watermark_and_below_it(tmp_path):
    # a answered watermark MS + 6 at 2.5 s; a block of MS + 5 asked for at 3 s is below it,
    # the same block asked for at 2 s (before the reply) is not.
    rows = good_rows()[:3] + [(3 * SEC, 3 * SEC + 10, 1, 0, cid(MS + 5, 3), 1)]
    v = chaos.check(chaos_world(), write_run(tmp_path, rows, [watermark_at(MS + 6, 2 * SEC + SEC // 2)]), [])
    assert len(v.violations) == 1, v.violations
    assert v.violations[0].startswith(f"block {cid(MS + 5, 3)} from b (sent {3 * SEC}) carries ")
    assert f"below the watermark {CL.epoch_ms + MS + 6} ms that a answered at {2 * SEC + SEC // 2}" in v.violations[0]
