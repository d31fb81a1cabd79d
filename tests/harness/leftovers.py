"""The test run leaves nothing behind: a pytest plugin that fails the run if it does.

At the end of the session it looks for what this run started and is still there:

- processes: descendants of the pytest process (which is made a child subreaper,
  so orphans stay its descendants), members of the process groups the harness
  started (nodes and etcd members run in sessions of their own), and their
  descendants;
- TCP sockets listening, held by those processes or opened by pytest itself;
- run directories of the nodes the harness started (by their owner's PID and
  start time);
- etcd data directories the harness created;
- mounts that appeared under this run's temp dir or where the harness mounted.

Only what this run started counts: other test runs may share the machine. The
harness records what it starts in a registry file (``register_*``); the file's
path is in the environment, so processes the tests start can add to it.
Leftovers get a grace period to exit, then the run fails with a list of them,
and they are cleaned up so the next run starts clean.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import orjson
import pytest

REGISTRY_ENV = "LEFTOVERS_REGISTRY"
#: How long leftovers get to go away on their own before they count (seconds; env LEFTOVERS_GRACE_S).
GRACE_S = 5.0
GRACE_ENV = "LEFTOVERS_GRACE_S"
PR_SET_CHILD_SUBREAPER = 36
TCP_LISTEN = "0A"


# -- the registry (used by the harness) ---------------------------------------------------------


def _record(entry: dict) -> None:
    path = os.environ.get(REGISTRY_ENV)
    if not path:
        return  # not under pytest with this plugin: nothing to record
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, orjson.dumps(entry) + b"\n")
    finally:
        os.close(fd)


def register_process(pid: int, *, group: bool = False, what: str = "", run_dir_bases: list[str] | None = None):
    """A process the harness started; ``group``: it leads a process group of its own;
    ``run_dir_bases``: where a node's run directory may be."""
    _record(
        {
            "kind": "process",
            "pid": pid,
            "ticks": _start_ticks(pid),
            "group": group,
            "what": what,
            "run_dir_bases": run_dir_bases or [],
        }
    )


def register_dir(path, what: str) -> None:
    """A directory that must be gone by the end of the run (an etcd data directory)."""
    _record({"kind": "dir", "path": str(path), "what": what})


def register_mount(path) -> None:
    """A mount point the harness mounted."""
    _record({"kind": "mount", "path": str(path)})


def node_run_dir_bases(state_dir, env: dict) -> list[str]:
    """Every place the run directory of a node with this state dir and environment may be."""
    from snowfence.broker import rundir

    return [base for base, _ in rundir.candidates(str(state_dir), env)]


def remove_stale_run_dirs(pid: int, bases: list[str]) -> None:
    """Remove the run directory a killed node ``pid`` left, as its next start would."""
    from snowfence.broker import rundir

    for base in bases:
        path = os.path.join(base, f"{rundir.PREFIX}{pid}")
        if rundir.stale(path) is not None:
            shutil.rmtree(path, ignore_errors=True)


def reap_group(pgid: int) -> None:
    """Collect the exited members of a killed process group that were handed to this process
    (as subreaper) when their parent died; the group's leader is left to its ``Popen``."""
    me = os.getpid()
    for info in _processes().values():
        if info["ppid"] == me and info["pgid"] == pgid and info["pid"] != pgid and info["state"] == "Z":
            try:
                os.waitpid(info["pid"], os.WNOHANG)
            except ChildProcessError:
                pass


def group_alive(pgid: int) -> bool:
    """True while a member of process group ``pgid`` is running (a zombie is not)."""
    return any(info["pgid"] == pgid and info["state"] != "Z" for info in _processes().values())


def _read_registry(path: str) -> list[dict]:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    return [orjson.loads(line) for line in data.splitlines() if line.strip()]


# -- the process table ---------------------------------------------------------------------------


def _start_ticks(pid: int) -> int | None:
    info = _stat(pid)
    return info["ticks"] if info else None


def _stat(pid: int) -> dict | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return {
            "pid": pid,
            "state": fields[0].decode(),
            "ppid": int(fields[1]),
            "pgid": int(fields[2]),
            "ticks": int(fields[19]),
        }
    except (OSError, IndexError, ValueError):  # gone while we looked
        return None


def _processes() -> dict[int, dict]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _stat(int(entry))
            if info is not None:
                out[info["pid"]] = info
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def _listening() -> dict[int, str]:
    """inode -> local address of every listening TCP socket of this network namespace."""
    out = {}
    for name, v6 in (("tcp", False), ("tcp6", True)):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != TCP_LISTEN:
                continue
            addr, port = fields[1].split(":")
            out[int(fields[9])] = f"{_address(addr, v6)}:{int(port, 16)}"
    return out


def _address(hexaddr: str, v6: bool) -> str:
    import ipaddress

    raw = bytes.fromhex(hexaddr)
    # /proc/net/tcp prints each 32-bit word in host (little-endian) order.
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.IPv6Address(raw) if v6 else ipaddress.IPv4Address(raw))


def _mounts() -> dict[str, str]:
    """mount id -> mount point."""
    out = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        out[fields[0]] = fields[4].encode().decode("unicode_escape")
    return out


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


# -- the check ----------------------------------------------------------------------------------


class Check:
    def __init__(self, config=None) -> None:
        self.me = os.getpid()
        self.config = config
        fd, self.registry = tempfile.mkstemp(prefix="leftovers-", suffix=".jsonl")
        os.close(fd)
        self.previous_env = os.environ.get(REGISTRY_ENV)
        os.environ[REGISTRY_ENV] = self.registry
        self.mounts_before = _mounts()
        self.my_sockets_before = _socket_inodes(self.me)
        self.subreaper = _become_subreaper()

    def close(self) -> None:
        if self.previous_env is None:
            os.environ.pop(REGISTRY_ENV, None)
        else:
            os.environ[REGISTRY_ENV] = self.previous_env
        try:
            os.unlink(self.registry)
        except FileNotFoundError:
            pass

    def leftovers(self) -> list[tuple[str, object]]:
        """(description, what to clean up) of everything of this run still there."""
        entries = _read_registry(self.registry)
        procs = _processes()
        children: dict[int, list[int]] = {}
        for info in procs.values():
            children.setdefault(info["ppid"], []).append(info["pid"])
        started = [e for e in entries if e["kind"] == "process"]
        # Roots: this process, and every registered process that is still the one registered.
        roots = {self.me}
        roots |= {e["pid"] for e in started if procs.get(e["pid"], {}).get("ticks") == e["ticks"]}
        ours: dict[int, str] = {pid: "started by the test harness" for pid in roots - {self.me}}
        stack = list(roots)
        while stack:
            pid = stack.pop()
            for child in children.get(pid, []):
                if child not in ours:
                    ours[child] = "started by the tests"
                    stack.append(child)
        for e in started:
            if not e["group"] or e["ticks"] is None:
                continue
            leader_alive = e["pid"] in roots
            if not leader_alive and self.subreaper:
                continue  # its orphans were handed to us: they are descendants already
            for info in procs.values():
                # Members of a harness-made group. Once the leader is gone its PID may be
                # reused, and a group of that id is ours only if it started after ours did.
                if info["pgid"] == e["pid"] and info["ticks"] >= e["ticks"]:
                    ours.setdefault(info["pid"], f"in the process group of {e['what'] or e['pid']}")
        for pid in list(ours):
            if pid == self.me or procs[pid]["state"] in ("Z", "X"):
                del ours[pid]
        found: list[tuple[str, object]] = []
        for pid, why in sorted(ours.items()):
            found.append((f"process {pid} ({why}): {_cmdline(pid)}", ("process", pid)))
        listening = _listening()
        holders = {self.me: _socket_inodes(self.me) - self.my_sockets_before}
        holders.update((pid, _socket_inodes(pid)) for pid in ours)
        for pid, inodes in holders.items():
            for inode in sorted(inodes & listening.keys()):
                who = "the pytest process" if pid == self.me else f"process {pid}"
                found.append((f"listening socket {listening[inode]} held by {who}", ("socket", pid)))
        for e in started:
            for base in e["run_dir_bases"]:
                path = os.path.join(base, f"snowfence-{e['pid']}")
                if _run_dir_of(path, e["pid"], e["ticks"]):
                    found.append((f"run directory {path} of node pid {e['pid']}", ("dir", path)))
        for e in entries:
            if e["kind"] == "dir" and os.path.lexists(e["path"]):
                found.append((f"{e['what']} {e['path']}", ("dir", e["path"])))
        roots_of_mounts = [e["path"] for e in entries if e["kind"] == "mount"]
        # This run's temp dir, if it made one (pytest makes it when a test first asks).
        basetemp = getattr(getattr(self.config, "_tmp_path_factory", None), "_basetemp", None)
        if basetemp is not None:
            roots_of_mounts.append(str(basetemp))
        for mid, point in sorted(_mounts().items()):
            if mid not in self.mounts_before and _under(point, roots_of_mounts):
                found.append((f"mount on {point}", ("mount", point)))
        return found

    def wait(self, grace_s: float | None = None) -> list[tuple[str, object]]:
        """The leftovers still there after up to ``grace_s`` of waiting for them to go."""
        if grace_s is None:
            grace_s = float(os.environ.get(GRACE_ENV) or GRACE_S)
        deadline = time.monotonic() + grace_s
        while True:
            self.reap()
            found = self.leftovers()
            if not found or time.monotonic() >= deadline:
                return found
            time.sleep(0.05)

    def reap(self) -> None:
        """Collect exited children (orphans handed to us as subreaper become our zombies)."""
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def clean(self, found: list[tuple[str, object]]) -> None:
        for _, (kind, target) in found:
            if kind == "process":
                try:
                    os.kill(target, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            elif kind == "mount":
                os.system(f"umount -l '{target}' 2>/dev/null")
        for _, (kind, target) in found:
            if kind == "dir":
                shutil.rmtree(target, ignore_errors=True)
        time.sleep(0.1)
        self.reap()


def _run_dir_of(path: str, pid: int, ticks: int | None) -> bool:
    try:
        owner = orjson.loads(Path(path, "owner").read_bytes())
    except (OSError, ValueError):
        return os.path.isdir(path)
    return owner.get("pid") == pid and (ticks is None or owner.get("start_ticks") == ticks)


def _become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# -- the pytest hooks ----------------------------------------------------------------------------

_check: Check | None = None
_found: list[tuple[str, object]] = []


def _xdist_controller(config) -> bool:
    """Whether this process hands the tests to pytest-xdist workers and runs none itself:
    each worker then checks what its own tests started, and reports it here."""
    return getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput")


def pytest_sessionstart(session) -> None:
    global _check
    if not _xdist_controller(session.config):
        _check = Check(session.config)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """An xdist worker finished: what its check found (see pytest_sessionfinish)."""
    _found.extend((what, None) for what in getattr(node, "workeroutput", {}).get("leftovers", ()))


@pytest.hookimpl(tryfirst=True)  # before pytest removes the temp dirs of a passing run
def pytest_sessionfinish(session, exitstatus) -> None:
    global _check
    if _check is None:
        if _found and session.exitstatus == pytest.ExitCode.OK:  # the workers' findings
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return
    try:
        _found[:] = _check.wait()
        if _found:
            _check.clean(_found)
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if hasattr(session.config, "workeroutput"):  # an xdist worker: sent to the controller
            session.config.workeroutput["leftovers"] = [what for what, _ in _found]
    finally:
        _check.close()
        _check = None
    if _found and session.config.pluginmanager.get_plugin("terminalreporter") is None:
        print(_report(), flush=True)


def pytest_terminal_summary(terminalreporter) -> None:
    if _found:
        terminalreporter.write_sep("=", "the test run left things behind", red=True, bold=True)
        terminalreporter.write_line(_report())


def _report() -> str:
    lines = [f"{len(_found)} leftover(s) outlived the test run (now cleaned up):"]
    lines += [f"  {what}" for what, _ in _found]
    return "\n".join(lines)
