"""The JSON log format keeps every field an event carries."""

from __future__ import annotations

import io
import logging
import os

import orjson

from snowfence import logs


def test_json_keeps_fields_that_share_a_name_with_top_level_keys(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    logs.setup("info", "json", role="broker")
    try:
        log = logging.getLogger("snowfence.test")
        logs.event(log, "worker_connected", "worker slot 0 connected", slot=0, pid=4242, role="worker", level_=1)
    finally:
        logging.getLogger("snowfence").handlers[:] = []
    doc = orjson.loads(stream.getvalue().splitlines()[-1])
    assert doc["pid"] == os.getpid() and doc["role"] == "broker"  # the record's own
    assert doc["event"] == "worker_connected" and doc["slot"] == 0 and doc["level_"] == 1
    assert doc["fields"] == {"pid": 4242, "role": "worker"}  # the event's, not dropped
