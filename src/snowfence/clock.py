"""Watching the host's clock beyond the minter's own rules.

* The kernel's view, from ``adjtimex(2)`` in read-only mode: whether the clock
  is synchronised (``STA_UNSYNC`` clear) and its maximum and estimated error.
  Workers veto minting on it; the broker exports it as metrics.
* Forward jumps: the wall clock advancing much faster than the monotonic clock
  between two readings. The minter tolerates them (the reservation bounds what
  an owner can mint), but IDs minted during one sort into the future, and when
  the clock is corrected the worker must refuse until real time catches up.
* Steps back, as the minters see them: a histogram of their sizes.

:class:`HostClock` puts the three together for one worker process and says
whether the host's clock forbids minting (its ``veto``).
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from .logs import event

#: Upper bounds (ms) of the step-back histogram's buckets.
STEP_BACK_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 1000, 10000)
#: How often the kernel's clock state is read again.
KERNEL_CHECK_INTERVAL_NS = 1_000_000_000

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


class StepBacks:
    """Sizes of the steps back the minters saw: cumulative counts per bucket (ms)."""

    def __init__(self, buckets_ms: tuple[int, ...] = STEP_BACK_BUCKETS_MS) -> None:
        self.le = list(buckets_ms)
        self.counts = [0] * (len(buckets_ms) + 1)
        self.sum_ms = 0
        self.count = 0

    def record(self, back_ms: int) -> None:
        self.count += 1
        self.sum_ms += back_ms
        self.counts[bisect.bisect_left(self.le, back_ms)] += 1

    def to_dict(self) -> dict:
        """The STATE field ``step_back_ms``."""
        return {"le": self.le, "counts": list(self.counts), "sum_ms": self.sum_ms, "count": self.count}


class HostClock:
    """One process's watch on the host clock: forward jumps, the kernel's error
    bound and the steps back its minters report. ``veto`` is set while a policy
    forbids minting (``refuse_forward_jumps`` after a jump; the kernel's maximum
    error above ``max_clock_error_ms``, or the clock unsynchronised).

    Call :meth:`check` from the process's loop with the monotonic time; hand
    :meth:`on_step_back` to the minters. Clocks are injectable for tests."""

    def __init__(
        self,
        *,
        forward_jump_ms: int,
        refuse_forward_jumps: bool,
        max_clock_error_ms: int,
        log: logging.Logger,
        wall_ns: Callable[[], int] = time.time_ns,
        read_kernel: Callable[[], KernelClock | None] = read_kernel_clock,
    ) -> None:
        self.refuse_forward_jumps = refuse_forward_jumps
        self.max_clock_error_ms = max_clock_error_ms
        self.log = log
        self._wall_ns = wall_ns
        self._read_kernel = read_kernel
        self.jumps = ForwardJumps(forward_jump_ms)
        self.step_backs = StepBacks()
        self.kernel_clock = read_kernel()
        self.veto: str | None = None
        self._next_kernel_ns = 0

    @property
    def ahead_ms(self) -> int:
        return self.jumps.ahead_ms

    @classmethod
    def watching(cls, config, log: logging.Logger) -> HostClock:
        """The watch a process's settings ask for (``forward_jump_ms``,
        ``refuse_forward_jumps``, ``max_clock_error_ms``), on the host's clocks."""
        return cls(
            forward_jump_ms=config.forward_jump_ms,
            refuse_forward_jumps=config.refuse_forward_jumps,
            max_clock_error_ms=config.max_clock_error_ms,
            log=log,
        )

    def check(self, now_ns: int) -> tuple[bool, bool]:
        """Look at the clocks now: (a new forward jump?, did the veto change?)."""
        jumped = self.jumps.observe(self._wall_ns(), now_ns)
        if jumped:
            event(
                self.log,
                "clock_forward_jump",
                f"wall clock jumped {self.jumps.ahead_ms} ms ahead of the monotonic clock",
                level=logging.ERROR,
                ahead_ms=self.jumps.ahead_ms,
            )
        veto = None
        if self.refuse_forward_jumps and self.jumps.ahead_ms:
            veto = f"wall clock is {self.jumps.ahead_ms} ms ahead after a forward jump"
        if now_ns >= self._next_kernel_ns:
            self._next_kernel_ns = now_ns + KERNEL_CHECK_INTERVAL_NS
            self.kernel_clock = self._read_kernel()
        bound_ms = self.max_clock_error_ms
        kc = self.kernel_clock
        if bound_ms and kc is not None and (not kc.synchronized or kc.max_error_s * 1000 > bound_ms):
            veto = veto or (
                f"kernel clock {'unsynchronised' if not kc.synchronized else 'error'}: maximum error "
                f"{kc.max_error_s * 1000:.0f} ms exceeds {bound_ms} ms"
            )
        if veto == self.veto:
            return jumped, False
        if veto:
            event(self.log, "clock_veto", veto, level=logging.ERROR)
        self.veto = veto
        return jumped, True

    def on_step_back(self, back_ms: int, refused: bool) -> None:
        """A minter saw the wall clock step back ``back_ms`` (and refused, if it was too far)."""
        self.step_backs.record(back_ms)
        if refused:
            event(
                self.log,
                "clock_step_back",
                f"wall clock stepped back {back_ms} ms; refusing",
                level=logging.ERROR,
                step_back_ms=back_ms,
            )


#: What a worker is told, and assumes, before its node's clock was first compared with its peers'.
PENDING_VERDICT = "this node's clock has not been compared with its peers' yet"


def pending_verdict(config) -> str | None:
    """The clock verdict before any is in: pending where the node's peers will judge it
    (etcd mode, or peers named, and a bound set), None where nothing will."""
    judged = bool(config.peer_offset_bound_ms) and (not config.embedded or bool(config.peers))
    return PENDING_VERDICT if judged else None
