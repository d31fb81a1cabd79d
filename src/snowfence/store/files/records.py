"""The file store's records, read and checked: the genesis record (``layout.json``, read
without a store for ``store.read_genesis``) and a worker ID's mark (:class:`Mark`, its checksum).
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import orjson

from ...errors import ConfigError, StateDirError
from ..genesis import Genesis

#: The fields of a mark of an older release (before genesis records), and of this one.
_MARK_FIELDS = ("holder", "reserved_until_ms", "reserved_until_unix_ms", "token")
_MARK_FIELDS_V2 = (*_MARK_FIELDS, "rev", "store", "layout")


def layout_path(state_dir: str | os.PathLike) -> Path:
    """The genesis record of the store in ``state_dir``."""
    return Path(state_dir) / "layout.json"


def read_genesis(state_dir: str | os.PathLike) -> Genesis | None:
    """The genesis record of the store in ``state_dir``, read without writing anything; None
    if there is none. Raises StateDirError if it is unreadable."""
    path = layout_path(state_dir)
    try:
        return Genesis.from_dict(orjson.loads(path.read_bytes()))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateDirError(f"{path} is unreadable: {exc.strerror or exc}") from None
    except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError, ConfigError) as exc:
        raise StateDirError(
            f"{path} is unreadable: {exc}; restore it from a backup, or move it out of the state directory "
            "and run `snowfence accept-restore --reason TEXT` with this node's settings, which records the "
            "layout anew and has claims wait out a quarantine"
        ) from None


def _mark_layout(path: Path) -> str | None:
    """The layout digest a mark file names (None: an older release's mark, or unreadable)."""
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return doc.get("layout") if isinstance(doc, dict) and isinstance(doc.get("layout"), str) else None


def mark_checksum(doc: dict) -> str:
    """The checksum a mark carries: CRC-32 of its other fields, canonically encoded."""
    fields = _MARK_FIELDS_V2 if "rev" in doc else _MARK_FIELDS
    canonical = orjson.dumps({k: doc.get(k) for k in fields}, option=orjson.OPT_SORT_KEYS)
    return f"crc32:{zlib.crc32(canonical):08x}"


@dataclass(frozen=True)
class Mark:
    reserved_until_ms: int
    token: int
    holder: str
    #: False for a mark written before marks carried a checksum.
    checked: bool = True
    #: Raised by one at every write: a copy put back has a lower one. 0 in older releases' marks.
    rev: int = 0
    #: The genesis store ID and the layout digest it was written under; None in older releases' marks.
    store: str | None = None
    layout: str | None = None
