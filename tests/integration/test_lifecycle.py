"""A node's life as a service manager sees it: systemd's readiness protocol, signals
that stop it cleanly, and checks made before it says it is serving.

Every node here is a real ``snowfence serve`` process group; the service manager's
end of sd_notify is a Unix datagram socket the test binds, as systemd would.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import time

import pytest
from nodes import group_has_live_members, wait_for

from snowfence.broker import rundir

CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid


class NotifySocket:
    """The service manager's side of sd_notify: messages, and the PID of whoever sent each."""

    def __init__(self, path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.messages: list[tuple[int, dict[str, str]]] = []

    def env(self) -> dict:
        return {"NOTIFY_SOCKET": self.path}

    def wait(self, field: str, timeout_s: float = 20.0) -> tuple[int, dict[str, str]]:
        """The first message that carries ``field`` (e.g. READY=1): (sender pid, its fields)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for pid, fields in self.messages:
                key, _, value = field.partition("=")
                if fields.get(key) == value:
                    return pid, fields
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {field} within {timeout_s} s; got {self.messages}")
            self.sock.settimeout(left)
            try:
                data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(CREDENTIALS.size))
            except TimeoutError:
                continue
            pid = next(
                CREDENTIALS.unpack(bytes(d[: CREDENTIALS.size]))[0]
                for level, kind, d in ancillary
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS
            )
            lines = data.decode().splitlines()
            self.messages.append((pid, dict(line.partition("=")[::2] for line in lines)))

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path):
    sock = NotifySocket(tmp_path / "notify")
    yield sock
    sock.close()


def run_dirs_of(node) -> list[str]:
    return [
        os.path.join(base, f"{rundir.PREFIX}{node.pid}")
        for base in node.run_dir_bases
        if os.path.lexists(os.path.join(base, f"{rundir.PREFIX}{node.pid}"))
    ]


def test_the_node_tells_systemd_it_is_ready_once_bound_and_that_it_is_stopping(nodes, notify_socket):
    node = nodes.start(workers=2, env=notify_socket.env())
    pid, fields = notify_socket.wait("READY=1")
    assert pid == node.pid, "from the main process (NotifyAccess=main)"
    assert "serving on" in fields.get("STATUS", ""), fields
    assert node.status()["broker"]["pid"] == node.pid, "bound when it says ready"
    node.wait_ready()
    assert not [m for m in notify_socket.messages if "STOPPING" in m[1]]
    node.proc.send_signal(signal.SIGTERM)
    pid, fields = notify_socket.wait("STOPPING=1")
    assert pid == node.pid
    assert node.proc.wait(10) == 0
    # The workers never saw NOTIFY_SOCKET: with NotifyAccess=all they could not pass for the node.
    assert all(pid == node.pid for pid, _ in notify_socket.messages)


def test_a_standby_node_is_ready_for_systemd_though_it_mints_nothing(nodes, notify_socket, tmp_path):
    # Two worker IDs in the layout, both held by the first node: the second one stands by.
    layout = ("--worker-bits", "1", "--sequence-bits", "18")
    shared = tmp_path / "shared-state"
    first = nodes.start("first", workers=2, state_dir=shared, args=layout)
    first.wait_ready()
    standby = nodes.start("standby", workers=1, state_dir=shared, args=layout, env=notify_socket.env())
    pid, _ = notify_socket.wait("READY=1")
    assert pid == standby.pid
    wait_for(
        lambda: any("taken" in (w.get("reason") or "") for w in standby.status()["workers"]),
        10,
        what="the standby to find every worker ID taken",
    )
    assert not standby.ready_workers()
    assert standby.proc.poll() is None


def test_an_abstract_notify_socket_is_used_too(nodes, tmp_path):
    name = f"snowfence-test-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(20)
    try:
        node = nodes.start(workers=1, env={"NOTIFY_SOCKET": "@" + name})
        got = b""
        while b"READY=1" not in got.splitlines():
            got = sock.recv(4096)
        assert node.proc.poll() is None
    finally:
        sock.close()


@pytest.mark.parametrize("to", ["broker", "process group"])
def test_sighup_stops_the_node_cleanly_and_says_so(nodes, to):
    """``kill -HUP`` of the broker, or a terminal that hangs up on the whole group: a graceful stop."""
    node = nodes.start(workers=2)
    node.wait_ready()
    workers = node.worker_pids()
    assert run_dirs_of(node), "a running node has its run directory"
    if to == "broker":
        os.kill(node.pid, signal.SIGHUP)
    else:
        os.killpg(node.pgid, signal.SIGHUP)
    assert node.proc.wait(15) == 0, node.log_tail()
    log = node.log()
    assert "SIGHUP: stopping" in log, log
    assert log.count("event=released") == 2, log  # each worker let go of its worker ID
    wait_for(lambda: not group_has_live_members(node.pgid), 5, what="the workers to be gone")
    assert all(not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
               for pid in workers)  # fmt: skip
    assert not run_dirs_of(node), "the run directory is removed"
