"""What a worker's exit status tells its supervisor.

A worker that cannot boot for a reason a restart will not fix (a layout that
differs from the cluster's, an unusable state directory, invalid settings) exits
with one of :data:`HALT`; the supervisor then stops the node instead of
respawning it forever. Any other non-zero status is a crash: restart, with
back-off.
"""

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    CRASHED = 1
    CANTCREAT = 73  # sysexits EX_CANTCREAT: the state directory is unusable
    CONFIG = 78  # sysexits EX_CONFIG: layout mismatch or invalid settings


HALT = frozenset({Exit.CANTCREAT, Exit.CONFIG})
