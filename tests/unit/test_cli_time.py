"""`snowfence id-at` and the checks of `snowfence decode` (--check, or the node's layout with --connect)."""

from __future__ import annotations

import time

import orjson
import pytest

from snowfence import cli, verify
from snowfence.ids import DEFAULT_EPOCH_MS, Layout

SHARDED = Layout(time_bits=39, region_bits=3, worker_bits=7, sequence_bits=12, shard_bits=2)
SHARDED_FLAGS = ["--time-bits", "39", "--shard-bits", "2"]
MARCH = 1_772_323_200_000  # 2026-03-01T00:00:00Z


def run(argv, capsys):
    try:
        status = cli.main(argv)
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, out, err


def test_id_at_one_millisecond_prints_the_first_and_last_id_carrying_it(capsys):
    status, out, err = run(["id-at", "2026-03-01T00:00:00Z"], capsys)
    assert status == 0 and not err
    ms = MARCH - DEFAULT_EPOCH_MS
    first, last = out.split()[:2]
    assert (int(first), int(last)) == (ms << 22, ((ms + 1) << 22) - 1)
    assert len(out.splitlines()) == 1 and "2026-03-01T00:00:00.000Z" in out


def test_id_at_a_range_is_half_open_unless_closed(capsys):
    status, out, _ = run(["id-at", str(MARCH), str(MARCH + 1000), "--json"], capsys)
    (doc,) = [orjson.loads(line) for line in out.splitlines()]
    ms = MARCH - DEFAULT_EPOCH_MS
    assert status == 0 and doc["first"] == str(ms << 22) and doc["last"] == str(((ms + 1000) << 22) - 1)
    assert doc["end"] == "2026-03-01T00:00:00.999Z" and doc["shard"] == 0
    status, out, _ = run(["id-at", str(MARCH), str(MARCH + 1000), "--json", "--closed"], capsys)
    assert orjson.loads(out)["last"] == str(((ms + 1001) << 22) - 1)


def test_id_at_with_shard_bits_prints_one_range_per_shard(capsys):
    status, out, err = run(["id-at", "2026-03-01T00:00:00Z", *SHARDED_FLAGS], capsys)
    assert status == 0 and not err
    lines = out.splitlines()
    assert len(lines) == 4
    ms = MARCH - DEFAULT_EPOCH_MS
    for shard, line in enumerate(lines):
        first, last = map(int, line.split()[:2])
        assert f"shard={shard}" in line
        assert first == (shard << 61) | (ms << 22) and last == (shard << 61) | ((ms + 1) << 22) - 1
    status, out, _ = run(["id-at", "2026-03-01T00:00:00Z", *SHARDED_FLAGS, "--json"], capsys)
    docs = [orjson.loads(line) for line in out.splitlines()]
    assert [d["shard"] for d in docs] == [0, 1, 2, 3] and all(isinstance(d["first"], str) for d in docs)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["id-at", "2025-12-31T23:59:59Z"], "before the layout's epoch"),
        (["id-at", "2096-01-01T00:00:00Z"], "after the last millisecond"),
        (["id-at", "tomorrow"], "neither Unix milliseconds nor an ISO-8601 time"),
        (["id-at", "2026-03-01", "2026-02-01"], "holds no millisecond"),
        (["id-at", "2026-03-01", "2026-03-01"], "holds no millisecond"),
        (["id-at", "2026-03-01", "--time-bits", "39"], "sum to 63"),
        (["id-at", "2026-03-01", "--connect", "udp://127.0.0.1:5555"], "--connect"),
    ],
)
def test_id_at_refuses_bad_input_with_one_line_and_exit_78(argv, needle, capsys):
    status, out, err = run(argv, capsys)
    assert status == 78 and not out
    assert len(err.strip().splitlines()) == 1 and needle in err, err


def test_id_at_without_a_time_is_a_usage_error_exit_2(capsys):
    status, out, err = run(["id-at"], capsys)
    assert status == 2 and not out
    assert len(err.strip().splitlines()) == 1 and "TIME" in err, err


def _id(layout, ms, region=1, worker=3, seq=0, shard=None):
    id_ = layout.compose(ms, region, worker, seq)
    if shard is not None:
        id_ = (id_ & ((1 << layout.shard_shift) - 1)) | (shard << layout.shard_shift)
    return id_


def _now_ms(layout):
    return time.time_ns() // 1_000_000 - layout.epoch_ms


def test_decode_check_flags_ids_from_the_future_and_still_prints_them(capsys):
    L = Layout()
    good, future = _id(L, _now_ms(L) - 1000), _id(L, _now_ms(L) + verify.FUTURE_MARGIN_MS + 60_000)
    near = _id(L, _now_ms(L) + verify.FUTURE_MARGIN_MS - 60_000)  # within the margin
    status, out, err = run(["decode", str(good), str(future), str(near), "--check"], capsys)
    lines = out.splitlines()
    assert status == 1 and len(lines) == 3
    assert "INVALID" not in lines[0] and "INVALID" not in lines[2]
    assert lines[1].startswith(str(future)) and "INVALID: from the future" in lines[1]
    assert "1 ID cannot be valid" in err
    status, out, _ = run(["decode", str(good), str(future), "--check", "--json"], capsys)
    docs = [orjson.loads(line) for line in out.splitlines()]
    assert status == 1 and docs[0]["flags"] == [] and docs[1]["flags"][0].startswith("from the future")
    assert docs[1]["id"] == str(future)


def test_decode_check_flags_shard_bits_that_disagree_with_the_worker_ids_hash(capsys):
    ms = _now_ms(SHARDED) - 5000
    right = _id(SHARDED, ms, region=2, worker=9)
    wrong_shard = (SHARDED.shard_of(2, 9) + 1) % 4
    wrong = _id(SHARDED, ms, region=2, worker=9, shard=wrong_shard)
    status, out, _ = run(["decode", str(right), str(wrong), "--check", *SHARDED_FLAGS], capsys)
    lines = out.splitlines()
    assert status == 1 and "INVALID" not in lines[0]
    assert f"INVALID: shard {wrong_shard}, but region 2 worker 9 is shard {SHARDED.shard_of(2, 9)}" in lines[1]
    status, out, _ = run(["decode", str(right), "--check", *SHARDED_FLAGS], capsys)
    assert status == 0 and "INVALID" not in out


def test_decode_without_a_check_keeps_its_output_and_exit_status(capsys):
    L = Layout()
    future = _id(L, _now_ms(L) + 10 * verify.FUTURE_MARGIN_MS)
    status, out, err = run(["decode", str(future)], capsys)
    assert status == 0 and not err and "INVALID" not in out and out.startswith(f"{future}  ")
    status, out, _ = run(["decode", str(future), "--json"], capsys)
    assert status == 0 and "flags" not in orjson.loads(out)


class FakeClient:
    """What `_layout_for` asks of a client; the layout the 'node' has."""

    def __init__(self, layout):
        self.layout = layout

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def status(self):
        return {"layout": self.layout.to_dict()}


def test_decode_and_id_at_take_the_layout_from_the_node_with_connect(capsys, monkeypatch):
    monkeypatch.setattr(cli.node, "open_client", lambda args: FakeClient(SHARDED))
    ms = _now_ms(SHARDED) - 5000
    wrong = _id(SHARDED, ms, region=0, worker=1, shard=(SHARDED.shard_of(0, 1) + 1) % 4)
    # The node's layout: shard bits, and the checks are on without --check.
    status, out, _ = run(["decode", str(wrong), "--connect", "tcp://127.0.0.1:1"], capsys)
    assert status == 1 and "shard=" in out and "INVALID: shard" in out
    status, out, _ = run(["id-at", "2026-03-01T00:00:00Z", "--connect", "tcp://127.0.0.1:1"], capsys)
    assert status == 0 and len(out.splitlines()) == 4
