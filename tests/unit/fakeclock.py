"""A wall clock, a monotonic clock and sleep that tests drive by hand, and the minter and
keeper of a worker ID on them."""

from __future__ import annotations

from snowfence.ids import DEFAULT_EPOCH_MS, DEFAULT_LAYOUT, Layout
from snowfence.store.base import Lease
from snowfence.workers.keeper import Keeper
from snowfence.workers.minter import Minter


class FakeClock:
    """Sleeping advances both clocks; ``step`` moves only the wall clock."""

    def __init__(self, wall_ms: int = DEFAULT_EPOCH_MS + 1_000_000, mono_s: float = 1000.0) -> None:
        self.wall_ns_value = wall_ms * 1_000_000
        self.mono_ns_value = int(mono_s * 1e9)
        self.slept_s = 0.0
        self.sleeps = 0
        #: Called after each sleep, e.g. to step the clock while the minter waits.
        self.on_sleep = None

    def wall_ns(self) -> int:
        return self.wall_ns_value

    def mono_ns(self) -> int:
        return self.mono_ns_value

    def sleep(self, seconds: float) -> None:
        ns = max(int(seconds * 1e9), 1)
        self.wall_ns_value += ns
        self.mono_ns_value += ns
        self.slept_s += ns / 1e9
        self.sleeps += 1
        if self.on_sleep is not None:
            self.on_sleep(self)

    def advance_ms(self, ms: float) -> None:
        """Time passes: both clocks move."""
        self.wall_ns_value += int(ms * 1_000_000)
        self.mono_ns_value += int(ms * 1_000_000)

    def step_ms(self, ms: float) -> None:
        """The wall clock is stepped (negative: backwards); the monotonic clock is not."""
        self.wall_ns_value += int(ms * 1_000_000)

    def pause_s(self, s: float) -> None:
        """The process was paused: only the monotonic clock tells (the wall moves too)."""
        self.advance_ms(s * 1000)

    @property
    def wall_ms(self) -> int:
        return self.wall_ns_value // 1_000_000

    def minter(self, layout: Layout = DEFAULT_LAYOUT, region: int = 0, worker_id: int = 0, **kw) -> Minter:
        """A minter on this clock: fenced, with nothing reserved, as a keeper finds a new one."""
        return Minter(layout, region, worker_id, wall_ns=self.wall_ns, mono_ns=self.mono_ns, sleep=self.sleep, **kw)

    def keeper(self, lease: Lease, minter: Minter, events: list | None = None, **kw) -> Keeper:
        """A keeper of ``lease`` for ``minter`` on this clock: renewals every 2 s, a fence after
        5 s without one, a 5 s window; each event it reports goes to ``events`` as (name, fields)."""
        settings = dict(interval_s=2.0, fence_after_s=5.0, window_ms=5000, mono_ns=self.mono_ns)
        if events is not None:
            settings["on_event"] = lambda name, fields: events.append((name, fields))
        return Keeper(lease, minter, **{**settings, **kw})
