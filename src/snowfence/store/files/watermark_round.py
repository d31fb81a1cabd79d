"""The file store's round of the watermark (:class:`WatermarkRound`, a part of
:class:`~.store.FileStore`): the holders' floor files, every region read under its lock,
the record raised (the rules are ``store/watermark.py``'s).
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from ...errors import StateDirError, WatermarkRecordUnreadable
from .. import watermark
from ..durable import _tmp_name, write_atomic
from .locks import RegionLock

#: Up to this many worker IDs per region, a watermark round asks the kernel's witnesses about
#: every one; beyond it (wide worker fields), only those with files in the region directory.
WITNESS_PROBE_LIMIT = 4096


class WatermarkRound:
    """The watermark record, the holders' floors and the round, for :class:`~.store.FileStore`."""

    def _watermark_path(self) -> Path:
        return self.root / "watermark"

    def read_watermark(self) -> int:
        """The watermark record's millisecond (0: none). Raises WatermarkRecordUnreadable."""
        path = self._watermark_path()
        try:
            return watermark.decode(path.read_bytes())
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise StateDirError(f"cannot read {path}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise WatermarkRecordUnreadable(f"the watermark record {path} is unreadable ({exc})") from None

    def _watermark_floor(self, worker_id: int) -> int:
        """What a claim must not mint below for the watermark: the record's millisecond, or,
        for a record that is not ours to read, a quarantine from now (it may hide any
        watermark already answered)."""
        try:
            record = self.read_watermark()
        except WatermarkRecordUnreadable as exc:
            return self._unknown_floor(worker_id, None, str(exc))
        # The highest this node's journal saw or promised: a state directory wiped (its record
        # with it) is not a watermark forgotten.
        self.journal.note_watermark(record)
        return max(record, self.journal.watermark_ms)

    def _floor_path(self, worker_id: int, region_dir: Path | None = None) -> Path:
        return (self.dir if region_dir is None else region_dir) / f"worker-{worker_id}.floor"

    def write_floor(self, worker_id: int, floor_ms: int, token: int, *, released: bool = False) -> None:
        """What the holder of ``worker_id`` never mints below, or that it let go. Renamed into
        place but not fsynced: after a crash of the host no holder is left to keep it."""
        path = self._floor_path(worker_id)
        tmp = _tmp_name(path)
        tmp.write_bytes(orjson.dumps({"floor_ms": floor_ms, "token": token, "released": released}))
        os.replace(tmp, path)

    def _region_floors(self, region: int, region_dir: Path) -> list[watermark.Floor]:
        """Every worker ID of a region as the watermark reads it (under the region's lock):
        held if the kernel's witness is taken; its reservation from its mark, its floor from
        its floor file (nothing known of either: none)."""
        floors = []
        bound = self._bound_names()
        try:
            present = {entry.name for entry in os.scandir(region_dir)}
        except OSError:
            present = None  # read each file, as it comes
        if self.layout.max_worker < WITNESS_PROBE_LIMIT:
            worker_ids = range(self.layout.max_worker + 1)  # every one: a holder's files may be gone
        else:  # too many to probe each second: those with files (a holder wiped out fences within a renewal)
            worker_ids = sorted(
                {int(p.stem.split("-")[1]) for p in region_dir.glob("worker-*.*") if p.stem[7:].isdigit()}
            )
        for worker_id in worker_ids:
            if bound is not None:
                held = not bound.isdisjoint(self.witness_names(worker_id, region))
            else:
                witnesses = self._bind_witnesses(worker_id, region)
                held = witnesses is None
                for witness in witnesses or ():
                    witness.close()
            mark_path = region_dir / f"worker-{worker_id}.mark"
            floor_path = self._floor_path(worker_id, region_dir)
            if present is not None and not held and mark_path.name not in present and floor_path.name not in present:
                continue  # never used here, or its state removed with no live holder
            try:
                reserved = orjson.loads(mark_path.read_bytes())["reserved_until_ms"]
                if type(reserved) is not int:
                    raise TypeError
                has_mark = True
            except FileNotFoundError:
                reserved, has_mark = -1, False
            except (OSError, ValueError, KeyError, TypeError):
                reserved, has_mark = self.layout.max_ms, True
            try:
                doc = orjson.loads(floor_path.read_bytes())
                floor_ms, released = doc["floor_ms"], doc.get("released") is True
                if type(floor_ms) is not int:
                    raise TypeError
            except FileNotFoundError:
                floor_ms, released = None, False
            except (OSError, ValueError, KeyError, TypeError):
                floor_ms, released = None, False
            if not held and not has_mark and floor_ms is None:
                continue  # never used here, or its state removed with no live holder
            floors.append(watermark.Floor(region, worker_id, floor_ms, reserved, held=held, released=released))
        return floors

    def _region_dirs(self) -> list[tuple[int, Path]]:
        out = []
        try:
            for path in (self.root / "regions").iterdir():
                if path.name.isdigit() and 0 <= int(path.name) <= self.layout.max_region:
                    out.append((int(path.name), path))
        except OSError:
            pass
        return sorted(out)

    def watermark_round(self, now_ms: int, promised: int) -> int:
        """One round (see watermark.py): read every worker ID's floor; raise the record to
        the lowest they allow (under the state directory's lock, durably); then read them
        again under each region's lock, which every claim takes to read the record. One host
        has one clock: no skew. Returns the highest millisecond now promised."""
        if not watermark.settled(self.read_genesis(), self.layout, now_ms, 0):
            return promised
        regions = self._region_dirs()
        floors = [f for region, path in regions for f in self._region_floors(region, path)]
        self.watermark_low = watermark.lowest(floors, now_ms, 0)
        self.watermark_floors = tuple(floors)
        wanted = watermark.candidate(floors, now_ms, 0)
        if wanted <= promised:
            return promised
        with self.root_lock():
            if self.read_watermark() < wanted:
                write_atomic(self._watermark_path(), watermark.encode(wanted))
        floors = []
        for region, path in self._region_dirs():
            with RegionLock(path):
                floors.extend(self._region_floors(region, path))
        self.watermark_low = watermark.lowest(floors, now_ms, 0)
        if not watermark.holds(wanted, floors, now_ms, 0):
            return promised
        self.journal.note_watermark(wanted)  # before it is answered: this node's claims never forget it
        return wanted
