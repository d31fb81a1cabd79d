"""Real etcd members on loopback for tests: one member or a cluster, in temp dirs.

The binary is ``SNOWFENCE_ETCD_BIN`` if set, else the first ``etcd`` on PATH or in
/usr/bin (Debian's ``etcd-server``, 3.4) of a release the project calls safe; etcdctl
(Debian's ``etcd-client``) is ``SNOWFENCE_ETCDCTL_BIN``, else the one beside that etcd,
else the first on PATH. A release the project warns about (3.5.0 to 3.5.4, etcd issue
14110: see ``snowfence.broker.preflight.etcd_version_problem``) is refused with the
reason, wherever it was found: the suite must not test on an etcd it tells users to
upgrade. No etcd at all is an error too, never a skip.
Ports are picked at random and the whole start is retried if a port turns out
to be taken: no "find a free port, then bind" race. Members are stopped by PID.
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import leftovers
import orjson

SYSTEM_DIRS = ("/usr/bin",)


class EtcdMissing(RuntimeError):
    """No etcd binary the suite may use: none found, or only releases it refuses."""


def _version(binary: str) -> str:
    """The release ``binary --version`` names ("etcd Version: 3.4.23"), or "" if it names none."""
    try:
        p = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EtcdMissing(f"{binary} --version failed: {exc}") from None
    for line in p.stdout.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "etcd version":
            return value.strip()
    return ""


def _refusal(binary: str) -> str | None:
    """Why the suite will not run on ``binary``; None if it will."""
    from snowfence.broker.preflight import etcd_version_problem

    version = _version(binary)
    if not version:
        return f"{binary} does not say which etcd release it is (--version)"
    problem = etcd_version_problem(version)
    return f"{binary}: {problem}" if problem else None


HOW = (
    "install Debian's etcd 3.4 (apt-get install etcd-server etcd-client; .ci/run does), or put an etcd "
    "of 3.4, or 3.5.5 or later, on PATH, or name one with SNOWFENCE_ETCD_BIN"
)


def find_etcd(environ: dict | None = None, system_dirs: tuple[str, ...] = SYSTEM_DIRS) -> str:
    """The etcd server binary the suite runs (see the module's docstring); EtcdMissing if none."""
    environ = os.environ if environ is None else environ
    named = environ.get("SNOWFENCE_ETCD_BIN")
    if named:
        candidates = [named]
    else:
        candidates = []
        for directory in [*environ.get("PATH", "").split(os.pathsep), *system_dirs]:
            path = shutil.which("etcd", path=directory) if directory else None
            if path and os.path.realpath(path) not in map(os.path.realpath, candidates):
                candidates.append(path)
    if not candidates:
        where = f"on PATH or in {', '.join(system_dirs)}" if system_dirs else "on PATH"
        raise EtcdMissing(f"no etcd binary {where}: {HOW}")
    refusals = []
    for path in candidates:
        refusal = _refusal(path)
        if refusal is None:
            return path
        refusals.append(refusal)
    raise EtcdMissing(f"refusing to test on the etcd found: {'; '.join(refusals)}; {HOW}")


def find_tool(name: str, etcd: str, environ: dict | None = None, *, on_path: bool = True) -> str | None:
    """etcdctl or etcdutl (3.5 and later): ``SNOWFENCE_<NAME>_BIN``, else the one beside ``etcd``,
    else (``on_path``) the first on PATH; None if there is none."""
    environ = os.environ if environ is None else environ
    named = environ.get(f"SNOWFENCE_{name.upper()}_BIN")
    if named:
        return named
    beside = Path(etcd).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name, path=environ.get("PATH")) if on_path else None


@functools.cache
def binaries() -> tuple[str, str]:
    """(etcd, etcdctl), found once per test process."""
    etcd = find_etcd()
    etcdctl = find_tool("etcdctl", etcd)
    if etcdctl is None:
        raise EtcdMissing(f"no etcdctl beside {etcd} or on PATH: {HOW}")
    return etcd, etcdctl


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
        self.etcd, self.etcdctl = binaries()
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

    def restore_snapshot(self, snapshot: Path, m: Member | None = None) -> None:
        """Stop member ``m`` (the first), replace its data with ``snapshot`` and start it again:
        ``etcdutl snapshot restore`` where there is one (3.5 and later), else ``etcdctl snapshot
        restore`` (3.4, where etcdutl does not exist yet). Only an etcdutl of the same release
        as the member, beside its etcd, will do: the data it writes is that release's."""
        m = m or self.members[0]
        m.stop()
        shutil.rmtree(m.data_dir, ignore_errors=True)
        etcdutl = find_tool("etcdutl", self.etcd, on_path=False)
        tool = [etcdutl] if etcdutl else [self.etcdctl]
        p = subprocess.run(
            [
                *tool,
                "snapshot",
                "restore",
                str(snapshot),
                "--data-dir",
                str(m.data_dir),
                "--name",
                m.name,
                "--initial-cluster",
                self.initial_cluster(),
                "--initial-cluster-token",
                self.token,
                "--initial-advertise-peer-urls",
                m.peer_url,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "ETCDCTL_API": "3"},
        )
        assert p.returncode == 0, p.stderr
        m.start()
        assert self.wait_healthy(), f"etcd did not come back from the snapshot; see {m.log_path}"

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
