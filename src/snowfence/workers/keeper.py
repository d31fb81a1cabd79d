"""The keeper: one thread per held worker ID that renews its lease and extends its
mark ahead of use, and moves the minter's ``fence_deadline_ns`` and
``reserved_until_ms`` only after the store confirmed; the minter never waits for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..errors import LeaseLost, SnowfenceError
from ..store.base import Lease
from .minter import NEVER_NS, Minter

log = logging.getLogger("snowfence.lease")


class Keeper(threading.Thread):
    """Renews one lease and extends its mark ahead of the minter, in the background.

    Every ``interval_s`` it sends a renewal; if that succeeds, the fence deadline
    moves to ``sent + fence_after_s`` (monotonic, counted from when the renewal was
    sent, not when it returned). Then it extends the mark to ``now + window`` and
    moves the minter's ``reserved_until_ms`` only after the store confirmed the
    write. After a failure
    it retries sooner, with back-off, so a renewal rides over a short etcd election.

    It also watches the worker's minting loop (``loop_ns``: when the loop last
    turned). A loop stalled for ``stall_s`` must not keep its worker ID alive
    from this thread: the keeper fences the minter, stops renewing (an etcd
    lease then lapses) and lets go of a lease only the process can free (a file
    lock), without touching the mark, which still bounds whatever the stalled
    loop might yet mint.
    """

    def __init__(
        self,
        lease: Lease,
        minter: Minter,
        *,
        interval_s: float,
        fence_after_s: float,
        window_ms: int,
        retry_s: float = 0.25,
        fence: bool = True,
        mono_ns: Callable[[], int] = time.monotonic_ns,
        on_event: Callable[[str, dict], None] | None = None,
        wake_event: threading.Event | None = None,
        loop_ns: Callable[[], int] | None = None,
        stall_s: float = 0.0,
    ) -> None:
        super().__init__(name=f"keeper-{lease.worker_id}", daemon=True)
        self.lease = lease
        self.minter = minter
        self.interval_s = interval_s
        self.fence_ns = int(fence_after_s * 1e9)
        #: False when minting through a partition: only the reservation bounds the owner.
        self.fence = fence
        self.window_ms = window_ms
        self.retry_s = retry_s
        self._mono_ns = mono_ns
        self._on_event = on_event or (lambda name, fields: None)
        self._stopping = threading.Event()
        #: What the keeper waits on between renewals; tests pass one that runs on a fake clock.
        self._wake = threading.Event() if wake_event is None else wake_event
        #: Set once the store said the lease is gone; the worker must re-claim.
        self.lost: SnowfenceError | None = None
        self.last_renewal_ns: int | None = None
        self.last_renewal_latency_s: float | None = None
        self.failures = 0
        self.renewals = 0
        #: Set when the keeper gave the worker ID up because the minting loop stalled.
        self.stalled = False
        self._loop_ns = loop_ns
        self._stall_ns = int(stall_s * 1e9)
        #: How much longer than asked the keeper's last wait took (a pause of the whole process).
        #: When the keeper last judged the loop, and how long it meant to be away
        #: until the next time (its wait): a keeper away much longer than that was
        #: paused with the whole process, wherever in its iteration.
        self._judged_ns = 0
        self._away_ns = 0
        #: The wait after a failed renewal, doubled each failure up to half the interval.
        self._backoff_s = retry_s

    def renew_once(self) -> None:
        """One renewal: renew the lease, then extend the mark (or, if no extension is due,
        confirm the claim), each guarded by the claim being ours and the mark the one we
        wrote. The fence moves only when both succeeded. Raises what the store raised."""
        lease, minter = self.lease, self.minter
        sent = self._mono_ns()
        lease.refresh()
        self.last_renewal_latency_s = (self._mono_ns() - sent) / 1e9
        now_ms = minter.now_ms()
        wanted = min(now_ms + self.window_ms, minter.layout.max_ms)
        # Every mint from now on carries last_ms or more (the minting thread only raises it):
        # the extension publishes it as this holder's floor, for the watermark.
        floor_ms = minter.last_ms
        if floor_ms > lease.floor_ms:
            lease.floor_ms = floor_ms
        if wanted > lease.reserved_until_ms:
            lease.extend(wanted)
        else:
            lease.confirm()
        self.last_renewal_ns = sent
        minter.fence_deadline_ns = sent + self.fence_ns if lease.expires and self.fence else NEVER_NS
        minter.reserved_until_ms = lease.reserved_until_ms
        self.renewals += 1

    def loop_stalled_s(self) -> float | None:
        """Seconds the worker's loop has not turned, if past the bound; else None.

        A keeper that itself was away far longer than it meant to be (in its wait
        or in a renewal) was paused with the whole process (SIGSTOP, a VM
        freeze): the loop gets a turn before it is judged.
        """
        if self._loop_ns is None or not self._stall_ns:
            return None
        now_ns = self._mono_ns()
        last_ns, self._judged_ns = self._judged_ns, now_ns
        if last_ns and now_ns - last_ns > self._away_ns + self._stall_ns // 2:
            return None
        idle_ns = now_ns - self._loop_ns()
        return idle_ns / 1e9 if idle_ns > self._stall_ns else None

    def give_up(self, why: str) -> None:
        """Stop holding the worker ID from this thread: fence, and free what only we can free."""
        self.minter.fence_deadline_ns = -1
        self.stalled = True
        self.lost = LeaseLost(why)
        if not self.lease.expires:
            self.lease.abandon()
        self._on_event("loop_stalled", {"worker_id": self.lease.worker_id, "reason": why})

    def step(self) -> float | None:
        """One turn of the keeper: judge the minting loop, renew once, and decide how long
        to wait before the next turn (None: the keeper is done, its worker ID lost or given
        up). :meth:`run` calls it on the keeper's thread; the simulator calls this same step
        on its own schedule, so what runs there is what runs here."""
        stalled_s = self.loop_stalled_s()
        if stalled_s is not None:
            self.give_up(f"the minting loop has not turned for {stalled_s:.1f} s")
            return None
        try:
            self.renew_once()
        except LeaseLost as exc:
            self.lost = exc
            self.minter.fence_deadline_ns = -1
            self._on_event("lease_lost", {"worker_id": self.lease.worker_id, "reason": str(exc)})
            return None
        except SnowfenceError as exc:
            self.failures += 1
            self._on_event(
                "renewal_failed", {"worker_id": self.lease.worker_id, "reason": str(exc), "failures": self.failures}
            )
            return self._back_off()
        except Exception as exc:  # a bug must not silently stop renewals: log, retry
            self.failures += 1
            log.exception("lease keeper for worker %d failed", self.lease.worker_id)
            self._on_event(
                "renewal_failed",
                {"worker_id": self.lease.worker_id, "reason": repr(exc), "failures": self.failures},
            )
            return self._back_off()
        if self.failures:
            self._on_event("renewed", {"worker_id": self.lease.worker_id, "after_failures": self.failures})
            self.failures = 0
        elif self.last_renewal_latency_s is not None and self.last_renewal_latency_s * 1e9 > self.fence_ns / 4:
            # Succeeded, but a few more like it and the worker fences.
            self._on_event(
                "renewed_late",
                {"worker_id": self.lease.worker_id, "latency_s": round(self.last_renewal_latency_s, 3)},
            )
        self._backoff_s = self.retry_s
        return self._away(self.interval_s)

    def _back_off(self) -> float:
        wait_s = self._backoff_s
        self._backoff_s = min(wait_s * 2, self.interval_s / 2)
        return self._away(wait_s)

    def _away(self, seconds: float) -> float:
        """The keeper means to be away ``seconds``: a turn that comes much later than
        that was paused with the whole process (see :meth:`loop_stalled_s`)."""
        self._away_ns = int(seconds * 1e9)
        return seconds

    def run(self) -> None:
        while not self._stopping.is_set():
            wait_s = self.step()
            if wait_s is None:
                return
            self._sleep(wait_s)

    def _sleep(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def wake(self) -> None:
        """Renew and extend now rather than at the next interval."""
        self._wake.set()

    def stop(self, timeout_s: float | None = None) -> None:
        self._stopping.set()
        self._wake.set()
        if self.is_alive():
            self.join(timeout_s)
