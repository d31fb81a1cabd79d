"""The store's genesis record: which store this is, written together with its layout.

Every store keeps one record of its layout (etcd ``<prefix>layout``, embedded
``layout.json``). Besides the layout's fields it carries::

    store_id             128 random bits, hex: every mark of this store carries it
    created_unix_ms      when the record was first written
    window_ms            the longest reservation window any node of this store uses
                         (a node with a longer one raises it before it claims)
    used                 {"<region>": [worker IDs]}: every worker ID ever claimed here
    quarantine_until_ms  no claim of this store mints at or below this millisecond
    restore              the last restore an operator accepted: {"id", "at_unix_ms", "reason"}
    legacy               upgraded from a layout-only record of an older release
    used_keys            (etcd, optional) first claims are recorded in keys of their own

``used`` is what lets a store prove that a worker ID without a mark was never
used: a claim writes the worker ID's mark, and its first claim adds it here, in
one transaction (etcd) or before the mark (embedded). Absent from ``used`` and
markless: never used. In ``used`` and markless: unknown, which costs a
quarantine, never a guess.

On etcd, a record with ``used_keys`` has its first claims recorded in a key per
worker ID (``used/<region>/<worker>``, written in the claim's own transaction)
rather than in this record, which every first claim of the cluster would otherwise
rewrite: a fleet's cold start would be a thousand claimers contending for one key.
``used`` then keeps what was recorded before (and what an accepted restore found);
a worker ID is used if either says so. Releases that do not know the field refuse
the record, so none of them can claim on a store whose first uses it does not read.

Releases before genesis records wrote the layout's fields alone, and their
reader refuses a record with any other field: an older node cannot start on a
store a newer one has upgraded (see docs/RELIABILITY.md, "Mixed versions").
"""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass, field

from ..errors import ConfigError, LayoutMismatch
from ..ids import Layout

LAYOUT_FIELDS = ("epoch_ms", "time_bits", "region_bits", "worker_bits", "sequence_bits", "shard_bits")
_GENESIS_FIELDS = ("store_id", "created_unix_ms", "window_ms", "used", "quarantine_until_ms", "restore", "legacy")
#: Fields a record has only when set (an older record of this release reads the same without them).
_OPTIONAL_FIELDS = ("used_keys",)


def new_store_id() -> str:
    return secrets.token_hex(16)


@dataclass(frozen=True)
class Restore:
    """An operator's acceptance of a store that went back (`snowfence accept-restore`)."""

    id: str
    at_unix_ms: int
    reason: str = ""

    def to_dict(self) -> dict:
        return {"id": self.id, "at_unix_ms": self.at_unix_ms, "reason": self.reason}


@dataclass(frozen=True)
class Genesis:
    layout: Layout
    #: None only for a layout-only record of an older release, before it is upgraded.
    store_id: str | None
    created_unix_ms: int = 0
    window_ms: int = 0
    used: dict[int, frozenset[int]] = field(default_factory=dict)
    quarantine_until_ms: int = 0
    restore: Restore | None = None
    legacy: bool = False
    #: etcd: first claims are recorded in ``used/<region>/<worker>`` keys, not in ``used``.
    used_keys: bool = False

    @property
    def upgraded(self) -> bool:
        return self.store_id is not None

    def is_used(self, region: int, worker_id: int) -> bool:
        return worker_id in self.used.get(region, ())

    def using(self, region: int, worker_id: int) -> Genesis:
        """This record with ``worker_id`` of ``region`` marked as used."""
        used = dict(self.used)
        used[region] = frozenset({*used.get(region, ()), worker_id})
        return dataclasses.replace(self, used=used)

    def restored(
        self, reason: str, *, now_unix_ms: int, window_ms: int, used: dict, quarantine_until_ms: int
    ) -> Genesis:
        """This record after an operator accepted the store as it is: a new restore record,
        the worker IDs ever used, and a quarantine every claim waits out."""
        return dataclasses.replace(
            self,
            window_ms=max(self.window_ms, window_ms),
            used={r: frozenset(ws) for r, ws in used.items()},
            restore=Restore(new_store_id(), now_unix_ms, reason),
            quarantine_until_ms=max(self.quarantine_until_ms, quarantine_until_ms),
        )

    def to_dict(self) -> dict:
        doc = self.layout.to_dict()
        if self.store_id is None:
            return doc
        doc.update(
            store_id=self.store_id,
            created_unix_ms=self.created_unix_ms,
            window_ms=self.window_ms,
            used={str(r): sorted(ws) for r, ws in sorted(self.used.items())},
            quarantine_until_ms=self.quarantine_until_ms,
            restore=self.restore.to_dict() if self.restore else None,
            legacy=self.legacy,
        )
        if self.used_keys:
            doc["used_keys"] = True
        return doc

    @classmethod
    def from_dict(cls, doc: object) -> Genesis:
        """The record a store holds; raises ConfigError if it is not one we could have written."""
        if not isinstance(doc, dict):
            raise ConfigError(f"a layout record is a JSON object, not {type(doc).__name__}")
        known = (*_GENESIS_FIELDS, *_OPTIONAL_FIELDS)
        layout = Layout.from_dict({k: v for k, v in doc.items() if k in LAYOUT_FIELDS or k not in known})
        if not any(k in doc for k in _GENESIS_FIELDS):
            return cls(layout, None)  # an older release's record: the layout alone
        missing = [k for k in _GENESIS_FIELDS if k not in doc]
        if missing:
            raise ConfigError(f"genesis fields missing: {', '.join(missing)}")
        store_id, created, window, quarantine = (
            doc["store_id"], doc["created_unix_ms"], doc["window_ms"], doc["quarantine_until_ms"]
        )  # fmt: skip
        if not (isinstance(store_id, str) and len(store_id) == 32 and all(c in "0123456789abcdef" for c in store_id)):
            raise ConfigError(f"store_id is {store_id!r}, not 32 hex digits")
        for name, value in (("created_unix_ms", created), ("window_ms", window), ("quarantine_until_ms", quarantine)):
            if type(value) is not int or value < 0:
                raise ConfigError(f"{name} is {value!r}, not a whole number >= 0")
        if type(doc["legacy"]) is not bool:
            raise ConfigError(f"legacy is {doc['legacy']!r}, not true or false")
        used = doc["used"]
        if not isinstance(used, dict):
            raise ConfigError("used is not an object")
        parsed: dict[int, frozenset[int]] = {}
        for region, workers in used.items():
            if not (isinstance(region, str) and region.isascii() and region.isdigit()):
                raise ConfigError(f"used: region {region!r} is not a number")
            ok = isinstance(workers, list) and all(type(w) is int and 0 <= w <= layout.max_worker for w in workers)
            if not ok:
                raise ConfigError(f"used: region {region}: {workers!r} is not a list of worker IDs")
            parsed[int(region)] = frozenset(workers)
        restore = doc["restore"]
        if restore is not None:
            if (
                not isinstance(restore, dict)
                or set(restore) != {"id", "at_unix_ms", "reason"}
                or not isinstance(restore["id"], str)
                or not restore["id"]
                or type(restore["at_unix_ms"]) is not int
                or not isinstance(restore["reason"], str)
            ):
                raise ConfigError(f"restore is {restore!r}, not an accepted restore")
            restore = Restore(restore["id"], restore["at_unix_ms"], restore["reason"])
        used_keys = doc.get("used_keys", False)
        if used_keys is not True and "used_keys" in doc:
            raise ConfigError(f"used_keys is {used_keys!r}, not true (or absent)")
        return cls(layout, store_id, created, window, parsed, quarantine, restore, doc["legacy"], used_keys)

    @classmethod
    def create(
        cls, layout: Layout, *, now_unix_ms: int, window_ms: int, quarantine_until_ms: int = 0, used_keys: bool = False
    ) -> Genesis:
        return cls(layout, new_store_id(), now_unix_ms, window_ms, {}, quarantine_until_ms, None, False, used_keys)


# -- what both stores decide alike --------------------------------------------------------


def legacy_genesis(layout: Layout, now_unix_ms: int, used: dict[int, set[int]]) -> Genesis:
    """The genesis an older release's layout record is upgraded to: every worker ID with a
    mark was used, and marks without a store ID are its own (legacy). The stores differ
    only in where they read ``used`` from (mark files, or mark keys)."""
    return dataclasses.replace(
        Genesis.create(layout, now_unix_ms=now_unix_ms, window_ms=0),
        used={r: frozenset(ws) for r, ws in used.items()},
        legacy=True,
    )


def restore_base(
    recorded: Genesis | None,
    marks: list[tuple[int, int, str | None, str]],
    layout: Layout,
    *,
    now_unix_ms: int,
    window_ms: int,
    where: str,
) -> tuple[Genesis, dict[int, set[int]]]:
    """What an accepted restore starts from, for either store: the genesis to add the
    restore to (the recorded one; a new one if it is gone; an older release's replaced),
    and every worker ID used (the record's and each mark's, which its claims quarantine).

    ``marks``: ``(region, worker ID, the layout digest the mark names or None, what the
    mark is called)``. A mark or a record of another layout is refused (LayoutMismatch):
    the record it was minted with is to be put back instead. Nothing is written here."""
    used: dict[int, set[int]] = {}
    for region, worker_id, digest, name in marks:
        if digest is not None and digest != layout.digest():
            raise LayoutMismatch(
                f"{name} was written under another layout: put the layout record it was minted with back "
                "instead of accepting this one"
            )
        used.setdefault(region, set()).add(worker_id)
    if recorded is None:
        genesis = Genesis.create(layout, now_unix_ms=now_unix_ms, window_ms=window_ms)
    elif recorded.layout != layout:
        raise LayoutMismatch(
            f"{where} records layout [{recorded.layout.describe()}], not the configured [{layout.describe()}]"
        )
    elif not recorded.upgraded:
        genesis = dataclasses.replace(Genesis.create(layout, now_unix_ms=now_unix_ms, window_ms=window_ms), legacy=True)
    else:
        genesis = recorded
    for region, workers in genesis.used.items():
        used.setdefault(region, set()).update(workers)
    return genesis, used
