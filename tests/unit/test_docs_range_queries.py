"""GUIDE.md's "Range queries" shows what `snowfence id-at` and Layout.bounds print."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from snowfence import cli
from snowfence.ids import Layout

ROOT = Path(__file__).resolve().parents[2]


def section() -> str:
    sections = re.split(r"^## ", (ROOT / "docs" / "GUIDE.md").read_text(), flags=re.M)
    return next(s for s in sections if s.startswith("Range queries"))


def test_each_id_at_example_without_a_node_prints_the_lines_shown_under_it(capsys):
    blocks = re.findall(r"```sh\n(.*?)```", section(), flags=re.S)
    checked = 0
    for block in blocks:
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("snowfence id-at") or "--connect" in line:
                continue
            shown = []
            for after in lines[i + 1 :]:
                if not after.startswith("# "):
                    break
                shown.append(after[2:])
            assert cli.main(shlex.split(line)[1:]) == 0
            assert capsys.readouterr().out.splitlines() == shown, line
            checked += 1
    assert checked == 2


def test_the_sql_example_uses_the_bounds_of_the_day_shown():
    text = section()
    first, last = map(int, re.search(r"WHERE id BETWEEN (\d+) AND (\d+);", text).groups())
    (day,) = Layout().bounds("2026-03-01T00:00:00Z", "2026-03-02T00:00:00Z")
    assert (first, last) == (day.first, day.last)
    assert "one range per shard" in text.lower()
