"""The routing core's gate (broker/gate.py), without sockets: which ZeroMQ requests are
dropped unanswered before the intake, and that each is counted. Real sockets and a real
node trip each gate in tests/integration/test_fast_port.py (an impostor) and
tests/integration/test_curve_rotation.py (a revoked key)."""

from __future__ import annotations

from snowfence.broker.routing import Routing
from snowfence.config import Config


class AllowList:
    def __init__(self) -> None:
        self.revoked: frozenset[bytes] = frozenset()


def core() -> tuple[Routing, list]:
    sent: list = []
    routing = Routing(Config(), lambda meta, addr, reply: sent.append((addr, reply)), lambda ident, frame: True)
    return routing, sent


def test_a_zeromq_peer_posing_as_one_of_the_brokers_own_connections_is_dropped_and_counted():
    routing, _ = core()
    gate, counters = routing.gate, routing.counters
    assert gate.admits(b"\x00\x00\x00\x00\x01", None)  # libzmq's own: five bytes
    assert gate.admits(b"client-id", None)
    assert counters["impostors"] == 0 and counters["bad_request"] == 0
    for posing in (b"\x00" + (1).to_bytes(8, "big"), b"\x00\x01" + (7).to_bytes(7, "big")):  # fast, HTTP
        assert not gate.admits(posing, None)
    assert counters["impostors"] == 2 and counters["bad_request"] == 2
    assert routing.status()["broker"]["counters"]["impostors"] == 2  # STATUS says so


def test_a_key_taken_off_the_allow_list_has_its_requests_dropped_and_counted():
    routing, sent = core()
    gate, counters = routing.gate, routing.counters
    assert gate.admits(b"carol", b"carol-key")  # no allow-list: every key is let through
    allow = gate.allow_list = AllowList()
    assert gate.admits(b"carol", b"carol-key")
    allow.revoked = frozenset({b"carol-key"})  # the allow-list's reload, on its thread
    assert not gate.admits(b"carol", b"carol-key")
    assert gate.admits(b"alice", b"alice-key")
    assert gate.admits(b"carol", None)  # a key not read is not judged (the front reads it while any is revoked)
    assert counters["revoked_dropped"] == 1 and counters["requests"] == 0 and sent == []
    assert routing.status()["broker"]["counters"]["revoked_dropped"] == 1


def test_the_metrics_report_both_drops():
    from snowfence.broker.metrics import Metrics

    routing, _ = core()
    routing.gate.allow_list = allow = AllowList()
    allow.revoked = frozenset({b"k"})
    routing.gate.admits(b"carol", b"k")
    routing.gate.admits(b"\x00" + bytes(8), None)
    routing.gate.admits(b"\x00" + bytes(8), None)
    text = "".join(
        f"{s.name} {s.labels} {s.value}\n" for fam in Metrics(Config()).build(routing, 0) for s in fam.samples
    )
    assert "snowfence_requests_dropped_total {'why': 'revoked'} 1" in text
    assert "snowfence_requests_dropped_total {'why': 'impostor'} 2" in text
