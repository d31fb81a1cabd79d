"""The suite's leftovers check (tests/harness/leftovers.py) fails a run that leaves things behind,
and passes one whose processes are only slow to exit."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from leftovers import GRACE_ENV

HARNESS = Path(__file__).resolve().parent / "harness"

LEAKY = r"""
import os, shutil, socket, subprocess, sys, time
from pathlib import Path

import leftovers

OUT = Path(__file__).parent / "leaked"
OUT.mkdir(exist_ok=True)
SOCKETS = []


def note(name, value):
    (OUT / name).write_text(str(value))


def test_a_child_left_running():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    note("child", p.pid)


def test_a_group_whose_leader_exited():
    # The leader exits at once; its child lives on in the group (and is reparented).
    p = subprocess.Popen(
        ["sh", "-c", "sleep 120 & echo $! > " + str(OUT / "orphan")], start_new_session=True
    )
    leftovers.register_process(p.pid, group=True, what="a test group")
    p.wait(10)


def test_a_listening_socket():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    SOCKETS.append(s)
    note("port", s.getsockname()[1])


def test_a_dead_nodes_run_directory(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    leftovers.register_process(p.pid, what="a node", run_dir_bases=[str(tmp_path)])
    ticks = int(Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    p.wait(10)
    d = tmp_path / f"snowfence-{p.pid}"
    d.mkdir()
    (d / "owner").write_text('{"pid": %d, "start_ticks": %d}' % (p.pid, ticks))
    note("rundir", d)


def test_an_etcd_data_directory(tmp_path):
    leftovers.register_dir(tmp_path / "m0", "etcd data directory")
    (tmp_path / "m0").mkdir()
    note("etcd", tmp_path / "m0")


def test_a_mount(tmp_path):
    # Needs root and the right to mount (not granted in every container).
    (tmp_path / "mnt").mkdir()
    mount = shutil.which("mount")
    cmd = [mount, "-t", "tmpfs", "none", str(tmp_path / "mnt")]
    if mount and subprocess.run(cmd, capture_output=True).returncode == 0:
        note("mount", tmp_path / "mnt")
"""

TIDY = r"""
import subprocess, sys


def test_a_child_that_exits_soon_after_the_run():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])


def test_nothing_at_all():
    pass
"""


@pytest.fixture
def inner(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(HARNESS))
    monkeypatch.setenv(GRACE_ENV, "1.5")

    def run(source: str, *args: str):
        pytester.makepyfile(test_inner=source)
        return pytester.runpytest_subprocess("-p", "leftovers", "-q", "-p", "no:cacheprovider", *args, timeout=120)

    return run


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def mounted(point: str) -> bool:
    return any(line.split()[4] == point for line in Path("/proc/self/mountinfo").read_text().splitlines())


@pytest.fixture
def unmount_after(pytester):
    """Should the check under test fail to unmount the inner run's mount, do it here."""
    yield
    marker = pytester.path / "leaked" / "mount"
    if marker.exists() and mounted(marker.read_text()):
        subprocess.run(["umount", "-l", marker.read_text()], check=False)


#: The suite runs in two processes at once (pytest-xdist), as CI runs it, and in one.
IN_PARALLEL = [pytest.param((), id="serial"), pytest.param(("-n", "2"), id="xdist")]


@pytest.mark.parametrize("args", IN_PARALLEL)
def test_a_run_that_leaves_things_behind_fails_and_names_each_of_them(inner, pytester, unmount_after, args):
    result = inner(LEAKY, *args)
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    result.assert_outcomes(passed=6)
    leaked = {p.name: p.read_text() for p in (pytester.path / "leaked").iterdir()}
    child, orphan = int(leaked["child"]), int(leaked["orphan"])
    assert re.search(rf"process {child} \(.*\): .*time.sleep\(120\)", out), out
    assert re.search(rf"process {orphan} \(.*\): sleep 120", out), out
    assert f"listening socket 127.0.0.1:{leaked['port']} held by the pytest process" in out, out
    # Under xdist each worker checks what its own tests started; the run reports it.
    assert f"run directory {leaked['rundir']} of node pid" in out, out
    assert f"etcd data directory {leaked['etcd']}" in out, out
    if "mount" in leaked:
        assert f"mount on {leaked['mount']}" in out, out
    # ... and cleaned up, so the next run starts clean.
    assert not alive(child) and not alive(orphan)
    assert not Path(leaked["rundir"]).exists() and not Path(leaked["etcd"]).exists()
    if "mount" in leaked:
        assert not mounted(leaked["mount"])


@pytest.mark.parametrize("args", IN_PARALLEL)
def test_a_run_whose_processes_exit_within_the_grace_period_passes(inner, args):
    result = inner(TIDY, *args)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.assert_outcomes(passed=2)
    assert "left things behind" not in result.stdout.str()


def test_a_process_group_is_alive_while_a_member_runs_not_once_only_zombies_are_left():
    import os
    import signal
    import time

    from leftovers import group_alive, reap_group

    # The leader exits at once, leaving its child running in the group (reparented).
    leader = subprocess.Popen(["sh", "-c", "sleep 30 & echo $!"], stdout=subprocess.PIPE, start_new_session=True)
    child = int(leader.stdout.readline())
    leader.stdout.close()
    try:
        leader.wait(5)
        assert group_alive(leader.pid)  # its leader is gone, its child is not
        os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while group_alive(leader.pid):  # the child may stay a zombie until its new parent reaps it
            assert time.monotonic() < deadline, "a killed group still counts as alive"
            time.sleep(0.02)
    finally:
        try:
            os.killpg(leader.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        reap_group(leader.pid)  # this process is the subreaper the child was handed to
    assert not group_alive(os.getpid() + 10**9)  # no such group
