"""The states of a held worker ID: their names on the wire, and next_state, the decision."""

from __future__ import annotations

import pytest

from snowfence import refusals
from snowfence.workers import states
from snowfence.workers.states import State, next_state


def test_state_names_are_the_ones_on_the_wire():
    names = [states.CLAIMING, states.WAITING, states.READY, states.FENCED]
    names += [states.CLOCK_UNSAFE, states.RESERVING, states.STOPPING]
    assert names == ["claiming", "waiting", "ready", "fenced", "clock_unsafe", "reserving", "stopping"]


def test_every_state_the_refusals_name_is_a_state():
    assert {name for name, _, _ in refusals.REFUSALS} <= set(states.State)


# -- next_state: the decision for one held worker ID ---------------------------------------


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
