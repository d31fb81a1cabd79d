"""The HTTP door's requests and answers without a socket (broker/doors/http_requests.py):
what a request asks, the bodies it asks of the routing core, its replies taken in, and when
its answer is overdue, on a fake clock. The door around them, on real sockets: test_http.py."""

from __future__ import annotations

import itertools
import json

import orjson
import pytest
from fakeclock import FakeClock
from hypothesis import given
from hypothesis import strategies as st

from snowfence import protocol
from snowfence.broker.doors import http_requests as hr
from snowfence.config import Config
from snowfence.errors import Fenced

LAYOUT = Config().layout


def routed(target: bytes, method: bytes = b"GET", body: bytes | None = None) -> hr.Request:
    return hr.route(method, target, body, False, False, LAYOUT)


def asked(req: hr.Request) -> tuple[list[bytes], dict[int, hr.Request]]:
    """The bodies ``req`` asks of the core now, and its connection's waiting table."""
    batch: list = []
    waiting: dict[int, hr.Request] = {}
    hr.ask(req, b"\x00\x01" + bytes(7), itertools.count(1).__next__, waiting, batch)
    return [body for _, _, body in batch], waiting


def test_a_request_for_ids_is_split_into_reserves_of_at_most_a_block_and_a_partial_grant_asks_again():
    req = routed(b"/v1/ids?count=10000")
    assert not req.refused and req.kind == hr.IDS and req.want == 10_000
    bodies, waiting = asked(req)
    assert [protocol.plain_reserve(b)[1] for b in bodies] == [4096, 4096, 1808]
    assert set(waiting) == {1, 2, 3} and req.want == 0

    def reply(rid: int, count: int) -> bool:
        waiting.pop(rid)  # as the door does before it hands the reply over
        return hr.take_reply(req, rid, protocol.encode_block(rid, rid << 30, count), waiting)

    # The first is granted in full, the second in part: the rest is to be asked again.
    assert reply(1, 4096) is False
    assert reply(2, 96) is True and req.want == 4000 and not req.done
    assert reply(3, 1808) is False and not req.done  # 4,000 still to come
    bodies, waiting = asked(req)
    assert [protocol.plain_reserve(b)[1] for b in bodies] == [4000]
    waiting.pop(1)
    assert hr.take_reply(req, 1, protocol.encode_block(1, 9 << 30, 4000), waiting) is False and req.done
    assert sum(count for _, count in req.got) == 10_000


def test_an_error_reply_answers_the_request_and_drops_what_else_it_waits_for():
    req = routed(b"/v1/ids?count=5000")
    _, waiting = asked(req)
    waiting.pop(1)
    assert hr.take_reply(req, 1, protocol.encode_error(1, Fenced("scripted")), waiting) is False
    assert req.done and req.status == 503 and not waiting and not req.rids
    assert b'"code":"fenced"' in req.out


@pytest.mark.parametrize(
    "target, method, status",
    [
        (b"/v1/nope", b"GET", 404),
        (b"/v1/status", b"POST", 405),
        (b"/v1/ids?count=0", b"GET", 400),
        (b"/v1/status?x=1", b"GET", 400),
        (b"/v1/bounds", b"GET", 400),
    ],
)
def test_a_request_the_door_refuses_is_answered_at_once_and_counts_as_refused(target, method, status):
    req = routed(target, method)
    assert req.done and req.kind == hr.DONE and req.status == status and req.refused  # never asked of the core


def test_bounds_are_answered_from_the_layout_without_the_core():
    req = routed(b"/v1/bounds?start=1772323200000")
    assert req.done and req.status == 200 and not req.refused
    assert orjson.loads(req.out.split(b"\r\n\r\n", 1)[1])["ranges"]


def test_an_answer_is_overdue_on_the_first_scan_past_answer_s_on_a_fake_clock():
    clock = FakeClock()
    timeouts = hr.Timeouts()
    answered, unanswered = routed(b"/v1/status"), routed(b"/v1/status")
    asked_ns = clock.mono_ns()
    late_at = None
    for _ in range(200):  # the loop's housekeeping, every 10 ms... here every 50 ms for 10 s
        clock.advance_ms(50)
        if timeouts.scan_due(clock.mono_ns()):
            for req in timeouts.overdue([answered, unanswered]):
                assert req is unanswered and late_at is None
                late_at = clock.mono_ns()
                req.fail(503, b"{}")  # what the door does: answered, never overdue again
        if clock.mono_ns() - asked_ns == 1_000_000_000:
            answered.fail(200, b"{}")
    assert late_at is not None
    waited_s = (late_at - asked_ns) / 1e9
    assert hr.ANSWER_S < waited_s <= hr.ANSWER_S + hr.SCAN_S + 0.05, waited_s


def test_scans_come_every_scan_s_however_often_the_loop_asks():
    timeouts = hr.Timeouts(scan_s=0.5)
    now = 10**12
    due = [timeouts.scan_due(now + i * 10_000_000) for i in range(101)]  # every 10 ms for 1 s
    assert sum(due) == 3 and due[0] and due[50] and due[100]


@given(st.lists(st.tuples(st.integers(0, (1 << 63) - 5000), st.integers(1, 4096)), min_size=1, max_size=5))
def test_an_id_list_is_every_id_as_its_decimal_string(blocks):
    assert json.loads(hr.ids_json(blocks)) == {"ids": [str(i) for f, c in blocks for i in range(f, f + c)]}
