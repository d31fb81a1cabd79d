"""No dead code in src/: vulture reads it, and every name it finds unused is either removed
or listed, with why it is used all the same, in dead_code_allowed.txt beside this file."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import vulture

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
ALLOWED_FILE = HERE / "dead_code_allowed.txt"


def allowed() -> list[str]:
    """The names of dead_code_allowed.txt (the first word of each line that is not a comment)."""
    lines = (line.split("#", 1)[0].split() for line in ALLOWED_FILE.read_text().splitlines())
    return [words[0] for words in lines if words]


def unused(path: Path, ignore: list[str]) -> list[str]:
    """What vulture finds unused under ``path``, one line each."""
    v = vulture.Vulture(ignore_names=ignore)
    v.scavenge([str(path)])
    return [item.get_report(add_size=False) for item in v.get_unused_code()]


def test_nothing_in_src_is_dead_but_what_is_listed_as_used_by_name():
    found = unused(SRC, allowed())
    assert not found, "dead code (remove it, or list it with why in dead_code_allowed.txt):\n" + "\n".join(found)


def test_every_listed_name_is_still_in_src():
    """A listed name nothing defines any more is a stale entry, which would hide the next dead
    code of that name."""
    words = set(re.findall(r"\w+", "\n".join(p.read_text() for p in SRC.rglob("*.py"))))
    stale = [name for name in allowed() if not fnmatch.filter(words, name)]
    assert not stale, stale


def test_the_check_finds_a_dead_function_and_a_dead_method(tmp_path):
    (tmp_path / "mod.py").write_text(
        "def used():\n    return 1\n\n\ndef planted():\n    return used()\n\n\n"
        "class K:\n    def dead(self):\n        return 2\n\n\nprint(used(), K)\n"
    )
    found = unused(tmp_path, [])
    assert len(found) == 2 and "'planted'" in found[0] and "'dead'" in found[1], found
    assert unused(tmp_path, ["planted", "dead"]) == []
