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
import subprocess
import time
import tomllib

import orjson
import pytest
from leftovers import group_alive
from nodes import wait_for

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
    held = node.all_worker_ids()  # its workers' and the broker's own, if it has claimed one yet
    assert run_dirs_of(node), "a running node has its run directory"
    if to == "broker":
        os.kill(node.pid, signal.SIGHUP)
    else:
        os.killpg(node.pgid, signal.SIGHUP)
    assert node.proc.wait(15) == 0, node.log_tail()
    log = node.log()
    assert "SIGHUP: stopping" in log, log
    assert log.count("event=released") == len(held) >= 2, log  # each holder let go of its worker ID
    wait_for(lambda: not group_alive(node.pgid), 5, what="the workers to be gone")
    assert all(not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
               for pid in workers)  # fmt: skip
    assert not run_dirs_of(node), "the run directory is removed"


def snowfence(*args, env=None, timeout_s: float = 30.0) -> subprocess.CompletedProcess:
    from test_edges import run_snowfence

    return run_snowfence(*args, env=env, timeout_s=timeout_s)[0]


def test_check_config_shows_each_setting_with_its_source_and_masks_secrets(tmp_path):
    assert snowfence("keygen", "server", "--dir", str(tmp_path)).returncode == 0
    key = tmp_path / "server.key_secret"
    secret_z85 = next(line.split('"')[1] for line in key.read_text().splitlines() if "secret-key" in line)
    toml = tmp_path / "node.toml"
    toml.write_text('region = 1\netcd_user = "snowfence"\netcd_password = "file-password-4711"\n')
    env = {"SNOWFENCE_WORKERS": "3", "SNOWFENCE_ETCD_PASSWORD": "env-password-0815"}
    args = ("--config", str(toml), "--etcd", "http://127.0.0.1:2379", "--cluster", "prod", "--curve-secret-key",
            str(key), "--state-dir", str(tmp_path / "not-yet"), "--bind", f"ipc://{tmp_path}/never.sock")  # fmt: skip
    p = snowfence("check-config", *args, env=env)
    assert p.returncode == 0 and not p.stderr, p.stderr
    for secret in ("file-password-4711", "env-password-0815", secret_z85):
        assert secret not in p.stdout, f"{secret} shown"
    shown = tomllib.loads(p.stdout)  # the output is itself a config file
    assert shown["region"] == 1 and shown["workers"] == 3 and shown["cluster"] == "prod"
    # The password commented out: the output fed back takes it from where it came from, never as a mask.
    assert "etcd_password" not in shown and shown["curve_secret_key"] == str(key)
    comment = {line.split(" = ")[0]: line.rsplit("# ", 1)[1] for line in p.stdout.splitlines() if " = " in line}
    assert comment["region"] == f"file {toml}"
    assert comment["workers"] == "env SNOWFENCE_WORKERS"
    assert comment["# etcd_password"] == "env SNOWFENCE_ETCD_PASSWORD"
    assert comment["cluster"] == "flag --cluster" and comment["bind"] == "flag --bind"
    assert comment["lease_ttl_s"] == "default"
    doc = orjson.loads(snowfence("check-config", *args, "--json", env=env).stdout)
    assert doc["settings"]["workers"] == {"value": 3, "source": "env", "from": "SNOWFENCE_WORKERS"}
    assert doc["settings"]["etcd_password"]["value"] == "***" and doc["warnings"] == []
    # Nothing bound, nothing written.
    assert not (tmp_path / "never.sock").exists() and not (tmp_path / "not-yet").exists()


def test_check_config_fails_as_serve_would_and_binds_nothing(tmp_path, taken_port):
    (tmp_path / "file").write_text("")
    for args, status, words in (
        (("--region", "8"), 78, "region must be 0..7"),
        (("--epoch", "2030-01-01"), 78, "in the future"),
        (("--state-dir", str(tmp_path / "file" / "state")), 73, "is not a directory"),
        (("--curve-secret-key", str(tmp_path / "file")), 78, "CURVE key"),
        (("--metrics-bind", "9650"), 78, "HOST:PORT"),
    ):
        p = snowfence("check-config", "--state-dir", str(tmp_path / "state"), *args)
        assert p.returncode == status and words in p.stderr and p.stderr.count("\n") == 1, (args, p.stderr)
        assert not p.stdout and "Traceback" not in p.stderr
    # serve would find the port taken; check-config does not try to bind it.
    p = snowfence("check-config", "--bind", f"tcp://127.0.0.1:{taken_port}", "--metrics-bind",
                  f"127.0.0.1:{taken_port}", "--state-dir", str(tmp_path / "state"))  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "state").exists()


def test_an_etcd_node_that_advertises_nothing_is_warned_about_at_start(tmp_path, taken_port):
    wildcard = f"tcp://0.0.0.0:{taken_port}"  # taken on loopback: serve warns, then cannot bind it
    args = ("--etcd", "http://127.0.0.1:9", "--bind", wildcard, "--state-dir", str(tmp_path / "state"))
    p = snowfence("serve", "--workers", "1", *args, env={"TMPDIR": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path)})
    assert p.returncode == 78 and "Address already in use" in p.stderr, p.stderr
    warning = next(line for line in p.stderr.splitlines() if "event=nothing_advertised" in line)
    assert "WARNING" in warning and "advertises no endpoint" in warning and "--advertise" in warning, warning
    p = snowfence("check-config", *args)
    assert p.returncode == 0 and "advertises no endpoint" in p.stderr, p.stderr
    p = snowfence("check-config", *args, "--advertise", f"tcp://127.0.0.1:{taken_port}")
    assert p.returncode == 0 and not p.stderr, p.stderr
    p = snowfence("check-config", *args[2:])  # embedded mode has no one to advertise to
    assert p.returncode == 0 and not p.stderr, p.stderr


def test_a_node_started_under_nohup_keeps_ignoring_sighup(nodes):
    node = nodes.start(workers=1, prefix=("nohup",))
    node.wait_ready()
    workers = node.worker_pids()
    os.killpg(node.pgid, signal.SIGHUP)
    time.sleep(1.0)
    assert node.proc.poll() is None and node.worker_pids() == workers, node.log_tail()
    assert "SIGHUP" not in node.log() and "stopping" not in node.log()
    assert node.stop(signal.SIGTERM) == 0
