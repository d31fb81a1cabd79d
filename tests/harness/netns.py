"""Each test process is a host of its own: its own network namespace.

A node holds a host-wide name for its region's home (src/snowfence/store/home.py), and
that host is its network namespace. Two test processes running at once (pytest -n 2)
each start embedded nodes in region 0 on state directories of their own, which on one
host is exactly the mistake the guard refuses. So each test process, before it starts
anything, moves into a network namespace of its own with its loopback up: its nodes,
etcd members and clients see each other on 127.0.0.1 as before, and the other test
process's nodes as another host's. A developer's own node on the machine is then out of
the suite's way too.

That takes root (CAP_SYS_ADMIN). Without it the suite runs its tests one at a time
(conftest.py), in the machine's namespace. What needs the outside network (pip, in the
client-install test) runs there through :func:`outside`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import socket
import struct

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
#: The namespace this process started in, while it lives in its own (None: it never moved).
_original_fd: int | None = None


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifreq = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b""))


def isolate() -> bool:
    """Move this process into a new network namespace with its loopback up; False (and
    nothing changed) where that is not allowed."""
    global _original_fd
    if _original_fd is not None:
        return True
    if os.geteuid() != 0:
        return False
    original = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    if _libc.unshare(CLONE_NEWNET) != 0:
        os.close(original)
        return False
    _original_fd = original
    _loopback_up()
    return True


def isolated() -> bool:
    return _original_fd is not None


def outside() -> None:
    """A ``preexec_fn``: run the child in the namespace this process started in."""
    if _original_fd is not None and _libc.setns(_original_fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns to the original network namespace failed")


_own_host: list[str] | None = None


def own_host() -> list[str]:
    """A command prefix that runs a process on a host of its own (``unshare -rn``: a user
    and a network namespace, which needs no root where user namespaces are allowed), for a
    node that outlives a test beside other tests' nodes (a session's or a module's server,
    reached over ipc://, which crosses network namespaces); [] where that cannot be had."""
    global _own_host
    if _own_host is None:
        import shutil
        import subprocess

        prefix = ["unshare", "-rn"]
        ok = shutil.which("unshare") is not None and (
            subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0
        )
        _own_host = prefix if ok else []
    return list(_own_host)
