"""Watching the host's clock beyond the minter's own rules.

* The kernel's view, from ``adjtimex(2)`` in read-only mode: whether the clock
  is synchronised (``STA_UNSYNC`` clear) and its maximum and estimated error.
* Forward jumps: the wall clock advancing much faster than the monotonic clock
  between two readings. The minter tolerates them (the reservation bounds what
  an owner can mint), but IDs minted during one sort into the future, and when
  the clock is corrected the worker must refuse until real time catches up.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass

STA_UNSYNC = 0x0040
TIME_ERROR = 5


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    # struct timex of <sys/timex.h> (Linux, glibc); modes = 0 only reads.
    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time", _Timeval),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("_reserved", ctypes.c_int * 11),
    ]


@dataclass(frozen=True)
class KernelClock:
    """The kernel's account of the wall clock."""

    synchronized: bool
    max_error_s: float
    est_error_s: float
    state: int

    def to_dict(self) -> dict:
        return {
            "synchronized": self.synchronized,
            "max_error_s": self.max_error_s,
            "est_error_s": self.est_error_s,
            "state": self.state,
        }


_libc = None


def read_kernel_clock() -> KernelClock | None:
    """The kernel clock's sync state and error bounds; None where adjtimex is unavailable."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        tx = _Timex()
        state = _libc.adjtimex(ctypes.byref(tx))
    except (OSError, AttributeError):
        return None
    if state < 0:
        return None
    synchronized = not (tx.status & STA_UNSYNC) and state != TIME_ERROR
    return KernelClock(synchronized, tx.maxerror / 1e6, tx.esterror / 1e6, state)


class ForwardJumps:
    """Notices the wall clock running ahead of the monotonic clock.

    Keeps the offset ``wall - monotonic`` seen so far. A reading whose offset
    exceeds it by more than ``threshold_ms`` is a forward jump; the worker is
    ``ahead`` until the offset comes back. Slow changes (NTP slewing, at most
    0.5 ms/s) move the baseline with them; a step back lowers it at once.
    """

    def __init__(self, threshold_ms: int) -> None:
        self.threshold_ns = threshold_ms * 1_000_000
        self.baseline_ns: int | None = None
        self.ahead_ms = 0
        self.jumps = 0

    def observe(self, wall_ns: int, mono_ns: int) -> bool:
        """Feed one reading; True if this reading found a new forward jump."""
        offset = wall_ns - mono_ns
        if self.baseline_ns is None or offset < self.baseline_ns:
            self.baseline_ns = offset
            self.ahead_ms = 0
            return False
        ahead = offset - self.baseline_ns
        if ahead <= self.threshold_ns:
            self.baseline_ns = offset  # drift or slewing: follow it
            self.ahead_ms = 0
            return False
        new = self.ahead_ms == 0
        self.ahead_ms = ahead // 1_000_000
        if new:
            self.jumps += 1
        return new
