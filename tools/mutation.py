"""Mutation testing of the safety core: run mutmut per file, then score it.

    python tools/mutation.py run [FILE ...]     # mutmut on each file (default: all configured)
    python tools/mutation.py report [FILE ...]  # scores, and every survivor not listed

FILE is a path or a file name (``minter``, ``keeper``, ...) among those that
``[tool.mutmut] only_mutate`` in ``pyproject.toml`` names; mutmut (``pip install
-e '.[mutation]'``) runs the unit tests against each mutant, in a copy of the
project under ``mutants/``. ``run`` tests each file's mutants afresh, one file
at a time (``--max-children`` bounds the test processes), and keeps the verdicts
of each file in ``mutants/verdicts/`` as soon as its run ends.

mutmut numbers a function's mutants in order, so the numbers shift when the code
does. ``tests/mutation/equivalents.txt`` names each listed mutant by what does
not shift: its module, its function, and the lines the mutation removes and
adds, with a reason. A reason starting ``equivalent:`` says no behaviour can
differ; such mutants leave the score. A reason starting ``wording:`` says only a
message's text differs; such mutants stay in the score as survivors, and are
listed so that the report shows only what needs looking at. ``report`` scores
each file as

    caught (killed or timed out) / (all mutants - listed equivalents)

and prints every survivor that is not listed, and every listed entry that no
longer matches a surviving mutant (the code changed, or a test now catches it:
update the list). ``--fail-under 90`` exits 1 if a file scores less.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS = ROOT / "tests" / "mutation" / "equivalents.txt"
#: One file of verdicts per source file, written right after its run: mutmut
#: resets the verdicts of a file when it mutates it again in a later run.
RESULTS = ROOT / "mutants" / "verdicts"
CAUGHT = {"killed", "timeout", "caught by type check", "segfault"}


def module_of(path: str) -> str:
    """``src/snowfence/workers/minter.py`` -> ``snowfence.workers.minter``."""
    rel = Path(path).with_suffix("")
    parts = rel.parts[1:] if rel.parts[0] == "src" else rel.parts
    return ".".join(parts)


def function_of(mutant: str) -> str:
    """``snowfence.m.xǁMinterǁreserve__mutmut_3`` -> ``Minter.reserve``; ``x_f__mutmut_1`` -> ``f``."""
    name = mutant.rpartition(".")[2].rsplit("__mutmut_", 1)[0]
    if name.startswith("xǁ"):
        return ".".join(name[2:].split("ǁ"))
    return name[2:] if name.startswith("x_") else name


@dataclass(frozen=True)
class Key:
    """What identifies a mutant across code changes elsewhere."""

    module: str
    function: str
    removed: tuple[str, ...]
    added: tuple[str, ...]

    def show(self) -> str:
        lines = [f"{self.module} {self.function}"]
        lines += [f"  - {line}" for line in self.removed]
        lines += [f"  + {line}" for line in self.added]
        return "\n".join(lines)


@dataclass
class Entry:
    key: Key
    reason: str
    line: int
    used: bool = False


@dataclass
class Score:
    path: str
    caught: int = 0
    equivalent: int = 0
    wording: int = 0
    survivors: list[tuple[str, str, Key]] = field(default_factory=list)  # (name, status, key)
    total: int = 0

    @property
    def counted(self) -> int:
        return self.total - self.equivalent

    @property
    def percent(self) -> float:
        return 100.0 * self.caught / self.counted if self.counted else 100.0


def read_equivalents(path: Path = EQUIVALENTS) -> list[Entry]:
    """Entries: a ``module function`` line, ``  - `` / ``  + `` lines, then ``  = reason``."""
    entries: list[Entry] = []
    head: tuple[str, str, int] | None = None
    removed: list[str] = []
    added: list[str] = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        if not raw.startswith(" "):
            if head is not None:
                raise SystemExit(f"{path}:{head[2]}: entry without a '  = reason' line")
            module, _, function = raw.strip().partition(" ")
            head, removed, added = (module, function.strip(), number), [], []
            continue
        text = raw.strip()
        if head is None:
            raise SystemExit(f"{path}:{number}: indented line outside an entry")
        if text.startswith("- "):
            removed.append(text[2:].strip())
        elif text.startswith("+ "):
            added.append(text[2:].strip())
        elif text in ("-", "+"):
            (removed if text == "-" else added).append("")
        elif text.startswith("= "):
            entries.append(Entry(Key(head[0], head[1], tuple(removed), tuple(added)), text[2:].strip(), head[2]))
            head = None
        else:
            raise SystemExit(f"{path}:{number}: expected '- old', '+ new' or '= reason', got {text!r}")
    if head is not None:
        raise SystemExit(f"{path}:{head[2]}: entry without a '  = reason' line")
    return entries


def key_of(mutant: str, path: str, diff: str) -> Key:
    removed, added = [], []
    for line in diff.splitlines():
        if line.startswith(("---", "+++")):
            continue
        if line.startswith("-"):
            removed.append(line[1:].strip())
        elif line.startswith("+"):
            added.append(line[1:].strip())
    return Key(module_of(path), function_of(mutant), tuple(removed), tuple(added))


def configured_files() -> list[str]:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    return list(config["only_mutate"])


def pick(files: list[str]) -> list[str]:
    """Configured files, or those named (by path or by file name, e.g. ``minter``)."""
    configured = configured_files()
    if not files:
        return configured
    picked = []
    for name in files:
        match = [p for p in configured if p == name or Path(p).stem == name or Path(p).name == name]
        if not match:
            raise SystemExit(f"{name} is not among the files configured in [tool.mutmut] only_mutate")
        picked += match
    return picked


def refresh_copy(targets: list[str]) -> None:
    """Make ``mutants/`` test the code and tests as they are now.

    mutmut copies each source file into ``mutants/`` once and keeps earlier
    verdicts when only the tests changed. So: drop copies of other source files
    that are out of date (mutmut copies them again), and drop the mutated copy
    and the verdicts of each file about to run (mutmut mutates it again).
    mutmut also keeps which tests reach which function, and measures that again
    only for tests with new names: a test that changed would not be run against
    the mutants it now reaches. So when any test changed, drop that record too
    (mutmut measures it all again, one run of the unit tests).
    """
    copy = ROOT / "mutants"
    if not copy.is_dir():
        return
    tests = tests_digest()
    seen = copy / "tests.sha256"
    if not seen.exists() or seen.read_text() != tests:
        (copy / "mutmut-stats.json").unlink(missing_ok=True)
        seen.write_text(tests)
    configured = set(configured_files())
    for source in (ROOT / "src").rglob("*.py"):
        rel = source.relative_to(ROOT).as_posix()
        copied = copy / rel
        if rel in targets:
            for stale in (copied, copy / (rel + ".meta"), copy / (rel + ".spans")):
                stale.unlink(missing_ok=True)
        elif rel not in configured and copied.exists() and copied.read_bytes() != source.read_bytes():
            copied.unlink()


def tests_digest() -> str:
    """One digest of every file under ``tests/``."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "tests").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def run(files: list[str], max_children: int) -> int:
    status = 0
    for path in pick(files):
        print(f"== mutmut: {path}", flush=True)
        refresh_copy([path])
        cmd = ["mutmut", "run", "--max-children", str(max_children), module_of(path) + ".*"]
        code = subprocess.call(cmd, cwd=ROOT)
        status |= code
        if code == 0:
            subprocess.check_call([sys.executable, __file__, "snapshot", path], cwd=ROOT)
    return status


def digest(path: str) -> str:
    return hashlib.sha256((ROOT / path).read_bytes()).hexdigest()


def snapshot(path: str) -> None:
    """Keep the verdicts and keys of ``path``'s mutants from the run just finished."""
    os.chdir(ROOT)
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    data = SourceFileMutationData(path=path)
    data.load()
    mutants = []
    for name, code in data.exit_code_by_key.items():
        key = key_of(name, path, get_diff_for_mutant(name, path=path))
        mutants.append({"name": name, "status": status_by_exit_code[code], "removed": key.removed, "added": key.added})
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"path": path, "sha256": digest(path), "mutants": mutants}
    (RESULTS / (module_of(path) + ".json")).write_text(json.dumps(out, indent=1))


def report(files: list[str], fail_under: float | None, template: bool = False) -> int:
    entries = read_equivalents()
    by_key: dict[Key, Entry] = {e.key: e for e in entries}
    scores = []
    for path in pick(files):
        score = Score(path)
        scores.append(score)
        results = RESULTS / (module_of(path) + ".json")
        if not results.exists():
            continue
        saved = json.loads(results.read_text())
        if saved["sha256"] != digest(path):
            print(f"# {path} changed since its last run: these verdicts are of the code as it was\n")
        for mutant in saved["mutants"]:
            name, status = mutant["name"], mutant["status"]
            if status == "not checked":
                continue
            score.total += 1
            key = Key(module_of(path), function_of(name), tuple(mutant["removed"]), tuple(mutant["added"]))
            entry = by_key.get(key)
            if entry is not None and status not in CAUGHT:
                entry.used = True
                if entry.reason.startswith("wording:"):
                    score.wording += 1
                else:
                    score.equivalent += 1
            elif status in CAUGHT:
                score.caught += 1
            else:
                score.survivors.append((name, status, key))

    for score in scores:
        for name, status, key in score.survivors:
            if template:  # ready to paste into the list, once each reason is written
                print(f"{key.show()}\n  = TODO ({status})\n")
            else:
                print(f"# {status}: {name}\n{key.show()}\n")
    checked = {module_of(p) for p in pick(files)}
    stale = [e for e in entries if not e.used and e.key.module in checked]
    for entry in stale:
        print(f"# listed at {EQUIVALENTS.name}:{entry.line} but no such mutant (or it is now caught):")
        print(entry.key.show() + "\n")
    print(f"{'file':40} {'mutants':>8} {'equiv.':>7} {'caught':>7} {'wording':>8} {'other':>6} {'score':>7}")
    failed = False
    for s in scores:
        row = f"{s.path:40} {s.total:8} {s.equivalent:7} {s.caught:7} {s.wording:8} {len(s.survivors):6}"
        print(f"{row} {s.percent:6.1f}%")
        if s.total == 0:
            print(f"  {s.path}: no results; run `python tools/mutation.py run {Path(s.path).stem}` first")
            failed = True
        elif fail_under is not None and s.percent < fail_under:
            failed = True
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/mutation.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run mutmut on each file in turn")
    r.add_argument("files", nargs="*")
    r.add_argument("--max-children", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    s = sub.add_parser("report", help="scores, unlisted survivors, stale list entries")
    s.add_argument("files", nargs="*")
    s.add_argument("--fail-under", type=float, default=None, metavar="PERCENT")
    s.add_argument("--template", action="store_true", help="print survivors as entries for the list")
    k = sub.add_parser("snapshot", help="keep the verdicts of a file's last run (run does this itself)")
    k.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args.files, args.max_children)
    if args.command == "snapshot":
        for path in pick(args.files):
            snapshot(path)
        return 0
    return report(args.files, args.fail_under, args.template)


if __name__ == "__main__":
    sys.exit(main())
