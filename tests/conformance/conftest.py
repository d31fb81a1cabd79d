"""A real snowfence server for the conformance suite, driven over raw ZeroMQ.

The server is ``python -m snowfence serve`` in its own process group (session),
bound to an ``ipc://`` endpoint under pytest's temp dir; it is ready when a
STATUS request shows every worker in rotation. Teardown SIGKILLs the group.

Nothing here imports ``snowfence``: readiness is judged over the wire, per
``docs/PROTOCOL.md``, with the helpers of ``sfwire``. Only the cleanup after a
killed server (its run directory) goes through the harness's ``leftovers``.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import leftovers
import netns
import pytest
import sfwire
import zmq
from nodes import QUICK_WINDOW, TIMING_FLAGS

#: Every test of this directory gets this timeout (pytest-timeout), well below the global one.
TEST_TIMEOUT_S = 60
READY_TIMEOUT_S = 20.0
#: A Unix socket path must fit in sun_path (108 bytes with the NUL).
MAX_IPC_PATH = 100
#: Heartbeats fast enough that a stopped worker leaves rotation within a second.
FAST_HEARTBEAT = ("--heartbeat-interval-s", "0.1", "--heartbeat-timeout-s", "0.5")


def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.hasplugin("timeout"):
        return
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))


class Server:
    """One ``snowfence serve`` process group, observed only through the wire protocol."""

    def __init__(
        self,
        directory: Path,
        workers: int = 2,
        args: tuple[str, ...] = (),
        ids_per_worker: int = 1,
        prefix: list[str] | None = None,
    ) -> None:
        #: A command the server runs under (netns.own_host() for a server that outlives a module).
        self.prefix = list(prefix or ())
        self.dir = directory
        self.workers = workers
        #: Entries of STATUS ``workers`` when ready: one per worker ID its workers hold.
        self.entries = workers * ids_per_worker
        self.args = list(args) + (["--ids-per-worker", str(ids_per_worker)] if ids_per_worker != 1 else [])
        # As the harness's nodes: a short window, so a new store's first ID is not 5 s away.
        if not any(arg.split("=")[0] in TIMING_FLAGS for arg in self.args):
            self.args += QUICK_WINDOW
        sock_path = directory / "sf.sock"
        assert len(str(sock_path)) <= MAX_IPC_PATH, f"ipc path too long for a Unix socket: {sock_path}"
        self.endpoint = f"ipc://{sock_path}"
        self.log_path = directory / "server.log"
        self.proc: subprocess.Popen | None = None
        #: The STATUS_REPLY that showed the server ready.
        self.ready_status: dict = {}
        self.ctx = zmq.Context()
        self._ids = itertools.count(1)

    def start(self) -> Server:
        cmd = [
            *self.prefix,
            sys.executable,
            "-m",
            "snowfence",
            "serve",
            "--bind",
            self.endpoint,
            "--state-dir",
            str(self.dir / "state"),
            "--workers",
            str(self.workers),
            *self.args,
        ]
        # Settings from the environment (SNOWFENCE_ETCD, ...) must not change what we test.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SNOWFENCE_")}
        self.run_dir_bases = leftovers.node_run_dir_bases(self.dir / "state", env)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True)
        leftovers.register_process(
            self.proc.pid, group=True, what=f"server in {self.dir.name}", run_dir_bases=self.run_dir_bases
        )
        return self

    def request_id(self) -> int:
        return next(self._ids)

    def status(self, timeout_ms: int = 1000) -> dict:
        """One STATUS round trip on a fresh DEALER socket (a lost request never poisons the next)."""
        sock = sfwire.connect(self.ctx, self.endpoint, timeout_ms=timeout_ms)
        try:
            rid = self.request_id()
            reply = sfwire.request(sock, sfwire.status(rid))
        finally:
            sock.close(0)
        assert reply.type == sfwire.STATUS_REPLY and reply.request_id == rid, reply
        return reply.json

    def bound_endpoint(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        """A ``tcp://HOST:0`` endpoint, once bound, as the server's log names it; it becomes ``endpoint``."""
        deadline = time.monotonic() + timeout_s
        while (found := re.search(r"snowfence serving on (tcp://\S+)", self.log_tail(200))) is None:
            assert self.proc.poll() is None, f"server exited; log:\n{self.log_tail()}"
            assert time.monotonic() < deadline, f"server did not bind; log:\n{self.log_tail()}"
            time.sleep(0.05)
        self.endpoint = found.group(1)
        return self.endpoint

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict:
        """Poll STATUS until every worker ID of its workers is held and in rotation."""
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}; log:\n{self.log_tail()}")
            try:
                st = self.status(timeout_ms=500)
            except (AssertionError, zmq.ZMQError) as exc:
                last = exc
            else:
                last = st.get("workers")
                workers = st.get("workers") or []
                if (
                    len(workers) == self.entries
                    and all(w.get("in_rotation") is True for w in workers)
                    and all(w.get("worker_id") is not None for w in workers)
                ):
                    return st
            time.sleep(0.05)
        raise AssertionError(f"server not ready after {timeout_s} s (last: {last!r}); log:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL the whole process group, reap the broker, wait for the group to be gone, and
        remove the run directory the broker left (as the next start would)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            deadline = time.monotonic() + 5
            while leftovers.group_alive(self.proc.pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            leftovers.reap_group(self.proc.pid)
            leftovers.remove_stale_run_dirs(self.proc.pid, self.run_dir_bases)
        self.ctx.destroy(linger=0)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def free_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on now (the system's pick, released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: The regions a module's own nodes take, one each in turn: they run beside other modules' nodes
#: and each other on state directories of their own, and a host refuses two state directories in
#: one region (store/home.py). Region 4 is the shard module's.
_MODULE_REGIONS = itertools.cycle((1, 2, 3, 5, 6, 7))


def started(directory: Path, workers: int = 1, args: tuple[str, ...] = (), tcp: bool = False, **kwargs) -> Server:
    """A server started and ready (``tcp``: bound to ``tcp://127.0.0.1`` on a port the system
    picks, instead of ``ipc://``), in a region of its own unless ``args`` name one; killed by
    the caller (``Server.kill``) in any case."""
    if "--region" not in args:
        args = (*args, "--region", str(next(_MODULE_REGIONS)))
    srv = Server(directory, workers=workers, args=args, **kwargs)
    if tcp:
        srv.endpoint = "tcp://127.0.0.1:0"
    try:
        srv.start()
        if tcp:
            srv.bound_endpoint()
        srv.ready_status = srv.wait_ready()
    except BaseException:
        srv.kill()
        raise
    return srv


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The suite's server: 2 workers, embedded mode, default layout; ready when yielded."""
    # On a host of its own: it lives for the whole session, beside every later test's nodes
    # (a host refuses a second state directory in its region).
    srv = Server(tmp_path_factory.mktemp("conformance"), workers=2, prefix=netns.own_host())
    try:
        srv.start()
        srv.ready_status = srv.wait_ready()
        yield srv
    finally:
        srv.kill()
    assert not leftovers.group_alive(srv.proc.pid), "processes of the server outlived SIGKILL of its group"


@pytest.fixture(scope="session")
def stalled_server(tmp_path_factory):
    """A 1-worker server whose worker is SIGSTOPped until the broker takes it out of rotation."""
    srv = Server(tmp_path_factory.mktemp("stalled"), workers=1, args=FAST_HEARTBEAT, prefix=netns.own_host())
    pid = None
    try:
        srv.start()
        pid = srv.wait_ready()["workers"][0]["pid"]
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while any(w["in_rotation"] for w in srv.status()["workers"]):
            assert time.monotonic() < deadline, "the stopped worker stayed in rotation"
            time.sleep(0.05)
        yield srv
    finally:
        if pid is not None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        srv.kill()


@pytest.fixture(scope="session")
def layout(server) -> sfwire.Layout:
    return sfwire.Layout.of(server.ready_status)


@pytest.fixture(scope="session")
def worker_ids(server) -> set[int]:
    return sfwire.held_worker_ids(server.ready_status)


@pytest.fixture
def sockets(server):
    """``sockets(kind=zmq.DEALER, endpoint=None, timeout_ms=3000, connect=True)``: raw sockets connected
    to the suite's server (or ``endpoint``), closed at teardown."""
    ctx = zmq.Context()
    made: list[zmq.Socket] = []

    def make(
        kind: int = zmq.DEALER, endpoint: str | None = None, timeout_ms: int = 3000, connect: bool = True
    ) -> zmq.Socket:
        sock = sfwire.socket(ctx, kind, timeout_ms)
        made.append(sock)
        if connect:
            sock.connect(endpoint or server.endpoint)
        return sock

    yield make
    for sock in made:
        sock.close(0)
    ctx.term()


@pytest.fixture(scope="session")
def start_node():
    """``start_node(directory, workers=1, args=(), tcp=False, ids_per_worker=1)``: a :class:`Server`
    started and ready, for a module's own node (the caller kills it)."""
    return started


@pytest.fixture(scope="session")
def unused_port():
    """``unused_port()``: a TCP port of 127.0.0.1 nothing listens on now."""
    return free_port


#: The example C client, which the suite builds.
C_CLIENT_SOURCE = Path(__file__).resolve().parents[2] / "examples" / "c" / "snowfence_client.c"


@pytest.fixture(scope="session")
def c_client(tmp_path_factory) -> Path:
    """The example C client (examples/c/snowfence_client.c), built with the system compiler
    (skipped without one, or without libzmq's development files)."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler: `cc` is not on PATH (install gcc or clang)")
    pkg_config = shutil.which("pkg-config")
    if pkg_config is None:
        pytest.skip("pkg-config is not on PATH (needed to find libzmq; install pkg-config)")
    if subprocess.run([pkg_config, "--exists", "libzmq"]).returncode != 0:
        pytest.skip("libzmq development files not found by `pkg-config --exists libzmq` (install libzmq3-dev)")
    flags = subprocess.run(
        [pkg_config, "--cflags", "--libs", "libzmq"], capture_output=True, text=True, check=True
    ).stdout.split()
    out = tmp_path_factory.mktemp("c-client") / "snowfence_client"
    build = subprocess.run(
        [cc, "-std=c99", "-O2", "-Wall", "-Wextra", "-o", str(out), str(C_CLIENT_SOURCE), *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert build.returncode == 0, f"build failed:\n{build.stderr}"
    assert "warning" not in build.stderr, f"the example should build without warnings:\n{build.stderr}"
    return out
