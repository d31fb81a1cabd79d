"""The clients' round policy, without a socket: what a reply, a timeout, a refusal
or ``overloaded`` makes a reservation (or a status request) do next, and how many
blocks ``ids()`` keeps in hand. Both clients run these same objects."""

from __future__ import annotations

import pytest

from snowfence import protocol
from snowfence.clients.core import BACKOFF_MAX_S, ClientBase, PrefetchDepth, ReserveJob, ReserveRound, StatusRound
from snowfence.errors import BadRequest, Fenced, Overloaded, Timeout

S = 1_000_000_000


def client(endpoints=("tcp://127.0.0.1:5555",), retries: int = 2, window: int = 4) -> ClientBase:
    return ClientBase(list(endpoints), timeout_s=1.0, retries=retries, window=window, server_key=None, client_key=None)


def answer(c: ClientBase, round_: ReserveRound, pending, body: bytes) -> None:
    matched = c._core.match(body)
    assert matched is not None and matched[0] is pending
    round_.on_reply(*matched)


def grant(c, round_, pending, first: int = 1 << 40) -> None:
    answer(c, round_, pending, protocol.encode_block(pending.request_id, first, pending.count))


def refuse(c, round_, pending, err) -> None:
    answer(c, round_, pending, protocol.encode_error(pending.request_id, err))


def overloaded(retry_after_ms):
    err = Overloaded("busy")
    err.retry_after_ms = retry_after_ms
    return err


def test_a_round_keeps_the_window_in_flight_and_is_done_when_everything_is_granted():
    c = client(window=3)
    r = ReserveRound(c, ReserveJob(10, window=3, chunk=2))
    sent = r.requests(0)
    assert [p.count for p, _ in sent] == [2, 2, 2]
    assert all(p.deadline_ns == 1 * S for p, _ in sent)
    grant(c, r, sent[0][0])
    assert r.settle(0) == (False, 0.0)
    assert [p.count for p, _ in r.requests(0)] == [2]
    for p in list(r.waiting.values()):
        grant(c, r, p)
    assert [p.count for p, _ in r.requests(0)] == [2]
    grant(c, r, next(iter(r.waiting.values())))
    assert r.done and r.settle(0) == (False, 0.0)


def test_a_timed_out_round_counts_one_attempt_and_resets_and_asks_again():
    # One attempt however many requests were in flight: a pipelined reservation
    # that times out once must fail over, not use up its retries at a stroke.
    c = client()
    r = ReserveRound(c, ReserveJob(8, window=4, chunk=2, retries=5))
    sent = r.requests(0)
    grant(c, r, sent[0][0])  # the server has answered before: not a dead address
    assert r.deadline_ns(0) == 1 * S
    assert r.settle(1 * S) == (True, 0.0)
    assert r.job.attempts == 1 and isinstance(r.job.last_error, Timeout)
    assert not r.waiting and not c._core.inflight  # nothing of the old socket can match later
    assert [p.count for p, _ in r.requests(1 * S)] == [2, 2, 2]


def test_timeouts_past_the_retries_raise_the_timeout():
    c = client(retries=1)
    r = ReserveRound(c, ReserveJob(1, retries=1))
    [(p, _)] = r.requests(0)
    c._core.heard = True
    assert r.settle(1 * S)[0]
    r.requests(1 * S)
    with pytest.raises(Timeout, match="no reply from tcp://127.0.0.1:5555 within 1.0 s"):
        r.settle(2 * S)


def test_nothing_expires_before_its_deadline():
    c = client()
    r = ReserveRound(c, ReserveJob(1))
    r.requests(0)
    assert r.settle(1 * S - 1) == (False, 0.0)
    assert len(r.waiting) == 1 and r.job.attempts == 0


def test_no_endpoint_ever_replied_gives_up_after_one_timeout_per_endpoint_with_a_hint():
    c = client(endpoints=("tcp://127.0.0.1:1", "tcp://127.0.0.1:2"), retries=5)
    r = ReserveRound(c, ReserveJob(1, retries=5))
    r.requests(0)
    assert r.settle(1 * S) == (True, 0.0)  # the first endpoint had its timeout; try the second
    c._forget_connection(rotate=True)
    r.requests(1 * S)
    with pytest.raises(Timeout, match=r"no endpoint ever replied .*tcp://127.0.0.1:1, tcp://127.0.0.1:2"):
        r.settle(2 * S)


def test_a_retriable_refusal_backs_off_and_moves_to_the_next_endpoint_when_there_is_one():
    c = client(endpoints=("tcp://127.0.0.1:1", "tcp://127.0.0.1:2"))
    r = ReserveRound(c, ReserveJob(4, chunk=2, window=2))
    (a, _), (b, _) = r.requests(0)
    refuse(c, r, a, Fenced("fenced"))
    reset, sleep_s = r.settle(0)
    assert reset and 0 < sleep_s <= BACKOFF_MAX_S
    assert not r.waiting and r.job.unasked == 4  # b is asked again on the next endpoint too


def test_a_retriable_refusal_with_one_endpoint_backs_off_on_the_same_connection():
    c = client()
    r = ReserveRound(c, ReserveJob(4, chunk=2, window=2))
    (a, _), (b, _) = r.requests(0)
    refuse(c, r, a, Fenced("fenced"))
    reset, sleep_s = r.settle(0)
    assert not reset and sleep_s > 0
    assert list(r.waiting.values()) == [b]


def test_overloaded_waits_as_long_as_the_server_says_and_never_rotates():
    c = client(endpoints=("tcp://127.0.0.1:1", "tcp://127.0.0.1:2"))
    r = ReserveRound(c, ReserveJob(4, chunk=2, window=2))
    (a, _), (b, _) = r.requests(0)
    refuse(c, r, a, overloaded(250))
    assert r.settle(0) == (False, 0.25)
    assert list(r.waiting.values()) == [b] and r.job.window == 1 and r.job.attempts == 0


def test_an_error_that_is_not_retriable_ends_the_round_and_abandon_forgets_its_requests():
    c = client()
    r = ReserveRound(c, ReserveJob(4, chunk=2, window=2))
    (a, _), (b, _) = r.requests(0)
    with pytest.raises(BadRequest):
        refuse(c, r, a, BadRequest("no"))
    assert r.abandon() == [b]
    assert not c._core.inflight and not r.waiting


def test_a_request_dropped_with_its_socket_is_asked_again_without_using_a_retry():
    c = client()
    r = ReserveRound(c, ReserveJob(2, chunk=2, window=1, retries=0))
    [(p, _)] = r.requests(0)
    r.on_dropped(p)
    assert r.job.attempts == 0 and r.job.unasked == 2
    assert [q.count for q, _ in r.requests(0)] == [2]


def test_a_reply_to_another_round_is_not_taken():
    c = client()
    mine, other = ReserveRound(c, ReserveJob(1)), ReserveRound(c, ReserveJob(1))
    [(p, _)] = other.requests(0)
    mine.requests(0)
    matched = c._core.match(protocol.encode_block(p.request_id, 1 << 40, 1))
    mine.on_reply(*matched)
    assert not mine.job.blocks and len(mine.waiting) == 1


# -- status --------------------------------------------------------------------------------


def test_status_is_asked_again_up_to_the_retries_then_times_out_naming_the_endpoint():
    c = client(retries=2)
    c._core.heard = True
    s = StatusRound(c)
    for _ in range(2):
        s.request(0)
        s.on_lost(0)
    s.request(0)
    with pytest.raises(Timeout, match="no status reply from tcp://127.0.0.1:5555"):
        s.on_lost(0)


def test_status_from_nowhere_gives_up_after_one_timeout_per_endpoint():
    c = client(endpoints=("tcp://127.0.0.1:1", "tcp://127.0.0.1:2"), retries=5)
    s = StatusRound(c)
    s.request(0)
    s.on_lost(0)
    s.request(0)
    with pytest.raises(Timeout, match="no endpoint ever replied"):
        s.on_lost(0)


def test_status_returns_the_reply_or_raises_its_error():
    c = client()
    s = StatusRound(c)
    pending, _ = s.request(0)
    _, reply = c._core.match(protocol.encode_status_reply(pending.request_id, {"version": 1}))
    assert s.on_reply(reply) == {"version": 1}
    pending, _ = s.request(0)
    _, reply = c._core.match(protocol.encode_error(pending.request_id, Fenced("x")))
    with pytest.raises(Fenced):
        s.on_reply(reply)


# -- prefetch depth ------------------------------------------------------------------------


def test_prefetch_depth_doubles_when_the_consumer_waits_up_to_the_limit():
    d = PrefetchDepth(batch=100, depth=5, max_age_s=1.0)
    assert d.target == 2 and d.wanted_ids(0) == 200 and d.wanted_ids(2) == 0
    d.starved()
    assert d.target == 4
    d.starved()
    assert d.target == 5 and d.wanted_ids(1) == 400


def test_prefetch_depth_halves_and_drops_a_stale_block_but_never_goes_below_one():
    d = PrefetchDepth(batch=1, depth=64, max_age_s=1.0)
    for _ in range(4):
        d.starved()
    assert d.target == 32
    assert not d.stale(0, 1 * S)  # exactly max_age_s old is still fresh
    assert d.stale(0, 1 * S + 1) and d.target == 16 and d.dropped == 1
    for _ in range(10):
        d.stale(0, 5 * S)
    assert d.target == 1


def test_prefetch_without_an_age_limit_keeps_every_block():
    d = PrefetchDepth(batch=1, depth=4, max_age_s=None)
    assert not d.stale(0, 10**6 * S) and d.dropped == 0


@pytest.mark.parametrize("batch, depth", [(0, 1), (protocol.MAX_BLOCK + 1, 1), (1, 0)])
def test_prefetch_settings_out_of_range_are_refused(batch, depth):
    with pytest.raises(ValueError):
        PrefetchDepth(batch, depth, 1.0)


# -- failover ------------------------------------------------------------------------------


A, B = "tcp://127.0.0.1:1", "tcp://127.0.0.1:2"


def test_a_timeout_with_another_endpoint_to_go_to_uses_up_no_retry():
    c = client(endpoints=(A, B), retries=0)
    c._core.heard = True
    r = ReserveRound(c, ReserveJob(2, retries=0))
    r.requests(0)
    assert r.settle(1 * S) == (True, 0.0)  # A timed out: on to B, however few retries
    assert r.job.attempts == 0 and r.job.failovers == 1
    c._forget_connection(rotate=True)
    assert c.endpoint == B
    [(p, _)] = r.requests(1 * S)
    grant(c, r, p)
    assert r.done and r.settle(1 * S) == (False, 0.0)


def test_a_call_that_found_every_endpoint_unresponsive_counts_its_retries_and_says_how_long_it_waited():
    c = client(endpoints=(A, B), retries=1)
    c._core.heard = True
    r = ReserveRound(c, ReserveJob(4, chunk=2, window=2, retries=1), started_ns=0)
    (p, _), _ = r.requests(0)
    grant(c, r, p, first=1 << 41)
    r.settle(S // 2)  # a reply at 0.5 s; the other request is still out
    for now in (1, 2):  # A (free: B is left), then B (counted)
        assert r.settle(now * S)[0]
        c._forget_connection(rotate=True)
        r.requests(now * S)
    assert r.job.attempts == 1 and r.job.failovers == 1
    with pytest.raises(Timeout) as caught:
        r.settle(3 * S)  # A again: past the retries
    assert str(caught.value) == (
        f"no reply from {A} within 1.0 s (the timeout of each attempt); gave up after 3 failed attempts,"
        " 2.5 s without a reply"
    )


def test_a_late_reply_from_the_endpoint_given_up_on_never_answers_a_newer_request():
    c = client(endpoints=(A, B))
    c._core.heard = True
    r = ReserveRound(c, ReserveJob(5, chunk=5, window=1))
    [(old, _)] = r.requests(0)
    assert r.settle(1 * S)[0]
    c._forget_connection(rotate=True)
    [(new, _)] = r.requests(1 * S)
    assert new.request_id != old.request_id
    # The frozen node wakes up and answers the request the client gave up on, with a block
    # of the same size: it matches nothing (the blocking client has closed that socket anyway).
    assert c._core.match(protocol.encode_block(old.request_id, 1 << 40, 5)) is None
    assert r.waiting == {new.request_id: new} and not r.job.blocks
    grant(c, r, new, first=1 << 41)
    assert r.job.result()[0].first == 1 << 41


def test_status_fails_over_without_using_a_retry_and_gives_up_saying_how_long_it_waited():
    c = client(endpoints=(A, B), retries=0)
    c._core.heard = True
    s = StatusRound(c, started_ns=0)
    s.request(0)
    c._forget_connection(rotate=True)
    s.on_lost(1 * S)  # A: free, B is left
    assert s.attempts == 0 and c.endpoint == B
    s.request(1 * S)
    c._forget_connection(rotate=True)
    with pytest.raises(Timeout, match=rf"no status reply from {B} within 1.0 s .*2 failed attempts, 2.0 s without"):
        s.on_lost(2 * S)


def test_discovery_waits_for_a_first_reply_and_takes_the_answer_or_nothing():
    c = client(endpoints=(A,))
    assert c._discovery(0) is None  # nobody has answered yet: a call says so first
    c._core.heard = True
    pending, _ = c._discovery(0)
    assert pending.kind == protocol.NODES and pending.deadline_ns == 1 * S
    assert c._discovery(1) is None  # asked: not again for a while
    assert c._discovered(None) is None  # no answer in time
    _, reply = c._core.match(
        protocol.encode_nodes_reply(pending.request_id, {"nodes": [{"endpoints": [B], "in_rotation": True}]})
    )
    assert c._discovered(reply) == B and c.endpoints == [B, A]


def nodes_reply(c: ClientBase, pending, *endpoints):
    body = protocol.encode_nodes_reply(
        pending.request_id, {"nodes": [{"endpoints": [ep], "in_rotation": True} for ep in endpoints]}
    )
    return c._core.match(body)[1]


def test_a_move_waits_while_other_requests_are_in_flight_and_is_made_at_the_next_call_for_both_clients():
    # The rule the asyncio client needs (tasks share its socket); the blocking one never has
    # another request in flight when it asks, and follows the same code.
    c = client(endpoints=(A,))
    c._core.heard = True
    pending, _ = c._discovery(0)
    busy = ReserveRound(c, ReserveJob(3))
    busy.requests(0)  # another task's reservation, on the same socket
    assert c._discovered(nodes_reply(c, pending, B)) is None
    assert c.endpoint == A and c.resets == 0  # its request is not dropped with the socket
    assert c._discovery(1) is None and c.endpoint == A  # still busy: still here
    busy.abandon()
    assert c._discovery(2) is None  # not due to ask again, but the move it owed is made
    assert c.endpoint == B and c.resets == 1


def test_a_request_left_in_flight_past_its_deadline_holds_a_move_up_no_longer():
    # A call interrupted (KeyboardInterrupt, a cancelled task) may leave its request behind.
    c = client(endpoints=(A,))
    c._core.heard = True
    pending, _ = c._discovery(0)
    ReserveRound(c, ReserveJob(1)).requests(0)  # never answered, never abandoned: due at 1 s
    c._discovered(nodes_reply(c, pending, B))
    c._discovery(1 * S - 1)
    assert c.endpoint == A
    c._discovery(1 * S)
    assert c.endpoint == B


def test_a_move_owed_to_a_node_that_has_left_since_is_not_made():
    c = client(endpoints=(A,))
    c._core.heard = True
    pending, _ = c._discovery(0)
    busy = ReserveRound(c, ReserveJob(3))
    busy.requests(0)
    c._discovered(nodes_reply(c, pending, B))
    busy.abandon()
    c.directory.endpoints = [A]  # a later answer no longer lists B
    c._discovery(1)
    assert c.endpoint == A and c.resets == 0


def test_an_answer_with_nothing_in_flight_moves_at_once():
    c = client(endpoints=(A,))
    c._core.heard = True
    pending, _ = c._discovery(0)
    assert c._discovered(nodes_reply(c, pending, B)) == B and c.endpoint == B and c.resets == 1


def test_prefetched_blocks_are_handed_out_in_order_stale_ones_passed_over_and_the_error_last():
    from snowfence.clients.core import Block, Prefetch

    p = Prefetch(PrefetchDepth(batch=10, depth=8, max_age_s=1.0))
    assert p.wanted() == 20  # two blocks to begin with
    assert p.take(0) is None and p.depth.target == 4 and p.wanted() == 40  # the consumer waited
    p.add([Block(100, 10), Block(200, 10)], asked_ns=0)
    p.add([Block(300, 10)], asked_ns=2 * S)
    assert p.take(2 * S) == (range(300, 310), 3 * S)  # the first two went stale; these until 3 s
    assert p.depth.dropped == 2
    p.add([Block(400, 10)], asked_ns=2 * S)
    p.error = Timeout("no reply")
    assert p.take(2 * S) == (range(400, 410), 3 * S)  # what is in hand first
    with pytest.raises(Timeout):
        p.take(2 * S)
    p.error, p.closed = None, True
    assert p.wanted() == 0
    with pytest.raises(ValueError, match="closed"):
        p.take(2 * S)


def test_both_clients_take_the_same_arguments_with_the_same_defaults():
    import inspect

    from snowfence import AsyncClient, Client

    assert inspect.signature(Client) == inspect.signature(AsyncClient) == inspect.signature(ClientBase)
    c = ClientBase(A)
    assert (c.timeout_s, c.retries, c.window, c.wait_for_server, c.curve) == (5.0, 5, 32, False, None)
    assert ClientBase(A, wait_for_server=True).wait_for_server


def test_each_id_is_handed_out_only_until_its_blocks_deadline():
    from snowfence.clients.core import fresh

    now = [0]
    handed = []
    for id_ in fresh(range(100, 110), 5, lambda: now[0]):
        handed.append(id_)
        now[0] += 1  # the consumer takes a moment over each, or pauses
    assert handed == list(range(100, 106))  # read at 0..5: the sixth one at the deadline itself, then no more
    now[0] = 6
    assert list(fresh(range(100, 110), 5, lambda: now[0])) == []  # a block gone stale before its first ID


def test_a_block_taken_without_max_age_has_no_deadline_and_is_never_stale():
    from snowfence.clients.core import Block, Prefetch

    p = Prefetch(PrefetchDepth(batch=10, depth=8, max_age_s=None))
    p.add([Block(100, 10)], asked_ns=0)
    assert p.take(10**6 * S) == (range(100, 110), None)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "1", True])
def test_max_age_must_be_a_positive_number_of_seconds_or_none(bad):
    with pytest.raises(ValueError, match="max_age_s"):
        PrefetchDepth(batch=10, depth=8, max_age_s=bad)
