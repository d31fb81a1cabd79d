"""The refusal a client gets for worker IDs that are not ready: the most telling
cause wins, and the reasons behind it travel with it. Workers and the broker
both answer with it."""

from __future__ import annotations

import pytest

from snowfence.errors import ClockUnsafe, Fenced, ReservationExpired, Unavailable
from snowfence.refusals import refusal_for
from snowfence.workers import states


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


def test_the_states_may_be_plain_wire_names():
    assert type(refusal_for(["reserving", "clock_unsafe"])) is ClockUnsafe


def test_each_refusal_says_what_it_is_waiting_for():
    assert str(refusal_for([states.FENCED])) == "lease renewals are failing"
    assert str(refusal_for([states.CLOCK_UNSAFE])) == "the wall clock cannot be trusted"
    assert str(refusal_for([states.RESERVING])) == "waiting for the reservation to be extended"
    assert str(refusal_for([states.WAITING])) == "no worker is ready"


def test_reasons_are_appended_once_each_in_order_and_blank_ones_dropped():
    err = refusal_for([states.WAITING], ["the broker is draining", "", "lease lost: TTL 0", "the broker is draining"])
    assert str(err) == "no worker is ready (lease lost: TTL 0; the broker is draining)"
    assert str(refusal_for([states.FENCED], [""])) == "lease renewals are failing"
