"""Real snowfence nodes for tests: each one a `python -m snowfence serve`
process group on an ipc:// endpoint (or on the TCP port the kernel picks), and
helpers to wait on conditions."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import leftovers

from snowfence import Client
from snowfence.errors import SnowfenceError


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
        prefix: tuple = (),
        bind: str | None = None,
        quick: bool = True,
    ) -> None:
        self.name = name
        #: A command the node runs under (e.g. ``("taskset", "-c", "0")``).
        self.prefix = list(prefix)
        self.dir = tmp_path
        self.endpoint = f"ipc://{tmp_path}/{name}.sock"
        #: What the node binds: its endpoint, unless told otherwise (``tcp://127.0.0.1:0``:
        #: a port the kernel picks, known after :meth:`wait_bound`).
        self.bind = bind or self.endpoint
        # Embedded nodes of one test share a state directory unless told otherwise, as nodes of
        # one host serving one region must (a host refuses a second directory in a region:
        # store/home.py); an etcd-mode node's directory holds its own journal.
        etcd = "--etcd" in args
        self.state_dir = state_dir or (tmp_path / f"{name}-state" if etcd else tmp_path / "state")
        self.workers = workers
        self.args = list(args)
        if quick and not any(arg.split("=")[0] in TIMING_FLAGS for arg in self.args):
            self.args += QUICK_WINDOW
        self.env = {**os.environ, **(env or {})}
        self.log_path = tmp_path / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.pgid: int | None = None
        #: Every broker PID this node has had (it may be started again).
        self.pids: list[int] = []
        self.run_dir_bases = leftovers.node_run_dir_bases(self.state_dir, self.env)

    def start(self) -> Node:
        cmd = [
            *self.prefix,
            sys.executable,
            "-m",
            "snowfence",
            "serve",
            "--bind",
            self.bind,
            "--state-dir",
            str(self.state_dir),
            "--workers",
            str(self.workers),
            *self.args,
        ]
        if "--etcd" in self.args and "--max-clock-skew-ms" not in self.args:
            # Nodes on loopback share one host's clock: no skew to wait out (a test that
            # skews a node's clock on purpose does not count on the quarantine).
            cmd += ["--max-clock-skew-ms", "0"]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=self.env, start_new_session=True)
        log.close()
        self.pgid = self.proc.pid
        self.pids.append(self.proc.pid)
        leftovers.register_process(
            self.proc.pid, group=True, what=f"node {self.name}", run_dir_bases=self.run_dir_bases
        )
        return self

    def wait_bound(self, timeout_s: float = 20.0) -> str:
        """The endpoint the node says it serves on, which is its ``endpoint`` from now on."""
        pattern = re.compile(r"snowfence serving on (\S+)")
        found = wait_for(lambda: pattern.search(self.log()), timeout_s, what=f"{self.name} to bind")
        self.endpoint = found.group(1)
        return self.endpoint

    @property
    def pid(self) -> int:
        return self.proc.pid

    def client(self, **kw) -> Client:
        kw.setdefault("timeout_s", 2.0)
        kw.setdefault("discover", False)  # a test that asks this node means this node
        return Client(self.endpoint, **kw)

    def status(self) -> dict:
        with Client(self.endpoint, timeout_s=1.0, retries=0, discover=False) as c:
            return c.status()

    def all_worker_ids(self) -> set[int]:
        """The worker IDs its workers and its broker (its own, for small requests) hold."""
        status = self.status()
        own = status["broker"].get("own_worker_id") or {}
        return {w["worker_id"] for w in status["workers"] if w.get("worker_id") is not None} | {
            h["worker_id"] for h in own.get("held", [])
        }

    def ready_workers(self) -> list[dict]:
        return [w for w in self.status()["workers"] if w.get("in_rotation")]

    def wait_ready(self, count: int | None = None, timeout_s: float = 20.0) -> list[dict]:
        """Until ``count`` workers are in rotation and the broker's own worker ID has
        settled (see :func:`own_settled`): what a test then reads of the node holds still."""
        count = self.workers if count is None else count

        def ready() -> list[dict] | None:
            status = self.status()
            workers = [w for w in status["workers"] if w.get("in_rotation")]
            return workers if len(workers) >= count and own_settled(status) else None

        return wait_for(ready, timeout_s, what=f"{count} ready workers on {self.name}; log:\n{self.log_tail()}")

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

    def close(self, timeout_s: float = 10.0) -> bool:
        """Kill the node, wait for its group to be gone, and remove the run directories its
        killed brokers left, as its next start would. False if the group outlived ``timeout_s``."""
        self.kill()
        deadline = time.monotonic() + timeout_s
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        gone = not self.group_alive()
        if not gone:
            os.killpg(self.pgid, signal.SIGKILL)
        for pid in self.pids:  # each broker led its own group
            leftovers.reap_group(pid)
            leftovers.remove_stale_run_dirs(pid, self.run_dir_bases)
        return gone

    def group_alive(self) -> bool:
        if self.pgid is None:
            return False
        return leftovers.group_alive(self.pgid)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


#: The reservation window of a test's node unless the test names its own timing (or passes
#: ``quick=False`` to run on the defaults): 2.5 s instead of 5 s, renewed every 0.5 s instead
#: of 2. A new store waits out its window bound before its first ID, and nearly every test
#: starts on a new store; on the defaults each would wait 5 s of its run for nothing it
#: checks. A renewal may come 2 s late before the reservation runs out (1 s was too little
#: on a loaded machine: clients saw reservation_expired). The rules between the settings
#: (renew < window, max_ahead_ms < window) hold.
QUICK_WINDOW = ("--keepalive-interval-s", "0.5", "--reservation-window-s", "2.5", "--max-reservation-window-s", "2.5")
#: Flags that make a test's timing its own: with any of them, the node gets no QUICK_WINDOW.
TIMING_FLAGS = {
    "--config",
    "--keepalive-interval-s",
    "--reservation-window-s",
    "--max-reservation-window-s",
    "--fence-after-s",
    "--lease-ttl-s",
    "--max-ahead-ms",
}

#: Lease timing scaled down 2.5x from the defaults, so tests see leases lapse and
#: worker IDs change hands in seconds; the relations between the settings (renew
#: < fence < TTL, window > renew) are the defaults'.
FAST_LEASES = (
    "--lease-ttl-s",
    "4",
    "--keepalive-interval-s",
    "0.8",
    "--fence-after-s",
    "2",
    "--reservation-window-s",
    "2",
    "--max-reservation-window-s",
    "2",
    "--etcd-timeout-s",
    "0.4",
)


def etcd_args(cluster, name: str = "test", *extra) -> tuple:
    return ("--etcd", ",".join(cluster.endpoints), "--cluster", name, *extra)


#: The load-generating client process (``loadgen.py``): reserves ``total`` IDs, records every block.
LOADGEN = Path(__file__).resolve().parent / "loadgen.py"


def loadgen(endpoint: str, total: int, out, seed: int, deadline_s: float = 60.0) -> subprocess.Popen:
    """Start one loadgen client against ``endpoint``; its blocks go to ``out``."""
    return subprocess.Popen(
        [sys.executable, str(LOADGEN), endpoint, str(total), str(out), str(seed), str(deadline_s)],
        stdout=subprocess.PIPE,
        text=True,
    )


def own_settled(status: dict) -> bool:
    """Whether the broker's own worker ID (for small requests) has settled in a STATUS:
    off, held, or left to workers (its last count found no worker ID to spare). It claims
    one shortly after the node's workers hold theirs, and STATUS shows it a little later."""
    broker = status["broker"]
    if not broker.get("mints_up_to"):
        return True
    own = broker.get("own_worker_id")
    if own is None:
        return False
    unheld = own.get("region_unheld")
    return bool(own.get("held")) or own.get("state") == "stopping" or (unheld is not None and unheld <= 1)


#: A node whose every request goes to a worker (two hops), said explicitly: for tests of
#: what a worker's minter does with each request, whatever the default of
#: ``--broker-mint-max-ids`` (with it on, the broker's own worker ID answers small ones).
TWO_HOPS = ("--broker-mint-max-ids", "0")
