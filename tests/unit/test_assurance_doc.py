"""docs/ASSURANCE.md names the tests that hold each promise: each must exist, or the map
has rotted. A name is ``tests/....py::test_name``, or ``::test_name`` after one on the
same line, meaning the same file (a parametrized test by its base name)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ASSURANCE.md"
CITED = re.compile(r"`(tests/[\w/]+\.py)?::(test_\w+)`")


def citations(text: str) -> list[tuple[str, str]]:
    """(file, test) for each test named, a bare ``::name`` taking the last file named
    before it on its line."""
    out = []
    for line in text.splitlines():
        path = None
        for m in CITED.finditer(line):
            path = m.group(1) or path
            assert path, f"{m.group(0)} names no file before it on its line: {line[:80]}"
            out.append((path, m.group(2)))
    return out


def missing(text: str, root: Path = ROOT) -> list[str]:
    gone = []
    for path, name in citations(text):
        f = root / path
        if not f.is_file():
            gone.append(f"{path}::{name}: no such file")
        elif not re.search(rf"^\s*(async\s+)?def {name}\(", f.read_text(), re.M):
            gone.append(f"{path}::{name}: no such test in the file")
    return gone


def test_every_test_the_assurance_page_names_exists():
    cited = citations(DOC.read_text())
    assert len(cited) > 100  # the page is read at all
    assert missing(DOC.read_text()) == []


def test_a_test_or_file_that_does_not_exist_is_named():
    text = (
        "| x | `tests/unit/test_checkers.py::test_chaos_check_names_ids_issued_twice`, `::test_gone_away` |\n"
        "| y | `tests/unit/no_such_file.py::test_anything` |\n"
    )
    assert missing(text) == [
        "tests/unit/test_checkers.py::test_gone_away: no such test in the file",
        "tests/unit/no_such_file.py::test_anything: no such file",
    ]


def test_a_bare_name_with_no_file_before_it_is_refused():
    with pytest.raises(AssertionError, match="names no file"):
        citations("| x | `::test_orphan` |")


def test_the_readme_and_reliability_link_the_page():
    for doc in ("README.md", "docs/RELIABILITY.md"):
        assert "ASSURANCE.md" in (ROOT / doc).read_text(), doc
