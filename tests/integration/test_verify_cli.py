"""``snowfence verify`` on what ``snowfence reserve`` wrote, from a real node: clean dumps pass, a duplicated ID
appended fails, and ``--connect`` takes a node's non-default layout."""

from __future__ import annotations

import subprocess
import sys

import orjson


def cli(*args, stdout=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snowfence", *args],
        stdout=stdout if stdout is not None else subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=120,
    )


def reserve(node, count: int, fmt: str, path) -> None:
    with open(path, "wb") as out:
        p = cli("reserve", str(count), "--connect", node.endpoint, "--format", fmt, stdout=out)
    assert p.returncode == 0, p.stderr.decode()


def verify(*args) -> tuple[int, dict]:
    p = cli("verify", *args, "--json")
    assert p.returncode in (0, 1), p.stderr.decode()
    return p.returncode, orjson.loads(p.stdout)


def test_verify_passes_reserved_dumps_and_catches_a_duplicate(nodes, tmp_path):
    node = nodes.start(workers=2)
    node.wait_ready()
    n = 50_000
    binary, text = tmp_path / "ids.bin", tmp_path / "ids.txt"
    reserve(node, n, "binary", binary)
    reserve(node, n, "text", text)
    status, s = verify(str(binary))
    assert status == 0 and s["ok"] and s["ids"] == s["distinct"] == n, s
    assert s["inputs"] == [{"name": str(binary), "format": "binary", "ids": n}]
    assert s["invalid"]["count"] == 0 and s["out_of_order"]["count"] == 0 and s["worker_ids"]["count"] >= 1
    status, s = verify(str(text), str(binary))  # both dumps together: still no ID twice
    assert status == 0 and s["distinct"] == 2 * n and [i["format"] for i in s["inputs"]] == ["text", "binary"]

    data = binary.read_bytes()
    (tmp_path / "dup.bin").write_bytes(data + data[8 * 123 : 8 * 124])
    status, s = verify(str(tmp_path / "dup.bin"))
    dup = int.from_bytes(data[8 * 123 : 8 * 124], "little")
    assert status == 1 and not s["ok"]
    assert s["duplicates"]["count"] == 1 and s["duplicates"]["examples"][0]["id"] == str(dup)
    with open(text, "a") as f:
        f.write(f"{text.read_text().split()[7]}\n")
    p = cli("verify", str(text))
    out = p.stdout.decode()
    assert p.returncode == 1 and "duplicates: 1 extra copy of 1 ID" in out and "PROBLEMS FOUND" in out, out


def test_verify_connect_takes_the_layout_of_a_node(nodes, tmp_path):
    widths = ("--time-bits", "37", "--shard-bits", "3", "--region-bits", "4", "--worker-bits", "7")  # to 2030-05
    node = nodes.start(workers=1, args=widths)
    node.wait_ready()
    dump = tmp_path / "ids.bin"
    reserve(node, 20_000, "binary", dump)
    status, s = verify(str(dump), "--connect", node.endpoint, "--no-discover")
    assert status == 0 and s["ok"] and s["ids"] == 20_000, s
    assert s["layout"]["shard_bits"] == 3 and s["layout"]["time_bits"] == 37
    # Read with the default layout instead, the milliseconds are shifted one bit further: twice as far from the
    # epoch, in the future.
    status, s = verify(str(dump))
    assert status == 1 and s["invalid"]["future"] > 0, s
