"""docs/ARCHITECTURE.md read against the code: every module, class, method and function
it names in backticks is there, where it says. A claim the code no longer makes (a module
moved, a method renamed) fails here, not with the next reader."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "snowfence"
DOC = ROOT / "docs" / "ARCHITECTURE.md"

SPAN = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^(?:[\w.-]+/)*[\w.-]+\.(?:py|md|c|txt)$")
CLASS = re.compile(r"^[A-Z][a-z]+[A-Za-z]*$")
DOTTED = re.compile(r"^([A-Za-z_]\w*)\.([a-z_]\w*)$")


@cache
def modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(SRC)): ast.parse(p.read_text()) for p in SRC.rglob("*.py")}


@cache
def classes() -> dict[str, list[set[str]]]:
    """Each class name defined in src, with the names each definition has: its methods,
    class attributes, and attributes its methods set on self."""
    found: dict[str, list[set[str]]] = {}
    for tree in modules().values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                names: set[str] = set()
                for item in ast.walk(node):
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(item.name)
                    elif isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name):
                        if item.value.id in ("self", "cls"):
                            names.add(item.attr)
                    elif isinstance(item, ast.Name) and isinstance(item.ctx, ast.Store):
                        names.add(item.id)
                found.setdefault(node.name, []).append(names)
    return found


def top_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        names.add(n.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def module_named(name: str) -> list[ast.Module]:
    """The modules (or packages' __init__) whose last part is ``name``."""
    return [
        tree
        for rel, tree in modules().items()
        if Path(rel).stem == name or (Path(rel).name == "__init__.py" and Path(rel).parent.name == name)
    ]


def problem(span: str) -> str | None:
    """What is false of a name the document gives, or None."""
    if PATH.match(span):
        if "/" not in span:  # a file of the package the sentence is about
            return None if next(ROOT.glob(f"[st][re][cs]*/**/{span}"), None) else f"{span}: no such file"
        if span.startswith(("tests/", "docs/", "examples/", "benchmarks/", "deploy/", "tools/", "src/")):
            return None if (ROOT / span).exists() else f"{span}: no such file"
        return None if (SRC / span).exists() else f"{span}: no such module in src/snowfence"
    if CLASS.match(span) and span.isidentifier():
        return None if span in classes() or _defined_anywhere(span) else f"{span}: no such class"
    m = DOTTED.match(span)
    if m:
        owner, attr = m.groups()
        if owner in classes():
            if any(attr in names for names in classes()[owner]):
                return None
            return f"{span}: {owner} has no {attr}"
        trees = module_named(owner)
        if trees:
            if any(attr in top_names(t) for t in trees):
                return None
            return f"{span}: module {owner} has no {attr}"
    return None


def _defined_anywhere(name: str) -> bool:
    return any(name in top_names(t) for t in modules().values())


def claims() -> list[str]:
    return SPAN.findall(DOC.read_text())


def test_every_module_class_and_method_the_architecture_names_is_in_the_code():
    false = sorted({p for span in claims() if (p := problem(span))})
    assert not false, "docs/ARCHITECTURE.md names what the code does not have:\n" + "\n".join(false)


def test_the_check_reads_enough_of_the_document_to_mean_something():
    checked = [s for s in claims() if PATH.match(s) or CLASS.match(s) or DOTTED.match(s)]
    assert len(checked) > 100, checked


def test_the_check_fails_on_what_the_code_does_not_have():
    assert problem("broker/nosuch.py") is not None
    assert problem("Routing.no_such_method") is not None
    assert problem("NoSuchClass") is not None
    assert problem("fair.no_such_function") is not None
    assert problem("Routing.requests") is None
    assert problem("workers/core.py") is None


def test_every_module_of_the_package_has_its_place_in_the_document():
    named = set(claims())
    missing = [
        rel
        for rel in sorted(modules())
        if Path(rel).name not in ("__init__.py", "__main__.py")
        and rel not in named
        and not any(rel in span for span in named)
        and Path(rel).name not in named
    ]
    assert not missing, f"modules docs/ARCHITECTURE.md does not place: {missing}"
