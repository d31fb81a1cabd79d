"""The etcd store's round of the watermark (:class:`WatermarkRound`, a part of
:class:`~.store.EtcdStore`): every mark read, the record raised, the marks read again in the
same transaction (the rules are ``store/watermark.py``'s).
"""

from __future__ import annotations

import logging

import orjson

from ...errors import WatermarkRecordUnreadable
from ...etcd import keys
from ...etcd.client import etcd_call
from ...logs import event
from .. import watermark

log = logging.getLogger("snowfence.etcd")


class WatermarkRound:
    """The watermark record and its round, for :class:`~.store.EtcdStore`."""

    # -- the watermark (see watermark.py) ------------------------------------------------

    def watermark_key(self) -> str:
        return self.keys.watermark()

    def _watermark_floor(self, record_kv) -> int:
        """The millisecond a claim that read ``record_kv`` must not mint below: the record's,
        or the highest this node's journal saw or promised (a record deleted or restored
        older is not a watermark forgotten); for a record that is not ours to read, a
        quarantine from now (it may hide any watermark already answered)."""
        try:
            record = watermark.decode(record_kv[0][0] if record_kv else None)
        except ValueError as exc:
            quarantine = self.quarantine_ms()
            event(
                log,
                "watermark_record_unreadable",
                f"the watermark record {self.watermark_key()} is unreadable ({exc}); this claim mints nothing "
                f"for {quarantine} ms (quarantine)",
                level=logging.WARNING,
            )
            return self._now_ms() + quarantine
        if self.journal is None:
            return record
        self.journal.note_watermark(record)
        return max(record, self.journal.watermark_ms)

    def _floors(self, mark_kvs, claim_kvs, record_rev: int) -> list[watermark.Floor]:
        """Every mark of the cluster (all regions), as the watermark reads it. A mark that
        cannot be read has no floor (nothing is known of it)."""
        claims = {}
        for _, meta in claim_kvs:
            place = keys.place(meta.key, self.keys.claims())
            if place is not None:
                claims[place] = meta.create_revision
        floors = []
        for value, meta in mark_kvs:
            place = keys.place(meta.key, self.keys.marks())
            if place is None:
                continue
            claimed = claims.get(place)
            try:
                mark = orjson.loads(value)
                reserved = keys.mark_ms(mark, self.layout)
                floor_ms, released = mark.get("floor_ms"), mark.get("released") is True
                if floor_ms is not None and (type(floor_ms) is not int or floor_ms < 0):
                    floor_ms = None
            except (KeyError, TypeError, ValueError, AttributeError):
                reserved, floor_ms, released = self.layout.max_ms, None, False
            floors.append(
                watermark.Floor(
                    place[0],
                    place[1],
                    floor_ms,
                    reserved,
                    held=claimed is not None,
                    released=released,
                    saw_record=claimed is not None and claimed > record_rev,
                )
            )
        marked = {(f.region, f.worker_id) for f in floors}
        for place in claims:
            if place not in marked:
                # A claim without a mark (deleted by hand): its holder fences at its next
                # renewal; until then nothing is known of it.
                floors.append(watermark.Floor(place[0], place[1], None, self.layout.max_ms, held=True))
        return floors

    def watermark_round(self, now_ms: int, promised: int) -> int:
        """One round (see watermark.py): read every mark; raise the record to the lowest
        floor they allow; read them again in the same transaction as the raise. Returns
        the highest millisecond now promised (``promised`` when this round earned no more)."""
        client = self.client
        tx = client.transactions
        key = self.watermark_key()
        marks, claims = self.keys.marks(), self.keys.claims()
        reads = [tx.get(marks, keys.range_end(marks)), tx.get(claims, keys.range_end(claims))]
        _, (genesis_kv, mark_kvs, claim_kvs) = client.transaction(
            compare=[], success=[tx.get(self.layout_key()), *reads], failure=[]
        )
        skew = self.config.max_clock_skew_ms
        genesis = self._parse_genesis(genesis_kv[0][0]) if genesis_kv else None
        if not watermark.settled(genesis, self.layout, now_ms, skew):
            return promised
        floors = self._floors(mark_kvs, claim_kvs, 0)
        self.watermark_low = watermark.lowest(floors, now_ms, skew)
        self.watermark_floors = tuple(floors)
        wanted = watermark.candidate(floors, now_ms, skew)
        if wanted <= promised:
            return promised
        value = watermark.encode(wanted)
        ok, responses = client.transaction(
            compare=[tx.value(key) < value],
            success=[tx.put(key, value), tx.get(key), *reads],
            failure=[tx.get(key), *reads],
        )
        record = responses[1] if ok else responses[0]
        if not ok and not record:  # no record yet: create it
            ok, responses = client.transaction(
                compare=[tx.version(key) == 0],
                success=[tx.put(key, value), tx.get(key), *reads],
                failure=[tx.get(key), *reads],
            )
            record = responses[1] if ok else responses[0]
        if not record:
            return promised  # deleted in between: the next round writes it again
        record_value, record_meta = record[0]
        try:
            at = watermark.decode(record_value)
        except ValueError as exc:
            raise WatermarkRecordUnreadable(f"the watermark record {key} is unreadable ({exc})") from None
        if at < wanted:
            return promised
        mark_kvs, claim_kvs = responses[-2], responses[-1]
        floors = self._floors(mark_kvs, claim_kvs, record_meta.mod_revision)
        self.watermark_low = watermark.lowest(floors, now_ms, skew)
        if not watermark.holds(wanted, floors, now_ms, skew):
            return promised
        if self.journal is not None:
            self.journal.note_watermark(wanted)  # before it is answered: this node's claims never forget it
        return wanted

    watermark_round = etcd_call(watermark_round)
