"""What the README and the protocol document say matches what the code does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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


def _code(line: str) -> str:
    """A line of Python without its comment and surrounding space ('...' stands for code left out)."""
    return line.split("  #", 1)[0].strip()


def guide_section(number: int) -> str:
    sections = re.split(r"^## ", (ROOT / "docs" / "GUIDE.md").read_text(), flags=re.M)
    return next(s for s in sections if s.startswith(f"{number}. "))


@pytest.mark.parametrize("section, example", [(1, "bulk_loader.py"), (2, "pipeline.py")])
def test_the_guide_shows_its_examples_as_they_are(section, example):
    """Each line of the guide's code is a line of the example, in the example's order."""
    text = guide_section(section)
    assert f"`examples/{example}`" in text
    block = re.search(r"```python\n(.*?)```", text, flags=re.S).group(1)
    shown = [_code(line) for line in block.splitlines() if _code(line) not in ("", "...")]
    lines = [_code(line) for line in (ROOT / "examples" / example).read_text().splitlines()]
    at = 0
    for line in shown:
        assert line in lines[at:], (
            f"GUIDE.md section {section} shows {line!r}, which examples/{example} does not have here"
        )
        at = lines.index(line, at) + 1
    command = re.search(r"```sh\n(python examples/\S+ .*)\n```", text).group(1)
    source = (ROOT / "examples" / example).read_text()
    assert all(f'"{flag}"' in source for flag in re.findall(r"--[a-z-]+", command)), command
