"""The client's sans-I/O core: splitting, partial grants, retries, stale replies; and the
fast-path policy, which both clients obey."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from snowfence import AsyncClient, Client
from snowfence import protocol as p
from snowfence.clients import aio
from snowfence.clients.core import KEEP, Block, ClientBase, Core, FastPath, ReserveJob
from snowfence.errors import ConnectionRefused, Fenced, Timeout


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
    assert job.done and sum(b.count for b in job.blocks) == 4096
    assert [b.first for b in job.result()] == [10, 5000]


def test_retries_are_bounded():
    job = ReserveJob(1, retries=2)
    for _ in range(2):
        job.to_send()
        assert job.on_lost(1, Fenced())
    job.to_send()
    assert not job.on_lost(1, Timeout())
    assert isinstance(job.last_error, Timeout)


@pytest.mark.parametrize(
    "n, error", [(0, ValueError), (-5, ValueError), (1.5, TypeError), ("3", TypeError), (True, TypeError)]
)
def test_bad_counts_are_refused_before_anything_is_sent(n, error):
    with pytest.raises(error):
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


# -- the fast-path policy: decided once, in the core, and obeyed by both clients -----------------

S = 1_000_000_000
NODE = "tcp://127.0.0.1:1"


def learnt(port=40001, endpoint=NODE) -> FastPath:
    fp = FastPath()
    fp.learn({"fast_port": port, "nodes": []}, endpoint)
    return fp


def test_only_a_reservation_that_fits_one_request_goes_to_the_fast_port():
    fp = learnt()
    big = p.MAX_BLOCK
    assert fp.route(NODE, 1, big, 0, False) == ("127.0.0.1", 40001)
    assert fp.route(NODE, big, big, 0, False) == ("127.0.0.1", 40001)
    assert fp.route(NODE, big + 1, 10**6, 0, False) is None  # more than one request holds
    assert fp.route(NODE, 65, 64, 0, False) is None  # split in requests of 64
    assert fp.route(NODE, 64, 64, 0, False) is not None
    assert fp.route(NODE, 1, big, 0, True) is None  # CURVE: the port has none
    assert fp.route("tcp://127.0.0.2:1", 1, big, 0, False) is None  # no port learnt for that node
    # The open connection is kept by the same rule.
    assert fp.still(NODE, NODE, 40001, big, big) and not fp.still(NODE, NODE, 40001, big + 1, 10**6)
    assert not fp.still(NODE, NODE, 40001, 65, 64)
    conn = SimpleNamespace(where=("127.0.0.1", 40001), endpoint=NODE)
    assert fp.choose(NODE, conn, 64, 64, 0, False) is KEEP
    assert fp.choose(NODE, conn, 65, 64, 0, False) is None
    assert fp.choose(NODE, None, 1, big, 0, False) == ("127.0.0.1", 40001)


def test_a_failed_fast_port_is_left_alone_for_30_s_and_asked_for_again():
    fp = learnt()
    fp.asked = NODE
    fp.failed(NODE, 7)
    assert fp.off_until_ns == 7 + 30 * S
    assert fp.unknown(NODE, False)  # asked again: a node restarted with auto has another port
    fp.learn({"fast_port": 40002, "nodes": []}, NODE)
    assert fp.route(NODE, 1, p.MAX_BLOCK, 7 + 30 * S - 1, False) is None
    assert not fp.still(NODE, NODE, 40002, 1, p.MAX_BLOCK)
    assert fp.route(NODE, 1, p.MAX_BLOCK, 7 + 30 * S, False) == ("127.0.0.1", 40002)
    assert fp.off_until_ns == 0 and fp.still(NODE, NODE, 40002, 1, p.MAX_BLOCK)


def test_a_timeout_while_a_fast_connection_is_open_is_the_fast_ports_failure_too():
    c = ClientBase(NODE)
    c.fast_path.learn({"fast_port": 40001, "nodes": []}, c.endpoint)
    c._reset(rotate=True, now_ns=5)  # no fast connection open: the port is not to blame
    assert c.fast_path.off_until_ns == 0
    c._fast = SimpleNamespace(where=("127.0.0.1", 40001), endpoint=NODE)
    c._reset(rotate=False, now_ns=5)  # a move, not a failure
    assert c.fast_path.off_until_ns == 0
    c._reset(rotate=True, now_ns=5)
    assert c.fast_path.off_until_ns == 5 + 30 * S


class ScriptedConnection:
    """The blocking client's fast connection, answering each request as ``answer`` says
    (a reply body, None for none, or OSError for the connection closing under it)."""

    def __init__(self, answer):
        self.where, self.endpoint, self.answer, self.asked, self.replies = ("127.0.0.1", 1), NODE, answer, [], []

    def send(self, frame):
        request = p.decode_request(frame)
        self.asked.append(request.count)
        reply = self.answer(request.request_id, request.count)
        if reply is OSError:
            raise ConnectionResetError("scripted")
        if reply is not None:
            self.replies.append(reply)

    def recv_within(self, timeout_ms):
        return self.replies.pop(0) if self.replies else None

    recv_ready = recv_within

    def close(self):
        pass


class ScriptedTransport:
    """The asyncio client's fast transport, answering as :class:`ScriptedConnection` does."""

    def __init__(self, proto, answer):
        self.proto, self.answer, self.asked = proto, answer, []

    def write(self, data):
        request = p.decode_request(data[4:])
        self.asked.append(request.count)
        reply = self.answer(request.request_id, request.count)
        loop = asyncio.get_running_loop()
        if reply is OSError:
            loop.call_soon(self.proto.connection_lost, ConnectionResetError("scripted"))
        elif reply is not None:
            loop.call_soon(self.proto.data_received, p.encode_stream(reply))

    def close(self):
        pass


def blocking_client(answer):
    c = Client(NODE)
    c._core.heard = True
    c.fast_path.learn({"fast_port": 1, "nodes": []}, c.endpoint)
    c.fast_path.asked = NODE
    c.directory.asked(time.monotonic_ns())  # discovery not due for a while
    c._fast = ScriptedConnection(answer)
    rounds = []

    def run(round_, chunk=p.MAX_BLOCK, sent=None):  # a round on ZeroMQ: grants what it is left
        rounds.append(round_.job.n)
        if sent is not None:
            c._take_over(round_, *sent)
        round_.abandon()
        round_.job.blocks, round_.job.unasked, round_.job.inflight = [Block(500, round_.job.n)], 0, 0

    c._run = run
    return c, c._fast, rounds


def async_client(answer):
    c = AsyncClient(NODE)
    c._core.heard = True
    c.fast_path.learn({"fast_port": 1, "nodes": []}, c.endpoint)
    c.fast_path.asked = NODE
    c.directory.asked(time.monotonic_ns())
    proto = aio._FastProtocol(c, ("127.0.0.1", 1), NODE)
    proto.transport = ScriptedTransport(proto, answer)
    c._fast = proto
    rounds = []

    async def reserve_in_rounds(n, *, after=None, chunk=p.MAX_BLOCK, sent=None):
        rounds.append(n)
        if sent is not None:
            c._core.abandon((sent[0],))
        return [Block(500, n)]

    c._reserve = reserve_in_rounds
    return c, proto.transport, rounds


def reserve(c, n, **kw):
    if isinstance(c, AsyncClient):
        return asyncio.new_event_loop().run_until_complete(c.reserve(n, **kw))
    return c.reserve(n, **kw)


CLIENTS = pytest.mark.parametrize("make", [blocking_client, async_client], ids=["blocking", "asyncio"])


def granted(rid, n):
    return p.encode_block(rid, 1000, n)


@CLIENTS
def test_both_clients_send_one_request_on_the_fast_port_only_when_the_reservation_fits_one(make):
    c, conn, rounds = make(granted)
    assert reserve(c, p.MAX_BLOCK) == [Block(1000, p.MAX_BLOCK)]
    assert conn.asked == [p.MAX_BLOCK] and rounds == [] and not c._core.inflight
    assert reserve(c, p.MAX_BLOCK + 1) == [Block(500, p.MAX_BLOCK + 1)]  # two requests: a round's
    assert reserve(c, 1, after=5) == [Block(500, 1)]  # a causal token: a round's
    assert conn.asked == [p.MAX_BLOCK] and rounds == [p.MAX_BLOCK + 1, 1]


@CLIENTS
def test_both_clients_do_what_the_fast_path_policy_says(make):
    class Ruling(FastPath):
        def __init__(self, verdict):
            super().__init__()
            self.verdict, self.calls = verdict, []

        def still(self, *args):
            self.calls.append(args)
            return self.verdict

    def policy(verdict):
        replaced = Ruling(verdict)
        replaced.ports, replaced.asked = c.fast_path.ports, c.fast_path.asked  # what was learnt
        return replaced

    c, conn, rounds = make(granted)
    c.fast_path = policy(False)
    assert reserve(c, 3) == [Block(500, 3)]
    assert c.fast_path.calls == [(NODE, NODE, 1, 3, p.MAX_BLOCK)] and conn.asked == [] and rounds == [3]
    c.fast_path = policy(True)
    assert reserve(c, 3) == [Block(1000, 3)]
    assert conn.asked == [3] and rounds == [3]


@CLIENTS
def test_both_clients_leave_a_fast_port_that_closed_under_a_request_alone_for_30_s(make):
    c, conn, rounds = make(lambda rid, n: OSError)
    before = time.monotonic_ns()
    assert reserve(c, 2) == [Block(500, 2)]  # asked again, in a round
    after = time.monotonic_ns()
    assert conn.asked == [2] and rounds == [2] and c._fast is None
    assert before + 30 * S <= c.fast_path.off_until_ns <= after + 30 * S
    c.fast_path.learn({"fast_port": 1, "nodes": []}, c.endpoint)  # even a port learnt again is left alone
    assert c._fast_choice(None, 1, p.MAX_BLOCK, c.fast_path.off_until_ns - 1) is None
    assert c._fast_choice(None, 1, p.MAX_BLOCK, c.fast_path.off_until_ns) == ("127.0.0.1", 1)


class _Round:
    """A round whose ``on_failed`` answers a wait, or raises what it is given."""

    def __init__(self, answer):
        self.answer = answer
        self.seen = []

    def on_failed(self, error, now_ns):
        self.seen.append((error, now_ns))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


@pytest.mark.parametrize("answer", [0.25, Fenced("refused for good")])
def test_a_refused_connection_goes_whatever_the_round_decides(answer):
    """Both clients, on a request whose connection was refused: the round says how long to wait
    (or gives up), and the connection goes either way: its requests are abandoned and the next
    connection is to the next endpoint."""
    c = ClientBase(["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"])
    pending, _ = c._core.status(10**12)
    round_, error = _Round(answer), ConnectionRefused("the node refused the connection")
    if isinstance(answer, BaseException):
        with pytest.raises(type(answer)):
            c._connection_failed(round_, error, 5_000)
    else:
        assert c._connection_failed(round_, error, 5_000) == answer
    assert round_.seen == [(error, 5_000)]
    assert c.resets == 1 and c.endpoint == "tcp://127.0.0.1:2" and not c._core.inflight
