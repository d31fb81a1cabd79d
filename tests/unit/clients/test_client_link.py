"""What a client makes of its socket monitor's events (:class:`Link`) and of a connection
that can carry nothing (``on_failed`` of both rounds), without a socket: the cause
named, the failover, the retries, the time budget. Both clients run these objects."""

from __future__ import annotations

import pytest
import zmq

from snowfence.clients.core import ClientBase, ReserveJob, ReserveRound, StatusRound, handshake
from snowfence.clients.core.handshake import Link, greeting_address, greeting_mechanism
from snowfence.errors import (
    ConnectionRefused,
    CurveNotUsed,
    CurveRequired,
    HandshakeRefused,
    KeyRefused,
    ServerKeyWrong,
    Timeout,
)

S = 1_000_000_000
EP = "tcp://127.0.0.1:5555"


def test_the_event_numbers_are_libzmqs():
    assert handshake.EVENT_CONNECTED == zmq.EVENT_CONNECTED
    assert handshake.EVENT_CONNECT_RETRIED == zmq.EVENT_CONNECT_RETRIED
    assert handshake.EVENT_DISCONNECTED == zmq.EVENT_DISCONNECTED
    assert handshake.EVENT_HANDSHAKE_FAILED_NO_DETAIL == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    assert handshake.EVENT_HANDSHAKE_SUCCEEDED == zmq.EVENT_HANDSHAKE_SUCCEEDED
    assert handshake.EVENT_HANDSHAKE_FAILED_PROTOCOL == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    assert handshake.EVENT_HANDSHAKE_FAILED_AUTH == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    assert handshake.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH


def feed(link: Link, *events) -> object:
    for event in events:
        link.feed(*(event if isinstance(event, tuple) else (event, 0)))
    return link.error


def test_each_refused_handshake_names_its_cause():
    auth = (handshake.EVENT_HANDSHAKE_FAILED_AUTH, 400)
    mismatch = (handshake.EVENT_HANDSHAKE_FAILED_PROTOCOL, handshake.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
    connected = handshake.EVENT_CONNECTED
    assert type(feed(Link(EP, True), connected, auth)) is KeyRefused
    assert type(feed(Link(EP, False), connected, mismatch)) is CurveRequired
    assert type(feed(Link(EP, True), connected, mismatch)) is CurveNotUsed
    assert type(feed(Link(EP, True), connected, handshake.EVENT_HANDSHAKE_FAILED_NO_DETAIL)) is ServerKeyWrong
    other = feed(Link(EP, False), connected, (handshake.EVENT_HANDSHAKE_FAILED_PROTOCOL, 0x10000001))
    assert type(other) is HandshakeRefused
    for error in (feed(Link(EP, True), connected, auth), other):
        assert not error.retriable and EP in str(error)


def test_a_handshake_that_failed_without_detail_is_told_by_the_nodes_greeting():
    for encrypted, mechanism, error in (
        (True, "NULL", CurveNotUsed),
        (False, "CURVE", CurveRequired),
        (True, "CURVE", ServerKeyWrong),  # the node speaks CURVE: the key is what is wrong
        (True, None, ServerKeyWrong),  # no greeting: what the monitor said stands
    ):
        link = Link(EP, encrypted)
        feed(link, handshake.EVENT_CONNECTED, handshake.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        assert link.unclear
        assert type(link.learn_mechanism(mechanism)) is error
        assert not link.unclear


def test_a_refused_connection_is_a_retry_that_never_connected():
    link = Link(EP, False)
    assert type(feed(link, handshake.EVENT_CONNECT_RETRIED)) is ConnectionRefused
    assert link.error.retriable
    # A connection that was up and went away is retried too: that alone refuses nothing.
    link = Link(EP, False)
    feed(link, handshake.EVENT_CONNECTED, handshake.EVENT_HANDSHAKE_SUCCEEDED, handshake.EVENT_DISCONNECTED)
    assert feed(link, handshake.EVENT_CONNECT_RETRIED) is None
    assert type(feed(link, handshake.EVENT_CONNECT_RETRIED)) is ConnectionRefused  # the next attempt was refused
    # And the refused handshake it followed is not overwritten by the retry after it.
    link = Link(EP, True)
    feed(link, handshake.EVENT_CONNECTED, (handshake.EVENT_HANDSHAKE_FAILED_AUTH, 400), handshake.EVENT_DISCONNECTED)
    assert type(feed(link, handshake.EVENT_CONNECT_RETRIED)) is KeyRefused


def test_a_handshake_that_succeeds_clears_what_failed_before():
    link = Link(EP, False)
    feed(link, handshake.EVENT_CONNECT_RETRIED)
    assert feed(link, handshake.EVENT_CONNECTED, handshake.EVENT_HANDSHAKE_SUCCEEDED) is None
    assert link.ready


def test_a_timeout_says_how_far_the_connection_got():
    link = Link(EP, False)
    assert "no connection was made" in link.silence()
    feed(link, handshake.EVENT_CONNECTED)
    assert "handshake never finished" in link.silence()
    feed(link, handshake.EVENT_HANDSHAKE_SUCCEEDED)
    assert link.silence() == ""
    curve = Link(EP, True)
    feed(curve, handshake.EVENT_CONNECTED, handshake.EVENT_HANDSHAKE_SUCCEEDED)
    assert "allow-list" in curve.silence()


def test_the_greeting_names_the_mechanism_and_nothing_else_is_read_as_one():
    def greeting(mechanism: bytes, major: int = 3) -> bytes:
        return b"\xff" + bytes(8) + b"\x7f" + bytes([major, 0]) + mechanism.ljust(20, b"\0") + bytes(32)

    assert greeting_mechanism(greeting(b"NULL")) == "NULL"
    assert greeting_mechanism(greeting(b"CURVE")) == "CURVE"
    assert greeting_mechanism(greeting(b"CURVE")[:32]) == "CURVE"
    assert greeting_mechanism(greeting(b"CURVE", major=2)) is None
    assert greeting_mechanism(greeting(b"CURVE")[:20]) is None
    assert greeting_mechanism(b"HTTP/1.1 400 Bad Request\r\n" + bytes(40)) is None
    assert greeting_mechanism(greeting(b"\x01\x02")) is None
    assert greeting_address("tcp://127.0.0.1:5555") == ("tcp", ("127.0.0.1", 5555))
    assert greeting_address("tcp://[::1]:5555") == ("tcp", ("::1", 5555))
    assert greeting_address("ipc:///run/x.sock") == ("ipc", "/run/x.sock")
    assert greeting_address("inproc://x") is None


# -- a connection that can carry nothing, to the rounds ------------------------------------


def client(endpoints=(EP,), retries: int = 2, **kw) -> ClientBase:
    return ClientBase(list(endpoints), timeout_s=1.0, retries=retries, window=4, **kw)


REFUSED = ConnectionRefused("refused")


def test_a_refusal_fails_over_at_once_while_an_endpoint_is_untried():
    c = client(endpoints=("tcp://127.0.0.1:1", "tcp://127.0.0.1:2"))
    r = ReserveRound(c, ReserveJob(10, retries=0))
    r.requests(0)
    assert r.on_failed(REFUSED, 0) == 0.0  # no back-off, no retry used
    assert not r.waiting and r.job.unasked == 10 and r.job.attempts == 0
    c._forget_connection(rotate=True)
    r.requests(0)
    # Both refused, no endpoint has ever answered: the call says so at once, naming both.
    with pytest.raises(ConnectionRefused, match=r"tcp://127.0.0.1:1, tcp://127.0.0.1:2"):
        r.on_failed(REFUSED, 0)


def test_a_refusal_from_a_node_that_answered_before_is_retried_with_back_off():
    c = client(retries=2)
    c._core.heard = True  # a node that restarts refuses for a moment
    r = ReserveRound(c, ReserveJob(1, retries=2))
    for _ in range(2):
        r.requests(0)
        assert 0 < r.on_failed(REFUSED, 0) <= 1.0
    r.requests(0)
    with pytest.raises(ConnectionRefused):
        r.on_failed(REFUSED, 0)


def test_a_refused_handshake_is_never_retried():
    c = client(retries=5)
    c._core.heard = True
    r = ReserveRound(c, ReserveJob(1, retries=5))
    r.requests(0)
    with pytest.raises(KeyRefused):
        r.on_failed(KeyRefused("not on the list"), 0)
    s = StatusRound(c, "status")
    with pytest.raises(KeyRefused):
        s.on_failed(KeyRefused("not on the list"), 0)


def test_a_time_budget_retries_until_it_has_passed_whatever_the_count():
    c = client(retries=0, retry_for_s=10.0)
    assert c.wait_for_server  # a budget in time waits for a server that is not there yet
    r = ReserveRound(c, ReserveJob(1, retries=0), started_ns=0)
    for second in range(10):
        r.requests(second * S)
        assert r.on_failed(REFUSED, second * S) > 0
    r.requests(10 * S)
    with pytest.raises(ConnectionRefused):
        r.on_failed(REFUSED, 10 * S)
    # Timeouts too: the attempt that ends past the budget gives up.
    r = ReserveRound(c, ReserveJob(1, retries=0), started_ns=0)
    r.requests(0)
    assert r.settle(9 * S)[0]
    r.requests(9 * S)
    with pytest.raises(Timeout, match="gave up after 2 failed attempts"):
        r.settle(11 * S)
    s = StatusRound(c, "status", started_ns=0)
    assert s.on_failed(REFUSED, 9 * S) > 0
    with pytest.raises(ConnectionRefused):
        s.on_failed(REFUSED, 10 * S)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "5", True])
def test_a_time_budget_must_be_a_positive_number_of_seconds(bad):
    with pytest.raises(ValueError, match="retry_for_s"):
        client(retry_for_s=bad)


def test_a_nodes_request_that_times_out_counts_against_the_call():
    # Asked before the round's own requests: its timeout is the call's first failed attempt,
    # so asking for the nodes never adds a timeout to the bound.
    c = client(retries=0)
    c._core.heard = True
    r = ReserveRound(c, ReserveJob(1, retries=0))
    with pytest.raises(Timeout, match="gave up after 1 failed attempt"):
        r.discovery_timed_out(1 * S)
    c = client(endpoints=("tcp://127.0.0.1:1", "tcp://127.0.0.1:2"), retries=0)
    c._core.heard = True
    r = ReserveRound(c, ReserveJob(1, retries=0))
    r.discovery_timed_out(1 * S)  # a failover: the other endpoint is untried
    assert r.job.failovers == 1 and r.job.attempts == 0
