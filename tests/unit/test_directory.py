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
    picks = {directory(seed=s).learn({"nodes": [node(A), node(B), node(C)]}, A) for s in range(60)}
    assert picks == {A, B, C}


def test_own_region_first_then_the_others_then_seeds_no_answer_lists():
    d = directory(seeds=("tcp://lb:5555",), region=2)
    d.learn({"nodes": [node(A, 1), node(B, 2), node(C, 2), node(D, 1)]}, "tcp://lb:5555")
    assert d.endpoints[:2] in ([B, C], [C, B]) and set(d.endpoints[2:4]) == {A, D}
    assert d.endpoints[4] == "tcp://lb:5555"
    assert d.preferred == [B, C]


def test_a_node_that_appears_later_is_where_the_client_moves():
    d = directory()
    d.learn({"nodes": [node(A), node(B)]}, A)
    assert d.learn({"nodes": [node(A), node(B)]}, A) is None  # nothing new: stay
    assert d.learn({"nodes": [node(A), node(B), node(D)]}, A) == D


def test_a_node_that_left_is_left_and_nodes_out_of_rotation_are_not_used():
    d = directory()
    d.learn({"nodes": [node(A), node(B)]}, B)
    assert d.learn({"nodes": [node(A), node(B, in_rotation=False)]}, B) == A
    assert B not in d.endpoints[:1]


def test_an_answer_without_usable_endpoints_changes_nothing():
    d = directory()
    for answer in ({"nodes": []}, {"nodes": [{"node": "x", "endpoints": []}]}, {"nodes": [{"endpoints": ["bad"]}]}, {}):
        assert d.learn(answer, A) is None
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
    c._endpoint_index = 1
    c.directory.seen = {A, B}
    assert c._learned({"nodes": [node(C), node(B), node(A)]}) == C  # C is new
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
        d.learn({"nodes": [node(A), node(B), node(C), node(D)]}, A)
        picks.add(d.learn({"nodes": [node(B), node(C), node(D)]}, A))
    assert picks == {B, C, D}
