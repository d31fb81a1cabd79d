"""An operator's acceptance of an etcd store that went back (:class:`Restore`, a part of
:class:`~.store.EtcdStore`): a new restore record in the genesis, and a quarantine.
"""

from __future__ import annotations

import dataclasses

import orjson

from ...errors import EtcdUnavailable
from ...etcd import keys
from ...etcd.client import etcd_call
from ..genesis import Genesis, restore_base


class Restore:
    """``accept-restore`` on the etcd store, for :class:`~.store.EtcdStore`."""

    def accept_restore(self, reason: str, *, dry_run: bool = False) -> Genesis:
        """An operator's acknowledgement that this store went back (restored from a snapshot,
        its keys deleted) on purpose: a new restore record in the genesis (written anew, with
        this layout, if it is gone), and a quarantine every claim of it waits out. Nodes that
        refused take it at their next claim, with their journal's floors; it is accepted once.
        With ``dry_run``, the genesis it would write, nothing written; ``found_genesis`` says
        whether a layout record was there."""
        client = self.client
        tx = client.transactions
        key = self.layout_key()
        marks_prefix = self.keys.marks()
        now_unix_ms = self._wall_ns() // 1_000_000
        for _ in range(5):
            _, (layout_kv, mark_kvs) = client.transaction(
                compare=[], success=[tx.get(key), tx.get(marks_prefix, keys.range_end(marks_prefix))], failure=[]
            )
            marks = []
            for value, meta in mark_kvs:
                place = keys.place(meta.key, marks_prefix)
                if place is None:
                    continue
                try:
                    digest = orjson.loads(value).get("layout")
                except (ValueError, AttributeError):
                    digest = None
                marks.append((place[0], place[1], digest, f"the mark {meta.key.decode()}"))
            recorded = self._parse_genesis(layout_kv[0][0]) if layout_kv else None
            self.found_genesis = recorded is not None
            compare = [tx.mod(key) == layout_kv[0][1].mod_revision] if layout_kv else [tx.create(key) == 0]
            genesis, used = restore_base(
                recorded,
                marks,
                self.layout,
                now_unix_ms=now_unix_ms,
                window_ms=self.window_ms,
                where=f"cluster {self.config.cluster!r}",
            )
            genesis = dataclasses.replace(genesis, used_keys=True)  # the used/ keys stay: still read
            self.genesis = genesis  # quarantine_ms() counts its window
            self._read_claims()  # and the region claim's, which outlives the cluster's keys
            genesis = genesis.restored(
                reason,
                now_unix_ms=now_unix_ms,
                window_ms=self.window_ms,
                used=used,
                quarantine_until_ms=self._now_ms() + self.quarantine_ms(),
            )
            if dry_run:
                return genesis
            ok, _ = client.transaction(
                compare=compare, success=[tx.put(key, orjson.dumps(genesis.to_dict()))], failure=[]
            )
            if ok:
                self.genesis = genesis
                return genesis
        raise EtcdUnavailable(f"the layout record {key} kept changing under this command")

    accept_restore = etcd_call(accept_restore)
