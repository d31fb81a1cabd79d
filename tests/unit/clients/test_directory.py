"""Where a client's requests go: the seeds, and the nodes a NODES answer lists."""

from __future__ import annotations

import random

import pytest

from snowfence.clients.core import ClientBase, Directory


def node(ep, region=0, in_rotation=True, name=None):
    return {"node": name or ep, "endpoints": [ep], "region": region, "in_rotation": in_rotation}


A, B, C, D = (f"tcp://10.0.0.{i}:5555" for i in range(1, 5))


def directory(seeds=(A,), region=None, seed=1):
    return Directory(list(seeds), discover=True, region=region, rng=random.Random(seed))


def test_the_first_answer_spreads_clients_over_the_nodes():
    picks = set()
    for s in range(60):
        d = directory(seed=s)
        picks.add(d.learn({"nodes": [node(A), node(B), node(C)]}) or d.current)  # None: stay on the seed
    assert picks == {A, B, C}


def test_own_region_first_then_the_others_then_seeds_no_answer_lists():
    d = directory(seeds=("tcp://lb:5555",), region=2)
    d.learn({"nodes": [node(A, 1), node(B, 2), node(C, 2), node(D, 1)]})
    assert d.endpoints[:2] in ([B, C], [C, B]) and set(d.endpoints[2:4]) == {A, D}
    assert d.endpoints[4] == "tcp://lb:5555"
    assert d.preferred == [B, C]


def test_a_node_that_appears_later_is_where_the_client_moves():
    d = directory()
    d.learn({"nodes": [node(A), node(B)]})
    assert d.learn({"nodes": [node(A), node(B)]}) is None  # nothing new: stay
    assert d.learn({"nodes": [node(A), node(B), node(D)]}) == D


def test_a_node_that_left_is_left_and_nodes_out_of_rotation_are_used_last():
    d = directory()
    d.current = B
    d.learn({"nodes": [node(A), node(B)]})
    assert d.learn({"nodes": [node(A), node(B, in_rotation=False)]}) == A
    assert B not in d.endpoints[:1]
    # Kept for failover all the same: it may be back by the time it is needed.
    assert d.endpoints == [A, B]


def test_an_answer_without_usable_endpoints_changes_nothing():
    d = directory()
    for answer in ({"nodes": []}, {"nodes": [{"node": "x", "endpoints": []}]}, {"nodes": [{"endpoints": ["bad"]}]}, {}):
        assert d.learn(answer) is None
        assert d.endpoints == [A]


def test_discovery_is_due_on_connect_after_a_failure_and_every_few_seconds():
    d = directory()
    assert d.due(0)
    d.asked(0)
    assert not d.due(1_000_000_000) and d.due(5_000_000_000)
    d.on_failure()
    assert d.due(1)
    assert not Directory([A], discover=False, region=None).due(0)


def test_the_client_keeps_its_endpoint_across_an_answer_that_lists_it():
    c = ClientBase([A, B], timeout_s=1.0, retries=1, window=1, server_key=None, client_key=None)
    c._move_to(B)
    c.directory.seen = {A, B}
    assert c.directory.learn({"nodes": [node(C), node(B), node(A)]}) == C  # C is new
    assert c.endpoint == B  # until the client moves
    c._move_to(C)
    assert c.endpoint == C


def test_a_region_must_be_a_number():
    with pytest.raises(ValueError):
        ClientBase([A], timeout_s=1.0, retries=1, window=1, server_key=None, client_key=None, region=-1)


def test_clients_whose_node_left_do_not_all_go_to_the_same_one():
    picks = set()
    for s in range(40):
        d = directory(seed=s)
        d.learn({"nodes": [node(A), node(B), node(C), node(D)]})
        picks.add(d.learn({"nodes": [node(B), node(C), node(D)]}))
    assert picks == {B, C, D}


# -- failover: where a client goes when its endpoint fails ------------------------------------------


def learned(*nodes_, current=A, seed=1):
    d = directory(seed=seed)
    d.learn({"nodes": list(nodes_)})
    d.current = current
    return d


def test_a_failed_endpoint_is_left_for_the_next_one_that_has_not_failed():
    d = learned(node(A), node(B), node(C))
    assert d.failed() == B
    assert d.due(0)  # and the cluster is asked again at the next chance
    assert d.failed() == C
    assert d.failed() == A  # every one failed: the one that failed longest ago
    assert d.failed() == B


def test_a_dead_node_still_listed_is_not_gone_back_to_while_another_will_do():
    # Its membership entry outlives it until its lease lapses (a node cut off from
    # clients but not from etcd: for good), and every answer still lists it in rotation.
    d = learned(node(A), node(B), node(C))
    assert d.failed() == B
    assert d.learn({"nodes": [node(A), node(B), node(C)]}) is None  # stays on B
    assert d.failed() == C  # B went too: on to C, not back to A
    assert d.learn({"nodes": [node(A), node(B), node(C)]}) is None
    d.current = D  # a seed, say, that no answer lists
    assert d.learn({"nodes": [node(A), node(B), node(C)]}) == C  # it left: the one that did not fail lately


def test_an_endpoint_that_answers_is_no_longer_one_that_failed():
    d = learned(node(A), node(B), node(C))
    d.failed()  # A
    d.current = A
    d.answered()
    assert d.failures == {}
    assert d.failed() == B


def test_random_picks_avoid_an_endpoint_that_failed():
    picks = set()
    for s in range(40):
        d = learned(node(A), node(B), node(C), node(D), seed=s)
        d.failed()  # A failed; the client is on B
        d.current = "tcp://lb:5555"  # say it had moved to an address no answer lists
        picks.add(d.learn({"nodes": [node(A), node(B), node(C), node(D)]}))
    assert picks == {B, C, D}
    d = directory()
    d.failed()  # the seed failed before any answer
    assert {d.learn({"nodes": [node(A), node(B)]})} == {B}


def test_nodes_out_of_rotation_are_there_to_fail_over_to():
    # The answer a client got while its peers were still starting: only the seed in
    # rotation. When the seed dies the others are where the client goes, not nowhere.
    d = learned(node(A), node(B, in_rotation=False), node(C, in_rotation=False))
    assert d.endpoints == [A, B, C]
    assert d.failed() == B
    assert d.failed() == C


def test_untried_says_whether_an_endpoint_is_left_that_did_not_time_out():
    d = learned(node(A), node(B))
    assert d.untried({A}) and not d.untried({A, B})
