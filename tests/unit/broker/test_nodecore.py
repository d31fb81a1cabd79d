"""The broker's decisions (broker/nodecore.py) on a fake clock: the real supervisor (with
a fake spawner) and the real routing core, with the peer clocks, the membership and
the broker's own worker ID stood in for by plain objects the tests set."""

from __future__ import annotations

import itertools
import logging
import signal

import pytest

from snowfence import protocol
from snowfence.broker.metrics import Metrics
from snowfence.broker.nodecore import PEER_INTERVAL_NS, NodeCore, peer_endpoints
from snowfence.broker.peers import ALONE, PENDING, VETOED, VOUCHED, Verdict
from snowfence.broker.routing import Routing
from snowfence.broker.supervisor import Supervisor
from snowfence.clock import PENDING_VERDICT
from snowfence.config import Config

MS = 1_000_000
S = 1000 * MS
HOUSEKEEPING_NS = 10 * MS


class FakePopen:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            self.returncode = -sig

    def wait(self) -> int:
        return self.returncode


class FakePeers:
    """What the core asks of broker/peers.py's PeerClocks."""

    def __init__(self) -> None:
        self.verdict = Verdict(PENDING, None, PENDING_VERDICT, "not judged yet")
        self.ticks: list[int] = []
        self.peer_sets: list[tuple[list[str], bool]] = []

    def tick(self, now_ns: int) -> None:
        self.ticks.append(now_ns)

    def set_peers(self, peers: list[str], complete: bool = True) -> None:
        self.peer_sets.append((peers, complete))

    def describe(self) -> dict:
        return {}


class FakeMembership:
    def __init__(self, nodes: list | None = None, read_ns: int | None = 1) -> None:
        self.name = "me"
        self.nodes = nodes or []
        self.read_ns = read_ns
        self.published: list[dict] = []

    def publish(self, entry: dict) -> None:
        self.published.append(entry)

    def view(self, own: dict) -> list[dict]:
        return [own]


class FakeStore:
    claim_veto = PENDING_VERDICT
    genesis = None


class FakeOwn:
    """The broker's own worker ID as the core sees it: its store's claim veto."""

    state_due = False

    def __init__(self) -> None:
        self.store = FakeStore()

    def worker_ids(self) -> list[int]:
        return []

    def describe(self) -> None:
        return None


class Rig:
    def __init__(self, **settings) -> None:
        settings.setdefault("workers", 1)
        self.config = Config(**settings)
        self.now_ns = 1000 * S
        pids = itertools.count(100)
        self.sup = Supervisor(
            self.config, lambda slot: FakePopen(next(pids)), clock=lambda: self.now_ns, slots=self.config.workers
        )
        self.to_workers: list[tuple[bytes, bytes]] = []
        self.routing = Routing(
            self.config,
            lambda meta, addr, reply: None,
            lambda ident, frame: self.to_workers.append((ident, frame)) or True,
            clock=lambda: self.now_ns,
            wall_clock=lambda: self.now_ns,
            live_pids=self.sup.live_pids,
        )
        self.stopping: list[str] = []
        self.rewired = 0
        self.core = NodeCore(
            self.config,
            self.sup,
            self.routing,
            Metrics(self.config),
            now_ns=self.now_ns,
            pid=1,
            bind="tcp://127.0.0.1:5555",
            entry={"node": "me", "endpoints": ["tcp://127.0.0.1:5555"]},
            rewire_peers=self.rewire,
            stopping=self.stopping.append,
        )
        self.peers = self.core.peers = FakePeers()

    def rewire(self, change) -> None:
        self.rewired += 1
        change()

    def run_s(self, seconds: float) -> list[bool]:
        """The loop's timers every HOUSEKEEPING_NS for ``seconds``; what each step returned."""
        out = []
        for _ in range(round(seconds * S / HOUSEKEEPING_NS)):
            out.append(self.core.housekeeping(self.now_ns))
            self.now_ns += HOUSEKEEPING_NS
        return out


@pytest.fixture
def rig():
    return Rig()


def test_the_verdict_goes_to_the_routing_core_and_the_own_worker_ids_store(rig, caplog):
    own = rig.core.own = FakeOwn()
    refused = Verdict(VETOED, "clock off by 3 s from a majority", "clock off by 3 s from a majority", "3 s")
    rig.peers.verdict = refused
    with caplog.at_level(logging.INFO, logger="snowfence.broker"):
        assert rig.core.housekeeping(rig.now_ns)
    assert rig.routing.clock_verdict == refused.claims
    assert rig.routing.veto == refused.claims
    assert own.store.claim_veto == refused.claims  # the own worker ID claims nothing either
    assert [r.msg for r in caplog.records if "leaving rotation" in r.getMessage()]
    vouched = Verdict(VOUCHED, None, None, "2 of 3 agree")
    rig.peers.verdict = vouched
    rig.core.housekeeping(rig.now_ns + HOUSEKEEPING_NS)
    assert rig.core.verdict is vouched
    assert rig.routing.veto is None and rig.routing.clock_verdict is None
    assert own.store.claim_veto is None  # and may claim again


def test_a_verdict_is_logged_when_its_state_changes_not_at_each_measurement(rig, caplog):
    with caplog.at_level(logging.INFO, logger="snowfence.broker"):
        for i in range(3):
            rig.peers.verdict = Verdict(ALONE, None, None, "no peer answers")
            rig.core.housekeeping(rig.now_ns + i * HOUSEKEEPING_NS)
    assert sum("claims count on this clock unchecked" in r.getMessage() for r in caplog.records) == 1


def test_the_peer_filter_leaves_out_entries_that_name_no_usable_endpoint():
    nodes = [
        {"node": "me", "endpoints": ["tcp://127.0.0.1:5555"]},  # this node
        {"node": "a", "endpoints": ["tcp://127.0.0.1:6000", "tcp://127.0.0.2:6000"]},
        {"node": "b"},  # no endpoints
        {"node": "c", "endpoints": "tcp://127.0.0.1:6001"},  # not a list
        {"node": "d", "endpoints": []},
        {"node": "e", "endpoints": ["tcp://127.0.0.1"]},  # no port
        {"node": "f", "endpoints": ["tcp://127.0.0.1:99999"]},
        {"node": "g", "endpoints": [7]},
        "not an entry",
        None,
        {"node": "h", "endpoints": ["ipc:///run/snowfence-h.sock"]},
    ]
    assert peer_endpoints(nodes, "me") == ["tcp://127.0.0.1:6000", "ipc:///run/snowfence-h.sock"]


def test_the_membership_turn_publishes_the_entry_and_measures_the_configured_and_registered_peers():
    rig = Rig(peers=("tcp://127.0.0.1:7000",))
    bad = {"node": "x", "endpoints": ["no endpoint"]}
    membership = rig.core.membership = FakeMembership(
        [
            {"node": "me", "endpoints": ["tcp://127.0.0.1:5555"]},
            {"node": "a", "endpoints": ["tcp://127.0.0.1:6000"]},
            bad,
        ],
        read_ns=None,
    )
    rig.core.housekeeping(rig.now_ns)
    assert membership.published[-1]["node"] == "me" and "worker_ids" in membership.published[-1]
    # Not read yet: the peer set is not the whole membership (no verdict counts it whole).
    assert rig.peers.peer_sets == [(["tcp://127.0.0.1:7000", "tcp://127.0.0.1:6000"], False)]
    assert rig.rewired == 1  # the adapter's epoll set let go of the peers' sockets around it
    membership.read_ns = rig.now_ns
    rig.now_ns += PEER_INTERVAL_NS
    rig.core.housekeeping(rig.now_ns)
    assert rig.peers.peer_sets[-1] == (["tcp://127.0.0.1:7000", "tcp://127.0.0.1:6000"], True)


def test_the_membership_has_its_turn_once_every_peer_interval_and_the_peers_every_step():
    rig = Rig()
    membership = rig.core.membership = FakeMembership()
    steps = rig.run_s(3.5)
    assert all(steps)
    assert len(membership.published) == 4  # at 0, 1, 2 and 3 s
    assert len(rig.peers.peer_sets) == 4 and rig.rewired == 4
    assert len(rig.peers.ticks) == len(steps)


def test_housekeeping_returns_false_once_the_supervisor_has_stopped_the_node(rig):
    rig.sup.start()
    assert rig.run_s(0.1) == [True] * 10
    rig.sup.enqueue(signal.SIGTERM)
    rig.sup.dispatch()
    # The stop plan: said, no new request taken, every worker told STOP.
    assert rig.stopping == ["SIGTERM"]
    assert not rig.routing.accepting
    rig.sup.enqueue(signal.SIGCHLD)  # the workers obeyed SIGTERM
    assert rig.core.housekeeping(rig.now_ns) is False


def test_the_stop_plan_tells_every_connected_worker_stop(rig):
    rig.sup.start()  # its worker process is pid 100
    rig.routing.on_worker(b"w0", bytes((protocol.STATE,)) + b'{"slot": 0, "pid": 100, "ready": true, "held": []}')
    rig.core.on_stop()
    assert (b"w0", protocol.STOP_FRAME) in rig.to_workers
    rig.core.on_exit(100)
    assert b"w0" not in rig.routing.links


def test_the_supervisors_callbacks_are_the_cores(rig):
    assert rig.sup.on_stop == rig.core.on_stop and rig.sup.on_exit == rig.core.on_exit
