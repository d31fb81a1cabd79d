"""The kernel's witnesses of held worker IDs (:class:`Witnesses`, a part of
:class:`~.store.FileStore`): two abstract unix socket names per held worker ID, which no
file operation can remove, and which a claimer that finds either taken passes over.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from ...errors import StateDirError


class Witnesses:
    """The kernel's witnesses of held worker IDs, for :class:`~.store.FileStore`."""

    def witness_names(self, worker_id: int, region: int | None = None) -> tuple[str, str]:
        """The abstract socket names a holder of ``worker_id`` binds: the state directory by
        its real path (a directory removed and made again at that path is still this store
        to a claimer), and by its device and inode (a bind mount, a symlink or a container's
        own mount of it is the same directory, whatever its path)."""
        try:
            st = os.stat(self.root)
        except OSError as exc:
            raise StateDirError(f"state directory {self.root} is not usable: {exc.strerror or exc}") from None
        where = f"{self.region if region is None else region}:{worker_id}"
        return f"\0{self._witness_prefix}:{where}", f"\0snowfence:dir-{st.st_dev:x}-{st.st_ino:x}:{where}"

    def _bind_witnesses(self, worker_id: int, region: int | None = None) -> tuple[socket.socket, ...] | None:
        """The kernel's witnesses that this process holds ``worker_id`` (of ``region``: this
        store's by default); None if a live process holds either name (then a name bound
        before it is let go at once)."""
        bound: list[socket.socket] = []
        try:
            for name in self.witness_names(worker_id, region):
                try:
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                except OSError as exc:  # out of descriptors, say
                    raise StateDirError(
                        f"cannot open the holder's witness socket for worker ID {worker_id}: {exc}"
                    ) from None
                try:
                    sock.bind(name)
                except OSError as exc:
                    sock.close()
                    if exc.errno == errno.EADDRINUSE:
                        for witness in bound:
                            witness.close()
                        return None
                    raise StateDirError(
                        f"cannot bind the holder's witness socket for worker ID {worker_id}: {exc}"
                    ) from None
                bound.append(sock)
        except BaseException:
            for witness in bound:
                witness.close()
            raise
        return tuple(bound)

    @staticmethod
    def _bound_names() -> set[str] | None:
        """Every snowfence witness name bound in this network namespace, read at once from
        the kernel's table of unix sockets; None where it cannot be read (then each name is
        tried by binding it). Reading the table costs a round one file, not two binds per
        worker ID (a round runs on the broker's process, beside its loop)."""
        try:
            text = Path("/proc/net/unix").read_text(errors="replace")
        except OSError:
            return None
        names = set()
        for line in text.splitlines()[1:]:
            parts = line.split(None, 7)
            if len(parts) == 8 and parts[7].startswith("@snowfence:"):
                names.add("\0" + parts[7][1:])
        return names
