"""What the README and the protocol document say matches what the code does."""

from __future__ import annotations

import re
from pathlib import Path

from snowfence import decode

ROOT = Path(__file__).resolve().parents[2]


def test_readme_decode_example_shows_every_field():
    readme = (ROOT / "README.md").read_text()
    shown = re.search(r"# (Decoded\([^)]*\))", readme).group(1)
    names = re.findall(r"(\w+)=", shown)
    assert names == re.findall(r"(\w+)=", repr(decode(121057962826403840))), shown


def test_protocol_does_not_call_overloaded_unsent():
    row = next(line for line in (ROOT / "docs" / "PROTOCOL.md").read_text().splitlines() if "| `overloaded`" in line)
    assert "not sent" not in row and "reserved" not in row, row
