"""The node's run directory: where the broker's backend socket lives.

Each node makes its own directory ``snowfence-<pid>`` under the first usable base:

1. systemd's ``RuntimeDirectory=`` (the ``RUNTIME_DIRECTORY`` variable);
2. ``$XDG_RUNTIME_DIR/snowfence``;
3. ``<state_dir>/run``;
4. the temp dir.

A base is skipped when the backend socket's path would not fit in a Unix
socket address (``sun_path``, 108 bytes with its NUL) or when it cannot be
created. The directory is mode 0700 and holds a file ``owner`` with the PID
and start time (clock ticks since boot, field 22 of ``/proc/<pid>/stat``) of
the broker that made it. At start a node removes every run directory of its
base whose owner is gone: no such process, a zombie, or a live process with
another start time (the PID was reused). A directory, or a base, owned by
another user is refused with a :class:`~snowfence.errors.ConfigError`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tempfile

import orjson

from ..errors import ConfigError
from ..logs import event

log = logging.getLogger("snowfence.broker")

PREFIX = "snowfence-"
OWNER_FILE = "owner"
SOCKET_NAME = "backend"
#: Bytes of a socket path that fit in sun_path (108 with the terminating NUL).
MAX_SOCKET_PATH = 107
#: Digits of the largest PID Linux hands out (pid_max is at most 2**22).
PID_DIGITS = 7
_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d+)(\.new)?$")


class RunDirError(ConfigError):
    """A run directory cannot be used safely."""

    code = "run_dir_error"


_PROC = os.path.isdir("/proc/self")


def start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot; None if it is gone, a zombie,
    or the system has no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        if fields[0] in (b"Z", b"X"):
            return None
        return int(fields[19])  # field 22; fields[0] is field 3 (the state)
    except (OSError, IndexError, ValueError):
        return None


def owner_alive(pid: int, ticks: int | None) -> bool:
    """True if ``pid`` runs and, when ``ticks`` is known, started at that time (the PID was not reused)."""
    if pid <= 0:
        return False
    if not _PROC:  # no start times to compare: the PID alone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    now = start_ticks(pid)
    if now is None:
        return False
    return ticks is None or now == ticks


def fits(base: str) -> bool:
    """True if a backend socket under a run directory of ``base`` fits in a Unix socket address."""
    longest = os.path.join(base, PREFIX + "9" * PID_DIGITS, SOCKET_NAME)
    return len(os.fsencode(longest)) <= MAX_SOCKET_PATH


def candidates(state_dir: str, environ=None) -> list[tuple[str, bool]]:
    """(base, private) in the order they are tried; ``private`` bases must belong to this user."""
    environ = os.environ if environ is None else environ
    out = []
    runtime = environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    if runtime:
        out.append((runtime, True))
    xdg = environ.get("XDG_RUNTIME_DIR", "")
    if xdg:
        out.append((os.path.join(xdg, "snowfence"), True))
    if state_dir:
        out.append((os.path.join(os.path.abspath(state_dir), "run"), True))
    out.append((tempfile.gettempdir(), False))
    return out


def _check_owner(path: str, st: os.stat_result, what: str) -> None:
    uid = os.geteuid()
    if st.st_uid != uid:
        raise RunDirError(f"{what} {path} belongs to uid {st.st_uid}, not to this user (uid {uid}); refusing it")


def base_dir(state_dir: str, environ=None) -> str:
    """The base this node's run directory goes under, created (mode 0700) if it is missing."""
    tried = []
    for base, private in candidates(state_dir, environ):
        if not fits(base):
            tried.append(f"{base} (path too long for a socket)")
            continue
        try:
            if private:
                os.makedirs(base, mode=0o700, exist_ok=True)
            st = os.stat(base)
        except OSError as exc:
            tried.append(f"{base} ({exc.strerror})")
            continue
        if not stat.S_ISDIR(st.st_mode):
            tried.append(f"{base} (not a directory)")
            continue
        if private:
            _check_owner(base, st, "run directory base")
        return base
    raise RunDirError("no usable place for the run directory: " + "; ".join(tried))


def _read_owner(path: str, name_pid: int) -> tuple[int, int | None]:
    """(pid, start ticks) of a run directory's owner; the PID in its name when the file is unreadable."""
    try:
        with open(os.path.join(path, OWNER_FILE), "rb") as f:
            data = orjson.loads(f.read())
        pid, ticks = data["pid"], data["start_ticks"]
        if type(pid) is int and (ticks is None or type(ticks) is int):
            return pid, ticks
    except (OSError, ValueError, TypeError, KeyError):
        pass
    return name_pid, None


def stale(path: str) -> tuple[int, int | None] | None:
    """The owner (pid, start ticks) of the run directory ``path`` if that owner is gone, else None.

    Only directories of this user are judged; anything else is never stale.
    """
    m = _NAME.match(os.path.basename(path))
    if m is None:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return None
    pid, ticks = _read_owner(path, int(m.group(1)))
    if ticks is None and pid == os.getpid():
        return pid, ticks  # our own PID, but not a directory we wrote: left by an earlier holder of it
    return None if owner_alive(pid, ticks) else (pid, ticks)


def reclaim(base: str) -> list[str]:
    """Remove the run directories under ``base`` whose owners are gone; the paths removed."""
    removed = []
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return removed
    for name in names:
        path = os.path.join(base, name)
        owner = stale(path)
        if owner is None:
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            removed.append(path)
            event(
                log,
                "run_dir_reclaimed",
                f"removed run directory {path} of pid {owner[0]}, which is gone",
                path=path,
                pid=owner[0],
            )
    return removed


def create(state_dir: str, environ=None) -> str:
    """Make this process's run directory (after reclaiming stale ones); its path."""
    base = base_dir(state_dir, environ)
    reclaim(base)
    pid = os.getpid()
    final = os.path.join(base, f"{PREFIX}{pid}")
    partial = final + ".new"
    for path in (final, partial):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise RunDirError(f"cannot use run directory {path}: {exc.strerror}") from None
        _check_owner(path, st, "run directory")
        # Ours, yet not this process's: an earlier process had this PID.
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    ticks = start_ticks(pid)
    try:
        # Built under a temporary name and renamed: a directory named snowfence-<pid>
        # always has its owner file.
        os.mkdir(partial, 0o700)
        os.chmod(partial, 0o700)  # whatever the umask
        fd = os.open(os.path.join(partial, OWNER_FILE), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps({"pid": pid, "start_ticks": ticks}) + b"\n")
        os.rename(partial, final)
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise RunDirError(f"cannot create run directory {final}: {exc.strerror}") from None
    st = os.lstat(final)
    _check_owner(final, st, "run directory")
    if stat.S_IMODE(st.st_mode) != 0o700:
        remove(final)
        raise RunDirError(f"run directory {final} is mode {stat.S_IMODE(st.st_mode):o}, not 700")
    return final


def remove(path: str) -> None:
    """Remove a run directory this process made (at a clean stop)."""
    if path:
        shutil.rmtree(path, ignore_errors=True)
