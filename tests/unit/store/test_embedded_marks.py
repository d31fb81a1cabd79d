"""The embedded store's mark files as input: what reads back exactly, and what
is refused as untrustworthy (the worker ID is then passed over, never guessed)."""

from __future__ import annotations

import orjson
import pytest
from filerig import file_store

from snowfence.errors import WorkerIdUnusable
from snowfence.ids import DEFAULT_LAYOUT
from snowfence.store.files import Mark, mark_checksum

EPOCH = DEFAULT_LAYOUT.epoch_ms


def at_epoch(layout) -> dict:
    """A store whose clock reads its layout's epoch and whose nodes never mint or reserve
    ahead of it (so a new one waits nothing out): its first marks are at 0, and these tests
    count milliseconds from there."""
    return {"max_ahead_ms": 0, "window_ms": 0, "wall_ns": lambda: layout.epoch_ms * 1_000_000}


def store(tmp_path):
    s = file_store(tmp_path, DEFAULT_LAYOUT, 0, **at_epoch(DEFAULT_LAYOUT))
    s.check_layout(DEFAULT_LAYOUT)
    return s


def legacy(ms=500, token=3, holder="h"):
    """A mark as written before marks carried a checksum."""
    return {"reserved_until_ms": ms, "reserved_until_unix_ms": ms + EPOCH, "token": token, "holder": holder}


def checked(**fields):
    doc = legacy(**fields)
    doc["checksum"] = mark_checksum(doc)
    return doc


def test_a_written_mark_reads_back_exactly(tmp_path):
    s = store(tmp_path)
    s.write_mark(4, 1234, 7, "node-a:99:slot0")
    assert s.mark(4) == Mark(
        1234, 7, "node-a:99:slot0", checked=True, store=s.genesis.store_id, layout=DEFAULT_LAYOUT.digest()
    )
    assert s.read_mark(4) == (1234, 7)


def test_a_worker_id_without_a_mark_file_starts_from_nothing(tmp_path):
    s = store(tmp_path)
    assert s.mark(5) is None and s.read_mark(5) == (0, 0)


def test_a_mark_from_before_checksums_is_read_and_flagged_unchecked(tmp_path):
    s = store(tmp_path)
    s.paths(2)[1].write_bytes(orjson.dumps(legacy()))
    assert s.mark(2) == Mark(500, 3, "h", checked=False)


def test_the_checksum_covers_the_fields_whatever_their_order():
    doc = legacy()
    assert mark_checksum(doc) == mark_checksum(dict(reversed(list(doc.items()))))
    assert mark_checksum(doc) != mark_checksum({**doc, "token": 4})


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json",
        b"[1, 2]",
        orjson.dumps({**legacy(), "reserved_until_ms": "500"}),
        orjson.dumps({**legacy(), "reserved_until_ms": 500.0}),
        orjson.dumps({**legacy(), "reserved_until_ms": True}),
        orjson.dumps({**legacy(), "reserved_until_ms": -1, "reserved_until_unix_ms": EPOCH - 1}),
        orjson.dumps({**legacy(), "token": "3"}),
        orjson.dumps({**legacy(), "token": -1}),
        orjson.dumps({k: v for k, v in legacy().items() if k != "token"}),
        orjson.dumps({k: v for k, v in legacy().items() if k != "holder"}),
        orjson.dumps({**legacy(), "holder": 5}),
        orjson.dumps({**legacy(), "extra": 1}),
        orjson.dumps({**legacy(), "reserved_until_unix_ms": EPOCH + 499}),  # the two times disagree
        orjson.dumps({**checked(), "token": 4}),  # edited after it was written
        orjson.dumps({**checked(), "checksum": "crc32:00000000"}),
        orjson.dumps({**checked(), "extra": 1}),
    ],
)
def test_a_mark_that_cannot_be_trusted_is_refused_with_its_path(tmp_path, content):
    s = store(tmp_path)
    path = s.paths(1)[1]
    path.write_bytes(content)
    with pytest.raises(WorkerIdUnusable) as info:
        s.mark(1)
    assert str(path) in str(info.value)
    with pytest.raises(WorkerIdUnusable):
        s.read_mark(1)
