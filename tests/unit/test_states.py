"""The refusal a client gets for worker IDs that are not ready: the most telling
cause wins, and the reasons behind it travel with it."""

from __future__ import annotations

import pytest

from snowfence.errors import ClockUnsafe, Fenced, ReservationExpired, Unavailable
from snowfence.workers import states
from snowfence.workers.states import refusal_for


@pytest.mark.parametrize(
    "seen, error",
    [
        ({states.FENCED, states.CLOCK_UNSAFE, states.RESERVING, states.WAITING}, Fenced),
        ({states.CLOCK_UNSAFE, states.RESERVING, states.WAITING}, ClockUnsafe),
        ({states.RESERVING, states.WAITING, states.CLAIMING}, ReservationExpired),
        ({states.WAITING, states.CLAIMING, states.STOPPING}, Unavailable),
        (set(), Unavailable),
    ],
)
def test_the_most_telling_state_decides_the_refusal(seen, error):
    err = refusal_for(iter(sorted(seen)))  # any iterable, read once
    assert type(err) is error and err.retriable


def test_each_refusal_says_what_it_is_waiting_for():
    assert str(refusal_for([states.FENCED])) == "lease renewals are failing"
    assert str(refusal_for([states.CLOCK_UNSAFE])) == "the wall clock cannot be trusted"
    assert str(refusal_for([states.RESERVING])) == "waiting for the reservation to be extended"
    assert str(refusal_for([states.WAITING])) == "no worker is ready"


def test_reasons_are_appended_once_each_in_order_and_blank_ones_dropped():
    err = refusal_for([states.WAITING], ["the broker is draining", "", "lease lost: TTL 0", "the broker is draining"])
    assert str(err) == "no worker is ready (lease lost: TTL 0; the broker is draining)"
    assert str(refusal_for([states.FENCED], [""])) == "lease renewals are failing"


def test_state_names_are_the_ones_on_the_wire():
    names = [states.CLAIMING, states.WAITING, states.READY, states.FENCED]
    names += [states.CLOCK_UNSAFE, states.RESERVING, states.STOPPING]
    assert names == ["claiming", "waiting", "ready", "fenced", "clock_unsafe", "reserving", "stopping"]


# -- next_state: the decision for one held worker ID ---------------------------------------

from snowfence.workers.states import State, next_state  # noqa: E402

#: Inputs under which a worker ID is ready: renewed, fence ahead, clock trusted,
#: past the previous owner's mark, inside its own reservation.
READY_INPUTS = dict(
    worker_id=5,
    renewals=3,
    mono_ns=1_000,
    fence_deadline_ns=2_000,
    clock_veto=None,
    clock_unsafe=False,
    now_ms=100,
    mark_ms=50,
    reserved_until_ms=150,
)

#: One spoiler per cause, in the order of precedence, with the state it leads to.
CAUSES = [
    ("no_renewal", dict(renewals=0), State.WAITING, "waiting for the first renewal"),
    ("fenced", dict(mono_ns=2_001), State.FENCED, "no lease renewal succeeded within the fence window"),
    ("veto", dict(clock_veto="kernel clock unsynchronised"), State.CLOCK_UNSAFE, "kernel clock unsynchronised"),
    ("clock_unsafe", dict(clock_unsafe=True), State.CLOCK_UNSAFE, "wall clock is behind the last minted"),
    ("mark", dict(mark_ms=100), State.WAITING, "pass the previous owner's mark (0 ms)"),
    ("reserving", dict(reserved_until_ms=99), State.RESERVING, "waiting for the reservation to be extended"),
]


def test_all_guards_holding_is_ready():
    assert next_state(**READY_INPUTS) == (State.READY, "worker ID 5 is ready")


@pytest.mark.parametrize("name, spoil, state, reason", CAUSES, ids=[c[0] for c in CAUSES])
def test_each_cause_alone_leads_to_its_state(name, spoil, state, reason):
    got, why = next_state(**{**READY_INPUTS, **spoil})
    assert got is state and reason in why


@pytest.mark.parametrize("i", range(len(CAUSES)))
def test_the_earlier_cause_wins_over_every_later_one(i):
    # next_state has no memory of the state it was in: the table of causes is
    # every transition, from any state to the one its first cause names.
    # Spoil cause i and every cause after it: the answer is cause i's.
    spoiled = dict(READY_INPUTS)
    for _, spoil, _, _ in CAUSES[i:]:
        spoiled.update(spoil)
    name, _, state, reason = CAUSES[i]
    got, why = next_state(**spoiled)
    assert got is state and reason in why, name


def test_edges_of_the_comparisons():
    # The fence passes only strictly after its deadline.
    assert next_state(**{**READY_INPUTS, "mono_ns": 2_000})[0] is State.READY
    # The mark must be passed, not reached; the reservation covers its own millisecond.
    assert next_state(**{**READY_INPUTS, "mark_ms": 99})[0] is State.READY
    assert next_state(**{**READY_INPUTS, "reserved_until_ms": 100})[0] is State.READY
    # An empty veto is no veto.
    assert next_state(**{**READY_INPUTS, "clock_veto": ""})[0] is State.READY


def test_the_mark_reason_says_how_far_ahead_the_mark_is():
    _, why = next_state(**{**READY_INPUTS, "mark_ms": 130})
    assert why == "worker ID 5: waiting for the wall clock to pass the previous owner's mark (30 ms)"


def test_a_state_is_its_wire_string():
    assert State.CLOCK_UNSAFE == "clock_unsafe" and f"{State.FENCED}" == "fenced"
    assert {State.READY: 1}["ready"] == 1
    import orjson

    assert orjson.dumps({"state": State.RESERVING}) == b'{"state":"reserving"}'
