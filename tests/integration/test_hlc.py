"""The hybrid-logical-clock policy and causal tokens, with real processes and a real etcd."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from checks import check_blocks
from nodes import etcd_args, wait_for

from snowfence import Client
from snowfence.errors import TokenAhead
from snowfence.ids import DEFAULT_LAYOUT as L


def counters(node) -> dict:
    total: dict = {}
    for w in node.status()["workers"]:
        for k, v in w.get("counters", {}).items():
            total[k] = total.get(k, 0) + v
    return total


def test_hlc_mints_straight_through_a_40_ms_step_back_without_waiting(nodes, etcd, clock):
    node = nodes.start(workers=1, env=clock.env(), args=(*etcd_args(etcd), "--clock-policy", "hlc"))
    node.wait_ready()
    # Ready as soon as the wall clock passed the mark its claim found; a step of 40 ms
    # back within 40 ms of that is the mark's wait (any policy), not the step's.
    time.sleep(0.2)
    with node.client(retries=0) as c:
        before = [b for _ in range(50) for b in c.reserve(1000)]
        clock.shift_all(-40)
        during = [b for _ in range(50) for b in c.reserve(1000)]  # not one refusal, not one wait
    pairs = [(b.first, b.count) for b in before + during]
    check_blocks([pairs])
    seen = wait_for(
        lambda: (lambda c: c if c.get("requests_ok", 0) >= 100 else None)(counters(node)),
        5,
        what="the worker's next report",
    )
    assert seen.get("waits_step_back", 0) == 0, "the HLC policy never waits out a step back"
    assert seen.get("waits_ahead", 0) >= 1, "it minted from the logical clock, ahead of the wall clock"
    assert seen.get("refused_clock_unsafe", 0) == 0
    # Minted during the step: milliseconds at or above the last one before it, though the wall clock was behind.
    assert L.ms_of(during[0].first) >= L.ms_of(before[-1].first)


def test_the_wait_policy_refuses_the_same_step(nodes, etcd, clock):
    node = nodes.start(workers=1, env=clock.env(), args=etcd_args(etcd))
    node.wait_ready()
    with node.client(retries=0) as c:
        c.reserve(1000)
        clock.shift_all(-40)
        with pytest.raises(Exception) as info:
            c.reserve(1000)
        assert info.value.code == "clock_unsafe"


def test_causal_tokens_are_honoured_across_two_nodes(nodes, etcd, clock, clockshim_library, tmp_path):
    from clock import ClockTable

    ahead = ClockTable(tmp_path / "ahead-clock", clockshim_library)
    ahead.shift_all(+300)  # node a's clock runs 300 ms ahead of node b's
    a = nodes.start("a", workers=1, env=ahead.env(), args=etcd_args(etcd))
    b_hlc = nodes.start("b", workers=1, args=(*etcd_args(etcd), "--clock-policy", "hlc"))
    b_wait = nodes.start("c", workers=1, args=etcd_args(etcd))
    for n in (a, b_hlc, b_wait):
        n.wait_ready()
    pin = {"discover": False}  # each client means its own node
    with (
        Client(a.endpoint, **pin) as ca,
        Client(b_hlc.endpoint, **pin) as cb,
        Client(b_wait.endpoint, retries=0, **pin) as cw,
    ):
        token = ca.reserve(1)[0].first
        after = cb.reserve(5000, after=token)  # b jumps its logical clock past the token
        assert all(blk.first > token for blk in after)
        assert L.ms_of(after[0].first) >= L.ms_of(token)
        chained = ca.reserve(10, after=after[-1].last)  # and back again
        assert chained[0].first > after[-1].last
        with pytest.raises(TokenAhead) as info:  # the wait policy does not wait 300 ms
            cw.reserve(1, after=token)
        assert info.value.retriable
        # b's worker followed a's clock: its IDs are now as far ahead of c's clock as a's
        # are (asked for more than b's broker answers itself, from its own worker ID).
        with pytest.raises(TokenAhead):
            cw.reserve(1, after=cb.reserve(100)[0].last)
        close = cw.reserve(1)[0].last  # a token within c's own clock: easy
        assert cw.reserve(1, after=close)[0].first > close
    ahead.close()


def test_a_token_too_far_ahead_is_rejected_not_followed(nodes, etcd, clock):
    node = nodes.start(workers=1, args=(*etcd_args(etcd), "--clock-policy", "hlc", "--max-ahead-ms", "1000"))
    node.wait_ready()
    with node.client(retries=0) as c:
        now = c.reserve(1)[0].first
        far = L.compose(L.ms_of(now) + 5_000, 0, 0, 0)
        with pytest.raises(TokenAhead):
            c.reserve(1, after=far)
        status = node.status()["workers"][0]
        assert status["last_ms"] < L.ms_of(far), "the node was not dragged into the future"
        assert c.reserve(1)[0].first > now


def test_cli_reserve_after(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    with node.client() as c:
        token = c.reserve(1)[0].first
    out = subprocess.run(
        [sys.executable, "-m", "snowfence", "reserve", "1000", "--connect", node.endpoint, "--after", str(token)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    ids = [int(x) for x in out.stdout.split()]
    assert len(ids) == 1000 and min(ids) > token


def test_a_token_from_a_higher_shard_is_a_bad_request_and_the_worker_lives_on(nodes):
    from snowfence.errors import BadRequest
    from snowfence.ids import Layout

    layout = Layout(time_bits=39, region_bits=3, worker_bits=7, sequence_bits=12, shard_bits=2)
    node = nodes.start(workers=1, args=("--time-bits", "39", "--shard-bits", "2"))
    node.wait_ready()
    pids = node.worker_pids()
    with node.client(retries=0) as c:
        first = c.reserve(1)[0].first
        assert layout.decompose(first).shard < 3  # worker ID 0 of region 0 hashes to shard 0
        token = layout.compose(layout.ms_of(first), 0, 0, 0) | (3 << layout.shard_shift)
        with pytest.raises(BadRequest) as info:
            c.reserve(1, after=token)
        assert "shard" in info.value.message
        assert c.reserve(1)[0].first > first
    assert node.worker_pids() == pids
