"""Small requests in one hop: the broker's own worker ID, with real nodes, real sockets,
real file locks and a real etcd."""

from __future__ import annotations

import signal
import time

import pytest
from checks import check_blocks, read_pairs
from nodes import etcd_args, loadgen, wait_for

from snowfence.ids import DEFAULT_LAYOUT, Layout

L = DEFAULT_LAYOUT
#: The broker answers plain requests of up to 64 IDs itself (the default, said explicitly).
ONE_HOP = ("--broker-mint-max-ids", "64")


def own(node) -> dict:
    return node.status()["broker"].get("own_worker_id") or {}


def own_ids(node) -> list[int]:
    return [h["worker_id"] for h in own(node).get("held", [])]


def workers_ids(node) -> set[int]:
    return {w["worker_id"] for w in node.status()["workers"] if w.get("worker_id") is not None}


def test_small_requests_are_minted_by_the_brokers_own_worker_id_and_large_ones_by_workers(nodes):
    node = nodes.start(workers=2, args=ONE_HOP)
    node.wait_ready()
    wait_for(lambda: own(node).get("ready"), 20, what="the broker's own worker ID")
    (broker_id,) = own_ids(node)
    assert broker_id not in workers_ids(node)
    with node.client() as c:
        small = [c.reserve(n)[0] for n in (1, 1, 7, 64)]
        large = c.reserve(65) + c.reserve(4096)
    assert {L.decompose(b.first).worker for b in small} == {broker_id}
    assert {L.decompose(b.first).worker for b in large} <= workers_ids(node)
    counters = node.status()["broker"]["counters"]
    assert counters["minted_here"] >= 4 and counters["ids_here"] >= 73


def test_ids_from_the_broker_and_its_workers_under_load_are_unique_and_survive_a_restart(nodes, tmp_path):
    node = nodes.start(workers=2, args=ONE_HOP)
    node.wait_ready()
    wait_for(lambda: own(node).get("ready"), 20, what="the broker's own worker ID")

    def load(tag: str) -> list[list[tuple[int, int]]]:
        outs = [tmp_path / f"{tag}{i}.bin" for i in range(3)]
        procs = [loadgen(node.endpoint, 30_000, out, i) for i, out in enumerate(outs)]
        for p in procs:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0, out
        return [read_pairs(out) for out in outs]

    before = load("a")
    broker_id = own_ids(node)[0]
    assert node.status()["broker"]["counters"]["minted_here"] > 0
    assert node.stop(signal.SIGTERM) == 0  # the broker releases its worker ID (mark lowered to its last ms)
    assert "released worker ID" in node.log()
    node.start()
    node.wait_ready()
    wait_for(lambda: own(node).get("ready"), 20, what="the broker's own worker ID again")
    after = load("b")
    # Unique across both runs, and per worker ID increasing within each client.
    figures = check_blocks(before + after)
    assert figures["ids"] == 180_000 and figures["workers"] >= 3
    minted_by_broker = [f for pairs in before for f, _ in pairs if L.decompose(f).worker == broker_id]
    assert minted_by_broker


def test_a_region_sized_for_the_workers_leaves_the_broker_without_one_and_everything_is_served(nodes):
    two = Layout(time_bits=41, region_bits=3, worker_bits=1, sequence_bits=18)
    node = nodes.start(workers=2, args=("--worker-bits", "1", "--sequence-bits", "18", *ONE_HOP))
    node.wait_ready()
    with node.client() as c:
        blocks = [c.reserve(1)[0] for _ in range(50)]
    assert {two.decompose(b.first).worker for b in blocks} == {0, 1}
    status = node.status()
    assert status["broker"]["counters"]["minted_here"] == 0 and own_ids(node) == []
    # Its claims fail as expected, quietly: no warning in the log for them.
    assert "broker" not in "".join(line for line in node.log().splitlines() if "claim_failed" in line)


def test_with_etcd_the_broker_holds_a_leased_worker_id_and_gives_it_back_when_killed(nodes, etcd):
    a = nodes.start("a", workers=1, args=(*etcd_args(etcd, "onehop"), *ONE_HOP))
    a.wait_ready()
    wait_for(lambda: own(a).get("ready"), 30, what="a's own worker ID")
    (broker_id,) = own_ids(a)
    held = own(a)["held"][0]
    assert held["token"] > 0 and held["lease_remaining_s"] is not None
    with a.client() as c:
        first = c.reserve(1)[0].first
    assert L.decompose(first).worker == broker_id
    assert broker_id not in workers_ids(a)
    a.kill()  # no release: its lease must lapse before anyone else mints from that worker ID
    b = nodes.start("b", workers=1, args=(*etcd_args(etcd, "onehop"), *ONE_HOP))
    b.wait_ready(timeout_s=60)
    wait_for(lambda: own(b).get("ready"), 60, what="b's own worker ID")
    with b.client() as c:
        later = [blk for n in (1, 1, 1000) for blk in c.reserve(n)]
    assert all(blk.first > first for blk in later if L.decompose(blk.first).worker == broker_id)


def test_a_clock_step_back_hands_small_requests_to_a_worker_without_an_error(nodes, clock):
    node = nodes.start(workers=1, env=clock.env(), args=ONE_HOP)
    node.wait_ready()
    wait_for(lambda: own(node).get("ready"), 20, what="the broker's own worker ID")
    with node.client(retries=0) as c:
        before = [c.reserve(1)[0] for _ in range(20)]  # minted by the broker's own worker ID
        clock.shift_all(-4)  # a few ms: a worker's minter would sleep it out; the broker's may not
        small = [c.reserve(1)[0] for _ in range(5)]
        assert own(node)["declined"].get("would_wait", 0) >= 1
        clock.shift_all(0)
        time.sleep(0.5)  # the worker's last millisecond is now well behind the clock
        again = [c.reserve(1)[0] for _ in range(20)]  # the broker's own again
        clock.shift_all(-300)  # beyond the 10 ms a minter waits out: the broker's refuses it
        after = [c.reserve(1)[0] for _ in range(5)]  # and the worker, which has not minted since, answers
    assert own(node)["declined"].get("refused", 0) >= 1, own(node)
    # Its state as STATUS shows it (a snapshot of at most one housekeeping turn ago).
    wait_for(lambda: own(node)["held"][0]["state"] == "clock_unsafe", 2, what="the broker's worker ID out")
    blocks = before + small + again + after
    check_blocks([[(b.first, b.count) for b in blocks]])  # unique; per worker ID increasing
    # Until the clock is back past its last millisecond (a few ms), small ones went to the worker.
    assert {L.decompose(b.first).worker for b in small} & workers_ids(node)
    assert {L.decompose(b.first).worker for b in after} <= workers_ids(node)
    assert {L.decompose(b.first).worker for b in before + again} == set(own_ids(node))


@pytest.mark.parametrize("store", ["embedded", "etcd"])
def test_workers_come_first_a_broker_gives_its_worker_id_back_to_a_node_that_needs_it(nodes, request, store):
    # Four worker IDs: node a's two workers and its broker leave one free; node b's two
    # workers need two. b's first worker takes the free one; a's broker must give its own
    # back for b's second (its mark lowered to what it used: b's worker waits for nothing).
    four = Layout(time_bits=46, region_bits=3, worker_bits=2, sequence_bits=12)
    args = ("--worker-bits", "2", "--time-bits", "46", *ONE_HOP)
    if store == "etcd":
        args = (*args, *etcd_args(request.getfixturevalue("etcd"), "giveback"))
    a = nodes.start("a", workers=2, args=args)
    a.wait_ready()
    wait_for(lambda: own(a).get("ready"), 20, what="a's own worker ID")
    (a_broker_id,) = own_ids(a)
    with a.client() as c:
        before = c.reserve(1)[0].first
    assert four.decompose(before).worker == a_broker_id
    b = nodes.start("b", workers=2, args=args, state_dir=a.state_dir if store == "embedded" else None)
    b.wait_ready(2, timeout_s=30)  # both of b's workers hold a worker ID
    status = own(a)
    assert own_ids(a) == [] and status["gave_back"] == 1, status
    assert "own_worker_id_gave_back" in a.log() and own_ids(b) == []  # none left for b's broker either
    assert a_broker_id in workers_ids(b)
    with b.client() as c:
        later = [blk for _ in range(20) for blk in c.reserve(1)]
    assert all(blk.first > before for blk in later if four.decompose(blk.first).worker == a_broker_id)
    with a.client() as c:  # a serves on, its small requests now through its workers
        assert len(c.reserve(1)) == 1
