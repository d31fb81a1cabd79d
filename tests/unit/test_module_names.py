"""Every test module has a name of its own: pytest imports test modules by their basename
(the suite's rootdir-relative import mode), so two ``test_x.py`` in different directories
make one run fail to collect the second."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_name():
    names = Counter(p.name for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)
    assert names, "no test modules found"
    twice = sorted(name for name, n in names.items() if n > 1)
    assert not twice, f"test modules that share a name (rename one): {twice}"
