"""A client never strands on a node that died, froze or was cut off: real nodes on
a real etcd, on TCP, a client of each kind reserving every few milliseconds, and
the node it uses killed (SIGKILL), frozen (SIGSTOP) or cut off from its clients
(a proxy that stops forwarding) while that node's membership entry is still in
etcd, so every answer to NODES still lists it in rotation.

Each client is seeded with node A and prefers A's region (the others serve
another), so it is on A when the fault comes. Asserted: its next ID comes from
another node within about one timeout (3x the timeout and a margin: behaviour,
not speed), no reserve() raises while a live node is known (even with
``retries=0``), it does not go back to A, every call gets exactly the IDs it
asked for (a late reply never answers another request) and no ID is issued
twice.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import pytest
import uvloop
from checks import check_blocks
from netproxy import Proxy
from nodes import etcd_args, wait_for

from snowfence import AsyncClient, Client
from snowfence.errors import SnowfenceError
from snowfence.ids import DEFAULT_LAYOUT as L

NODES_PREFIX = "/snowfence/test/nodes/"
#: A's region, which the clients prefer; B and C serve region 0.
HOME = 1
#: Slack on top of 3x the timeout for a loaded 2-core machine.
MARGIN_S = 2.0


@dataclass
class Call:
    started: float
    ended: float
    n: int
    blocks: list[tuple[int, int]] = field(default_factory=list)
    error: str | None = None


class Load(threading.Thread):
    """One client (blocking or asyncio) given one seed, reserving a few IDs every few
    milliseconds and recording each call. Counts vary from call to call, so a reply
    taken for the wrong request would show as a call with the wrong number of IDs."""

    def __init__(self, kind: str, seed: str, timeout_s: float, retries: int = 5) -> None:
        super().__init__(daemon=True, name=f"load-{kind}-{timeout_s}")
        self.kind, self.seed, self.timeout_s, self.retries = kind, seed, timeout_s, retries
        self.calls: list[Call] = []
        self.client: Client | AsyncClient | None = None
        self.halt = threading.Event()
        self._ready = threading.Event()

    def __str__(self) -> str:
        return f"{self.kind} client, timeout {self.timeout_s} s, retries {self.retries}"

    def begin(self) -> Load:
        self.start()
        assert self._ready.wait(10)
        return self

    def _record(self, started: float, n: int, blocks=None, error=None) -> None:
        pairs = [(b.first, b.count) for b in blocks or ()]
        self.calls.append(Call(started, time.monotonic(), n, pairs, error))

    def _calls(self):
        """The count of each call, with when it began, until the load is halted."""
        for i in itertools.count():
            if self.halt.is_set():
                return
            yield 1000 + i % 97, time.monotonic()

    def _client(self, kind):
        self.client = kind(self.seed, timeout_s=self.timeout_s, retries=self.retries, region=HOME)
        self._ready.set()
        return self.client

    def run(self) -> None:
        if self.kind != "blocking":
            uvloop.run(self._run_async())
            return
        with self._client(Client) as client:
            for n, started in self._calls():
                try:
                    self._record(started, n, client.reserve(n))
                except SnowfenceError as exc:
                    self._record(started, n, error=repr(exc))
                time.sleep(0.005)

    async def _run_async(self) -> None:
        async with self._client(AsyncClient) as client:
            for n, started in self._calls():
                try:
                    self._record(started, n, await client.reserve(n))
                except SnowfenceError as exc:
                    self._record(started, n, error=repr(exc))
                await asyncio.sleep(0.005)

    def stop(self) -> None:
        self.halt.set()
        self.join(30)
        assert not self.is_alive(), f"{self} did not stop"

    def served_elsewhere_since(self, t: float) -> float | None:
        """When the first call that ended after ``t`` with IDs of another region than A's ended."""
        for call in list(self.calls):
            if call.ended > t and any(L.decompose(first).region != HOME for first, _ in call.blocks):
                return call.ended
        return None


def start_fleet(nodes, etcd, a_args=(), extra=()):
    """Nodes A (region 1), B and C (region 0) on one etcd, on TCP ports the kernel
    picks; default lease timings, so a dead node's entry lasts 10 s."""
    common = (*etcd_args(etcd, "test"), *extra)
    made = {
        "a": nodes.start("a", workers=1, bind="tcp://127.0.0.1:0", args=(*common, "--region", str(HOME), *a_args)),
        "b": nodes.start("b", workers=1, bind="tcp://127.0.0.1:0", args=(*common, "--region", "0")),
        "c": nodes.start("c", workers=1, bind="tcp://127.0.0.1:0", args=(*common, "--region", "0")),
    }
    for node in made.values():
        node.wait_bound()
        node.wait_ready()
    return made


def listed_in_rotation(node) -> set[str]:
    with Client(node.endpoint, timeout_s=1.0, retries=0, discover=False) as c:
        return {n["endpoints"][0] for n in c.nodes()["nodes"] if n.get("in_rotation")}


def check_loads(loads: list[Load], fault_at: float, recovered: dict) -> None:
    for load in loads:
        errors = [c.error for c in load.calls if c.error]
        assert errors == [], f"{load}: {errors[:3]}"
        wrong = [(c.n, sum(n for _, n in c.blocks)) for c in load.calls if sum(n for _, n in c.blocks) != c.n]
        assert wrong == [], f"{load}: calls that got other than what they asked for: {wrong[:3]}"
        bound = 3 * load.timeout_s + MARGIN_S
        took = recovered[load] - fault_at
        assert took < bound, f"{load}: the first ID from another node came {took:.2f} s after the fault"
        ends = [c.ended for c in load.calls if c.ended > fault_at]
        gaps = [b - a for a, b in zip([fault_at, *ends], ends, strict=False)]
        assert max(gaps) < bound, f"{load}: {max(gaps):.2f} s without an ID after the fault"
        assert len(ends) > 100, f"{load}: only {len(ends)} calls after the fault"
    check_blocks([[pair for c in load.calls for pair in c.blocks] for load in loads])


def run_fault(nodes, etcd, fault: str) -> None:
    proxy = Proxy("127.0.0.1", 0) if fault == "cut" else None
    try:
        # Cut off: A advertises the proxy's address, and clients are given it as their seed.
        # The proxy carries only the ZeroMQ port: A has no fast port, which would bypass it.
        a_args = ("--advertise", f"tcp://127.0.0.1:{proxy.port}", "--fast-bind", "off") if proxy else ()
        made = start_fleet(nodes, etcd, a_args)
        a = made["a"]
        if proxy:
            proxy.forward_to("127.0.0.1", int(a.endpoint.rpartition(":")[2]))
        seed = f"tcp://127.0.0.1:{proxy.port}" if proxy else a.endpoint
        every = {seed, made["b"].endpoint, made["c"].endpoint}
        wait_for(lambda: listed_in_rotation(made["b"]) == every, 20, what="b to list all three in rotation")
        # With no retries at all too: moving to another node after a timeout is failover, not a retry.
        loads = [Load(kind, seed, t, r).begin() for kind in ("blocking", "asyncio") for t, r in ((0.5, 5), (2.0, 0))]
        try:
            wait_for(
                lambda: all(set(x.client.endpoints) == every and x.client.endpoint == seed for x in loads),
                20,
                what="every client to learn the cluster and stay on A",
            )
            time.sleep(0.5)
            fault_at = time.monotonic()
            if fault == "kill":
                os.killpg(a.pgid, signal.SIGKILL)
            elif fault == "stop":
                os.killpg(a.pgid, signal.SIGSTOP)
            else:
                proxy.sever()
            recovered = {}
            for load in loads:
                recovered[load] = wait_for(
                    lambda load=load: load.served_elsewhere_since(fault_at),
                    3 * load.timeout_s + MARGIN_S + 5,
                    what=f"{load} to get an ID from another node",
                )
            # A is still listed: its lease has not lapsed (or, cut off, it keeps renewing).
            entries = etcd.get_prefix(NODES_PREFIX)
            assert any(seed.replace(":", "%3A").replace("/", "%2F") in key for key in entries), sorted(entries)
            time.sleep(3)
            if fault == "stop":
                # A thaws and answers what it was asked before it froze: to sockets long closed.
                os.killpg(a.pgid, signal.SIGCONT)
            time.sleep(4)  # past the clients' next NODES (every 5 s), which still lists A
        finally:
            for load in loads:
                load.stop()
        check_loads(loads, fault_at, recovered)
    finally:
        if proxy:
            proxy.close()


@pytest.mark.parametrize("fault", ["kill", "stop", "cut"])
def test_a_client_on_a_node_that_dies_freezes_or_is_cut_off_goes_on_at_another_within_a_timeout(nodes, etcd, fault):
    run_fault(nodes, etcd, fault)


def test_a_client_that_learned_the_cluster_while_its_peers_were_out_of_rotation_does_not_strand(nodes, etcd):
    # Clients that learn the cluster while the other nodes are still starting (or
    # restarting) see them listed but not in rotation. They are where the client
    # goes when its node dies, not nowhere: it once stayed on the dead seed.
    # Workers silent for 1 s leave rotation.
    made = start_fleet(nodes, etcd, extra=("--heartbeat-interval-s", "0.25", "--heartbeat-timeout-s", "1"))
    a, b, c = made.values()
    wait_for(lambda: len(listed_in_rotation(a)) == 3, 20, what="a to list all three in rotation")
    # B's and C's workers fall silent: the brokers take them out of rotation, and say so in etcd.
    frozen = [pid for node in (b, c) for pid in node.worker_pids()]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: listed_in_rotation(a) == {a.endpoint}, 15, what="b and c to leave rotation")
        loads = [Load(kind, a.endpoint, 0.5).begin() for kind in ("blocking", "asyncio")]
        try:
            wait_for(
                lambda: all(x.client.directory.seen == {a.endpoint} for x in loads),
                10,
                what="both clients to learn the cluster with only a in rotation",
            )
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
        for node in (b, c):
            node.wait_ready()
        # Before the clients' next NODES (5 s after their first), which would list b and c in rotation.
        assert all(x.client.directory.seen == {a.endpoint} for x in loads)
        fault_at = time.monotonic()
        a.kill()
        recovered = {
            load: wait_for(lambda load=load: load.served_elsewhere_since(fault_at), 10, what=f"{load} to go on")
            for load in loads
        }
        time.sleep(2)
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    for load in loads:
        load.stop()
    check_loads(loads, fault_at, recovered)


# -- the command line ------------------------------------------------------------------------------


def test_reserve_on_the_command_line_gives_up_on_a_killed_node_within_its_bound_and_says_why(nodes, tmp_path):
    node = nodes.start(workers=1)
    node.wait_ready()
    timeout_s, retries = 1.0, 2
    out = tmp_path / "blocks.txt"
    with open(out, "wb") as sink:
        cli = subprocess.Popen(
            [sys.executable, "-m", "snowfence", "reserve", "100000000000", "--connect", node.endpoint, "--format",
             "blocks", "--timeout", str(timeout_s), "--retries", str(retries)],
            stdout=sink, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(lambda: out.stat().st_size > 100_000, 30, what="the reservation to stream")
        node.kill()
        killed_at = time.monotonic()
        _, err = cli.communicate(timeout=60)
        took = time.monotonic() - killed_at
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait(10)
    # The node is gone: its address refuses connections. The request in flight when it died
    # waits out its timeout at most; each retry after it is refused at once, after its
    # back-off (at most 1 s), and the command says why, within the bound of GUIDE.md.
    attempts = retries + 1
    assert cli.returncode == 1, err
    assert took < attempts * timeout_s + retries * 1.0 + MARGIN_S, (took, err)
    [line] = err.strip().splitlines()
    assert line == (
        f"snowfence: connection_refused: {node.endpoint} refused the connection: is snowfence serve running there?"
    ), line
    assert "Traceback" not in err
    blocks = [tuple(map(int, row.split())) for row in out.read_text().splitlines() if row.count(" ") == 1]
    check_blocks([blocks])  # what it printed before the node died is sound
