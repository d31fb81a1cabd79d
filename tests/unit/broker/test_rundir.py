"""The run directory: where it goes, who owns it, and which stale ones are reclaimed."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import pytest

from snowfence.broker import rundir

NOBODY = 65534


@pytest.fixture
def short_tmp():
    """A temp dir with a short path (pytest's own are too deep for some of these tests)."""
    path = tempfile.mkdtemp(prefix="sf-rd-")
    yield Path(path)
    subprocess.run(["rm", "-rf", path], check=True)


@pytest.fixture
def sleeper():
    """A live process that is not this one, stopped at teardown."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p
    p.kill()
    p.wait(10)


def dead_pid() -> int:
    """The PID of a process that has exited and been reaped."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(10)
    return p.pid


def foreign_dir(path: Path) -> Path:
    """A directory owned by another user: made and given away as root, else one root owns."""
    if os.geteuid() == 0:
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, NOBODY, NOBODY)
        return path
    return Path("/")


def make_run_dir(base: Path, name_pid: int, owner: dict | bytes | None) -> Path:
    d = base / f"{rundir.PREFIX}{name_pid}"
    d.mkdir(mode=0o700)
    if owner is not None:
        (d / rundir.OWNER_FILE).write_bytes(owner if isinstance(owner, bytes) else orjson.dumps(owner))
    (d / "backend").write_bytes(b"")
    return d


# -- where ------------------------------------------------------------------------------------


def test_bases_are_tried_runtime_directory_then_xdg_then_state_dir_then_temp(short_tmp):
    env = {"RUNTIME_DIRECTORY": str(short_tmp / "rt"), "XDG_RUNTIME_DIR": str(short_tmp / "xdg")}
    state = short_tmp / "state"
    assert [b for b, _ in rundir.candidates(str(state), env)] == [
        str(short_tmp / "rt"),
        str(short_tmp / "xdg" / "snowfence"),
        str(state / "run"),
        tempfile.gettempdir(),
    ]
    (short_tmp / "rt").mkdir()
    assert rundir.base_dir(str(state), env) == str(short_tmp / "rt")
    del env["RUNTIME_DIRECTORY"]
    assert rundir.base_dir(str(state), env) == str(short_tmp / "xdg" / "snowfence")
    assert stat.S_IMODE(os.stat(short_tmp / "xdg" / "snowfence").st_mode) == 0o700
    assert rundir.base_dir(str(state), {}) == str(state / "run")
    assert stat.S_IMODE(os.stat(state / "run").st_mode) == 0o700


def test_a_state_dir_too_deep_for_a_socket_path_falls_back_to_the_temp_dir(short_tmp, monkeypatch):
    deep = short_tmp / ("d" * 60) / ("e" * 60)
    monkeypatch.setattr(tempfile, "tempdir", str(short_tmp))
    assert not rundir.fits(str(deep / "run"))
    assert rundir.base_dir(str(deep), {}) == str(short_tmp)
    path = rundir.create(str(deep), {})
    try:
        assert os.path.dirname(path) == str(short_tmp)
        assert len(os.fsencode(os.path.join(path, rundir.SOCKET_NAME))) <= rundir.MAX_SOCKET_PATH
    finally:
        rundir.remove(path)


def test_an_unwritable_base_is_skipped(short_tmp):
    blocker = short_tmp / "file"
    blocker.write_text("not a directory")
    env = {"XDG_RUNTIME_DIR": str(blocker)}  # $XDG_RUNTIME_DIR/snowfence cannot be made
    assert rundir.base_dir(str(short_tmp / "state"), env) == str(short_tmp / "state" / "run")


def test_no_base_short_enough_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", "/" + "t" * 120)
    with pytest.raises(rundir.RunDirError, match="too long"):
        rundir.base_dir("/" + "s" * 120, {})


# -- what it holds ----------------------------------------------------------------------------


def test_the_run_directory_is_private_and_names_its_owner_by_pid_and_start_time(short_tmp):
    old = os.umask(0)
    try:
        path = rundir.create(str(short_tmp / "state"), {})
    finally:
        os.umask(old)
    assert path == str(short_tmp / "state" / "run" / f"snowfence-{os.getpid()}")
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    owner = orjson.loads(Path(path, "owner").read_bytes())
    with open(f"/proc/{os.getpid()}/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    assert owner == {"pid": os.getpid(), "start_ticks": ticks}
    assert rundir.stale(path) is None, "a live owner's directory is not stale"
    rundir.remove(path)
    assert not os.path.exists(path)


# -- reclaiming -------------------------------------------------------------------------------


def test_reclaim_removes_exactly_the_directories_whose_owner_is_gone(short_tmp, sleeper):
    live_ticks = rundir.start_ticks(sleeper.pid)
    one_ticks = rundir.start_ticks(1)
    gone, gone2 = dead_pid(), dead_pid()
    stale = {
        make_run_dir(short_tmp, gone, {"pid": gone, "start_ticks": 1}),
        # The PID runs, but it is another process than the one that wrote the file:
        # an unrelated process, and a child of ours started later than the owner.
        make_run_dir(short_tmp, 424242, {"pid": 1, "start_ticks": one_ticks + 12345}),
        make_run_dir(short_tmp, 99999999, {"pid": sleeper.pid, "start_ticks": live_ticks - 1}),
        # An unreadable owner file: the PID in the name decides, and it is gone.
        make_run_dir(short_tmp, gone2, b"\xff not json"),
    }
    live = make_run_dir(short_tmp, sleeper.pid, {"pid": sleeper.pid, "start_ticks": live_ticks})
    unnamed_live = make_run_dir(short_tmp, 1, None)  # no owner file; PID 1 runs
    other = short_tmp / "snowfence-chaos-x"  # not a run directory
    other.mkdir()
    assert sorted(rundir.reclaim(str(short_tmp))) == sorted(map(str, stale))
    assert live.is_dir() and unnamed_live.is_dir() and other.is_dir()
    assert not any(d.exists() for d in stale)


def test_a_zombie_owner_is_gone(short_tmp):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.01)
        d = make_run_dir(short_tmp, p.pid, {"pid": p.pid, "start_ticks": 0})
        assert rundir.reclaim(str(short_tmp)) == [str(d)]
    finally:
        p.wait(10)


def test_a_directory_left_under_this_processes_pid_is_replaced(short_tmp):
    base = short_tmp / "state" / "run"
    base.mkdir(parents=True)
    old = make_run_dir(base, os.getpid(), None)
    (old / "leftover").write_text("x")
    path = rundir.create(str(short_tmp / "state"), {})
    try:
        assert path == str(old) and not (old / "leftover").exists()
        assert orjson.loads(Path(path, "owner").read_bytes())["pid"] == os.getpid()
    finally:
        rundir.remove(path)


# -- other users' directories -----------------------------------------------------------------


def test_a_base_owned_by_another_user_is_refused(short_tmp):
    base = foreign_dir(short_tmp / "foreign")
    with pytest.raises(rundir.RunDirError, match="belongs to uid"):
        rundir.create(str(short_tmp / "state"), {"RUNTIME_DIRECTORY": str(base)})


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_run_directory_owned_by_another_user_is_refused_and_left_alone(short_tmp):
    base = short_tmp / "state" / "run"
    base.mkdir(parents=True)
    theirs = foreign_dir(base / f"snowfence-{os.getpid()}")
    with pytest.raises(rundir.RunDirError, match="belongs to uid"):
        rundir.create(str(short_tmp / "state"), {})
    assert theirs.is_dir() and theirs.stat().st_uid == NOBODY
    gone = dead_pid()
    stale_theirs = foreign_dir(base / f"snowfence-{gone}")
    assert rundir.reclaim(str(base)) == [], "another user's directory is never reclaimed"
    assert stale_theirs.is_dir()
