"""Embedded mode: worker IDs by file lock, the high-water mark in a file.

Layout of the state directory::

    layout.json                        the ID layout and the store's genesis (see genesis.py)
    regions/<r>/                       flock(2)ed briefly around every read-compare-write of a mark
    regions/<r>/worker-<w>.lock        flock(2)ed by the worker holding worker ID w
    regions/<r>/worker-<w>.mark        {"reserved_until_ms", "token", "rev", "store", "layout", ..., "checksum"}
    last-worker-id/<ns>/<node>/slot-N  "<worker ID> <token>" a worker slot claimed last
    journal/embedded.json              what the node's processes saw the store hold (see journal.py)

The kernel releases a flock when its process dies, so a crashed worker's ID
frees at once; its mark stays and makes the next owner wait until the wall
clock has passed it. Marks are written to a temporary file, fsynced, renamed
over the old one, and the directory fsynced, before the minter may use them.

The store does not trust its own belief that it holds a worker ID, as etcd does
not trust a stale lease: before every write of the mark, and on the keeper's
timer, the holder checks that the file it holds the lock on is still the lock
file at the path (device and inode) and that the mark is the one it wrote (its
token and its revision). The check and the write happen under the region
directory's flock, which every claim takes too, so a second process that locked
a new lock file at the same path (the old one deleted) and a holder of the old
one cannot interleave: one of them sees the other's token and drops the worker ID.

Files can be deleted; the kernel's own records cannot. A holder also keeps two
abstract unix sockets bound, each named after the state directory, its region and
the worker ID: one names the directory by its real path (a directory removed and
made again there is the same store to a claimer), the other by its device and
inode (a bind mount, a symlink or a container's own mount of it is the same
directory, whatever its path). The kernel frees the names when the process dies,
and no file operation touches them. A claimer that finds either name taken passes
over the worker ID, whatever the directory says: so a state directory wiped under
live holders gives their worker IDs to nobody else while they run.

Abstract socket names live in a network namespace: a node in another one (another
container that does not share the host's network) sees neither name. Such a node
is guarded by the files alone: a holder whose lock file was removed or replaced,
or whose mark another process wrote, fences at its next keeper check, and says
so when a live process it could not see holds the new lock file; until that
check (one keep-alive interval) it may mint as a worker ID a node there claimed
on a wiped directory.

State that is missing or inconsistent is never read as "fresh". A worker ID is
passed over, with the reason logged and shown in ``snowfence status``, when its
lock file exists without a mark, when its mark cannot be parsed or fails its
checksum, when its mark's token is below one a worker recorded when it claimed
it, or when its mark is of another layout. A worker ID without a mark is never
used only if the genesis record says so (its ``used`` set); otherwise it is
unknown, and its claim waits out a quarantine. A mark whose revision is below
the one the journal saw was put back from an older copy: refused by name.

The store is split by job: :mod:`.records` (the genesis record and the marks, read and
checked), :mod:`.locks` (the region directory's flock), :mod:`.lease` (``FileLease``), and
``FileStore`` (:mod:`.store`), assembled from :mod:`.layout` (the genesis record),
:mod:`.restore` (``accept-restore``), :mod:`.claims` (marks and claims), :mod:`.witnesses`
(the kernel's witnesses) and :mod:`.watermark_round`.
"""

from __future__ import annotations

from .lease import FileLease
from .locks import REGION_LOCK_WAIT_S, RegionLock
from .records import Mark, layout_path, mark_checksum, read_genesis
from .store import FileStore

__all__ = [
    "REGION_LOCK_WAIT_S",
    "FileLease",
    "FileStore",
    "Mark",
    "RegionLock",
    "layout_path",
    "mark_checksum",
    "read_genesis",
]
