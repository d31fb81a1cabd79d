"""A node name is one live node's, with real nodes and a real etcd: a second node started
under a name a live node holds refuses to start (exit status 78, one line naming the holder)
and the first stays in the membership; a node killed and started again under its own name
starts once its old entry has lapsed."""

from __future__ import annotations

from nodes import FAST_LEASES, etcd_args, wait_for

from snowfence import Client


def listed(node) -> list[tuple[str, list[str]]]:
    with Client(node.endpoint, timeout_s=1.0, retries=0, discover=False) as c:
        return [(n["node"], n["endpoints"]) for n in c.nodes()["nodes"]]


def test_a_second_node_with_a_live_node_s_name_refuses_to_start_and_hides_nobody(nodes, etcd):
    args = (*etcd_args(etcd, "test", *FAST_LEASES), "--node-name", "n1")
    first = nodes.start("first", workers=1, args=args)
    first.wait_ready()
    wait_for(lambda: listed(first) == [("n1", [first.endpoint])], 10, what="first to register")
    second = nodes.start("second", workers=1, args=args)
    assert second.proc.wait(timeout=15) == 78, second.log_tail()
    refusal = [line for line in second.log().splitlines() if "is held by a live node" in line]
    assert len(refusal) == 1 and first.endpoint in refusal[0], second.log_tail()
    assert "serving" not in second.log()
    assert listed(first) == [("n1", [first.endpoint])]


def test_a_node_killed_and_started_again_under_its_own_name_starts_once_its_entry_lapsed(nodes, etcd):
    args = (*etcd_args(etcd, "test", *FAST_LEASES), "--node-name", "n1")
    first = nodes.start("first", workers=1, args=args)
    first.wait_ready()
    wait_for(lambda: listed(first) == [("n1", [first.endpoint])], 10, what="first to register")
    first.kill()
    again = nodes.start("again", workers=1, args=args)
    again.wait_ready(timeout_s=20)
    assert "waiting up to" in again.log()
    wait_for(lambda: listed(again) == [("n1", [again.endpoint])], 10, what="the restarted node to register")
