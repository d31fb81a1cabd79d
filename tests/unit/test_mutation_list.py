"""The list of mutants that need no test stays readable, and every entry says why."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("mutation_tool", ROOT / "tools" / "mutation.py")
tool = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = tool  # its dataclasses look their module up
spec.loader.exec_module(tool)


def test_every_listed_mutant_names_a_configured_file_and_gives_a_reason():
    entries = tool.read_equivalents()
    assert entries
    modules = {tool.module_of(path) for path in tool.configured_files()}
    keys = [e.key for e in entries]
    assert len(keys) == len(set(keys)), "a mutant is listed twice"
    for e in entries:
        assert e.key.module in modules, f"line {e.line}: {e.key.module} is not mutated"
        assert e.key.removed or e.key.added, f"line {e.line}: no mutated lines"
        kind, _, why = e.reason.partition(": ")
        assert kind in ("equivalent", "wording") and len(why) > 10, f"line {e.line}: {e.reason!r}"


def test_an_entry_without_a_reason_or_with_stray_lines_is_refused(tmp_path):
    for text in (
        "snowfence.protocol decode_request\n  - a\n  + b\n",
        "snowfence.protocol decode_request\n  - a\n  ? b\n  = equivalent: why\n",
        "  - a\n",
    ):
        listed = tmp_path / "list.txt"
        listed.write_text(text)
        with pytest.raises(SystemExit):
            tool.read_equivalents(listed)


def test_a_mutant_is_named_by_module_function_and_changed_lines():
    diff = "--- src/snowfence/workers/minter.py\n+++ src/snowfence/workers/minter.py\n@@ -1 +1 @@\n"
    diff += "     def f():\n-        return ms + 1\n+        return ms - 1\n"
    key = tool.key_of(
        "snowfence.workers.minter.xǁMinterǁfloor_after__mutmut_12", "src/snowfence/workers/minter.py", diff
    )
    assert key == tool.Key("snowfence.workers.minter", "Minter.floor_after", ("return ms + 1",), ("return ms - 1",))
    assert tool.function_of("snowfence.protocol.x_decode_request__mutmut_3") == "decode_request"
