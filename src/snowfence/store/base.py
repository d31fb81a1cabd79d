"""Worker-ID leases: the handle and the store that hands them out.

A :class:`Lease` is the right to mint as one worker ID. It carries the fencing
token of its claim and the time high-water mark (``reserved_until_ms``): the
highest millisecond any owner of this worker ID may have used. Its verbs are
``refresh`` (renew the lease), ``extend`` (persist a higher mark, guarded by the
token) and ``release`` (lower the mark to the last millisecond used, then free
the worker ID).

The keeper (``workers/keeper.py``) renews and extends them ahead of use.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from ..errors import ClockUnsafe, LeaseLost, StateDirError
from ..ids import Layout
from ..logs import event

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
        #: What the holder promises never to mint below (ms since the epoch), published with
        #: every extension of the mark: the keeper sets it from the minter just before.
        #: A claim starts it above the mark it found.
        self.floor_ms = mark_ms + 1
        #: The cluster's watermark record as the claim read it (ms since the epoch; 0: none):
        #: a watermark already answered that this holder must not mint below (see watermark.py).
        self.watermark_ms = 0
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

    #: The mark that held the last watermark round back most (``watermark.Floor``; None:
    #: none bound it), for STATUS: which worker ID an operator looks at when it lags.
    watermark_low = None
    #: Every mark the last watermark round read (``watermark.Floor``s), for the worker-ID
    #: pool the node's metrics show: held, quarantined (mark ahead of the clock), free.
    #: None until a round has read them (a store too new for a promise reads none).
    watermark_floors: tuple | None = None

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
        one of them free for workers; see ``broker/own.py``). ``up_to``: counting may
        stop there (a region can have a million worker IDs; the rule needs to know 0, 1, 2)."""
        raise NotImplementedError

    def watermark_round(self, now_ms: int, promised: int) -> int:
        """One round of the cluster's watermark (``store/watermark.py``): the highest
        millisecond now promised (``promised`` when this round earned no more)."""
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
