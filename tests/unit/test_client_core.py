"""The client's sans-I/O core: splitting, partial grants, retries, stale replies."""

from __future__ import annotations

import pytest

from snowfence import protocol as p
from snowfence.clients.core import Block, Core, ReserveJob
from snowfence.errors import BadRequest, Fenced, Timeout


def test_block_behaves_like_a_range():
    b = Block(100, 5)
    assert list(b) == [100, 101, 102, 103, 104] and len(b) == 5 and b.last == 104
    assert 102 in b and 105 not in b
    assert b == Block(100, 5) and b != Block(100, 4)


def test_large_reservation_is_split_into_pipelined_requests():
    job = ReserveJob(10_000, window=2)
    assert job.to_send() == [4096, 4096]
    assert job.to_send() == []  # window full
    job.on_block(4096, Block(0, 4096))
    assert job.to_send() == [1808]


def test_partial_grant_asks_again_for_the_rest():
    job = ReserveJob(4096)
    assert job.to_send() == [4096]
    job.on_block(4096, Block(10, 96))
    assert job.to_send() == [4000]
    job.on_block(4000, Block(5000, 4000))
    assert job.done and job.granted == 4096
    assert [b.first for b in job.result()] == [10, 5000]


def test_retries_are_bounded():
    job = ReserveJob(1, retries=2)
    for _ in range(2):
        job.to_send()
        assert job.on_lost(1, Fenced())
    job.to_send()
    assert not job.on_lost(1, Timeout())
    assert isinstance(job.last_error, Timeout)


@pytest.mark.parametrize("n", [0, -5, 1.5, "3", True])
def test_bad_counts_are_refused_before_anything_is_sent(n):
    with pytest.raises(BadRequest):
        ReserveJob(n)


def test_core_matches_replies_and_drops_stale_or_unknown_ones():
    core = Core()
    pending, frame = core.reserve(10, deadline_ns=100)
    req = p.decode_request(frame)
    assert req.count == 10 and req.request_id == pending.request_id
    assert core.match(p.encode_block(pending.request_id + 1, 5, 10)) is None  # unknown id
    assert core.match(b"junk") is None
    assert core.match(p.encode_block(pending.request_id, 5, 11)) is None  # more than asked
    matched = core.match(p.encode_block(pending.request_id, 5, 10))
    assert matched is not None and matched[0] is pending and matched[1].first == 5
    assert core.match(p.encode_block(pending.request_id, 5, 10)) is None  # a duplicate is stale


def test_abandoned_requests_never_match_later():
    core = Core()
    pending, _ = core.reserve(1, deadline_ns=0)
    assert core.expired(now_ns=1) == [pending]
    core.abandon([pending])
    assert core.match(p.encode_block(pending.request_id, 1, 1)) is None
