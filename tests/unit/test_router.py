"""The broker's router and its fair queue, driven directly: real ZeroMQ sockets on
inproc:// endpoints stand in for clients and workers, and each test turns the
router's crank (on_frontend, on_backend, tick) itself."""

from __future__ import annotations

import itertools
import time

import orjson
import pytest
import zmq

from snowfence import latency, protocol
from snowfence.broker.fair import MIN_COST_IDS, QUANTUM, Conn, FairQueue
from snowfence.broker.router import Router
from snowfence.config import Config

_names = itertools.count()


def state_frame(payload: dict) -> bytes:
    """A STATE frame as a worker of any version might send it."""
    return bytes((protocol.STATE,)) + orjson.dumps(payload)


# -- the fair queue alone ----------------------------------------------------------------


def served_order(fq: FairQueue, conns: dict[str, Conn], limit: int) -> list[str]:
    out: list[str] = []

    def place(conn, meta, body, count):
        if len(out) >= limit:
            return False
        out.append(body.decode())
        return True

    fq.serve(place)
    return out


def test_a_newcomer_is_served_right_after_the_turn_in_progress():
    fq, g, p = FairQueue(), Conn(b"g"), Conn(b"p")
    for _ in range(100):
        fq.push(g, (0, b"g", 4096))
    assert served_order(fq, {}, 1) == ["g"]  # the greedy connection's turn has begun
    fq.push(p, (0, b"p", 1))
    assert served_order(fq, {}, 2) == ["p", "g"]


def test_connections_take_equal_shares_of_ids_whatever_their_request_sizes():
    fq, big, small = FairQueue(), Conn(b"big"), Conn(b"small")
    for _ in range(1000):
        fq.push(big, (0, b"big", 4096))
        fq.push(small, (0, b"small", 512))
    order = served_order(fq, {}, 900)
    ids_big = order.count("big") * 4096
    ids_small = order.count("small") * 512
    assert abs(ids_big - ids_small) <= QUANTUM


def test_single_id_requests_cost_at_least_the_minimum_so_they_cannot_take_thousands_of_turns():
    fq, blocks, singles = FairQueue(), Conn(b"b"), Conn(b"s")
    for _ in range(100):
        fq.push(blocks, (0, b"b", 4096))
    for _ in range(10_000):
        fq.push(singles, (0, b"s", 1))
    order = served_order(fq, {}, 500)
    # Between two blocks, at most one quantum's worth of minimum-cost requests.
    runs = [len(list(group)) for key, group in itertools.groupby(order) if key == "s"]
    assert max(runs) <= QUANTUM // MIN_COST_IDS
    assert order.count("b") >= 3


def test_a_retry_goes_to_the_front_of_its_connection_queue():
    fq, c = FairQueue(), Conn(b"c")
    fq.push(c, (0, b"first", 1))
    fq.push(c, (0, b"retry", 1), front=True)
    assert served_order(fq, {}, 2) == ["retry", "first"]


def test_nothing_is_served_when_no_worker_has_room_and_nothing_is_lost():
    fq, c = FairQueue(), Conn(b"c")
    for i in range(3):
        fq.push(c, (0, str(i).encode(), 1))
    fq.serve(lambda *a: False)
    assert len(fq) == 3
    drained = fq.drain()
    assert [body for _, _, body, _ in drained] == [b"0", b"1", b"2"]
    assert not fq and len(fq) == 0


# -- the router with sockets ---------------------------------------------------------------


class Rig:
    """A router on inproc endpoints, with fake workers and clients as sockets."""

    def __init__(self, **settings) -> None:
        self.ctx = zmq.Context()
        n = next(_names)
        self.front, self.back = f"inproc://front-{n}", f"inproc://back-{n}"
        self.config = Config(bind=self.front, **settings)
        self.router = Router(self.ctx, self.config, self.back)
        self.socks: list[zmq.Socket] = []
        self.rids = itertools.count(1)

    def worker(self, slot: int, ready_ids: int = 1, credits: int | None = None) -> zmq.Socket:
        w = self._socket(zmq.DEALER, self.back, identity=f"w{slot}".encode())
        status = {
            "slot": slot,
            "pid": 1000 + slot,
            "ready": True,
            "ready_ids": ready_ids,
            "credits": credits or self.config.worker_credits,
            "held": [],
        }
        w.send(state_frame(status))
        self.pump()
        return w

    def client(self) -> zmq.Socket:
        return self._socket(zmq.DEALER, self.front)

    def _socket(self, kind: int, endpoint: str, identity: bytes | None = None) -> zmq.Socket:
        s = self.ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        if identity:
            s.setsockopt(zmq.IDENTITY, identity)
        s.connect(endpoint)
        self.socks.append(s)
        return s

    def ask(self, client: zmq.Socket, count: int, n: int = 1) -> None:
        for _ in range(n):
            client.send(protocol.encode_reserve(next(self.rids), count))
        self.pump()

    def pump(self) -> None:
        for _ in range(5):
            self.router.on_frontend()
            self.router.on_backend()

    @staticmethod
    def work(w: zmq.Socket) -> list[tuple[int, bytes, bytes]]:
        """WORK frames waiting at a fake worker: (meta, addr, body)."""
        out = []
        while w.poll(20):
            frame = w.recv()
            if frame[0] == protocol.WORK:
                out.append(protocol.split_routed(frame))
        return out

    def answer(self, w: zmq.Socket, work: tuple[int, bytes, bytes], first: int = 1 << 40) -> None:
        meta, addr, body = work
        rid, count = protocol.plain_reserve(body)
        w.send(protocol.encode_reply(meta, addr, protocol.encode_block(rid, first, count)))
        self.pump()

    @staticmethod
    def replies(client: zmq.Socket) -> list[protocol.Reply]:
        out = []
        while client.poll(20):
            out.append(protocol.decode_reply(client.recv()))
        return out

    def close(self) -> None:
        for s in self.socks:
            s.close(0)
        self.router.close()
        self.ctx.term()


@pytest.fixture
def rig():
    rigs = []

    def make(**settings) -> Rig:
        r = Rig(**settings)
        rigs.append(r)
        return r

    yield make
    for r in rigs:
        r.close()


def test_a_worker_gets_no_more_than_its_minting_budget_of_ids(rig):
    r = rig(worker_queue_ms=1.0)
    w, c = r.worker(0), r.client()
    r.ask(c, 4096, n=10)
    first = r.work(w)
    assert len(first) == 1  # one millisecond of one worker ID: one full block
    assert len(r.router.fair) == 9
    r.answer(w, first[0])
    assert len(r.work(w)) == 1


def test_the_budget_grows_with_the_worker_ids_a_worker_holds_and_with_the_setting(rig):
    r = rig(worker_queue_ms=2.0)
    w, c = r.worker(0, ready_ids=4), r.client()
    r.ask(c, 4096, n=20)
    assert len(r.work(w)) == 8  # 2 ms x 4 worker IDs x 4,096


def test_small_requests_still_pipeline_up_to_the_request_credits(rig):
    r = rig(worker_credits=32)
    w, c = r.worker(0), r.client()
    r.ask(c, 1, n=100)
    assert len(r.work(w)) == 32
    assert len(r.router.fair) == 68


def test_a_newcomer_waits_behind_at_most_one_block_of_a_deep_pipeline(rig):
    r = rig(worker_queue_ms=1.0)
    w, greedy, probe = r.worker(0), r.client(), r.client()
    r.ask(greedy, 4096, n=200)
    for _ in range(3):  # the greedy pipeline is under way
        [sent] = r.work(w)
        r.answer(w, sent)
    r.ask(probe, 1)
    [sent] = r.work(w)
    assert protocol.plain_reserve(sent[2])[1] == 4096
    r.answer(w, sent)
    nxt = r.work(w)
    assert len(nxt) == 1 and protocol.plain_reserve(nxt[0][2])[1] == 1  # the probe's request, next
    r.answer(w, nxt[0])
    assert [rep.count for rep in r.replies(probe)] == [1]


def test_two_greedy_connections_get_equal_ids_whatever_their_request_sizes(rig):
    r = rig(worker_queue_ms=1.0)
    w, a, b = r.worker(0), r.client(), r.client()
    r.ask(a, 4096, n=100)
    r.ask(b, 1024, n=400)
    got = {}
    for _ in range(120):
        for work in r.work(w):
            got[work[1]] = got.get(work[1], 0) + protocol.plain_reserve(work[2])[1]
            r.answer(w, work)
    ids = sorted(got.values())
    assert len(ids) == 2 and ids[0] >= 0.9 * ids[1]


def test_over_the_in_flight_limit_the_answer_is_overloaded_with_a_retry_after_hint(rig):
    r = rig(max_inflight_per_client=4)
    r.worker(0)
    c = r.client()
    r.ask(c, 4096, n=10)
    errors = [rep.error for rep in r.replies(c)]
    assert len(errors) == 6 and all(e.code == "overloaded" for e in errors)
    assert all(isinstance(e.retry_after_ms, int) and 1 <= e.retry_after_ms <= 1000 for e in errors)
    # Four blocks in flight at one worker ID's 4,096 IDs per ms: a few ms.
    assert errors[0].retry_after_ms >= 3


def test_a_silent_workers_requests_stop_counting_against_their_connection_once(rig):
    r = rig(max_inflight_per_client=4, worker_credits=8, heartbeat_timeout_s=1.5)
    w, c = r.worker(0), r.client()
    r.ask(c, 1, n=4)
    held = r.work(w)
    assert len(held) == 4 and r.router.conns[next(iter(r.router.conns))].inflight == 4
    seen_ns = r.router.links[b"w0"].seen_ns
    for step in range(1, 6):  # 2.5 s of silence, heartbeat by heartbeat
        r.router.tick(seen_ns + step * int(0.5e9))
    assert not r.router.rotation
    assert r.router.active_connections() == 0  # its four requests no longer count
    # It speaks again and answers the old requests: they must not be counted off twice.
    w.send(state_frame({"slot": 0, "pid": 1000, "ready": True, "ready_ids": 1, "credits": 8}))
    r.pump()
    r.ask(c, 1, n=4)
    for work in held:
        r.answer(w, work)
    assert sum(conn.inflight for conn in r.router.conns.values()) == 4
    assert all(rep.error is None for rep in r.replies(c))


def test_requests_waiting_when_every_worker_leaves_rotation_are_answered_not_kept(rig):
    r = rig()
    w, c = r.worker(0), r.client()
    r.ask(c, 4096, n=5)
    assert len(r.router.fair) == 4
    w.send(state_frame({"slot": 0, "pid": 1000, "ready": False, "credits": 32, "reason": "fenced"}))
    r.pump()
    codes = [rep.error.code for rep in r.replies(c)]
    assert len(codes) == 4 and set(codes) == {"unavailable"}
    assert len(r.router.fair) == 0


def test_a_clock_veto_refuses_at_once_even_when_a_worker_has_room(rig):
    r = rig()
    r.worker(0)
    c = r.client()
    r.router.veto = "clock disagrees with 2 of 2 peers"
    r.ask(c, 1)
    [rep] = r.replies(c)
    assert rep.error.code == "clock_unsafe"


def test_a_refused_request_is_retried_on_another_worker_before_its_turn_comes_again(rig):
    r = rig(worker_queue_ms=1.0)
    w0, w1 = r.worker(0), r.worker(1)
    c = r.client()
    r.ask(c, 4096, n=2)
    sent0, sent1 = r.work(w0), r.work(w1)
    assert len(sent0) == len(sent1) == 1
    meta, addr, body = sent0[0]
    err = protocol.encode_error(protocol.request_id_of(body), protocol.from_code("fenced"))
    # As a real worker does: leave rotation, then refuse.
    w0.send(state_frame({"slot": 0, "pid": 1000, "ready": False, "credits": 32, "reason": "fenced"}))
    w0.send(protocol.encode_refused(meta, addr, body, err))
    r.pump()
    r.answer(w1, sent1[0])
    retried = r.work(w1)
    assert len(retried) == 1 and retried[0][2] == body and retried[0][0] & protocol.META_TRIES == 1


def test_status_reports_connections_and_waiting_requests(rig):
    r = rig()
    r.worker(0)
    c = r.client()
    r.ask(c, 4096, n=3)
    broker = orjson.loads(orjson.dumps(r.router.status()))["broker"]
    assert broker["connections"] == 1 and broker["waiting"] == 2


@pytest.mark.parametrize(
    "payload", [b"\x11", b"\x11{not json", b"\x11[]", b'\x11{"pid": "1000"}', b'\x11{"ready": true, "held": [1]}']
)
def test_a_bad_state_payload_is_counted_and_ignored_and_the_worker_keeps_its_place(rig, payload):
    r = rig(worker_queue_ms=1.0)
    w, c = r.worker(0), r.client()
    w.send(payload)
    r.pump()
    assert r.router.counters["bad_state"] == 1
    assert [link.slot for link in r.router.rotation] == [0]  # still in rotation, as it last said
    r.ask(c, 1)
    [sent] = r.work(w)
    r.answer(w, sent)
    assert [rep.count for rep in r.replies(c)] == [1]


def test_a_bad_state_from_an_unknown_worker_registers_nothing(rig):
    r = rig()
    stranger = r._socket(zmq.DEALER, r.back, identity=b"stranger")
    stranger.send(b'\x11{"slot": 0, "pid": 1000, "ready": "yes"}')
    r.pump()
    assert r.router.links == {} and r.router.counters["bad_state"] == 1
    c = r.client()
    r.ask(c, 1)
    [rep] = r.replies(c)
    assert rep.error.code == "unavailable"


def refuse(r: Rig, w: zmq.Socket, work, code: str = "clock_unsafe") -> None:
    meta, addr, body = work
    err = protocol.encode_error(protocol.request_id_of(body), protocol.from_code(code))
    w.send(protocol.encode_refused(meta, addr, body, err))
    r.pump()


def test_a_request_refused_by_max_tries_workers_is_answered_with_the_refusal(rig):
    from snowfence.broker.router import MAX_TRIES

    r = rig()
    workers = [r.worker(slot) for slot in range(MAX_TRIES + 1)]
    c = r.client()
    r.ask(c, 1)
    refusers = []
    for _ in range(MAX_TRIES):
        [(w, work)] = [(w, work) for w in workers for work in r.work(w)]
        assert w not in refusers  # each try goes to another worker (round robin)
        refusers.append(w)
        refuse(r, w, work)
    assert all(r.work(w) == [] for w in workers)  # nobody is asked a fourth time
    [rep] = r.replies(c)
    assert rep.error.code == "clock_unsafe"
    assert r.router.counters["retried"] == MAX_TRIES - 1 and r.router.counters["refused"] == 1
    assert r.router.active_connections() == 0


def test_a_refusal_with_no_worker_left_in_rotation_goes_straight_to_the_client(rig):
    r = rig()
    w, c = r.worker(0), r.client()
    r.ask(c, 1)
    [work] = r.work(w)
    w.send(state_frame({"slot": 0, "pid": 1000, "ready": False, "credits": 32, "reason": "fenced"}))
    refuse(r, w, work, "fenced")
    [rep] = r.replies(c)
    assert rep.error.code == "fenced"
    assert r.router.counters["retried"] == 0 and r.router.active_connections() == 0


def test_replies_free_the_workers_room_and_the_connection_stops_counting_once_nothing_is_in_flight(rig):
    r = rig(worker_credits=32)
    w, c = r.worker(0), r.client()
    r.ask(c, 100, n=3)
    sent = r.work(w)
    link = r.router.links[b"w0"]
    assert link.outstanding == 3 and link.sent_ids == 300
    [conn] = r.router.conns.values()
    assert conn.inflight == 3 and conn.ids == 300
    r.answer(w, sent[0])
    assert link.outstanding == 2 and link.sent_ids == 200 and conn.inflight == 2 and conn.ids == 200
    for work in sent[1:]:
        r.answer(w, work)
    assert link.outstanding == 0 and link.sent_ids == 0 and r.router.active_connections() == 0
    assert [rep.count for rep in r.replies(c)] == [100, 100, 100]
    assert r.router.counters["replies"] == 3


def test_a_state_sent_by_a_worker_already_reaped_does_not_bring_it_back(rig):
    r = rig()
    r.router.live_pids = {1001}  # the supervisor's live processes: slot 0's pid 1000 is gone
    r.worker(0)
    assert r.router.links == {} and r.router.rotation == []
    r.worker(1)
    assert [link.pid for link in r.router.rotation] == [1001]


def test_a_silent_worker_is_forgotten_after_three_timeouts_and_registers_again_when_it_speaks(rig):
    r = rig(heartbeat_timeout_s=1.5)
    w = r.worker(0)
    seen_ns = r.router.links[b"w0"].seen_ns
    for step in range(1, 5):  # 2 s: silent, out of rotation, still known
        r.router.tick(seen_ns + step * int(0.5e9))
    assert r.router.links[b"w0"].silent and r.router.rotation == []
    for step in range(5, 11):  # 5 s: more than three timeouts
        r.router.tick(seen_ns + step * int(0.5e9))
    assert r.router.links == {}
    w.send(state_frame({"slot": 0, "pid": 1000, "ready": True, "ready_ids": 1, "credits": 32}))
    r.pump()
    assert [link.slot for link in r.router.rotation] == [0] and not r.router.links[b"w0"].silent


def test_once_stopping_waiting_and_new_requests_are_answered_unavailable_and_sent_ones_still_complete(rig):
    r = rig(worker_queue_ms=1.0)
    w, c = r.worker(0), r.client()
    r.ask(c, 4096, n=3)
    [sent] = r.work(w)
    r.router.stop_accepting()
    r.ask(c, 1)
    codes = [rep.error.code for rep in r.replies(c)]
    assert codes == ["unavailable"] * 3  # two that waited, one new
    r.answer(w, sent)
    [rep] = r.replies(c)
    assert rep.error is None and rep.count == 4096
    assert r.router.active_connections() == 0


def test_connections_that_keep_one_request_waiting_cannot_shut_out_a_bulk_loader():
    fq, bulk = FairQueue(), Conn(b"bulk")
    eager = [Conn(f"e{i}".encode()) for i in range(3)]
    for _ in range(1000):
        fq.push(bulk, (0, b"bulk", 4096))
    for c in eager:
        fq.push(c, (0, c.addr, 4096))
    got = {b"bulk": 0, **{c.addr: 0 for c in eager}}
    for _ in range(300):  # rounds of three free slots; each eager connection asks again once served
        served = []

        def place(conn, meta, body, count, served=served):
            if len(served) == 3:
                return False
            served.append(conn)
            return True

        fq.serve(place)
        for conn in served:
            got[conn.addr] += 1
            if conn is not bulk:
                fq.push(conn, (0, conn.addr, 4096))
    assert got[b"bulk"] >= 0.2 * sum(got.values()), got  # about a quarter, its fair share


def test_a_worker_silent_while_its_process_lives_keeps_what_it_owes_and_its_late_answers_match(rig):
    r = rig(max_inflight_per_client=8, worker_credits=8, heartbeat_timeout_s=1.5)
    r.router.live_pids = {1000}
    w, c = r.worker(0), r.client()
    r.ask(c, 1, n=4)
    owed = r.work(w)
    seen_ns = r.router.links[b"w0"].seen_ns
    for step in range(1, 12):  # 5.5 s of silence: past three heartbeat timeouts
        r.router.tick(seen_ns + step * int(0.5e9))
    assert b"w0" in r.router.links and not r.router.rotation  # kept: its process lives
    assert r.router.active_connections() == 0
    w.send(state_frame({"slot": 0, "pid": 1000, "ready": True, "ready_ids": 1, "credits": 8}))
    r.pump()
    r.ask(c, 1, n=2)
    fresh = r.work(w)
    assert len(fresh) == 2
    for work in owed:  # it answers in order: what it owed first
        r.answer(w, work)
    conn = next(iter(r.router.conns.values()))
    assert conn.inflight == 2  # the late answers took nothing off the new requests
    for work in fresh:
        r.answer(w, work)
    assert conn.inflight == 0 and not r.router.links[b"w0"].sent


# -- how long requests wait for a worker --------------------------------------------------


def test_a_request_sent_to_a_worker_at_once_counts_as_having_waited_nothing(rig):
    r = rig()
    w, c = r.worker(0), r.client()
    r.ask(c, 1, n=3)
    assert len(r.work(w)) == 3
    plain, after = r.router.queued_ns
    assert plain.counts[0] == 3 and plain.count == 3 and plain.sum_ns == 0
    assert after.count == 0


def test_a_request_that_waits_for_room_is_timed_until_it_is_sent_to_a_worker(rig):
    r = rig(worker_credits=1)
    w, c = r.worker(0), r.client()
    r.ask(c, 1, n=2)
    [first] = r.work(w)
    assert len(r.router.fair) == 1
    time.sleep(0.03)
    r.answer(w, first)
    assert len(r.work(w)) == 1  # the second, sent once the first was answered
    plain = r.router.queued_ns[0]
    assert plain.count == 2 and plain.counts[0] == 1  # the first waited for nothing
    assert 0.03e9 <= plain.sum_ns < 5e9
    waited = next(i for i, n in enumerate(plain.counts) if i and n)
    assert latency.BOUNDS_NS[waited - 1] < plain.sum_ns <= latency.BOUNDS_NS[waited]


def test_requests_with_a_causal_token_are_timed_as_their_own_kind(rig):
    r = rig(worker_credits=1)
    w, c = r.worker(0), r.client()
    c.send(protocol.encode_reserve(next(r.rids), 1, after=1 << 40))
    c.send(protocol.encode_reserve(next(r.rids), 1, after=1 << 40))
    r.pump()
    [(meta, addr, body)] = r.work(w)
    w.send(protocol.encode_reply(meta, addr, protocol.encode_block(protocol.request_id_of(body), 1 << 41, 1)))
    r.pump()
    assert len(r.work(w)) == 1
    plain, after = r.router.queued_ns
    assert plain.count == 0 and after.count == 2 and after.counts[0] == 1 and after.sum_ns > 0


def test_a_request_answered_without_a_worker_is_not_timed(rig):
    r = rig(worker_credits=1)
    w, c = r.worker(0), r.client()
    r.ask(c, 1, n=3)
    w.send(state_frame({"slot": 0, "pid": 1000, "ready": False, "credits": 1, "reason": "fenced"}))
    r.pump()
    assert [rep.error.code for rep in r.replies(c)] == ["unavailable", "unavailable"]
    assert r.router.queued_ns[0].count == 1  # only the one sent to the worker
