"""Real snowfence nodes for integration tests.

Each node is ``python -m snowfence serve`` in its own process group, bound to
an ``ipc://`` endpoint under the test's temp dir (no free-port races); teardown
kills the whole group and checks that nothing it started is left running.
"""

from __future__ import annotations

import mmap
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from snowfence import Client
from snowfence.errors import SnowfenceError

HERE = Path(__file__).resolve().parent
SHIM_SOURCE = HERE.parent / "clockshim" / "clockshim.c"


def wait_for(predicate, timeout_s: float, interval_s: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last_exc = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (SnowfenceError, OSError) as exc:
            last_exc = exc
            value = None
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(
        f"timed out after {timeout_s} s waiting for {what}" + (f" (last error: {last_exc})" if last_exc else "")
    )


class ClockTable:
    """Shifts the wall clock of processes running under the clock shim."""

    SIZE = 8 + 64 * 16

    def __init__(self, path: Path, library: Path) -> None:
        self.path = path
        self.library = library
        path.write_bytes(b"\0" * self.SIZE)
        self._file = open(path, "r+b")
        self._map = mmap.mmap(self._file.fileno(), self.SIZE)

    def env(self) -> dict:
        return {"LD_PRELOAD": str(self.library), "SNOWFENCE_CLOCKSHIM": str(self.path)}

    def shift_all(self, offset_ms: float) -> None:
        struct.pack_into("<q", self._map, 0, int(offset_ms * 1_000_000))

    def shift_pid(self, pid: int, offset_ms: float) -> None:
        free = None
        for i in range(64):
            slot_pid, _ = struct.unpack_from("<qq", self._map, 8 + 16 * i)
            if slot_pid == pid:
                free = i
                break
            if slot_pid == 0 and free is None:
                free = i
        assert free is not None, "clock table full"
        struct.pack_into("<q", self._map, 8 + 16 * free + 8, int(offset_ms * 1_000_000))
        struct.pack_into("<q", self._map, 8 + 16 * free, pid)

    def close(self) -> None:
        self._map.close()
        self._file.close()


@pytest.fixture(scope="session")
def clockshim_library(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("a C compiler (cc or gcc) is needed to build the clock shim for clock-step tests")
    out = tmp_path_factory.mktemp("clockshim") / "libclockshim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(SHIM_SOURCE), "-ldl"], check=True)
    return out


@pytest.fixture
def clock(tmp_path, clockshim_library):
    table = ClockTable(tmp_path / "clock-table", clockshim_library)
    yield table
    table.close()


class Node:
    """One ``snowfence serve`` process group."""

    def __init__(
        self,
        tmp_path: Path,
        name: str,
        *,
        workers: int = 2,
        state_dir: Path | None = None,
        args: tuple = (),
        env: dict | None = None,
    ) -> None:
        self.name = name
        self.dir = tmp_path
        self.endpoint = f"ipc://{tmp_path}/{name}.sock"
        self.state_dir = state_dir or tmp_path / f"{name}-state"
        self.workers = workers
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.log_path = tmp_path / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.pgid: int | None = None

    def start(self) -> Node:
        cmd = [
            sys.executable,
            "-m",
            "snowfence",
            "serve",
            "--bind",
            self.endpoint,
            "--state-dir",
            str(self.state_dir),
            "--workers",
            str(self.workers),
            *self.args,
        ]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=self.env, start_new_session=True)
        log.close()
        self.pgid = self.proc.pid
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def client(self, **kw) -> Client:
        kw.setdefault("timeout_s", 2.0)
        return Client(self.endpoint, **kw)

    def status(self) -> dict:
        with Client(self.endpoint, timeout_s=1.0, retries=0) as c:
            return c.status()

    def ready_workers(self) -> list[dict]:
        return [w for w in self.status()["workers"] if w.get("in_rotation")]

    def wait_ready(self, count: int | None = None, timeout_s: float = 20.0) -> list[dict]:
        count = self.workers if count is None else count
        return wait_for(
            lambda: (lambda r: r if len(r) >= count else None)(self.ready_workers()),
            timeout_s,
            what=f"{count} ready workers on {self.name}; log:\n{self.log_tail()}",
        )

    def worker_pids(self) -> list[int]:
        return sorted({w["pid"] for w in self.status()["workers"] if w.get("pid")})

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL the whole process group and reap the broker."""
        if self.pgid is not None:
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None and self.proc.poll() is None:
            self.proc.wait(10)

    def group_alive(self) -> bool:
        if self.pgid is None:
            return False
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        return _group_has_live_members(self.pgid)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


def _group_has_live_members(pgid: int) -> bool:
    """True if a non-zombie process of the group is running."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state != "Z":
            return True
    return False


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
    leftovers = []
    for node in started:
        node.kill()
        # Orphaned workers must exit on their own once the broker is gone.
        deadline = time.monotonic() + 10
        while node.group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if node.group_alive():
            leftovers.append(node.name)
            os.killpg(node.pgid, signal.SIGKILL)
    assert not leftovers, f"processes of {leftovers} outlived the test"


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
    from etcdharness import EtcdCluster

    cluster = EtcdCluster(tmp_path / "etcd", size=1).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def etcd3(tmp_path):
    """A three-member etcd cluster on loopback, stopped at teardown."""
    from etcdharness import EtcdCluster

    cluster = EtcdCluster(tmp_path / "etcd3", size=3).start()
    yield cluster
    cluster.stop()


def etcd_args(cluster, name: str = "test", *extra) -> tuple:
    return ("--etcd", ",".join(cluster.endpoints), "--cluster", name, *extra)


def make_certs(directory: Path) -> dict:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    run("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=snowfence-test-ca")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, cn in (("server", "127.0.0.1"), ("client", "root")):
        run("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}")
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        )
    return {
        "ca": directory / "ca.pem",
        "server_cert": directory / "server.pem",
        "server_key": directory / "server.key",
        "client_cert": directory / "client.pem",
        "client_key": directory / "client.key",
    }


@pytest.fixture
def etcd_secure(tmp_path):
    """One etcd member with TLS (client certificates required) and authentication on."""
    from etcdharness import EtcdCluster

    tls = make_certs(tmp_path / "certs")
    cluster = EtcdCluster(tmp_path / "etcd-tls", size=1, tls=tls).start()
    for args in (("user", "add", "root", "--new-user-password", "s3cret"), ("auth", "enable")):
        p = cluster.ctl(*args)
        assert p.returncode == 0, p.stderr
    cluster.password = "s3cret"
    yield cluster
    cluster.stop()
