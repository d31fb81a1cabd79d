"""``snowfence verify``: each check trips on a planted problem and stays silent on a clean dump; every format
reads the same IDs; exit statuses; bad input is one clear line."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from unittest import mock

import numpy as np
import orjson
import pytest
from blockimport import blocking_env

from snowfence import cli, verify
from snowfence.ids import DEFAULT_LAYOUT as L
from snowfence.ids import Layout

NOW_MS = int(time.time() * 1000) - L.epoch_ms - 60_000  # a minute ago, in ms since the epoch


def dump(count: int = 3000, worker_ids: int = 3, layout: Layout = L, ms: int | None = None) -> list[int]:
    """A clean dump: blocks of 100 IDs from each worker ID in turn, each worker ID's clock advancing."""
    ms = NOW_MS if ms is None else ms
    ids = []
    for i in range(count):
        block, seq = divmod(i, 100)
        slot = block % worker_ids
        ids.append(layout.compose(ms + block // worker_ids + (worker_ids - slot), slot % 8, slot // 8, seq))
    return ids


def write(path, ids, fmt: str = "binary"):
    if fmt == "binary":
        np.array(ids, dtype="<i8").tofile(path)
    elif fmt == "text":
        path.write_text("\n".join(map(str, ids)) + "\n")
    elif fmt == "json":
        path.write_bytes(orjson.dumps([str(i) for i in ids]))
    return path


def main(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        return exc.code


def run(capsys, *argv, stdin: bytes | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        fake = mock.Mock()
        fake.buffer = io.BytesIO(stdin)
        fake.isatty.return_value = False
        with mock.patch("sys.stdin", fake):
            status = main(["verify", *argv])
    else:
        status = main(["verify", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def summary(capsys, *argv, stdin: bytes | None = None) -> tuple[int, dict]:
    status, out, err = run(capsys, *argv, "--json", stdin=stdin)
    assert not err, err
    return status, orjson.loads(out)


# -- a clean dump ------------------------------------------------------------------------------------------------


def test_a_clean_dump_is_ok_with_exit_0(tmp_path, capsys):
    ids = dump()
    status, s = summary(capsys, str(write(tmp_path / "d.bin", ids)))
    assert status == 0 and s["ok"]
    assert s["ids"] == s["distinct"] == len(ids)
    assert s["duplicates"]["count"] == s["invalid"]["count"] == s["out_of_order"]["count"] == 0
    assert s["worker_ids"]["count"] == 3
    assert sorted(w["ids"] for w in s["worker_ids"]["ids"]) == [1000, 1000, 1000]
    first, last = min(L.decompose(i).unix_ms for i in ids), max(L.decompose(i).unix_ms for i in ids)
    assert (s["time_span"]["first_unix_ms"], s["time_span"]["last_unix_ms"]) == (first, last)
    status, out, err = run(capsys, str(tmp_path / "d.bin"))
    assert status == 0 and out.splitlines()[-1] == "OK" and "IDs read: 3,000" in out and not err


def test_an_empty_dump_is_clean(tmp_path, capsys):
    (tmp_path / "empty").write_bytes(b"")
    status, s = summary(capsys, str(tmp_path / "empty"))
    assert status == 0 and s["ids"] == 0 and s["time_span"] is None


# -- each check --------------------------------------------------------------------------------------------------


def test_duplicates_are_counted_with_examples(tmp_path, capsys):
    ids = dump()
    ids[2000] = ids[1999]  # next to its original: a duplicate, and not out of order
    ids.append(ids[5])
    ids.append(ids[5])
    status, s = summary(capsys, str(write(tmp_path / "d.bin", ids)), "--no-order")
    assert status == 1 and not s["ok"]
    assert s["duplicates"]["count"] == 3 and s["duplicates"]["ids"] == 2
    assert s["distinct"] == len(ids) - 3
    shown = {e["id"]: e["copies"] for e in s["duplicates"]["examples"]}
    assert shown == {str(ids[5]): 3, str(ids[1999]): 2}
    status, out, _ = run(capsys, str(tmp_path / "d.bin"), "--no-order")
    assert "duplicates: 3 extra copies of 2 IDs" in out and f"{ids[5]} (" in out and "x3" in out
    assert out.splitlines()[-1] == "PROBLEMS FOUND"


def test_duplicates_across_inputs(tmp_path, capsys):
    ids = dump()
    a, b = write(tmp_path / "a.bin", ids[:2000]), write(tmp_path / "b.bin", ids[1999:])
    status, s = summary(capsys, str(a), str(b))
    assert status == 1 and s["duplicates"]["count"] == 1 and s["duplicates"]["examples"][0]["id"] == str(ids[1999])


def test_negative_and_over_63_bit_ids_are_invalid(tmp_path, capsys):
    ids = dump()
    raw = np.array(ids, dtype="<i8")
    raw[10] = -7
    raw[20] = np.int64(-(1 << 63))  # 2^63 as unsigned: bit 63 set
    raw.tofile(tmp_path / "d.bin")
    status, s = summary(capsys, str(tmp_path / "d.bin"))
    assert status == 1 and s["invalid"]["count"] == 2 and s["invalid"]["not_63_bit"] == 2
    assert [e["position"] for e in s["invalid"]["examples"]] == [11, 21]
    assert s["out_of_order"]["count"] == 0  # the IDs around them are still in order
    (tmp_path / "d.txt").write_text(f"{ids[0]}\n-5\n{1 << 63}\n{ids[1]}\n{10**25}\n")
    status, s = summary(capsys, str(tmp_path / "d.txt"))
    assert status == 1 and s["invalid"]["not_63_bit"] == 3 and s["ids"] == 5
    assert s["duplicates"]["count"] == 0 and s["distinct"] == 2  # 2^63 and 10^25 both read as -2^63: not duplicates


def test_ids_from_the_future_are_invalid_beyond_the_margin(tmp_path, capsys):
    ids = dump()
    day = 86_400_000
    ahead = L.compose(NOW_MS + 60_000 + 2 * day, 0, 0, 0)  # two days ahead of now
    near = L.compose(NOW_MS + 60_000 + 600_000, 0, 1, 0)  # ten minutes ahead
    path = write(tmp_path / "d.bin", [*ids, ahead, near])
    status, s = summary(capsys, str(path), "--no-order")  # by default, a day ahead
    assert status == 1 and s["invalid"]["future"] == 1 and s["invalid"]["examples"][0]["id"] == str(ahead)
    status, s = summary(capsys, str(path), "--no-order", "--future-margin", "60")
    assert status == 1 and s["invalid"]["future"] == 2
    status, s = summary(capsys, str(path), "--no-order", "--future-margin", str(3 * 86_400))
    assert status == 0 and s["invalid"]["count"] == 0


def test_ids_before_since_are_invalid(tmp_path, capsys):
    ids = dump()
    path = write(tmp_path / "d.bin", ids)
    first_ms = min(L.decompose(i).unix_ms for i in ids)
    status, s = summary(capsys, str(path), "--since", str(first_ms))
    assert status == 0 and s["invalid"]["count"] == 0
    status, s = summary(capsys, str(path), "--since", str(first_ms + 1))
    early = sum(1 for i in ids if L.decompose(i).unix_ms == first_ms)
    assert status == 1 and s["invalid"]["before_since"] == early > 0


def test_a_shard_field_that_disagrees_with_the_worker_id_is_invalid(tmp_path, capsys):
    layout = Layout(time_bits=37, shard_bits=4)
    flags = ("--time-bits", "37", "--shard-bits", "4")
    ids = dump(layout=layout)
    status, s = summary(capsys, str(write(tmp_path / "clean.bin", ids)), *flags)
    assert status == 0 and s["invalid"]["count"] == 0
    d = layout.decompose(ids[7])
    wrong = ((d.shard + 1) % 16) << layout.shard_shift | (ids[7] & ((1 << layout.shard_shift) - 1))
    status, s = summary(capsys, str(write(tmp_path / "bad.bin", [*ids, wrong])), *flags, "--no-order")
    assert status == 1 and s["invalid"]["shard"] == 1 and s["invalid"]["examples"][0]["id"] == str(wrong)
    # Read with the default layout, the shard bits are far-future milliseconds.
    status, s = summary(capsys, str(tmp_path / "clean.bin"))
    assert status == 1 and s["invalid"]["future"] > 0


def test_an_id_lower_than_the_previous_of_its_worker_id_is_out_of_order(tmp_path, capsys):
    ids = dump()
    ids[1500], ids[1501] = ids[1501], ids[1500]  # two neighbours of one worker ID swapped
    path = write(tmp_path / "d.bin", ids)
    status, s = summary(capsys, str(path))
    assert status == 1 and s["out_of_order"]["count"] == 1 and s["duplicates"]["count"] == 0
    (e,) = s["out_of_order"]["examples"]
    assert (e["position"], e["id"], e["after"]) == (1502, str(ids[1501]), str(ids[1500]))
    status, s = summary(capsys, str(path), "--no-order")
    assert status == 0 and s["out_of_order"] is None
    status, out, _ = run(capsys, str(path), "--no-order")
    assert "out of order: not checked (--no-order)" in out


def test_other_worker_ids_interleaved_are_not_out_of_order(tmp_path, capsys):
    # Worker ID 1's IDs are lower than worker ID 0's (its clock is behind) and arrive between them.
    hi = [L.compose(NOW_MS + 50, 0, 0, s) for s in range(4)]
    lo = [L.compose(NOW_MS, 0, 1, s) for s in range(4)]
    mixed = [x for pair in zip(hi, lo, strict=True) for x in pair]
    status, s = summary(capsys, str(write(tmp_path / "d.bin", mixed)))
    assert status == 0 and s["out_of_order"]["count"] == 0
    status, s = summary(capsys, str(write(tmp_path / "d2.bin", [*mixed, lo[0] - 1])))
    assert status == 1 and s["out_of_order"]["count"] == 1


def test_order_is_checked_across_chunks_and_not_across_inputs(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(verify, "CHUNK_IDS", 64)
    ids = dump()
    status, s = summary(capsys, str(write(tmp_path / "clean.bin", ids)))
    assert status == 0
    ids[639], ids[640] = ids[640], ids[639]  # the last ID of the 10th chunk and the first of the 11th
    status, s = summary(capsys, str(write(tmp_path / "d.bin", ids)))
    assert status == 1 and s["out_of_order"]["count"] == 1 and s["out_of_order"]["examples"][0]["position"] == 641
    later, earlier = write(tmp_path / "later.bin", dump()[1500:]), write(tmp_path / "earlier.bin", dump()[:1500])
    status, s = summary(capsys, str(later), str(earlier))
    assert status == 0, s  # two receivers' dumps: each is in order


def test_ids_outside_from_to_are_reported(tmp_path, capsys):
    ids = dump()
    path = write(tmp_path / "d.bin", ids)
    times = sorted(L.decompose(i).unix_ms for i in ids)
    status, s = summary(capsys, str(path), "--from", str(times[0]), "--to", str(times[-1] + 1))
    assert status == 0 and s["outside_range"]["count"] == 0
    status, s = summary(capsys, str(path), "--from", str(times[0] + 1), "--to", str(times[-1]))
    expected = sum(1 for t in times if t < times[0] + 1 or t >= times[-1])
    assert status == 1 and s["outside_range"]["count"] == expected > 0
    iso = "2026-01-01T00:00:00Z"
    status, s = summary(capsys, str(path), "--to", iso)
    assert status == 1 and s["outside_range"]["count"] == len(ids) and s["outside_range"]["to"].startswith(iso[:19])


# -- formats -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["binary", "text", "json"])
def test_every_format_reads_the_same_ids_by_name_and_by_detection(tmp_path, capsys, fmt):
    ids = dump()
    ids[100] = ids[99]
    path = write(tmp_path / f"d.{fmt}", ids, fmt)
    for flag in ("auto", fmt):
        status, s = summary(capsys, str(path), "--format", flag)
        assert status == 1 and s["ids"] == len(ids) and s["duplicates"]["count"] == 1
        assert s["inputs"] == [{"name": str(path), "format": fmt, "ids": len(ids)}]
        assert s["duplicates"]["examples"][0]["id"] == str(ids[99])


@pytest.mark.parametrize("engine", ["numpy", "plain"])
@pytest.mark.parametrize("fmt", ["uuid", "base32"])
def test_the_uuid_and_base32_dumps_reserve_writes_are_read_by_name_and_by_detection(
    tmp_path, capsys, monkeypatch, fmt, engine
):
    if engine == "plain":
        monkeypatch.setattr(verify, "_numpy", lambda: None)
    from snowfence.cli.reserve import _uuid_writer, _write_base32
    from snowfence.clients.core import Block

    monkeypatch.setattr(verify, "TEXT_CHUNK", 1000)  # words cut across reads
    ids = dump()
    ids[100] = ids[99]
    out = io.BytesIO()
    writer = _uuid_writer(L) if fmt == "uuid" else _write_base32
    for i in ids:  # as `snowfence reserve --format uuid|base32` writes them, one block at a time
        writer(out, Block(i, 1), False)
    path = tmp_path / f"d.{fmt}"
    path.write_bytes(out.getvalue())
    for flag in ("auto", fmt):
        status, s = summary(capsys, str(path), "--format", flag)
        assert status == 1 and s["ids"] == len(ids) and s["duplicates"]["count"] == 1, s
        assert s["inputs"] == [{"name": str(path), "format": fmt, "ids": len(ids)}]
        assert s["duplicates"]["examples"][0]["id"] == str(ids[99])
    # A word that is not one: its line, and what it was read as.
    lines = out.getvalue().splitlines()
    lines[2000] = lines[2000][:-1] + b"U"
    path.write_bytes(b"\n".join(lines) + b"\n")
    status, out_text, err = run(capsys, str(path))
    assert status == 78 and not out_text and err.count("\n") == 1, err
    assert f"{path}: line 2001: " in err and f"(read as {fmt}; see --format)" in err, err


def test_uuids_of_another_layout_are_refused_by_name(tmp_path, capsys):
    other = Layout(epoch_ms=L.epoch_ms, time_bits=40, region_bits=4, worker_bits=7, sequence_bits=12)
    (tmp_path / "u.txt").write_text("".join(f"{other.to_uuid(i)}\n" for i in dump(count=10, layout=other)))
    status, _, err = run(capsys, str(tmp_path / "u.txt"))
    assert status == 78 and "line 1:" in err and "(read as uuid" in err, err


def test_json_of_numbers_and_text_with_several_ids_per_line(tmp_path, capsys):
    ids = dump(count=10)
    (tmp_path / "n.json").write_text(" [ " + ", ".join(map(str, ids)) + " ]\n")
    (tmp_path / "t.txt").write_text(" ".join(map(str, ids[:5])) + "\r\n\t" + "  ".join(map(str, ids[5:])))
    for name in ("n.json", "t.txt"):
        status, s = summary(capsys, str(tmp_path / name))
        assert status == 0 and s["ids"] == s["distinct"] == 10, name


def test_text_parsing_is_exact_over_chunk_boundaries(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(verify, "TEXT_CHUNK", 37)
    values = [0, 1, 9, 10, 123456789012345678, (1 << 63) - 1, 10**18, 999999999999999999] * 3000
    (tmp_path / "v.txt").write_text("\n".join(map(str, values)) + "\n")  # past the 64 KiB read to detect the format
    parts = verify._read(np, verify._open(str(tmp_path / "v.txt"), []), "text", L)
    assert np.concatenate(parts).tolist() == values


def test_blocks_format_expands_first_count_pairs(tmp_path, capsys):
    first = L.compose(NOW_MS, 0, 0, 0)
    other = L.compose(NOW_MS, 0, 1, 0)
    (tmp_path / "b.txt").write_text(f"{first} 100\n{other} 50\n")
    status, s = summary(capsys, str(tmp_path / "b.txt"), "--format", "blocks")
    assert status == 0 and s["ids"] == 150 and s["worker_ids"]["count"] == 2
    (tmp_path / "o.txt").write_text(f"{first} 100\n{first + 99} 2\n")
    status, s = summary(capsys, str(tmp_path / "o.txt"), "--format", "blocks")
    assert status == 1 and s["duplicates"]["count"] == 1 and s["duplicates"]["examples"][0]["id"] == str(first + 99)
    (tmp_path / "odd.txt").write_text(f"{first} 100\n{other}\n")
    status, _, err = run(capsys, str(tmp_path / "odd.txt"), "--format", "blocks")
    assert status == 78 and "odd number" in err


@pytest.mark.parametrize("fmt", ["binary", "text", "json"])
def test_stdin_with_dash_and_with_no_file(tmp_path, capsys, fmt):
    ids = dump()
    data = write(tmp_path / "d", ids, fmt).read_bytes()
    for argv in (["-"], []):
        status, s = summary(capsys, *argv, stdin=data)
        assert (
            status == 0 and s["ids"] == len(ids) and s["inputs"][0] == {"name": "<stdin>", "format": fmt, "ids": 3000}
        )


# -- bad usage and bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, fmt, needle",
    [
        (b"123\n45x6\n", "text", "line 2: '45x6': not a decimal ID"),
        (b"123 12-3\n", "text", "a minus sign inside a number"),
        (b"123 - 4\n", "text", "a minus sign without a number"),
        (b'{"ids": [1]}', "json", "starts with '['"),
        (b'["1", "2"', "json", "not a JSON array"),
        (b"[1, 2.5]", "json", "not a decimal ID"),
        (b"\x00\x01\x02", "auto", "3 bytes is not a whole number of 8-byte binary IDs"),
        (b"1 2 3", "binary", "5 bytes is not a whole number"),
        (b"[1, 2]", "text", "not a decimal ID"),
    ],
)
@pytest.mark.parametrize("engine", ["numpy", "plain"])
def test_input_that_cannot_be_read_exits_78_with_one_line(tmp_path, capsys, monkeypatch, engine, content, fmt, needle):
    if engine == "plain":
        monkeypatch.setattr(verify, "_numpy", lambda: None)
    (tmp_path / "bad").write_bytes(content)
    status, out, err = run(capsys, str(tmp_path / "bad"), "--format", fmt)
    assert status == 78 and not out
    assert len(err.splitlines()) == 1 and needle in err and str(tmp_path / "bad") in err, err


def test_a_missing_or_unreadable_file_is_one_line_and_exit_78_not_problems_found(tmp_path, capsys):
    # 1 means "problems found": an input that cannot be read is a bad argument, as --help says.
    status, out, err = run(capsys, str(tmp_path / "nope.bin"))
    assert status == 78 and not out and err.count("\n") == 1 and "nope.bin" in err and "No such file" in err
    status, out, err = run(capsys, str(tmp_path))
    assert status == 78 and err.count("\n") == 1 and "directory" in err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--since", "yesterday"], "--since 'yesterday'"),
        (["--from", "2026-12-02", "--to", "2026-12-01"], "--from must be before --to"),
        (["--examples", "-1"], "--examples"),
        (["--future-margin", "-5"], "--future-margin"),
        (["--format", "xml"], "invalid choice"),
        (["--time-bits", "40"], "widths must sum to 63"),
        (["-", "-"], "stdin (-) given twice"),
    ],
)
def test_bad_usage_exits_78(tmp_path, capsys, argv, needle):
    path = write(tmp_path / "d.bin", dump(count=10))
    status, out, err = run(capsys, *argv, stdin=b"") if argv[0] == "-" else run(capsys, str(path), *argv)
    assert status == 78 and len(err.splitlines()) == 1 and needle in err, err


def test_no_file_and_a_terminal_on_stdin_is_a_usage_error(capsys):
    tty = mock.Mock()
    tty.isatty.return_value = True
    with mock.patch("sys.stdin", tty):
        status = cli.main(["verify"])
    assert status == 78 and "give FILEs" in capsys.readouterr().err


def test_without_numpy_verify_checks_in_plain_python_with_the_same_summary(tmp_path, capsys):
    ids = dump(count=500)
    ids[300] = ids[10]  # a duplicate
    ids[7], ids[8] = ids[8], ids[7]  # out of order
    path = write(tmp_path / "d.bin", ids)
    env = blocking_env(tmp_path, "numpy")
    p = subprocess.run(
        [sys.executable, "-m", "snowfence", "verify", str(path), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert p.returncode == 1 and not p.stderr, p.stderr
    status, with_numpy = summary(capsys, str(path))
    assert status == 1 and comparable(orjson.loads(p.stdout)) == comparable(with_numpy)
    assert with_numpy["duplicates"]["count"] == 1 and with_numpy["out_of_order"]["count"] >= 1


def comparable(s: dict) -> dict:
    """A summary without its timing, its examples in one order (two of one ID for two reasons may come either way)."""
    s = dict(s, seconds=None)
    for kind in ("invalid", "out_of_order", "outside_range"):
        if s.get(kind):
            s[kind] = dict(s[kind], examples=sorted(s[kind]["examples"], key=orjson.dumps))
    return s


@pytest.fixture
def pure(monkeypatch):
    """verify as on a host without NumPy."""
    monkeypatch.setattr(verify, "_numpy", lambda: None)


def _planted(tmp_path) -> list:
    """Dumps with every kind of problem, in every format the vectorised path reads."""
    sharded = Layout(epoch_ms=L.epoch_ms, time_bits=41, region_bits=3, worker_bits=5, sequence_bits=12, shard_bits=2)
    ids = dump(count=3000, worker_ids=5)
    ids[100] = ids[99]
    ids[1500], ids[1501] = ids[1501], ids[1500]
    ids[2000] = L.compose(NOW_MS + 10 * 86_400_000, 1, 1, 1)  # from the future
    ids[2001] = -5
    ids[2002] = ids[0] - (1 << 40)  # long before --since
    other = dump(count=700, worker_ids=2)
    shard = dump(count=300, worker_ids=2, layout=sharded)
    shard[5] ^= 1 << sharded.shard_shift
    first = L.compose(NOW_MS, 0, 3, 0)
    (tmp_path / "b.txt").write_text(f"{first} 100\n{first + 99} 2\n")
    return [
        (
            [str(write(tmp_path / "a.bin", ids)), str(write(tmp_path / "o.txt", other, "text"))],
            ["--since", str(NOW_MS + L.epoch_ms - 100_000)],
        ),
        (
            [str(write(tmp_path / "a.json", ids, "json")), str(write(tmp_path / "o.json", other, "json"))],
            ["--no-order"],
        ),
        (
            [str(write(tmp_path / "s.bin", shard))],
            [f"--{k.replace('_', '-')}={v}" for k, v in sharded.to_dict().items() if k.endswith("_bits")],
        ),
        ([str(tmp_path / "b.txt")], ["--format", "blocks"]),
        (
            [str(write(tmp_path / "r.txt", ids, "text"))],
            ["--from", str(NOW_MS + L.epoch_ms + 5), "--to", str(NOW_MS + L.epoch_ms + 20)],
        ),
    ]


def test_plain_python_finds_what_numpy_finds(tmp_path, capsys, monkeypatch):
    cases, seen = _planted(tmp_path), []
    for names, flags in cases:
        argv = [*names, *flags, "--examples", "10000"]
        with_numpy = summary(capsys, *argv)
        with monkeypatch.context() as m:
            m.setattr(verify, "_numpy", lambda: None)
            without = summary(capsys, *argv)
        assert with_numpy[0] == without[0] == 1, argv
        assert comparable(with_numpy[1]) == comparable(without[1]), argv
        seen.append(with_numpy[1])
    # Between them the cases trip every check.
    assert all(sum(s["invalid"][kind] for s in seen) for kind in ("not_63_bit", "future", "before_since", "shard"))
    assert all(sum((s[kind] or {"count": 0})["count"] for s in seen) for kind in ("out_of_order", "outside_range"))
    assert sum(s["duplicates"]["count"] for s in seen) and sum(s["worker_ids"]["count"] for s in seen)


def test_plain_python_parses_text_exactly_as_numpy(tmp_path):
    tokens = [
        "0",
        "-0",
        "7",
        str((1 << 63) - 1),
        str(1 << 63),
        str((1 << 64) - 1),
        "99999999999999999999",
        "-1",
        "-" + str(1 << 63),
        "-" + str((1 << 64) - 1),
        "123456789012345678901234",
        "0000000000000000000042",
    ]
    (tmp_path / "t.txt").write_text(" ".join(tokens) + "\n")
    (tmp_path / "t.json").write_text("[" + ", ".join(f'"{t}"' for t in tokens) + "]")
    for name, fmt in (("t.txt", "text"), ("t.json", "json")):
        vectorised = np.concatenate(verify._read(np, verify._open(str(tmp_path / name), []), fmt, L)).tolist()
        plain = [i for part in verify._read(None, verify._open(str(tmp_path / name), []), fmt, L) for i in part]
        assert plain == vectorised, name


def test_the_text_summary_names_examples_and_worker_ids(tmp_path, capsys):
    ids = dump()
    ids[1500], ids[1501] = ids[1501], ids[1500]
    status, out, _ = run(capsys, str(write(tmp_path / "d.bin", ids)))
    assert status == 1
    assert f"out of order: 1\n  #1,502 of {tmp_path / 'd.bin'}: {ids[1501]} (" in out
    assert f"after {ids[1500]}" in out
    assert "worker IDs seen: 3 (region/worker:IDs 0/0:1,000 1/0:1,000 2/0:1,000)" in out
