"""A wall clock, a monotonic clock and sleep that tests drive by hand."""

from __future__ import annotations

from snowfence.ids import DEFAULT_EPOCH_MS


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
