"""Run directories of real nodes: a killed node's is reclaimed by the next start, and
one owned by another user is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import pytest
from leftovers import group_alive
from nodes import wait_for

from snowfence.broker import rundir

#: Nodes of these tests keep their run directory in the state dir, whatever this machine's environment.
NO_RUNTIME_ENV = {"XDG_RUNTIME_DIR": "", "RUNTIME_DIRECTORY": ""}


@pytest.fixture
def short_dir():
    """A directory with a path short enough for ``<state>/run/snowfence-<pid>/backend``."""
    path = tempfile.mkdtemp(prefix="sf-rd-")
    yield Path(path)
    subprocess.run(["rm", "-rf", path], check=True)


def run_dirs(base: Path) -> list[Path]:
    return sorted(p for p in base.iterdir() if p.name.startswith(rundir.PREFIX)) if base.is_dir() else []


def owner(path: Path) -> dict:
    return orjson.loads((path / rundir.OWNER_FILE).read_bytes())


def test_a_node_killed_with_sigkill_leaves_one_run_directory_after_its_restart(nodes, short_dir):
    state = short_dir / "state"
    base = state / "run"
    first = nodes.start("first", workers=1, state_dir=state, env=NO_RUNTIME_ENV)
    first.wait_ready()
    [killed] = run_dirs(base)
    assert killed.name == f"snowfence-{first.pid}" and owner(killed)["pid"] == first.pid
    assert owner(killed)["start_ticks"] == rundir.start_ticks(first.pid)
    os.killpg(first.pgid, signal.SIGKILL)
    first.proc.wait(10)
    wait_for(lambda: not group_alive(first.pgid), 10, what="the killed node's workers to exit")
    assert run_dirs(base) == [killed], "SIGKILL leaves the run directory behind"
    # A directory naming a live process that is not its owner (the PID was reused).
    me = rundir.start_ticks(os.getpid())
    reused = base / "snowfence-4000000"
    reused.mkdir(mode=0o700)
    (reused / rundir.OWNER_FILE).write_bytes(orjson.dumps({"pid": os.getpid(), "start_ticks": me - 1}))

    again = nodes.start("again", workers=1, state_dir=state, env=NO_RUNTIME_ENV, args=("--log-format", "json"))
    again.wait_ready()
    [kept] = run_dirs(base)
    assert kept.name == f"snowfence-{again.pid}" and owner(kept)["pid"] == again.pid
    reclaimed = {e["path"] for e in events(again.log()) if e["event"] == "run_dir_reclaimed"}
    assert reclaimed == {str(killed), str(reused)}

    # Several nodes may share a state directory: starting one never touches a live one's.
    third = nodes.start("third", workers=1, state_dir=state, env=NO_RUNTIME_ENV)
    third.wait_ready()
    assert run_dirs(base) == sorted([kept, base / f"snowfence-{third.pid}"])
    again.wait_ready()
    assert third.stop() == 0 and again.stop() == 0
    assert run_dirs(base) == [], "a clean stop removes the node's run directory"


def events(log_text: str) -> list[dict]:
    out = []
    for line in log_text.splitlines():
        if line.startswith("{"):
            out.append(orjson.loads(line))
    return out


def test_a_run_directory_base_owned_by_another_user_is_refused_with_a_config_error(short_dir):
    if os.geteuid() == 0:
        theirs = short_dir / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
    else:
        theirs = Path("/")  # root's, so another user's
    before = sorted(os.listdir(theirs))
    env = {**os.environ, "RUNTIME_DIRECTORY": str(theirs)}
    cmd = [sys.executable, "-m", "snowfence", "serve", "--state-dir", str(short_dir / "state"), "--workers", "1"]
    bind = ["--bind", f"ipc://{short_dir}/n.sock"]
    p = subprocess.run([*cmd, *bind], capture_output=True, text=True, timeout=30, env=env)
    config_error = subprocess.run([*cmd, "--bind", "nonsense"], capture_output=True, text=True, timeout=30, env=env)
    assert config_error.returncode not in (0, 1)
    assert p.returncode == config_error.returncode, (p.returncode, p.stderr)
    assert p.stderr.strip().count("\n") == 0 and "Traceback" not in p.stderr
    assert f"{theirs} belongs to uid" in p.stderr and "refusing" in p.stderr
    assert sorted(os.listdir(theirs)) == before, "nothing was made in another user's directory"
