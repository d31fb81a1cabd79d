"""Worker-ID leases: the handle, the store that hands them out, and the keeper.

A :class:`Lease` is the right to mint as one worker ID. It carries the fencing
token of its claim and the time high-water mark (``reserved_until_ms``): the
highest millisecond any owner of this worker ID may have used. Its verbs are
``refresh`` (renew the lease), ``extend`` (persist a higher mark, guarded by the
token) and ``release`` (lower the mark to the last millisecond used, then free
the worker ID).

The :class:`Keeper` thread renews and extends ahead of use and moves the
minter's ``fence_deadline_ns`` and ``reserved_until_ms`` only after the store
confirmed; the minter never waits for it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import ClockUnsafe, LeaseLost, SnowfenceError, StateDirError
from ..ids import Layout
from ..logs import event
from .durable import write_atomic
from .minter import NEVER_NS, Minter

log = logging.getLogger("snowfence.lease")


class Lease:
    """One claimed worker ID. Subclasses talk to their store."""

    #: Whether the lease can lapse (etcd) or is held by the kernel (file lock).
    expires = False

    def __init__(self, region: int, worker_id: int, token: int, mark_ms: int) -> None:
        self.region = region
        self.worker_id = worker_id
        #: Fencing token: increases with every claim of this worker ID.
        self.token = token
        #: The mark found when claiming: no ID of ours may carry this ms or an earlier one.
        self.claimed_mark_ms = mark_ms
        #: The highest millisecond we have persisted as ours to use.
        self.reserved_until_ms = mark_ms
        self.released = False

    def refresh(self) -> None:
        """Renew the lease; raises :class:`LeaseLost` if it is gone."""

    def confirm(self) -> None:
        """Check that the claim is still ours and the mark the one we wrote (raises
        :class:`LeaseLost` if not): a renewal that extends nothing confirms instead."""

    def extend(self, until_ms: int) -> None:
        """Persist ``until_ms`` as the mark, only while we still hold the worker ID."""
        raise NotImplementedError

    def release(self, last_used_ms: int) -> None:
        """Lower the mark to ``last_used_ms`` and free the worker ID."""
        raise NotImplementedError

    def abandon(self) -> None:
        """Drop local resources of a lease that is already lost; writes nothing."""
        self.released = True

    def remaining_s(self) -> float | None:
        """Seconds until the lease lapses without renewal; None if it cannot lapse."""
        return None

    def describe(self) -> dict:
        return {
            "worker_id": self.worker_id,
            "token": self.token,
            "reserved_until_ms": self.reserved_until_ms,
        }

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc) -> None:
        if not self.released:
            self.abandon()


class Store:
    """Hands out leases on worker IDs of one region."""

    #: Skip free worker IDs whose mark is implausibly far ahead of our clock. In
    #: etcd mode another host's clock may be wrong; on one host the mark came from
    #: our own clock, so the right answer is to wait for it, not to hop.
    skips_far_marks = False

    #: The store's genesis record, once :meth:`check_layout` has read (or written) it.
    genesis = None

    #: Set (to why) while no majority of the cluster vouches for this node's clock (and
    #: until its broker first judged it): no worker ID is claimed and no new store is
    #: created until it does. Every claim counts on the clock-skew bound: a worker ID of
    #: unknown state is quarantined from this clock's "now", and a mark that an etcd
    #: restore no journal saw took back is passed only by the wall clock's advance.
    claim_veto: str | None = None

    def refuse_if_vetoed(self) -> None:
        if self.claim_veto:
            raise ClockUnsafe(f"claiming no worker ID while this node's clock is not vouched for: {self.claim_veto}")

    @property
    def passed_over(self) -> dict[int, str]:
        """Worker IDs the last claims passed over because their state cannot be
        trusted, and why (shown in status)."""
        return self.__dict__.setdefault("_passed_over", {})

    def check_layout(self, layout: Layout) -> None:
        """Record the layout if none is recorded; raise LayoutMismatch if it differs."""
        raise NotImplementedError

    def try_claim(
        self, worker_id: int, holder: str, max_mark_ms: int | None, now_ms: int | None = None
    ) -> Lease | None:
        """Claim ``worker_id`` if it is free (and its mark <= ``max_mark_ms``, if given).

        ``now_ms``: the claimer's wall clock, from which a worker ID of unknown
        state is quarantined."""
        raise NotImplementedError

    def candidates(self) -> Iterator[int]:
        """Worker IDs worth trying, in order."""
        raise NotImplementedError

    def unheld(self, up_to: int | None = None) -> int:
        """How many of the region's worker IDs no live holder has now, less those the last
        claim pass passed over: what a claim could find (the broker's own worker ID keeps
        one of them free for workers; see ``workers/inline.py``). ``up_to``: counting may
        stop there (a region can have a million worker IDs; the rule needs to know 0, 1, 2)."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {}

    def close(self) -> None:
        pass

    def claim(self, preferred: int | None, holder: str, now_ms: int, max_ahead_ms: int) -> Lease | None:
        """Claim the preferred worker ID if free, else any free one; None if none is.

        Where the store skips far marks, a first pass passes over worker IDs whose
        mark is more than ``max_ahead_ms`` ahead of ``now_ms``; only if that finds
        nothing does a second pass take them.
        """
        self.refuse_if_vetoed()
        if self.genesis is None:
            self.check_layout(self.layout)  # a claim needs to know which store this is
        order = list(self.candidates())
        if preferred is not None and preferred in order:
            order.remove(preferred)
            order.insert(0, preferred)
        # First a worker ID whose mark has passed (serve at once), then one whose
        # mark is a plausible wait away, and only then any.
        passes = [now_ms, now_ms + max_ahead_ms, None] if self.skips_far_marks else [None]
        for limit in passes:
            for worker_id in order:
                try:
                    lease = self.try_claim(worker_id, holder, limit, now_ms)
                except StateDirError as exc:
                    if self.passed_over.get(worker_id) != str(exc):
                        event(
                            log,
                            "worker_id_passed_over",
                            f"passing over worker ID {worker_id}: {exc}",
                            level=logging.WARNING,
                            worker_id=worker_id,
                            reason=str(exc),
                        )
                    self.passed_over[worker_id] = str(exc)
                    continue
                self.passed_over.pop(worker_id, None)
                if lease is not None:
                    return lease
        return None


def exclusivity_lost(lease: Lease, why: str) -> LeaseLost:
    """A holder found its claim or mark no longer its own: logged (and counted from the
    log's event), and the error that fences its minter."""
    event(
        log,
        "lease_exclusivity_lost",
        f"worker ID {lease.worker_id}: {why}; the lease is lost",
        level=logging.ERROR,
        worker_id=lease.worker_id,
        token=lease.token,
        reason=why,
    )
    return LeaseLost(f"worker ID {lease.worker_id}: {why}")


def embedded_namespace(region: int) -> str:
    """Where embedded mode's preference files of ``region`` live, under last-worker-id/."""
    return f"embedded-r{region}"


def node_key(bind: str) -> str:
    """A file name for a node, stable across its restarts: from its bind endpoint."""
    safe = re.sub(r"[^A-Za-z0-9.]+", "-", bind).strip("-")[:48]
    return f"{safe}-{hashlib.sha256(bind.encode()).hexdigest()[:8]}"


#: The names of the files that record tokens: a worker slot's, and the broker's own.
RECORD_NAMES = ("slot-*", "broker")


class PreferenceFile:
    """The worker ID a worker slot claimed last, so a restart asks for it again.

    One file per node and slot: ``last-worker-id/<namespace>/<node>/slot-N``, and
    ``.../<node>/broker`` for the broker's own worker ID (see ``workers/inline.py``).
    Its first line is ``<worker ID> <token>`` of the last claim; the lines after
    it keep the highest token this slot ever claimed each other worker ID with.
    Those tokens are a record of how far each worker ID's token has gone: a mark
    whose token is below a recorded one was rolled back.
    """

    def __init__(self, state_dir: str | os.PathLike, namespace: str, name: str) -> None:
        self.path = Path(state_dir) / "last-worker-id" / namespace / name

    @staticmethod
    def parse(text: str) -> list[tuple[int, int | None]]:
        """``[(worker_id, token), ...]``, the last claim first; a token is None in
        files that predate tokens. A line that does not read is left out, not the
        file: the tokens on the other lines still guard against a rolled-back mark.
        Nothing that reads gives ``[]``: no preference, no recorded token."""
        out = []
        for line in text.splitlines():
            parts = line.split()
            try:
                if not 1 <= len(parts) <= 2:
                    raise ValueError
                worker_id = int(parts[0])
                token = int(parts[1]) if len(parts) == 2 else None
            except ValueError:
                continue
            if worker_id < 0 or (token is not None and token < 0):
                continue
            out.append((worker_id, token))
        return out

    def _entries(self) -> list[tuple[int, int | None]]:
        try:
            return self.parse(self.path.read_text())
        except (OSError, UnicodeDecodeError):
            return []

    def read(self) -> int | None:
        entries = self._entries()
        return entries[0][0] if entries else None

    def write(self, worker_id: int, token: int | None = None) -> None:
        tokens = {w: t for w, t in self._entries() if t is not None}
        if token is not None:
            tokens[worker_id] = max(token, tokens.get(worker_id, token))
        lines = [f"{worker_id} {tokens[worker_id]}" if worker_id in tokens else f"{worker_id}"]
        lines += [f"{w} {t}" for w, t in sorted(tokens.items()) if w != worker_id]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Durable (the directory fsynced too): its tokens are a guard, kept across a crash.
            write_atomic(self.path, ("\n".join(lines) + "\n").encode())
        except OSError as exc:  # losing a preference costs churn and weakens the rollback check, no more
            log.warning("cannot record last worker ID in %s: %s", self.path, exc)

    @staticmethod
    def recorded_tokens(state_dir: str | os.PathLike, namespace: str) -> dict[int, int]:
        """The highest token recorded per worker ID by any node's slots in ``namespace``,
        its brokers' own included: a worker ID a broker held last is guarded as any other."""
        out: dict[int, int] = {}
        base = Path(state_dir) / "last-worker-id" / namespace
        try:
            files = [p for pattern in RECORD_NAMES for p in base.rglob(pattern) if p.suffix != ".tmp"]
        except OSError:
            return out
        for path in files:
            try:
                entries = PreferenceFile.parse(path.read_text())
            except (OSError, UnicodeDecodeError):
                continue
            for worker_id, token in entries:
                if token is not None and token > out.get(worker_id, -1):
                    out[worker_id] = token
        return out


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

    def run(self) -> None:
        backoff = self.retry_s
        while not self._stopping.is_set():
            stalled_s = self.loop_stalled_s()
            if stalled_s is not None:
                self.give_up(f"the minting loop has not turned for {stalled_s:.1f} s")
                return
            try:
                self.renew_once()
            except LeaseLost as exc:
                self.lost = exc
                self.minter.fence_deadline_ns = -1
                self._on_event("lease_lost", {"worker_id": self.lease.worker_id, "reason": str(exc)})
                return
            except SnowfenceError as exc:
                self.failures += 1
                self._on_event(
                    "renewal_failed", {"worker_id": self.lease.worker_id, "reason": str(exc), "failures": self.failures}
                )
                self._sleep(backoff)
                backoff = min(backoff * 2, self.interval_s / 2)
                continue
            except Exception as exc:  # a bug must not silently stop renewals: log, retry
                self.failures += 1
                log.exception("lease keeper for worker %d failed", self.lease.worker_id)
                self._on_event(
                    "renewal_failed",
                    {"worker_id": self.lease.worker_id, "reason": repr(exc), "failures": self.failures},
                )
                self._sleep(backoff)
                backoff = min(backoff * 2, self.interval_s / 2)
                continue
            if self.failures:
                self._on_event("renewed", {"worker_id": self.lease.worker_id, "after_failures": self.failures})
                self.failures = 0
            elif self.last_renewal_latency_s is not None and self.last_renewal_latency_s * 1e9 > self.fence_ns / 4:
                # Succeeded, but a few more like it and the worker fences.
                self._on_event(
                    "renewed_late",
                    {"worker_id": self.lease.worker_id, "latency_s": round(self.last_renewal_latency_s, 3)},
                )
            backoff = self.retry_s
            self._sleep(self.interval_s)

    def _sleep(self, seconds: float) -> None:
        self._away_ns = int(seconds * 1e9)
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
