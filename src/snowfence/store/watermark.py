"""The watermark: a millisecond W with a promise about the past.

**No ID carrying a millisecond below W is minted, by any holder of the cluster, after
the reply that carried W**, whatever fails. (IDs minted before it may still be on their
way to their clients, and a client may hold blocks it reserved earlier: those are the
reader's own in-flight work.)

Three kinds of worker ID could mint below W later, and each is held to it:

- **held** ones: every holder publishes a *floor* with each extension of its mark, a
  millisecond its minter never mints below again (``Minter.raise_floor`` keeps an idle
  minter's floor up with the clock, on the minting thread; the keeper publishes
  ``last_ms``). W may not pass the lowest floor;
- **let go without a release** (a holder that crashed, was cut off, or whose loop
  stalled): a mint already under way may still complete, at or above its last floor and
  never past its reservation. Its floor binds W until the wall clock, less the skew
  bound, has passed that reservation. A released mark binds nothing;
- **never used, quarantined, or claimed later**: every claim reads the cluster's
  *watermark record* in its own transaction (or under the store's lock) and its minter
  starts at or above it.

An answer is earned in one step that orders against every claim: the answerer raises
the record to its candidate W first (it only ever rises) and, in the same transaction
(etcd) or afterwards under each region's lock (files), reads every mark. A claim ordered
before the raise is among the marks read (held, with the floor its claim wrote); one
ordered after it read the record. W is promised only if every binding mark's floor is at
or above it, or its claim saw the raised record. Once promised, W stays true for ever:
floors only rise, and the record only rises. So answers come from the last promise, and
rounds run in the background (``broker/watermark.py``), off every minting path.

Pure: the stores read the marks (:meth:`snowfence.store.Store.watermark_round`); this
module decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: The record's value in etcd: milliseconds since the epoch, zero-padded, so that etcd's
#: byte-wise comparison of values (``value < candidate``) is the numbers' comparison.
RECORD_WIDTH = 20


def encode(ms: int) -> bytes:
    return b"%0*d" % (RECORD_WIDTH, ms)


def decode(value: bytes | None) -> int:
    """The record's millisecond (0: no record). Raises ValueError for anything else."""
    if value is None:
        return 0
    if len(value) != RECORD_WIDTH or not value.isdigit():
        raise ValueError(f"not {RECORD_WIDTH} decimal digits: {value[:40]!r}")
    return int(value)


@dataclass(frozen=True, slots=True)
class Floor:
    """One worker ID's mark as the watermark reads it."""

    region: int
    worker_id: int
    #: What its holder promised never to mint below (ms since the epoch); None when the
    #: mark carries no floor (written by an older release): nothing is known.
    floor_ms: int | None
    #: Its reservation: nobody mints under this mark past it.
    reserved_until_ms: int
    #: A live holder has it (etcd: its claim key exists; files: the kernel's witness is taken).
    held: bool
    #: Its last holder released it (and so mints nothing more under it).
    released: bool = False
    #: Its claim read the record after the candidate was written there (so its minter starts
    #: at or above the candidate, whatever floor the claim wrote).
    saw_record: bool = False


def binds(floor: Floor, now_ms: int, skew_ms: int) -> bool:
    """Whether anyone may still mint under this mark, so that its floor bounds W."""
    if floor.held:
        return True
    if floor.released:
        return False
    # Let go without a release: a mint under way completes at or below the reservation,
    # and the holder's clock may be behind ours by up to the skew bound.
    return now_ms - skew_ms <= floor.reserved_until_ms


def lowest(floors: Iterable[Floor], now_ms: int, skew_ms: int) -> Floor | None:
    """The binding mark that holds W back most (one without a floor first); None if none binds."""
    low = None
    for floor in floors:
        if binds(floor, now_ms, skew_ms):
            if floor.floor_ms is None:
                return floor
            if low is None or floor.floor_ms < low.floor_ms:
                low = floor
    return low


def candidate(floors: Iterable[Floor], now_ms: int, skew_ms: int) -> int:
    """The highest W the marks allow: the lowest binding floor, and never above the wall
    clock less the skew bound (a claimer whose clock is behind ours never waits for it).
    A binding mark without a floor allows nothing (0)."""
    low = lowest(floors, now_ms, skew_ms)
    if low is None:
        return max(now_ms - skew_ms, 0)
    if low.floor_ms is None:
        return 0
    return max(min(low.floor_ms, now_ms - skew_ms), 0)


def pools(floors: Iterable[Floor], now_ms: int, size: int, regions: Iterable[int] = ()) -> dict[int, dict]:
    """Each region's worker-ID pool from the marks a round read: of ``size`` worker IDs,
    ``held`` (a live holder), ``quarantined`` (no holder, its reservation still ahead of
    ``now_ms``: a new owner mints nothing before it has passed) and ``free`` (the rest).
    ``regions``: regions to show even with no mark."""
    out = {region: {"held": 0, "quarantined": 0, "free": size} for region in regions}
    for floor in floors:
        pool = out.setdefault(floor.region, {"held": 0, "quarantined": 0, "free": size})
        if floor.held:
            pool["held"] += 1
        elif floor.reserved_until_ms > now_ms:
            pool["quarantined"] += 1
        else:
            continue
        pool["free"] -= 1
    return dict(sorted(out.items()))


def settled(genesis, layout, now_ms: int, skew_ms: int) -> bool:
    """Whether the store is old enough for a promise. A store made anew (first start, a wipe,
    an accepted restore) may have had holders it no longer shows, still minting under
    reservations it forgot until the store's window (or quarantine) has passed; a store
    with no genesis record promises nothing."""
    if genesis is None:
        return False
    quiet_ms = max(genesis.quarantine_until_ms, genesis.created_unix_ms - layout.epoch_ms + genesis.window_ms)
    return now_ms - skew_ms > quiet_ms


def holds(candidate_ms: int, floors: Iterable[Floor], now_ms: int, skew_ms: int) -> bool:
    """Whether ``candidate_ms`` may be promised, given the marks read after the record was
    raised to it: every binding mark's floor is at or above it, or its claim saw the record."""
    for floor in floors:
        if not binds(floor, now_ms, skew_ms) or floor.saw_record:
            continue
        if floor.floor_ms is None or floor.floor_ms < candidate_ms:
            return False
    return True
