"""Minting through a partition: a node cut off from etcd keeps minting until its
reservation runs out, and its worker IDs stay untouched until their marks pass."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from conftest import HARNESS
from netproxy import Proxy
from nodes import FAST_LEASES, wait_for
from recorder import read as read_records

from snowfence.ids import Layout

LAYOUT = Layout(time_bits=41, region_bits=3, worker_bits=1, sequence_bits=18)  # two worker IDs
COMMON = (
    "--worker-bits",
    "1",
    "--sequence-bits",
    "18",
    *FAST_LEASES,
    "--log-format",
    "json",
    "--reservation-window-s",
    "8",
    "--max-reservation-window-s",
    "8",
)  # later flags win: a longer reservation than FAST_LEASES's


def claims(node) -> list[dict]:
    out = []
    for line in node.log().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") == "claimed":
            out.append(e)
    return out


def test_a_partitioned_node_mints_until_its_reservation_ends_and_nothing_repeats(nodes, etcd, tmp_path):
    proxies = [Proxy("127.0.0.1", m.client_port) for m in etcd.members]
    try:
        a = nodes.start(
            "a",
            workers=2,
            args=(
                "--etcd",
                ",".join(p.url for p in proxies),
                "--cluster",
                "test",
                "--partition-minting",
                "true",
                *COMMON,
            ),
        )
        a.wait_ready()
        b = nodes.start("b", workers=2, args=("--etcd", ",".join(etcd.endpoints), "--cluster", "test", *COMMON))
        wait_for(lambda: "every worker ID of region 0 is taken" in b.log(), 10, what="b to find no free worker ID")
        out = tmp_path / "calls.bin"
        rec = subprocess.Popen(
            [sys.executable, str(HARNESS / "recorder.py"), str(out), "1", "0.002", a.endpoint, b.endpoint]
        )
        time.sleep(1.0)
        cut = time.monotonic_ns()
        for p in proxies:
            p.sever()
        wait_for(lambda: len(b.ready_workers()) == 2, 30, what="b to take both worker IDs over")
        time.sleep(1.0)
        for p in proxies:
            p.heal()
        rec.terminate()
        rec.wait(30)
    finally:
        for p in proxies:
            p.close()
    rows = read_records(str(out))
    ok_a = [r for r in rows if r[2] == 0 and r[3] == 0]
    ok_b = [r for r in rows if r[2] == 1 and r[3] == 0]
    # a kept minting well past the 2 s fence of a node that fences...
    last_a_s = (max(r[1] for r in ok_a) - cut) / 1e9
    assert last_a_s > 5.0, f"a stopped minting {last_a_s:.1f} s after the cut"
    # ...and stopped once its 8 s reservation ran out.
    assert last_a_s < 8.0 + 2.0
    refused_a = {r[3] for r in rows if r[2] == 0 and r[3] != 0 and r[0] > cut}
    assert refused_a, "a refused once its reservation was gone"
    # b claimed only after a's leases lapsed, and waited for a's marks.
    taken = claims(b)
    assert len(taken) == 2 and all(c["mark_ahead_ms"] > 0 for c in taken), taken
    # Per worker ID, every ID b minted is above every ID a minted.
    for w in (0, 1):
        a_ids = [r[4] + r[5] - 1 for r in ok_a if LAYOUT.decompose(r[4]).worker == w]
        b_ids = [r[4] for r in ok_b if LAYOUT.decompose(r[4]).worker == w]
        assert a_ids and b_ids and min(b_ids) > max(a_ids)
    spans = sorted((r[4], r[4] + r[5] - 1) for r in ok_a + ok_b)
    assert all(f2 > l1 for (_, l1), (f2, _) in zip(spans, spans[1:], strict=False)), "an ID was issued twice"


def test_a_prefix_deleted_under_a_cut_off_long_window_node_is_waited_out_by_a_new_default_node(nodes, etcd, tmp_path):
    # a mints through a partition with an 8 s window; while it is cut off, an operator
    # deletes the cluster's keys; b, with the default (2 s here) window and bound, finds
    # a store that looks new. Its quarantine comes from the region's claim (outside the
    # deleted prefix), which recorded a's 8 s: b mints nothing a may still mint.
    proxies = [Proxy("127.0.0.1", m.client_port) for m in etcd.members]
    try:
        a = nodes.start(
            "a",
            workers=2,
            args=(
                "--etcd",
                ",".join(p.url for p in proxies),
                "--cluster",
                "test",
                "--partition-minting",
                "true",
                *COMMON,
            ),
        )
        a.wait_ready()
        out = tmp_path / "calls.bin"
        rec = subprocess.Popen([sys.executable, str(HARNESS / "recorder.py"), str(out), "1", "0.002", a.endpoint])
        time.sleep(1.0)
        for p in proxies:
            p.sever()
        cut = time.monotonic_ns()
        assert etcd.ctl("del", "--prefix", "/snowfence/test/").returncode == 0
        b = nodes.start(
            "b",
            workers=2,
            args=("--etcd", ",".join(etcd.endpoints), "--cluster", "test", *COMMON[:4], *FAST_LEASES),
        )
        b_rec = subprocess.Popen([sys.executable, str(HARNESS / "recorder.py"), str(tmp_path / "b.bin"), "1",
                                  "0.002", b.endpoint])  # fmt: skip
        wait_for(lambda: len(b.ready_workers()) == 2, 30, what="b to claim both worker IDs")
        ready_s = (time.monotonic_ns() - cut) / 1e9
        # Until a's reservation (8 s from its last renewal) has surely run out.
        time.sleep(max(1.5, 10.0 - (time.monotonic_ns() - cut) / 1e9))
        for r in (rec, b_rec):
            r.terminate()
            r.wait(30)
    finally:
        for p in proxies:
            p.close()
    assert "mint nothing for 8000 ms" in b.log(), b.log_tail()
    rows_a, rows_b = read_records(str(out)), read_records(str(tmp_path / "b.bin"))
    ok_a = [r for r in rows_a if r[3] == 0]
    ok_b = [r for r in rows_b if r[3] == 0]
    assert ok_b, f"b served nothing ({ready_s:.1f} s to ready)"
    assert max(r[1] for r in ok_a) > cut + 5e9, "a minted through the partition"
    for w in (0, 1):
        a_ids = [r[4] + r[5] - 1 for r in ok_a if LAYOUT.decompose(r[4]).worker == w]
        b_ids = [r[4] for r in ok_b if LAYOUT.decompose(r[4]).worker == w]
        assert not a_ids or not b_ids or min(b_ids) > max(a_ids), f"worker ID {w}: b minted below a"
    spans = sorted((r[4], r[4] + r[5] - 1) for r in ok_a + ok_b)
    assert all(f2 > l1 for (_, l1), (f2, _) in zip(spans, spans[1:], strict=False)), "an ID was issued twice"
