"""The STATE payload's schema: what a worker reports, with defaults for what it
leaves out, and one error (BadState) for anything malformed."""

from __future__ import annotations

import orjson
import pytest

from snowfence import protocol
from snowfence.protocol import BadState, HeldState, WorkerState


def test_missing_fields_take_their_defaults():
    state = protocol.decode_state(b"\x11{}")
    assert state == WorkerState()
    assert (state.slot, state.pid, state.state, state.ready, state.credits) == (-1, 0, "claiming", False, 1)
    assert state.held == () and state.counters == {} and state.step_back_ms is None


def test_a_full_payload_round_trips_and_keeps_the_stores_own_fields():
    sent = {
        "slot": 2,
        "pid": 4242,
        "state": "ready",
        "ready": True,
        "ready_ids": 3,
        "credits": 32,
        "reason": None,
        "held": [{"worker_id": 7, "state": "ready", "token": 9, "fence_in_s": 2.5, "store": "etcd", "lease_id": "1f"}],
        "counters": {"ids": 100, "waits_sequence": 2},
        "step_back_ms": {"le": [1, 10], "counts": [1, 2, 2], "sum_ms": 12, "count": 2},
        "kernel_clock": {"synchronized": True, "max_error_s": 0.1, "est_error_s": 0.01, "state": 0},
        "clock_ahead_ms": 1.5,
        "passed_over": [{"worker_id": 3, "reason": "its mark is unreadable"}],
        "mint_ns": {"le": [10, 20], "kinds": {"reserve": {"counts": [1, 0, 2], "sum_ns": 95}}},
    }
    state = protocol.decode_state(b"\x11" + orjson.dumps(sent))
    assert state.pid == 4242 and state.ready_ids == 3 and state.clock_ahead_ms == 1.5
    assert state.passed_over == [{"worker_id": 3, "reason": "its mark is unreadable"}]
    assert state.mint_ns == sent["mint_ns"]
    [held] = state.held
    assert isinstance(held, HeldState) and held.worker_id == 7 and held.fence_in_s == 2.5
    assert held.extra == {"store": "etcd", "lease_id": "1f"}
    assert held.to_dict()["lease_id"] == "1f" and held.to_dict()["token"] == 9
    assert protocol.decode_state(protocol.encode_state(state)) == state


def test_a_key_this_version_does_not_know_is_named_and_the_rest_is_read():
    """A worker of another version (a package upgraded under a running broker) adds a
    field: the reader learns its name (the router counts and logs it) and keeps the rest."""
    state = protocol.decode_state(b'\x11{"ready": true, "ready_ids": 2, "zeta": 1, "alpha": {}}')
    assert state.ready is True and state.ready_ids == 2
    assert state.unknown == ("alpha", "zeta")
    assert "unknown" not in state.to_dict() and "zeta" not in state.to_dict()


def test_the_stores_own_held_fields_are_not_unknown_keys():
    state = protocol.decode_state(b'\x11{"held": [{"worker_id": 1, "store": "etcd", "lease_ttl_s": 10}]}')
    assert state.unknown == () and state.held[0].extra == {"store": "etcd", "lease_ttl_s": 10}


def test_each_fields_type_is_declared_once_by_its_annotation():
    """What a field admits on the wire comes from its annotation: a new field needs no second declaration."""
    wire = {name: kinds for name, (_, kinds) in WorkerState._WIRE.items()}
    assert wire["pid"] == (int,) and wire["ready"] == (bool,) and wire["clock_ahead_ms"] == (int, float)
    assert wire["held"] == (list,) and wire["reason"] == (str,) and "unknown" not in wire
    assert {name for name, (_, kinds) in HeldState._WIRE.items()} >= {"worker_id", "fence_in_s"}
    assert "extra" not in HeldState._WIRE


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'"ready"',
        b'{"pid": "1000"}',
        b'{"slot": 1.5}',
        b'{"ready": 1}',
        b'{"credits": true}',
        b'{"ready_ids": null}',
        b'{"reason": 3}',
        b'{"held": {"worker_id": 1}}',
        b'{"held": [7]}',
        b'{"held": [{"worker_id": "7"}]}',
        b'{"held": [{"state": null}]}',
        b'{"counters": [1]}',
        b'{"counters": {"ids": "many"}}',
        b'{"counters": {"ids": true}}',
        b'{"step_back_ms": {"le": [1], "counts": []}}',
        b'{"step_back_ms": {"le": [1], "counts": [0, 0], "sum_ms": "0"}}',
        b'{"kernel_clock": 1}',
        b'{"clock_ahead_ms": "1"}',
        b'{"passed_over": {"3": "x"}}',
        b'{"passed_over": [{"reason": "x"}]}',
        b'{"mint_ns": []}',
        b'{"mint_ns": {"le": [1], "kinds": []}}',
        b'{"mint_ns": {"le": [1], "kinds": {"reserve": {"counts": [1], "sum_ns": 1}}}}',
        b'{"mint_ns": {"le": [1], "kinds": {"reserve": {"counts": [1, 0], "sum_ns": true}}}}',
        b'{"mint_ns": {"le": [1], "kinds": {"reserve": {"counts": [1, "0"], "sum_ns": 1}}}}',
        b'{"mint_ns": {"kinds": {}}}',
    ],
)
def test_a_malformed_payload_is_one_bad_state_error(payload):
    with pytest.raises(BadState):
        protocol.decode_state(b"\x11" + payload)


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"[1, 2]", "a STATE payload is list, not an object"),
        (b'{"pid": "1000"}', "STATE field 'pid' is str, not int"),
        (b'{"clock_ahead_ms": "1"}', "STATE field 'clock_ahead_ms' is str, not int/float"),
        (b'{"held": {"worker_id": 1}}', "STATE field 'held' is dict, not list"),
        (b'{"held": [7]}', "a STATE 'held' entry is int, not an object"),
        (b'{"counters": {"ids": "many"}}', "STATE counter 'ids' is str, not a number"),
        (
            b'{"step_back_ms": {"le": [1], "counts": []}}',
            "STATE field 'step_back_ms' is not a histogram (le, counts, sum_ms)",
        ),
        (
            b'{"step_back_ms": {"le": 5, "counts": [1], "sum_ms": 0}}',
            "STATE field 'step_back_ms' is not a histogram (le, counts, sum_ms)",
        ),
        (
            b'{"step_back_ms": {"le": ["x"], "counts": [1], "sum_ms": 0}}',
            "STATE field 'step_back_ms' is not a histogram (le, counts, sum_ms)",
        ),
        (
            b'{"step_back_ms": {"le": [true], "counts": [1], "sum_ms": 0}}',
            "STATE field 'step_back_ms' is not a histogram (le, counts, sum_ms)",
        ),
        (b'{"passed_over": [{"reason": "x"}]}', "STATE field 'passed_over' is not a list of objects with a worker_id"),
        (
            b'{"mint_ns": {"le": [1], "kinds": {"reserve": {"counts": [1], "sum_ns": 1}}}}',
            "STATE field 'mint_ns' is not histograms by kind (le, kinds: counts, sum_ns)",
        ),
    ],
)
def test_a_malformed_payload_says_what_is_wrong_with_it(payload, message):
    """The broker logs this text when it ignores a worker's STATE."""
    with pytest.raises(BadState) as info:
        protocol.decode_state(b"\x11" + payload)
    assert str(info.value) == message


def test_a_payload_that_is_not_json_says_so_with_the_parser_s_reason():
    with pytest.raises(BadState) as info:
        protocol.decode_state(b"\x11not json")
    assert str(info.value).startswith("a STATE payload is not JSON: ") and "line 1 column 1" in str(info.value)


def test_a_histogram_without_an_overflow_bucket_is_accepted():
    state = protocol.decode_state(b'\x11{"step_back_ms": {"le": [1, 5], "counts": [1, 2], "sum_ms": 3}}')
    assert state.step_back_ms == {"le": [1, 5], "counts": [1, 2], "sum_ms": 3}
