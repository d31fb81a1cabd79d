"""Fixtures for integration tests: real nodes, real etcd, real sockets.

Each node is ``python -m snowfence serve`` in its own process group, bound to
an ``ipc://`` endpoint under the test's temp dir (no free-port races); teardown
kills the whole group, checks that nothing it started is left running, and
removes the run directory the killed broker left, as its next start would.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import zmq
from certs import make_certs
from clock import ClockTable, build_clockshim
from etcdharness import EtcdCluster
from nodes import Node

HARNESS = Path(__file__).resolve().parent.parent / "harness"


@pytest.fixture(scope="session")
def clockshim_library(tmp_path_factory) -> Path:
    return build_clockshim(tmp_path_factory.mktemp("clockshim"))


@pytest.fixture
def clock(tmp_path, clockshim_library):
    table = ClockTable(tmp_path / "clock-table", clockshim_library)
    yield table
    table.close()


@pytest.fixture
def nodes(tmp_path):
    """Start nodes with ``nodes.start(name=..., **kw)``; all are killed at teardown."""
    started: list[Node] = []

    class Factory:
        def new(self, name: str = "node", **kw) -> Node:
            node = Node(tmp_path, name, **kw)
            started.append(node)
            return node

        def start(self, name: str = "node", **kw) -> Node:
            return self.new(name, **kw).start()

    yield Factory()
    outlived = [node.name for node in started if not node.close()]
    assert not outlived, f"processes of {outlived} outlived the test"


@pytest.fixture
def raw(tmp_path):
    """Raw ZeroMQ sockets, closed at teardown."""
    ctx = zmq.Context()
    socks = []

    def make(endpoint: str, kind: int = zmq.DEALER) -> zmq.Socket:
        s = ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, 3000)
        s.connect(endpoint)
        socks.append(s)
        return s

    yield make
    for s in socks:
        s.close(0)
    ctx.term()


@pytest.fixture
def etcd(tmp_path):
    """A single etcd member on loopback, stopped at teardown."""

    cluster = EtcdCluster(tmp_path / "etcd", size=1).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def etcd3(tmp_path):
    """A three-member etcd cluster on loopback, stopped at teardown."""

    cluster = EtcdCluster(tmp_path / "etcd3", size=3).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def etcd_secure(tmp_path):
    """One etcd member with TLS (client certificates required) and authentication on."""

    tls = make_certs(tmp_path / "certs")
    cluster = EtcdCluster(tmp_path / "etcd-tls", size=1, tls=tls).start()
    for args in (("user", "add", "root", "--new-user-password", "s3cret"), ("auth", "enable")):
        p = cluster.ctl(*args)
        assert p.returncode == 0, p.stderr
    cluster.password = "s3cret"
    yield cluster
    cluster.stop()


@pytest.fixture
def taken_port():
    """A loopback TCP port something else is listening on."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()
