"""One region, one home, per host.

A region's *home* is the store its worker IDs are leased from: one embedded state
directory, or one etcd cluster. Two homes of one region hand out the same worker IDs
to two minters, and so the same IDs, in silence: each store is consistent, and neither
knows of the other. Two users each running ``snowfence serve`` (the default state
directory is per user), a systemd template unit with ``StateDirectory=snowfence-%i``,
or a typo in ``--state-dir`` are enough.

So a node holds, for as long as it runs, a host-wide name for its region and its home:
an abstract unix socket

    @snowfence:home:r<region>:<home>:<pid>:<where>

where ``<home>`` is ``dir-<device>-<inode>`` of an embedded state directory (the same
for every path to it: a bind mount, a symlink, a container's own mount; another for a
directory removed and made again) or ``etcd-<digest>`` of an etcd-mode node's cluster,
and ``<where>`` is the directory's path (or the cluster's name), for the refusal to
name. Before it binds anything else, a node binds its own name and then reads the
kernel's table of unix sockets (``/proc/net/unix``); a name of the same region with
another home refuses the start. Binding first and reading after means that of two
nodes starting at once, at least the later one sees the other; both may refuse, which
is loud and safe. Nodes that share one state directory share one home and run on.

The kernel frees the name when the process dies, and no file operation reaches it, so
neither a deleted nor a replaced directory, nor a stale file, can free or fake it.

What it cannot see: abstract socket names live in a network namespace. A node in
another one (a container without the host's network, another host) is invisible here;
there, give each home its own region, or use etcd mode, where regions are claimed in
etcd (a second cluster on the same etcd that names a region in use is refused). An
embedded node checks against every home; an etcd-mode node publishes its home and
checks against embedded ones (two etcd clusters are told apart by etcd's own region
claim, not here).
"""

from __future__ import annotations

import errno
import hashlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import orjson

from ..errors import RegionHeld, StateDirError

PREFIX = "snowfence:home:"
#: An abstract unix socket name is at most 107 bytes after its leading NUL.
MAX_NAME_BYTES = 107


@dataclass(frozen=True)
class Home:
    """One node's claim: its region, its home's key, its pid, and where the home is."""

    region: int
    key: str
    pid: int
    where: str

    @property
    def embedded(self) -> bool:
        return self.key.startswith("dir-")

    def name(self) -> str:
        """The abstract socket name (with its leading NUL); ``where`` is cut from the
        front if the name would be too long (the end of a path says most)."""
        head = f"{PREFIX}r{self.region}:{self.key}:{self.pid}:"
        room = MAX_NAME_BYTES - len(head.encode())
        where = _printable(self.where)
        if len(where.encode()) > room:
            where = "..." + where.encode()[-(room - 3) :].decode(errors="ignore")
        return "\0" + head + where

    @classmethod
    def parse(cls, name: str) -> Home | None:
        """The home a name in the kernel's table stands for; None for a name not ours."""
        if not name.startswith(PREFIX):
            return None
        parts = name[len(PREFIX) :].split(":", 3)
        if len(parts) != 4 or not parts[0].startswith("r"):
            return None
        region, key, pid, where = parts
        if not (region[1:].isdigit() and pid.isdigit() and key[:4] in ("dir-", "etcd")):
            return None
        return cls(int(region[1:]), key, int(pid), where)

    def describe(self) -> str:
        if self.embedded:
            return f"state directory {self.where} (pid {self.pid})"
        return f"etcd-mode node of cluster {self.where!r} (pid {self.pid})"


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() and c != "\n" else "?" for c in text)


def embedded_key(state_dir: str | os.PathLike) -> str:
    """The home key of a state directory: its device and inode."""
    try:
        st = os.stat(state_dir)
    except OSError as exc:
        raise StateDirError(f"state directory {state_dir} is not usable: {exc.strerror or exc}") from None
    return f"dir-{st.st_dev:x}-{st.st_ino:x}"


def etcd_key(cluster: str) -> str:
    """The home key of an etcd-mode node: a digest of its cluster's name (its endpoints
    are left out: one etcd is often named by different members)."""
    return "etcd-" + hashlib.blake2s(cluster.encode(), digest_size=6).hexdigest()


def embedded_store_id(state_dir: str | os.PathLike) -> str | None:
    """The store ID a state directory's genesis record holds; None if it has none (yet) or
    it cannot be read (the store itself says why, to the node that opens it)."""
    try:
        with open(os.path.join(state_dir, "layout.json"), "rb") as f:
            store_id = orjson.loads(f.read()).get("store_id")
    except (OSError, ValueError, AttributeError):
        return None
    return store_id if isinstance(store_id, str) and store_id else None


def read_homes(table: str | None = None) -> list[Home] | None:
    """Every home named in this network namespace; None if the kernel's table of unix
    sockets cannot be read."""
    if table is None:
        try:
            table = Path("/proc/net/unix").read_text(errors="replace")
        except OSError:
            return None
    homes = []
    for line in table.splitlines()[1:]:
        parts = line.split(None, 7)
        if len(parts) == 8 and parts[7].startswith("@" + PREFIX):
            home = Home.parse(parts[7][1:])
            if home is not None:
                homes.append(home)
    return homes


def conflicts(mine: Home, homes: list[Home]) -> list[Home]:
    """The homes that keep ``mine`` from serving its region: the same region with another
    key, where either is embedded (etcd-mode homes are told apart by etcd's region claim)."""
    return [
        other
        for other in homes
        if other.region == mine.region
        and other.key != mine.key
        and (mine.embedded or other.embedded)
        and other.name() != mine.name()
    ]


def refusal(mine: Home, others: list[Home]) -> RegionHeld:
    """The error that names the home holding the region and the ways out."""
    first = others[0]
    here = f"state directory {mine.where}" if mine.embedded else f"etcd cluster {mine.where!r}"
    also = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
    if first.embedded and mine.embedded:
        ways = f"share that directory (--state-dir {first.where}) or give this node another region (--region N)"
    else:
        ways = "give this node another region (--region N)"
    return RegionHeld(
        f"region {mine.region} is already served on this host from {first.describe()}{also}; "
        f"{here} in the same region would mint the same IDs: {ways}"
    )


def admit(mine: Home, homes: list[Home]) -> None:
    """The decision: raise RegionHeld if another home among ``homes`` serves ``mine``'s region."""
    others = conflicts(mine, homes)
    if others:
        raise refusal(mine, others)


class HomeHold:
    """This process's name for its region's home, bound while it runs."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.sock: socket.socket | None = None

    def hold(self) -> list[Home] | None:
        """Bind the name, then read every other: raises RegionHeld (the name let go) if
        another home serves the region here. Returns the homes seen (None: the table
        could not be read, so only this name is held)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(self.home.name())
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:  # our own pid's name: held already in this process
                raise StateDirError(f"this process already holds the home of region {self.home.region}") from None
            raise StateDirError(f"cannot bind the region's home name: {exc.strerror or exc}") from None
        self.sock = sock
        homes = read_homes()
        if homes is not None:
            try:
                admit(self.home, homes)
            except RegionHeld:
                self.close()
                raise
        return homes

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def for_config(config, pid: int | None = None) -> Home:
    """This node's home: its state directory's, or its etcd cluster's."""
    pid = os.getpid() if pid is None else pid
    if config.embedded:
        where = os.path.realpath(config.state_dir)
        return Home(config.region, embedded_key(config.state_dir), pid, where)
    return Home(config.region, etcd_key(config.cluster), pid, config.cluster)


def check(config) -> None:
    """Refuse (RegionHeld) if another home serves this node's region here; binds nothing
    (``check-config``)."""
    homes = read_homes()
    if homes is None:
        return  # no table to read here (serve says so when it binds its name)
    if config.embedded and not os.path.isdir(config.state_dir):
        # A directory not made yet is no home another node shares: any home of the region refuses it.
        mine = Home(config.region, "dir-new", 0, os.path.realpath(config.state_dir))
    else:
        mine = for_config(config, pid=0)
    admit(mine, homes)
