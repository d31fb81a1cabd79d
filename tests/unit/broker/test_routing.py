"""The broker's routing core with no sockets: each test feeds it client requests
and worker frames by plain calls, reads what it sent from two lists, and moves a
fake monotonic clock by hand."""

from __future__ import annotations

import itertools

import orjson
import pytest

from snowfence import latency, protocol
from snowfence.broker.routing import MAX_TRIES, RETRY_AFTER_MAX_MS, Routing
from snowfence.config import Config

S = 1_000_000_000


def state_frame(payload: dict) -> bytes:
    """A STATE frame as a worker of any version might send it."""
    return bytes((protocol.STATE,)) + orjson.dumps(payload)


class Rig:
    """A routing core whose send functions write down what it sent."""

    def __init__(self, live_pids: set[int] | None = None, describe_broker=None, **settings) -> None:
        self.config = Config(**settings)
        self.now_ns = 1000 * S
        self.wall_ns = 1_800_000_000 * S
        #: Replies sent, by client connection: (meta, reply), oldest first.
        self.sent_to_clients: dict[bytes, list[tuple[int, bytes]]] = {}
        #: Frames sent, by worker socket, oldest first.
        self.sent_to_workers: dict[bytes, list[bytes]] = {}
        #: Worker sockets that are gone: sends to them fail.
        self.gone: set[bytes] = set()
        self.core = Routing(
            self.config,
            self.to_client,
            self.to_worker,
            clock=lambda: self.now_ns,
            wall_clock=lambda: self.wall_ns,
            describe_broker=describe_broker,
            live_pids=live_pids,
        )
        self.rids = itertools.count(1)

    # -- the send functions -------------------------------------------------------------

    def to_client(self, meta: int, addr: bytes, reply: bytes) -> None:
        self.sent_to_clients.setdefault(addr, []).append((meta, reply))

    def to_worker(self, ident: bytes, frame: bytes) -> bool:
        if ident in self.gone:
            return False
        self.sent_to_workers.setdefault(ident, []).append(frame)
        return True

    # -- fake workers ------------------------------------------------------------------

    def worker(self, slot: int, ready_ids: int = 1, credits: int | None = None, **fields) -> bytes:
        """A worker in rotation (unless told otherwise); its socket's identity."""
        ident = f"w{slot}".encode()
        self.state(ident, slot=slot, ready_ids=ready_ids, credits=credits or self.config.worker_credits, **fields)
        return ident

    def state(self, ident: bytes, slot: int | None = None, **fields) -> None:
        slot = int(ident[1:]) if slot is None else slot
        status = {"slot": slot, "pid": 1000 + slot, "ready": True, "ready_ids": 1, "credits": 32, "held": []}
        self.core.on_worker(ident, state_frame({**status, **fields}))

    def leave(self, ident: bytes, reason: str = "fenced") -> None:
        """As a worker says it has left rotation."""
        self.state(ident, ready=False, reason=reason, held=[{"worker_id": 1, "state": reason}])

    def work(self, ident: bytes) -> list[tuple[int, bytes, bytes]]:
        """WORK frames sent to ``ident`` since the last look: (meta, addr, body)."""
        frames = self.sent_to_workers.pop(ident, [])
        return [protocol.split_routed(f) for f in frames if f[0] == protocol.WORK]

    def pings(self, ident: bytes) -> int:
        return self.sent_to_workers.pop(ident, []).count(protocol.PING_FRAME)

    def answer(self, ident: bytes, work: tuple[int, bytes, bytes], first: int = 1 << 40) -> None:
        meta, addr, body = work
        rid, count = protocol.plain_reserve(body)
        self.core.on_worker(ident, protocol.encode_reply(meta, addr, protocol.encode_block(rid, first, count)))
        self.core.schedule()

    def refuse(self, ident: bytes, work: tuple[int, bytes, bytes], code: str = "clock_unsafe") -> None:
        meta, addr, body = work
        err = protocol.encode_error(protocol.request_id_of(body), protocol.from_code(code))
        self.core.on_worker(ident, protocol.encode_refused(meta, addr, body, err))
        self.core.schedule()

    # -- fake clients ------------------------------------------------------------------

    def ask(self, client: bytes, count: int, n: int = 1, after: int | None = None) -> None:
        for _ in range(n):
            self.core.request(0, client, protocol.encode_reserve(next(self.rids), count, after))

    def replies(self, client: bytes) -> list[protocol.Reply]:
        """Replies sent to ``client`` since the last look."""
        return [protocol.decode_reply(reply) for _, reply in self.sent_to_clients.pop(client, [])]

    def codes(self, client: bytes) -> list[str | None]:
        return [rep.error.code if rep.error else None for rep in self.replies(client)]

    # -- time --------------------------------------------------------------------------

    def pass_s(self, seconds: float, step_s: float = 0.5) -> None:
        """Time passes, the broker's timers ticking every ``step_s``."""
        for _ in range(round(seconds / step_s)):
            self.now_ns += int(step_s * S)
            self.core.tick(self.now_ns)

    def inflight(self) -> int:
        return sum(conn.inflight for conn in self.core.conns.values())


@pytest.fixture
def rig():
    return Rig


# -- placement: round robin within credits and the ID budget -------------------------------


def test_a_request_goes_to_a_worker_at_once_and_its_reply_to_the_client(rig):
    r = rig()
    w = r.worker(0)
    r.ask(b"c", 7)
    [(meta, addr, body)] = r.work(w)
    assert (meta, addr, protocol.plain_reserve(body)[1]) == (0, b"c", 7)
    r.answer(w, (meta, addr, body), first=1 << 41)
    [rep] = r.replies(b"c")
    assert (rep.first, rep.count, rep.error) == (1 << 41, 7, None)
    assert r.core.counters["requests"] == 1 and r.core.counters["replies"] == 1


def test_workers_take_requests_in_turn(rig):
    r = rig()
    workers = [r.worker(slot) for slot in range(3)]
    r.ask(b"c", 1, n=6)
    assert [len(r.work(w)) for w in workers] == [2, 2, 2]


def test_a_worker_gets_no_more_than_its_minting_budget_of_ids(rig):
    r = rig(worker_queue_ms=1.0)
    w = r.worker(0)
    r.ask(b"c", 4096, n=10)
    first = r.work(w)
    assert len(first) == 1  # one millisecond of one worker ID: one full block
    assert len(r.core.fair) == 9
    r.answer(w, first[0])
    assert len(r.work(w)) == 1


def test_the_budget_grows_with_the_worker_ids_a_worker_holds_and_with_the_setting(rig):
    r = rig(worker_queue_ms=2.0)
    w = r.worker(0, ready_ids=4)
    r.ask(b"c", 4096, n=20)
    assert len(r.work(w)) == 8  # 2 ms x 4 worker IDs x 4,096


def test_small_requests_still_pipeline_up_to_the_request_credits(rig):
    r = rig(worker_credits=32)
    w = r.worker(0)
    r.ask(b"c", 1, n=100)
    assert len(r.work(w)) == 32
    assert len(r.core.fair) == 68


def test_replies_free_the_workers_room_and_the_connection_stops_counting_once_nothing_is_in_flight(rig):
    r = rig(worker_credits=32)
    w = r.worker(0)
    r.ask(b"c", 100, n=3)
    sent = r.work(w)
    link = r.core.links[w]
    assert link.outstanding == 3 and link.sent_ids == 300
    [conn] = r.core.conns.values()
    assert conn.inflight == 3 and conn.ids == 300
    r.answer(w, sent[0])
    assert link.outstanding == 2 and link.sent_ids == 200 and conn.inflight == 2 and conn.ids == 200
    for work in sent[1:]:
        r.answer(w, work)
    assert link.outstanding == 0 and link.sent_ids == 0 and r.core.active_connections() == 0
    assert [rep.count for rep in r.replies(b"c")] == [100, 100, 100]
    assert r.core.counters["replies"] == 3


def test_a_worker_whose_socket_is_gone_is_forgotten_and_the_request_goes_to_another(rig):
    r = rig()
    w0, w1 = r.worker(0), r.worker(1)
    r.gone.add(w1)  # next in turn
    r.ask(b"c", 1)
    assert len(r.work(w0)) == 1
    assert w1 not in r.core.links and [link.ident for link in r.core.rotation] == [w0]


def test_a_ready_state_read_after_its_workers_socket_is_gone_leaves_no_link_in_rotation(rig):
    # A worker's last STATE (ready) read after its process died: the CLOCK the broker
    # sends a new worker fails and forgets it. Left in rotation, every request would be
    # picked for it, fail, and be picked for it again: the loop would spin for good.
    r = rig()
    r.gone.add(b"w0")
    r.worker(0)
    assert b"w0" not in r.core.links and r.core.rotation == []
    r.ask(b"c", 1)
    assert r.codes(b"c") == ["unavailable"]  # answered, not spinning


# -- fair turns ----------------------------------------------------------------------------


def test_a_newcomer_waits_behind_at_most_one_block_of_a_deep_pipeline(rig):
    r = rig(worker_queue_ms=1.0)
    w = r.worker(0)
    r.ask(b"greedy", 4096, n=200)
    for _ in range(3):  # the greedy pipeline is under way
        [sent] = r.work(w)
        r.answer(w, sent)
    r.ask(b"probe", 1)
    [sent] = r.work(w)
    assert protocol.plain_reserve(sent[2])[1] == 4096
    r.answer(w, sent)
    [nxt] = r.work(w)
    assert nxt[1] == b"probe"  # the probe's request, next
    r.answer(w, nxt)
    assert [rep.count for rep in r.replies(b"probe")] == [1]


def test_two_greedy_connections_get_equal_ids_whatever_their_request_sizes(rig):
    r = rig(worker_queue_ms=1.0)
    w = r.worker(0)
    r.ask(b"a", 4096, n=100)
    r.ask(b"b", 1024, n=400)
    got: dict[bytes, int] = {}
    for _ in range(120):
        for work in r.work(w):
            got[work[1]] = got.get(work[1], 0) + protocol.plain_reserve(work[2])[1]
            r.answer(w, work)
    ids = sorted(got.values())
    assert len(ids) == 2 and ids[0] >= 0.9 * ids[1]


# -- overload ------------------------------------------------------------------------------


def test_over_the_in_flight_limit_the_answer_is_overloaded_with_a_retry_after_hint(rig):
    r = rig(max_inflight_per_client=4)
    r.worker(0)
    r.ask(b"c", 4096, n=10)
    errors = [rep.error for rep in r.replies(b"c")]
    assert len(errors) == 6 and all(e.code == "overloaded" for e in errors)
    assert r.core.counters["overloaded"] == 6 and r.inflight() == 4
    # Four blocks in flight at one worker ID's 4,096 IDs per ms: a few ms.
    assert all(e.retry_after_ms == errors[0].retry_after_ms for e in errors)
    assert 3 <= errors[0].retry_after_ms <= 10


def test_the_retry_after_hint_grows_with_the_connections_sharing_the_node_and_is_bounded(rig):
    r = rig(max_inflight_per_client=2, worker_credits=1024, worker_queue_ms=1000.0)
    r.worker(0)
    r.ask(b"c", 4096, n=3)
    [alone] = [rep.error.retry_after_ms for rep in r.replies(b"c")]
    for i in range(3):  # three more connections with blocks in flight
        r.ask(f"o{i}".encode(), 4096, n=2)
    r.ask(b"c", 4096)
    [shared] = [rep.error.retry_after_ms for rep in r.replies(b"c")]
    assert shared == pytest.approx(4 * alone, abs=1)
    for i in range(600):  # so many that its share would take over a second
        r.ask(f"x{i}".encode(), 4096, n=2)
    r.ask(b"c", 4096)
    [rep] = r.replies(b"c")
    assert rep.error.retry_after_ms == RETRY_AFTER_MAX_MS


# -- refusals: another worker, then the client ---------------------------------------------


def test_a_refused_request_goes_to_another_worker_not_back_to_the_one_that_refused_it(rig):
    r = rig(worker_credits=1)
    w0, w1 = r.worker(0), r.worker(1)
    r.ask(b"c", 1, n=2)
    [a], [b] = r.work(w1), r.work(w0)  # round robin began at w1
    r.leave(w1, "reserving")  # as a real worker does: leave rotation, then refuse
    r.refuse(w1, a, "reservation_expired")
    assert r.core.counters["retried"] == 1 and r.replies(b"c") == []
    # Its reservation is extended at once and it is back, with room, before w0
    # has any: round robin alone would send the retry straight back to it.
    r.state(w1, credits=1)
    assert r.work(w1) == []
    r.answer(w0, b)
    [retried] = r.work(w0)
    assert retried[2] == a[2] and retried[0] & protocol.META_TRIES == 1
    assert r.codes(b"c") == [None]  # b's block


def test_a_retry_goes_before_the_other_waiting_requests_of_its_connection(rig):
    r = rig(worker_credits=1)
    w0, w1 = r.worker(0), r.worker(1)
    r.ask(b"c", 1, n=4)
    [a], [b] = r.work(w1), r.work(w0)
    r.refuse(w1, a)  # w1 stays in rotation with room, but a must not go back there
    assert r.work(w0) == [] and r.work(w1) == []  # (the queue waits behind the retry)
    r.answer(w0, b)
    [retried] = r.work(w0)
    assert retried[2] == a[2]  # ahead of the two that waited before it
    [c] = r.work(w1)
    assert protocol.plain_reserve(c[2])[0] == 3


def test_a_refusal_with_no_other_worker_in_rotation_goes_straight_to_the_client(rig):
    r = rig()
    w = r.worker(0)
    r.ask(b"c", 1)
    [work] = r.work(w)
    r.leave(w)  # as a real worker does: leave rotation, then refuse
    r.refuse(w, work, "fenced")
    assert r.codes(b"c") == ["fenced"]
    assert r.core.counters["retried"] == 0 and r.core.counters["refused"] == 1
    assert r.core.active_connections() == 0


def test_a_refusal_is_not_retried_on_the_only_worker_even_if_it_stays_in_rotation(rig):
    r = rig()
    w = r.worker(0)
    r.ask(b"c", 1)
    [work] = r.work(w)
    r.refuse(w, work, "clock_unsafe")
    assert r.work(w) == [] and r.codes(b"c") == ["clock_unsafe"]
    assert r.core.active_connections() == 0


def test_a_retry_waiting_for_room_gets_the_refusal_when_every_other_worker_leaves(rig):
    r = rig(worker_credits=1)
    w0, w1 = r.worker(0), r.worker(1)
    r.ask(b"c", 1, n=2)
    [a], _ = r.work(w1), r.work(w0)
    r.refuse(w1, a, "reservation_expired")  # waits for w0, which has no room
    assert r.replies(b"c") == []
    r.leave(w0)
    assert r.codes(b"c") == ["reservation_expired"]
    assert r.work(w1) == [] and r.core.counters["refused"] == 1
    assert r.inflight() == 1  # b is still w0's to answer


def test_a_request_refused_by_max_tries_workers_is_answered_with_the_refusal(rig):
    r = rig()
    workers = [r.worker(slot) for slot in range(MAX_TRIES + 1)]
    r.ask(b"c", 1)
    refusers = []
    for _ in range(MAX_TRIES):
        [(w, work)] = [(w, work) for w in workers for work in r.work(w)]
        assert w not in refusers  # each try goes to another worker
        refusers.append(w)
        r.refuse(w, work)
    assert all(r.work(w) == [] for w in workers)  # nobody is asked a fourth time
    assert r.codes(b"c") == ["clock_unsafe"]
    assert r.core.counters["retried"] == MAX_TRIES - 1 and r.core.counters["refused"] == 1
    assert r.core.active_connections() == 0


def test_a_token_no_worker_id_of_a_worker_can_honour_goes_to_every_other_worker_beyond_max_tries(rig):
    # A worker none of whose worker IDs can sort after a causal token (a token from a
    # higher shard) refuses it with bad_request; which worker took it first must not
    # decide the answer, so every worker in rotation is tried, MAX_TRIES or not.
    r = rig()
    workers = [r.worker(slot) for slot in range(MAX_TRIES + 2)]
    r.ask(b"c", 3, after=1 << 62)
    tried = []
    for _ in range(MAX_TRIES + 1):
        [(w, work)] = [(w, work) for w in workers for work in r.work(w)]
        assert w not in tried and work[0] & protocol.META_TRIES == 0  # not counted as a try
        tried.append(w)
        r.refuse(w, work, "bad_request")
    assert r.replies(b"c") == []
    [(last, (meta, addr, body))] = [(w, work) for w in workers for work in r.work(w)]
    assert last not in tried and protocol.decode_request(body).after == 1 << 62
    block = protocol.encode_block(protocol.request_id_of(body), (1 << 62) + 5, 3)
    r.core.on_worker(last, protocol.encode_reply(meta, addr, block))
    [rep] = r.replies(b"c")
    assert rep.error is None and rep.first == (1 << 62) + 5
    assert r.core.counters["retried"] == MAX_TRIES + 1 and len(r.core.rotation) == len(workers)
    assert r.core.active_connections() == 0


def test_a_token_no_worker_can_honour_gets_bad_request_once_every_worker_in_rotation_refused_it(rig):
    r = rig()
    workers = [r.worker(slot) for slot in range(MAX_TRIES + 1)]
    for _ in range(2):  # the same answer every time, whichever worker takes it first
        r.ask(b"c", 1, after=1 << 62)
        for _ in workers:
            [(w, work)] = [(w, work) for w in workers for work in r.work(w)]
            r.refuse(w, work, "bad_request")
        assert all(r.work(w) == [] for w in workers)
        assert r.codes(b"c") == ["bad_request"]
    assert r.core.counters["bad_request"] == 2 and r.core.counters["refused"] == 0
    assert r.core.counters["retried"] == 2 * MAX_TRIES and r.core.active_connections() == 0


def test_a_refusal_once_stopping_goes_to_the_client(rig):
    r = rig()
    w0, _ = r.worker(0), r.worker(1)
    r.ask(b"c", 1, n=2)
    [work] = r.work(w0)
    r.core.stop_accepting()
    r.refuse(w0, work, "fenced")
    assert r.codes(b"c") == ["fenced"] and r.core.counters["retried"] == 0


# -- one rule for requests that cannot be placed -------------------------------------------


def no_room_left(r: Rig, w: bytes) -> None:
    """Fill the worker and leave requests waiting."""
    r.ask(b"old", 4096, n=3)
    assert len(r.work(w)) == 1 and len(r.core.fair) == 2


CANNOT_PLACE = {
    "stopping": lambda r, w: r.core.stop_accepting(),
    "clock veto": lambda r, w: setattr(r.core, "veto", "clock disagrees with 2 of 2 peers"),
    "no worker in rotation": lambda r, w: r.state(w, ready=False, reason="lease lost"),
}


@pytest.mark.parametrize("cause", CANNOT_PLACE, ids=list(CANNOT_PLACE))
def test_waiting_and_new_requests_that_cannot_be_placed_get_the_same_answer_counted_the_same(rig, cause):
    r = rig(worker_queue_ms=1.0)
    w = r.worker(0)
    no_room_left(r, w)
    before = dict(r.core.counters)
    CANNOT_PLACE[cause](r, w)
    r.pass_s(0.5)  # a tick: what waits is placed or answered
    waited = r.replies(b"old")
    counted_waited = {k: v - before[k] for k, v in r.core.counters.items() if v != before[k]}
    before = dict(r.core.counters)
    r.ask(b"new", 4096, n=2)
    new = r.replies(b"new")
    counted_new = {k: v - before[k] for k, v in r.core.counters.items() if v != before[k]}
    assert len(waited) == len(new) == 2
    assert {(rep.error.code, rep.error.message) for rep in waited} == {
        (rep.error.code, rep.error.message) for rep in new
    }
    counted_new.pop("requests")
    assert counted_waited == counted_new and sum(counted_new.values()) == 2, (counted_waited, counted_new)
    assert len(r.core.fair) == 0 and r.inflight() == 1  # only the one at the worker


def test_a_clock_veto_refuses_at_once_even_when_a_worker_has_room(rig):
    r = rig()
    r.worker(0)
    r.core.veto = "clock disagrees with 2 of 2 peers"
    r.ask(b"c", 1)
    [rep] = r.replies(b"c")
    assert rep.error.code == "clock_unsafe" and "2 of 2 peers" in rep.error.message
    assert r.core.counters["refused"] == 1


def test_with_no_worker_in_rotation_the_answer_names_the_most_telling_state(rig):
    r = rig()
    r.worker(0, ready=False, reason="renewals failing", held=[{"worker_id": 3, "state": "fenced"}])
    r.worker(1, ready=False, held=[{"worker_id": 4, "state": "waiting"}])
    r.ask(b"c", 1)
    [rep] = r.replies(b"c")
    assert rep.error.code == "fenced" and "renewals failing" in rep.error.message
    assert r.core.counters["unavailable"] == 1


def test_until_a_first_worker_is_ready_the_refusal_says_the_node_is_starting(rig):
    r = rig()
    w = r.worker(0, ready=False, held=[{"worker_id": 3, "state": "waiting"}])
    r.ask(b"c", 1)
    [rep] = r.replies(b"c")
    assert rep.error.code == "unavailable" and rep.error.message.startswith("the node is starting: "), rep.error
    r.state(w)  # in rotation once
    r.leave(w, reason="waiting")
    r.ask(b"c", 1)
    [rep] = r.replies(b"c")
    assert "starting" not in rep.error.message, rep.error


def test_readiness_is_a_worker_in_rotation_a_node_taking_requests_and_no_clock_refusal(rig):
    r = rig()
    w = r.worker(0, ready=False, held=[{"worker_id": 3, "state": "waiting"}])
    ready, why = r.core.readiness()
    assert not ready and why.startswith("unavailable: the node is starting: "), why
    r.state(w)
    assert r.core.readiness() == (True, "ready")
    r.core.veto = "clock vetoed: 40 ms ahead of the cluster"
    assert r.core.readiness() == (False, "clock vetoed: 40 ms ahead of the cluster")
    r.core.veto = None
    r.core.stop_accepting()
    ready, why = r.core.readiness()
    assert not ready and "starting" not in why, why


def test_once_stopping_waiting_and_new_requests_are_answered_unavailable_and_sent_ones_still_complete(rig):
    r = rig(worker_queue_ms=1.0)
    w = r.worker(0)
    r.ask(b"c", 4096, n=3)
    [sent] = r.work(w)
    r.core.stop_accepting()
    r.ask(b"c", 1)
    assert r.codes(b"c") == ["unavailable"] * 3  # two that waited, one new
    assert r.core.counters["unavailable"] == 3
    r.answer(w, sent)
    [rep] = r.replies(b"c")
    assert rep.error is None and rep.count == 4096
    assert r.core.active_connections() == 0


def test_broadcast_sends_a_frame_to_every_worker(rig):
    r = rig()
    workers = [r.worker(slot) for slot in range(2)]
    for w in workers:
        assert r.sent_to_workers.pop(w) == [protocol.encode_clock(None)]  # each is told the clock's verdict
    r.core.broadcast(protocol.STOP_FRAME)
    assert all(r.sent_to_workers.pop(w) == [protocol.STOP_FRAME] for w in workers)


# -- silence, forgetting, hearing again ----------------------------------------------------


def test_workers_are_pinged_every_heartbeat(rig):
    r = rig(heartbeat_interval_s=0.5)
    w = r.worker(0)
    r.pass_s(2.0, step_s=0.01)
    assert r.pings(w) == 4
    assert w in r.core.links  # it spoke at the start only, but within the timeout


def test_a_silent_worker_leaves_rotation_and_its_requests_stop_counting_against_their_connection_once(rig):
    r = rig(max_inflight_per_client=4, worker_credits=8, heartbeat_timeout_s=1.5)
    w = r.worker(0)
    r.ask(b"c", 1, n=4)
    held = r.work(w)
    assert len(held) == 4 and r.inflight() == 4
    r.pass_s(2.5)
    assert not r.core.rotation and r.core.links[w].silent
    assert r.core.active_connections() == 0  # its four requests no longer count
    assert r.core.status()["workers"][0]["state"] == "silent"
    # It speaks again and answers the old requests: they must not be counted off twice.
    r.state(w, credits=8)
    assert [link.ident for link in r.core.rotation] == [w] and not r.core.links[w].silent
    r.ask(b"c", 1, n=4)
    for work in held:
        r.answer(w, work)
    assert r.inflight() == 4
    assert all(rep.error is None for rep in r.replies(b"c"))


def test_a_silent_worker_is_forgotten_after_three_timeouts_and_registers_again_when_it_speaks(rig):
    r = rig(heartbeat_timeout_s=1.5)
    w = r.worker(0)
    r.pass_s(2.0)  # silent, out of rotation, still known
    assert r.core.links[w].silent and r.core.rotation == []
    r.pass_s(3.0)  # more than three timeouts
    assert r.core.links == {} and r.core.heard == {}
    r.state(w)
    assert [link.slot for link in r.core.rotation] == [0] and not r.core.links[w].silent


def test_a_worker_silent_while_its_process_lives_keeps_what_it_owes_and_its_late_answers_match(rig):
    r = rig(live_pids={1000}, max_inflight_per_client=8, worker_credits=8, heartbeat_timeout_s=1.5)
    w = r.worker(0)
    r.ask(b"c", 1, n=4)
    owed = r.work(w)
    r.pass_s(5.5)  # past three heartbeat timeouts
    assert w in r.core.links and not r.core.rotation  # kept: its process lives
    assert r.core.active_connections() == 0
    r.state(w, credits=8)
    r.ask(b"c", 1, n=2)
    fresh = r.work(w)
    assert len(fresh) == 2
    for work in owed:  # it answers in order: what it owed first
        r.answer(w, work)
    assert r.inflight() == 2  # the late answers took nothing off the new requests
    for work in fresh:
        r.answer(w, work)
    assert r.inflight() == 0 and not r.core.links[w].sent


def test_silence_the_broker_slept_through_is_its_own(rig):
    r = rig(heartbeat_timeout_s=1.5)
    w = r.worker(0)
    r.pass_s(1.0)
    r.now_ns += 60 * S  # the whole broker was stopped for a minute
    r.core.tick(r.now_ns)
    assert [link.ident for link in r.core.rotation] == [w]
    r.pass_s(2.0)  # but silence after the pause counts
    assert r.core.rotation == []


def test_a_worker_process_gone_is_forgotten_with_what_it_owed(rig):
    r = rig(live_pids={1000, 1001})
    w0, w1 = r.worker(0), r.worker(1)
    r.ask(b"c", 1, n=2)
    assert len(r.work(w1)) == 1
    r.core.forget_pid(1001, "process exited")
    assert list(r.core.links) == [w0] and 1001 not in r.core.heard
    assert r.inflight() == 1  # the one w1 owed is written off: its client retries
    r.ask(b"c", 1)
    assert len(r.work(w0)) == 2


def test_a_state_sent_by_a_worker_already_reaped_does_not_bring_it_back(rig):
    r = rig(live_pids={1001})  # the supervisor's live processes: slot 0's pid 1000 is gone
    r.worker(0)
    assert r.core.links == {} and r.core.rotation == [] and r.core.heard == {}
    r.worker(1)
    assert [link.pid for link in r.core.rotation] == [1001]


def test_heard_is_when_each_worker_process_last_spoke(rig):
    r = rig()
    r.worker(0)
    t0 = r.now_ns
    r.now_ns += S
    r.worker(1)
    assert r.core.heard == {1000: t0, 1001: t0 + S}
    r.now_ns += S
    r.state(b"w0")
    assert r.core.heard == {1000: t0 + 2 * S, 1001: t0 + S}


# -- STATE frames that cannot be read ------------------------------------------------------


@pytest.mark.parametrize(
    "payload", [b"\x11", b"\x11{not json", b"\x11[]", b'\x11{"pid": "1000"}', b'\x11{"ready": true, "held": [1]}']
)
def test_a_bad_state_payload_is_counted_and_ignored_and_the_worker_keeps_its_place(rig, payload):
    r = rig(worker_queue_ms=1.0)
    w = r.worker(0)
    r.core.on_worker(w, payload)
    assert r.core.counters["bad_state"] == 1
    assert [link.slot for link in r.core.rotation] == [0]  # still in rotation, as it last said
    r.ask(b"c", 1)
    [sent] = r.work(w)
    r.answer(w, sent)
    assert [rep.count for rep in r.replies(b"c")] == [1]


def test_a_state_with_keys_this_version_does_not_know_is_read_counted_and_logged(rig, caplog):
    r = rig()
    w = r.worker(0)
    r.core.on_worker(w, b'\x11{"slot": 0, "pid": 1000, "ready": false, "credits": 8, "zeta": 1}')
    assert r.core.counters["state_unknown_keys"] == 1 and r.core.counters["bad_state"] == 0
    assert r.core.rotation == []  # what it does say is taken: it left rotation
    assert any("does not know: zeta" in rec.getMessage() for rec in caplog.records)


def test_a_bad_state_from_an_unknown_worker_registers_nothing(rig):
    r = rig()
    r.core.on_worker(b"stranger", b'\x11{"slot": 0, "pid": 1000, "ready": "yes"}')
    assert r.core.links == {} and r.core.counters["bad_state"] == 1
    r.ask(b"c", 1)
    assert r.codes(b"c") == ["unavailable"]


def test_frames_of_no_known_kind_are_ignored(rig):
    r = rig()
    w = r.worker(0)
    for frame in (b"", b"\x7f", protocol.PING_FRAME):
        r.core.on_worker(w, frame)
    assert [link.ident for link in r.core.rotation] == [w] and r.sent_to_clients == {}


# -- other requests ------------------------------------------------------------------------


def test_status_reports_the_broker_its_connections_waiting_requests_and_workers(rig):
    r = rig(describe_broker=lambda: {"pid": 4242})
    w = r.worker(0, held=[{"worker_id": 9, "state": "ready"}])
    r.ask(b"c", 4096, n=3)
    r.core.request(0, b"s", protocol.encode_status(77))
    [rep] = r.replies(b"s")
    assert rep.request_id == 77
    status = orjson.loads(orjson.dumps(rep.status))
    broker = status["broker"]
    assert broker["pid"] == 4242 and broker["connections"] == 1 and broker["waiting"] == 2
    assert broker["workers_in_rotation"] == 1 and broker["counters"]["requests"] == 4
    [worker] = status["workers"]
    assert worker["worker_id"] == 9 and worker["state"] == "ready" and worker["outstanding"] == 1
    assert worker["in_rotation"] and not worker["silent"] and worker["pid"] == 1000
    assert status["layout"] == r.config.layout.to_dict() and status["region"] == r.config.region
    assert r.work(w)


def test_time_is_answered_from_the_wall_clock_and_nodes_from_what_the_broker_says(rig):
    r = rig()
    r.core.request(0, b"c", protocol.encode_time(5))
    r.core.describe_nodes = lambda: {"cluster": "x", "nodes": [{"node": "n1"}]}
    r.core.request(protocol.META_DELIMITED, b"c", protocol.encode_nodes(6))
    [(meta_time, time_reply), (meta_nodes, nodes_reply)] = r.sent_to_clients[b"c"]
    assert meta_time == 0 and meta_nodes == protocol.META_DELIMITED  # the framing travels with the reply
    assert protocol.decode_reply(time_reply).times == (r.wall_ns, r.wall_ns)
    assert protocol.decode_reply(nodes_reply).nodes == {"cluster": "x", "nodes": [{"node": "n1"}]}


def test_a_malformed_request_is_counted_and_answered_bad_request(rig):
    r = rig()
    r.worker(0)
    r.core.request(0, b"c", protocol.encode_reserve(3, 1)[:-1])
    r.core.request(0, b"c", b"")
    assert r.codes(b"c") == ["bad_request", "bad_request"]
    assert r.core.counters["bad_request"] == 2 and r.core.counters["requests"] == 2


# -- how long requests wait for a worker (the fake clock) ----------------------------------


def test_a_request_sent_to_a_worker_at_once_counts_as_having_waited_nothing(rig):
    r = rig()
    w = r.worker(0)
    r.ask(b"c", 1, n=3)
    assert len(r.work(w)) == 3
    plain, after = r.core.queued_ns
    assert plain.counts[0] == 3 and plain.count == 3 and plain.sum_ns == 0
    assert after.count == 0


def test_a_request_that_waits_for_room_is_timed_until_it_is_sent_to_a_worker(rig):
    r = rig(worker_credits=1)
    w = r.worker(0)
    r.ask(b"c", 1, n=2)
    [first] = r.work(w)
    assert len(r.core.fair) == 1
    r.now_ns += 30_000_000
    r.answer(w, first)
    assert len(r.work(w)) == 1  # the second, sent once the first was answered
    plain = r.core.queued_ns[0]
    assert plain.count == 2 and plain.counts[0] == 1  # the first waited for nothing
    assert plain.sum_ns == 30_000_000
    waited = next(i for i, n in enumerate(plain.counts) if i and n)
    assert latency.BOUNDS_NS[waited - 1] < plain.sum_ns <= latency.BOUNDS_NS[waited]


def test_requests_with_a_causal_token_are_timed_as_their_own_kind(rig):
    r = rig(worker_credits=1)
    w = r.worker(0)
    r.ask(b"c", 1, n=2, after=1 << 40)
    [(meta, addr, body)] = r.work(w)
    r.now_ns += 1_000_000
    r.core.on_worker(w, protocol.encode_reply(meta, addr, protocol.encode_block(protocol.request_id_of(body), 1, 1)))
    r.core.schedule()
    assert len(r.work(w)) == 1
    plain, after = r.core.queued_ns
    assert plain.count == 0 and after.count == 2 and after.counts[0] == 1 and after.sum_ns == 1_000_000


def test_a_request_answered_without_a_worker_is_not_timed(rig):
    r = rig(worker_credits=1)
    w = r.worker(0)
    r.ask(b"c", 1, n=3)
    r.leave(w)
    assert r.codes(b"c") == ["fenced", "fenced"]
    assert r.core.queued_ns[0].count == 1  # only the one sent to the worker


# -- the broker's own minter: small plain requests in one hop ---------------------------


class HereMinter:
    """What the broker's own worker ID answers: a block, or None (the request goes on)."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.answer: tuple[int, int] | None = (5 << 30, 1)

    def __call__(self, n: int) -> tuple[int, int] | None:
        self.asked.append(n)
        return None if self.answer is None else (self.answer[0], min(n, self.answer[1]))


def test_a_small_plain_request_is_minted_by_the_broker_itself_and_never_reaches_a_worker(rig):
    r = rig()
    w = r.worker(0)
    here = HereMinter()
    r.core.mint_own(here, 64)
    r.ask(b"c", 1)
    [rep] = r.replies(b"c")
    assert (rep.first, rep.count, rep.error) == (5 << 30, 1, None)
    assert r.work(w) == [] and here.asked == [1]
    assert r.inflight() == 0  # answered at once: nothing in flight counts against the connection
    assert (r.core.counters["minted_here"], r.core.counters["ids_here"], r.core.counters["replies"]) == (1, 1, 0)


def test_larger_requests_causal_tokens_and_declined_ones_go_to_a_worker(rig):
    r = rig()
    w = r.worker(0)
    here = HereMinter()
    r.core.mint_own(here, 64)
    r.ask(b"c", 65)  # above the limit
    r.ask(b"c", 1, after=1 << 50)  # a causal token: the workers' minters wait for it
    here.answer = None
    r.ask(b"c", 1)  # declined (it would have waited, or its lock was taken)
    sent = [protocol.decode_request(body) for _, _, body in r.work(w)]
    assert [(req.count, req.after) for req in sent] == [(65, None), (1, 1 << 50), (1, None)]
    assert here.asked == [1]  # neither the large request nor the token's was offered to it
    assert r.core.counters["minted_here"] == 0 and r.replies(b"c") == []


def test_the_broker_mints_nothing_itself_while_vetoed_stopping_or_over_the_in_flight_limit(rig):
    r = rig(max_inflight_per_client=2)
    w = r.worker(0)
    here = HereMinter()
    r.core.mint_own(here, 64)
    r.ask(b"big", 100, n=2)
    r.ask(b"big", 1)  # the connection has its limit in flight: overloaded, as for any request
    assert r.codes(b"big") == ["overloaded"] and here.asked == []
    r.core.veto = "clock disagrees with the cluster"
    r.ask(b"c", 1)
    assert r.codes(b"c") == ["clock_unsafe"]
    r.core.veto = None
    r.core.stop_accepting()
    r.ask(b"c", 1)
    assert r.codes(b"c") == ["unavailable"] and here.asked == []
    assert len(r.work(w)) == 2


def test_with_no_worker_in_rotation_a_small_request_is_still_answered_by_the_broker(rig):
    r = rig()
    here = HereMinter()
    r.core.mint_own(here, 64)
    r.ask(b"c", 1)
    assert r.codes(b"c") == [None]
    here.answer = None
    r.ask(b"c", 1)
    assert r.codes(b"c") == ["unavailable"]
