"""A node name is one live node's: a second node with it refuses to start, a stopped node's
name is taken again once its entry lapses (a restart), and a running node never writes over
another's entry."""

from __future__ import annotations

import logging

import pytest
from etcdrig import TTL_S, config

from snowfence.broker.membership import Membership, NodeNameTaken
from snowfence.errors import ConfigError


def member(etcd, name: str, port: int = 5555) -> Membership:
    m = Membership(config(), name, {"node": name, "endpoints": [f"tcp://h:{port}"], "started_unix_ms": 0})
    m.cluster = etcd.cluster()
    return m


def clock_of(etcd, between=None):
    """sleep/now for register on the rig's clock; ``between`` runs at each sleep (a live holder renewing)."""

    def sleep(s: float) -> None:
        etcd.elapse_s(s)
        if between is not None:
            between()

    return sleep, lambda: etcd.clock.mono_ns() / 1e9


def test_a_name_held_by_a_live_node_is_refused_naming_the_holder_and_its_entry_stays(etcd):
    a = member(etcd, "n1", 1111)
    a.step()
    b = member(etcd, "n1", 2222)
    sleep, now = clock_of(etcd, between=a.step)
    start = now()
    with pytest.raises(NodeNameTaken, match=r"node name 'n1' is held by a live node .*tcp://h:1111") as info:
        b.register(sleep=sleep, now=now)
    assert isinstance(info.value, ConfigError)  # exit status 78
    assert now() - start < 1  # told at once, not after the lease ran out
    assert etcd.json("nodes/n1")["endpoints"] == ["tcp://h:1111"]
    assert b.lease_id is None and b.created is None
    b.stop()  # a refused node's stop leaves the holder's entry alone
    assert etcd.json("nodes/n1")["endpoints"] == ["tcp://h:1111"]


def test_a_restart_under_its_own_name_waits_for_the_dead_node_s_entry_to_lapse_then_takes_it(etcd, caplog):
    dead = member(etcd, "n1", 1111)
    dead.step()  # and never again: killed
    again = member(etcd, "n1", 2222)
    sleep, now = clock_of(etcd)
    start = now()
    with caplog.at_level(logging.INFO, logger="snowfence.broker"):
        again.register(sleep=sleep, now=now)
    assert now() - start <= TTL_S + 1
    assert "waiting up to" in caplog.text
    assert again.created is not None
    assert etcd.json("nodes/n1")["endpoints"] == ["tcp://h:2222"]


def test_a_free_name_is_taken_at_once_and_a_cleanly_stopped_node_s_name_is_free(etcd):
    a = member(etcd, "n1", 1111)
    a.register()
    assert etcd.json("nodes/n1")["endpoints"] == ["tcp://h:1111"]
    a.stop()
    b = member(etcd, "n1", 2222)
    b.register(sleep=lambda s: pytest.fail("no wait for a free name"))
    assert etcd.json("nodes/n1")["endpoints"] == ["tcp://h:2222"]


def test_a_running_node_whose_name_was_taken_while_its_lease_lapsed_never_writes_over_the_holder(etcd, caplog):
    a = member(etcd, "n1", 1111)
    a.step()
    etcd.elapse_s(TTL_S + 1)  # a's lease lapses (etcd out of reach, say)
    b = member(etcd, "n1", 2222)
    b.register()
    with caplog.at_level(logging.INFO, logger="snowfence.broker"):
        a.step()
        a.step()
    assert caplog.text.count("is now held by another node") == 1  # said once, not at every step
    assert etcd.json("nodes/n1")["endpoints"] == ["tcp://h:2222"]
    a.stop()
    assert etcd.json("nodes/n1")["endpoints"] == ["tcp://h:2222"]
    b.stop()
    a2 = member(etcd, "n1", 1111)
    a2.step()
    assert etcd.json("nodes/n1")["endpoints"] == ["tcp://h:1111"]
