"""Each store is a package split by job (docs/ARCHITECTURE.md): its parts import the
package's records, locks and lease and never each other, and only ``store.py`` assembles
them, so a part can be read (and changed) knowing only those three."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

STORE = Path(__file__).resolve().parents[3] / "src" / "snowfence" / "store"
SHARED = {"records", "locks", "lease"}


def siblings_imported(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("package", ["files", "etcd"])
def test_the_parts_of_a_store_import_only_its_records_locks_and_lease(package):
    parts = {p.stem: p for p in (STORE / package).glob("*.py")}
    assert {"records", "lease", "layout", "restore", "claims", "watermark_round", "store"} <= set(parts)
    for name, path in parts.items():
        if name in ("__init__", "store"):
            continue
        allowed = SHARED - {name} if name in SHARED else SHARED
        assert siblings_imported(path) <= allowed, (name, siblings_imported(path) - allowed)
    assert siblings_imported(parts["lease"]) <= {"records"}  # a lease knows its records, not how it was claimed


def test_the_rule_reads_an_import_of_another_part(tmp_path):
    planted = tmp_path / "restore.py"
    planted.write_text("from .claims import Claims\nfrom . import layout\nfrom ..genesis import Genesis\n")
    assert siblings_imported(planted) == {"claims", "layout"}
