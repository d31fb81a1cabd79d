"""The fair queue alone: which waiting connection goes next, with no router around it."""

from __future__ import annotations

import itertools

from snowfence.broker.fair import MIN_COST_IDS, QUANTUM, Conn, FairQueue


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
