"""A node's membership entry carries the bounds its store's quarantines count on, and status
names any the cluster's nodes do not set alike."""

from __future__ import annotations

from snowfence.broker.membership import base_entry, bounds_differ
from snowfence.config import Config


def entry(name: str, **config) -> dict:
    return base_entry(Config(etcd=("http://127.0.0.1:2379",), **config), name, [f"tcp://{name}:5555"], None)


def test_the_entry_carries_the_bounds():
    bounds = entry("a", max_reservation_window_s=8.0, max_ahead_ms=700)["bounds"]
    assert bounds == {
        "reservation_window_ms": 5000,
        "max_reservation_window_ms": 8000,
        "max_ahead_ms": 700,
        "max_clock_skew_ms": 1000,
        "max_peer_offset_ms": 500,
    }


def test_bounds_not_set_alike_are_named_with_their_nodes_and_own_windows_may_differ():
    members = [
        entry("a"),
        entry("b", max_reservation_window_s=8.0),
        entry("c", reservation_window_s=3.0, keepalive_interval_s=1.0),  # its own window: fine
        {"node": "old"},  # an older release: no bounds to compare
    ]
    assert bounds_differ(members) == ["max_reservation_window_ms is not set alike: 5000 on a, c; 8000 on b"]
    assert bounds_differ([entry("a"), entry("c", reservation_window_s=3.0, keepalive_interval_s=1.0)]) == []
