"""The rows of `snowfence status` from a STATUS: a fenced worker ID says how long ago it
fenced, each row's reason is about its own worker ID, the broker's own worker ID is a row; and
from `status --etcd`'s census, each region's worker-ID pool."""

from __future__ import annotations

from snowfence.cli.status import _fence_text, _own_rows, _port, _row_reason


def test_a_fenced_worker_id_says_how_long_ago_rather_than_a_negative_fence_in_s():
    assert _fence_text({"state": "fenced", "fence_in_s": -5.123}) == "fenced 5.1 s ago"
    assert _fence_text({"state": "waiting", "fence_in_s": -0.4}) == "fenced 0.4 s ago"
    assert _fence_text({"state": "ready", "fence_in_s": 3.5}) == "3.5"
    assert _fence_text({"state": "claiming", "fence_in_s": None}) == "-"


def test_each_row_s_reason_is_about_its_own_worker_id():
    reason = "holding worker ID 11, 12, 13"
    assert [_row_reason({"worker_id": w, "reason": reason}) for w in (11, 12, 13)] == [
        "holding worker ID 11",
        "holding worker ID 12",
        "holding worker ID 13",
    ]
    about_12 = "worker ID 12 waits out its mark until 12:00"
    assert _row_reason({"worker_id": 12, "reason": about_12}) == about_12
    assert _row_reason({"worker_id": 11, "reason": about_12}) == "holding worker ID 11"
    process = "the broker is silent"
    assert _row_reason({"worker_id": 11, "reason": process}) == process
    assert _row_reason({"worker_id": None, "reason": "claiming"}) == "claiming"


def test_the_broker_s_own_worker_id_is_a_row_and_the_ports_are_shown():
    broker = {
        "pid": 42,
        "own_worker_id": {
            "state": "ready",
            "ready": True,
            "reason": None,
            "held": [{"worker_id": 7, "state": "ready"}],
        },
    }
    assert _own_rows(broker) == [
        {"worker_id": 7, "state": "ready", "slot": "own", "pid": 42, "in_rotation": True, "reason": None}
    ]
    assert _own_rows({"pid": 42, "own_worker_id": None}) == []
    idle = _own_rows({"pid": 42, "own_worker_id": {"state": "claiming", "held": [], "reason": "waiting"}})
    assert idle == [
        {"slot": "own", "pid": 42, "in_rotation": False, "reason": "waiting", "worker_id": None, "state": "claiming"}
    ]
    assert _port({"port": 5556, "host": "127.0.0.1"}) == "5556" and _port(None) == "off"


def test_each_region_s_pool_counts_held_quarantined_unreadable_and_free_worker_ids():
    from snowfence.cli.cluster import worker_id_pools
    from snowfence.ids import Layout

    entries = [
        {"region": 0, "worker_id": 0, "state": "held", "mark_ms": 5, "mark_passed": False},
        {"region": 0, "worker_id": 1, "state": "held", "mark_ms": None},
        {"region": 0, "worker_id": 2, "state": "retired", "mark_ms": 9, "mark_passed": False},  # mark ahead
        {"region": 0, "worker_id": 3, "state": "retired", "mark_ms": 1, "mark_passed": True},  # free again
        {"region": 0, "worker_id": 4, "state": "unreadable", "mark_ms": None},
        {"region": 2, "worker_id": 7, "state": "retired", "mark_ms": 9, "mark_passed": False},
    ]
    pools = worker_id_pools(entries, [0, 1], Layout(worker_bits=3, sequence_bits=16))
    assert pools == [
        {"region": 0, "size": 8, "free": 4, "held": 2, "quarantined": 1, "unreadable": 1},
        {"region": 1, "size": 8, "free": 8, "held": 0, "quarantined": 0, "unreadable": 0},  # used, nothing recorded
        {"region": 2, "size": 8, "free": 7, "held": 0, "quarantined": 1, "unreadable": 0},  # recorded, not used now
    ]
