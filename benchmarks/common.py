"""Shared pieces of the benchmark scripts: start servers, run `snowfence bench`,
account CPU per process tree, take medians."""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
TICKS = os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """All descendants of ``pid``."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        for k in map(int, kids):
            out.append(k)
            todo.append(k)
    return out


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def wait_ready(endpoint: str, workers: int, timeout_s: float = 30.0) -> None:
    from snowfence import Client
    from snowfence.errors import SnowfenceError

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with Client(endpoint, timeout_s=1.0, retries=0) as c:
                status = c.status()
            if sum(1 for w in status["workers"] if w.get("in_rotation")) >= workers:
                return
        except SnowfenceError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{endpoint} not ready")


def own_region(index: int, args) -> list[str]:
    """``--region`` for the ``index``-th of servers started side by side on state directories
    of their own (a host serves a region from one state directory), unless ``args`` name one."""
    return [] if "--region" in args else ["--region", str(index % 8)]


class Server:
    """A server process group: ``snowfence serve`` or the relay."""

    def __init__(self, name: str, cmd: list[str], endpoint: str, log: Path) -> None:
        self.name, self.cmd, self.endpoint = name, cmd, endpoint
        self.log = open(log, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, start_new_session=True)

    def pids(self) -> list[int]:
        return [self.proc.pid, *children(self.proc.pid)]

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.log.close()


@contextmanager
def servers(specs: dict[str, dict]):
    """Start named servers: {"name": {"kind": "snowfence"|"relay", "workers": n, "args": [...]}}."""
    root = Path(tempfile.mkdtemp(prefix="sfbench-"))
    started: dict[str, Server] = {}
    done = False
    try:
        for index, (name, spec) in enumerate(specs.items()):
            endpoint = f"ipc://{root}/{name}.sock"
            if spec["kind"] == "relay":
                cmd = [sys.executable, str(HERE / "relay.py"), "--bind", endpoint, "--workers", str(spec["workers"])]
            else:
                cmd = [
                    sys.executable,
                    "-m",
                    "snowfence",
                    "serve",
                    "--bind",
                    endpoint,
                    "--workers",
                    str(spec["workers"]),
                    "--state-dir",
                    str(root / f"{name}-state"),
                    *spec.get("args", []),
                    *own_region(index, spec.get("args", [])),
                ]
            started[name] = Server(name, cmd, endpoint, root / f"{name}.log")
        for name, spec in specs.items():
            wait_ready(started[name].endpoint, spec.get("ready", spec["workers"]))
        yield started
        done = True
    finally:
        for s in started.values():
            try:
                s.stop()
            except Exception as exc:  # stop the others all the same
                print(f"could not stop {s.name}: {exc!r}", file=sys.stderr)
                done = False
        if done:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"the servers' logs and state directories are kept in {root}", file=sys.stderr)


def bench(server: Server, *args: str) -> dict:
    """Run `snowfence bench --json` against a server; add CPU us per request by component."""
    cmd = [sys.executable, "-m", "snowfence", "bench", "--connect", server.endpoint, "--json", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    time.sleep(1.5)  # clients started and warmed up
    server_pids, client_pids = server.pids(), children(proc.pid)
    s0, c0, t0 = cpu_seconds(server_pids), cpu_seconds(client_pids), time.monotonic()
    time.sleep(2.0)
    s1, c1, t1 = cpu_seconds(server_pids), cpu_seconds(client_pids), time.monotonic()
    out, _ = proc.communicate(timeout=300)
    res = json.loads(out)
    rate = res["requests_per_s"] or 1
    res["cpu"] = {
        "server_cores": (s1 - s0) / (t1 - t0),
        "clients_cores": (c1 - c0) / (t1 - t0),
        "server_us_per_request": (s1 - s0) / (t1 - t0) / rate * 1e6,
    }
    return res


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else 0.0
