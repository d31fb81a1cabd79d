"""The node's watermark: rounds on a thread of their own, answers from the last promise.

A round (``Store.watermark_round``, see ``store/watermark.py``) reads every worker ID's
floor, raises the store's record and checks the floors again; what it promises stays
true for ever. So the thread runs a round every ``watermark_interval_s`` and the broker's
loop answers WATERMARK from the last promise at once (an attribute read, never a store
call), and nothing on a minting path waits for it.

Like the broker's own worker ID, it is a step the simulator can run on its own clocks:
:meth:`step` is one round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..config import Config
from ..errors import SnowfenceError
from ..logs import event
from ..store.watermark import pools

log = logging.getLogger("snowfence.watermark")

#: Seconds between two warnings of rounds that keep failing (one line, not one per round).
WARN_EVERY_S = 60.0


class Watermark:
    """Earns and keeps the node's watermark. ``promised_ms`` (ms since the epoch; 0: none
    yet) is read by the broker's loop."""

    def __init__(
        self,
        config: Config,
        *,
        open_store: Callable[..., object],
        wall_ns: Callable[[], int] = time.time_ns,
        mono_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.config = config
        self._open_store = open_store
        self._wall_ns = wall_ns
        self._mono_ns = mono_ns
        self.store = None
        self.promised_ms = 0
        self.rounds = 0
        self.failures = 0
        self.last_error: str | None = None
        self._warned_ns: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def interval_s(self) -> float:
        return self.config.watermark_interval_s

    def open(self) -> bool:
        """Open its own store (read-mostly: it holds no worker ID). False if it cannot."""
        try:
            # With the node's journal: a round that finds the store went back promises nothing,
            # and every promise is noted there before it is answered (claims start above it).
            self.store = self._open_store(self.config)
        except SnowfenceError as exc:
            event(log, "watermark_disabled", f"this node answers no WATERMARK: {exc}", level=logging.WARNING)
            return False
        return True

    def start(self) -> bool:
        if self.interval_s <= 0 or not self.open():
            return False
        self._thread = threading.Thread(target=self._run, name="watermark", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.config.etcd_timeout_s * 2 + 1)
        if self.store is not None:
            self.store.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.interval_s)

    def step(self) -> int:
        """One round; returns the millisecond promised now (0: none yet)."""
        store = self.store
        now_ms = self._wall_ns() // 1_000_000 - self.config.layout.epoch_ms
        try:
            if getattr(store, "genesis", None) is None:
                store.check_layout(self.config.layout)  # the layout is the store's, as for a claim
            promised = store.watermark_round(now_ms, self.promised_ms)
        except SnowfenceError as exc:
            self._failed(str(exc))
            return self.promised_ms
        except Exception as exc:  # a bug must not stop the rounds: log, go on
            log.exception("a watermark round failed")
            self._failed(repr(exc))
            return self.promised_ms
        self.rounds += 1
        if self.failures:
            event(log, "watermark_resumed", f"watermark rounds succeed again after {self.failures} failures")
            self.failures, self._warned_ns = 0, None
        if promised > self.promised_ms:
            self.promised_ms = promised
        return self.promised_ms

    def _failed(self, why: str) -> None:
        self.failures += 1
        self.last_error = why
        now_ns = self._mono_ns()
        if self._warned_ns is None or now_ns - self._warned_ns > WARN_EVERY_S * 1e9:
            self._warned_ns = now_ns
            event(
                log,
                "watermark_round_failed",
                f"the watermark cannot advance: {why} (the last promise stands; rounds retry every "
                f"{self.interval_s:g} s)",
                level=logging.WARNING,
                failures=self.failures,
            )

    def describe(self, now_ms: int) -> dict:
        """For STATUS: the promise, its lag behind the wall clock, and the rounds."""
        epoch = self.config.layout.epoch_ms
        promised = self.promised_ms
        low = getattr(self.store, "watermark_low", None)
        floors = getattr(self.store, "watermark_floors", None)
        size = self.config.layout.max_worker + 1
        return {
            "unix_ms": promised + epoch if promised else None,
            "lag_ms": now_ms - promised if promised else None,
            "rounds": self.rounds,
            "failures": self.failures,
            "last_error": self.last_error,
            # The worker ID whose floor held the last round back most (its floor null: none known).
            "held_back_by": None
            if low is None
            else {
                "region": low.region,
                "worker_id": low.worker_id,
                "floor_unix_ms": None if low.floor_ms is None else low.floor_ms + epoch,
                "held": low.held,
            },
            # Each region's worker IDs as the last round read them (null: no round has read them yet).
            "pools": None
            if floors is None
            else [
                {"region": region, "size": size, **pool}
                for region, pool in pools(floors, now_ms, size, (self.config.region,)).items()
            ],
        }
