"""`snowfence reserve --format uuid|base32` and `snowfence decode` reading those forms back:
the forms' text is checked bit by bit here (RFC 9562's fields, Python's own base-32), and
decode must print the same fields for an ID in any form."""

from __future__ import annotations

import io
import time
import uuid
from unittest import mock

import orjson
import pytest

from snowfence import cli
from snowfence.clients import Block
from snowfence.ids import DEFAULT_LAYOUT, Layout

SHARDED = Layout(time_bits=39, region_bits=3, worker_bits=7, sequence_bits=12, shard_bits=2)
SHARDED_FLAGS = ["--time-bits", "39", "--shard-bits", "2"]
ENDPOINT = ["--connect", "tcp://127.0.0.1:1"]


def run(argv, capsys, stdin: str | None = None):
    try:
        if stdin is None:
            status = cli.main(argv)
        else:
            with mock.patch("sys.stdin", io.StringIO(stdin)):
                status = cli.main(argv)
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, out, err


def crockford(id_: int) -> str:
    """Base32 of an ID, independently: Python's base-32 digits 0-9a-v, mapped to Crockford's."""
    digits = []
    for _ in range(13):
        digits.append("0123456789ABCDEFGHJKMNPQRSTVWXYZ"[id_ % 32])
        id_ //= 32
    return "".join(reversed(digits))


class FakeClient:
    """A 'node' of one layout that hands out the given blocks, in turn."""

    def __init__(self, layout: Layout, blocks: list[Block]):
        self._layout = layout
        self.blocks = list(blocks)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def status(self):
        return {"layout": self._layout.to_dict()}

    def layout(self):
        return self._layout

    def reserve(self, n, after=None):
        out, left = [], n
        while left and self.blocks:
            b = self.blocks.pop(0)
            take = min(b.count, left)
            out.append(Block(b.first, take))
            if take < b.count:
                self.blocks.insert(0, Block(b.first + take, b.count - take))
            left -= take
        return out


def now_ms(layout):
    return time.time_ns() // 1_000_000 - layout.epoch_ms


def node_blocks(layout):
    ms = now_ms(layout) - 2000
    return [Block(layout.compose(ms, 1, 3, 0), 5), Block(layout.compose(ms + 1, 2, 9, 10), 4)]


@pytest.fixture
def node(monkeypatch):
    def start(layout=DEFAULT_LAYOUT):
        blocks = node_blocks(layout)
        monkeypatch.setattr(cli.node, "open_client", lambda args: FakeClient(layout, blocks))
        return [i for b in blocks for i in b.range()]

    return start


@pytest.mark.parametrize("layout", [DEFAULT_LAYOUT, SHARDED], ids=["plain", "sharded"])
def test_reserve_format_uuid_prints_one_uuidv7_per_id_in_the_nodes_layout(layout, node, capsys):
    ids = node(layout)
    status, out, err = run(["reserve", str(len(ids)), "--format", "uuid", *ENDPOINT], capsys)
    assert status == 0 and not err
    lines = out.splitlines()
    assert len(lines) == len(ids) == len(set(lines))
    for id_, line in zip(ids, lines, strict=True):
        u = uuid.UUID(line)
        assert str(u) == line and u.version == 7 and u.variant == uuid.RFC_4122
        d = layout.decompose(id_)
        assert u.int >> 80 == d.unix_ms  # RFC 9562's unix_ts_ms is the ID's Unix millisecond
        assert u.int & ((1 << 62) - 1) == (d.shard << layout.time_shift) | (id_ & ((1 << layout.time_shift) - 1))
        assert layout.from_uuid(u) == id_
    if not layout.shard_bits:
        assert lines == sorted(lines)


def test_reserve_format_base32_prints_13_crockford_characters_per_id_in_order(node, capsys):
    ids = node()
    status, out, err = run(["reserve", str(len(ids)), "--format", "base32", *ENDPOINT], capsys)
    assert status == 0 and not err
    assert out.splitlines() == [crockford(i) for i in ids]
    assert out.splitlines() == sorted(out.splitlines())


def test_reserve_format_json_still_prints_ids_as_strings(node, capsys):
    ids = node()
    status, out, _ = run(["reserve", str(len(ids)), "--format", "json", *ENDPOINT], capsys)
    assert status == 0 and orjson.loads(out) == [str(i) for i in ids]


def test_reserve_refuses_an_unknown_format(capsys):
    status, out, err = run(["reserve", "3", "--format", "ulid", *ENDPOINT], capsys)
    assert status == 78 and not out and len(err.strip().splitlines()) == 1 and "uuid" in err and "base32" in err


@pytest.mark.parametrize("layout, flags", [(DEFAULT_LAYOUT, []), (SHARDED, SHARDED_FLAGS)], ids=["plain", "sharded"])
@pytest.mark.parametrize("json", [False, True], ids=["text", "json"])
def test_decode_reads_uuids_hex_and_base32_as_the_ids_they_stand_for(layout, flags, json, capsys):
    ids = [i for b in node_blocks(layout) for i in b.range()]
    extra = [*flags, *(["--json"] if json else [])]
    status, expected, err = run(["decode", *map(str, ids), *extra], capsys)
    assert status == 0 and not err and len(expected.splitlines()) == len(ids)
    uuids = [str(layout.to_uuid(i)) for i in ids]
    for form in (
        uuids,
        [u.upper() for u in uuids],
        [u.replace("-", "") for u in uuids],
        [crockford(i) for i in ids],
        [crockford(i).lower() for i in ids],
    ):
        status, out, err = run(["decode", *form, *extra], capsys)
        assert (status, out, err) == (0, expected, ""), form
    # From stdin too, as `reserve --format uuid` prints them, or as a JSON array.
    status, out, _ = run(["decode", *extra], capsys, "\n".join(uuids) + "\n")
    assert (status, out) == (0, expected)
    status, out, _ = run(["decode", "-", *extra], capsys, orjson.dumps([crockford(i) for i in ids]).decode())
    assert (status, out) == (0, expected)


def test_decode_reads_crockford_aliases_and_all_digits_as_decimal(capsys):
    id_ = DEFAULT_LAYOUT.compose(now_ms(DEFAULT_LAYOUT), 1, 1, 0)
    text = crockford(id_)
    assert "1" in text or "0" in text
    aliased = text.replace("1", "l").replace("0", "O")
    _, expected, _ = run(["decode", str(id_)], capsys)
    status, out, _ = run(["decode", aliased], capsys)
    assert (status, out) == (0, expected)
    # 13 digits: decimal, not base32.
    status, out, _ = run(["decode", "0000000004096"], capsys)
    assert status == 0 and out.startswith("4096  ") and "worker=1 sequence=0" in out


def test_decode_checks_a_uuids_id_as_it_checks_a_decimal_one(capsys):
    ms = now_ms(SHARDED) - 5000
    right = SHARDED.compose(ms, 2, 9, 0)
    wrong = (right & ((1 << SHARDED.shard_shift) - 1)) | (((SHARDED.shard_of(2, 9) + 1) % 4) << SHARDED.shard_shift)
    argv = ["decode", str(SHARDED.to_uuid(right)), str(SHARDED.to_uuid(wrong)), "--check", *SHARDED_FLAGS]
    status, out, err = run(argv, capsys)
    lines = out.splitlines()
    assert status == 1 and len(lines) == 2 and lines[0].startswith(f"{right}  ") and "INVALID" not in lines[0]
    assert lines[1].startswith(f"{wrong}  ") and "INVALID: shard" in lines[1] and "1 ID cannot be valid" in err


def test_decode_with_connect_reads_uuids_in_the_nodes_layout(node, capsys):
    ids = node(SHARDED)
    status, out, err = run(["decode", *(str(SHARDED.to_uuid(i)) for i in ids), "--json", *ENDPOINT], capsys)
    docs = [orjson.loads(line) for line in out.splitlines()]
    assert status == 0 and not err and [d["id"] for d in docs] == list(map(str, ids))
    assert all(d["flags"] == [] and "shard" in d for d in docs)
    # Without --connect the default layout reads them, and its tag is not theirs.
    status, out, err = run(["decode", str(SHARDED.to_uuid(ids[0]))], capsys)
    assert status == 1 and not out and "not a snowfence ID of this layout" in err and "layout tag" in err


GOOD = DEFAULT_LAYOUT.to_uuid(DEFAULT_LAYOUT.compose(1_000_000, 3, 5, 7))


@pytest.mark.parametrize(
    "bad, needle",
    [
        ("dde19362-f7f9-4467-8528-59cded0d8179", "version 4, not 7"),
        (str(GOOD).replace("-8000-", "-c000-"), "variant bits"),
        (str(GOOD).replace("-7dfd-", "-7dfe-"), "layout tag"),
        (str(GOOD)[:-9] + "100185007", "leaves zero"),
        ("00000000-0000-7dfd-8000-000000185007", "outside the layout's"),
        ("000000000000U", "'U' is not a Crockford base32 digit"),
        ("8ZZZZZZZZZZZZ", "above the largest ID"),
        ("0000-0000-000", "'-' is not a Crockford base32 digit"),
        ("019b76e9-ea40-7dfd-8000-00000018500", "is not a snowfence ID"),  # 35 characters
        ("{" + str(GOOD) + "}", "is not a snowfence ID"),
        ("urn:uuid:" + str(GOOD), "is not a snowfence ID"),
        ("99999999999999999999", "is not a snowfence ID"),
        ("-1", "is not a snowfence ID"),
    ],
)
def test_decode_refuses_a_bad_form_with_one_line_and_goes_on(bad, needle, capsys):
    good = DEFAULT_LAYOUT.compose(now_ms(DEFAULT_LAYOUT), 1, 1, 0)
    status, out, err = run(["decode", bad, str(good)], capsys)
    assert status == 1 and out.startswith(f"{good}  ") and len(out.splitlines()) == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("snowfence: ") and needle in lines[0], err
    assert "not a snowfence ID" in lines[0]


@pytest.mark.parametrize("command", ["decode", "serve"])
def test_the_shard_bits_help_gives_a_layout_the_command_takes(command, capsys, monkeypatch):
    # The help's own example of shard bits, as given, is a layout the command accepts.
    import re

    monkeypatch.setenv("COLUMNS", "400")  # no line breaks inside a flag
    status, out, _ = run([command, "--help"], capsys)
    assert status == 0
    text = " ".join(out.split())
    help_text = text[text.index("--shard-bits BITS ", text.index("--shard-bits BITS]") + 1) :]
    example = re.search(r"--shard-bits (\d+) --time-bits (\d+)", help_text)
    assert example, help_text[:300]
    shard, time_bits = example.groups()
    status, out, err = run(["decode", "--shard-bits", shard, "--time-bits", time_bits, str(1 << 40)], capsys)
    assert status == 0 and "shard=" in out, err


def test_shard_bits_alone_is_refused_with_the_widths_to_give_back(capsys):
    status, out, err = run(["decode", "--shard-bits", "3", "1"], capsys)
    assert status == 78 and not out and len(err.splitlines()) == 1, err
    assert "3+41+3+7+12=66" in err and "3 bits too many" in err and "time_bits 38" in err, err
