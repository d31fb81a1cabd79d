"""Every etcd key is built in src/snowfence/etcd/keys.py and nowhere else: read from the
source (string constants and the pieces of f-strings), a key spelled anywhere else fails
here. The tests themselves spell keys on purpose (they check the format from outside, as
an operator's etcdctl sees it), and so are not read."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEYS_MODULE = ROOT / "src" / "snowfence" / "etcd" / "keys.py"
#: Where the rule holds: the package, and the tools and benchmarks that run against a cluster.
READ = [ROOT / "src", ROOT / "benchmarks", ROOT / "tools"]

#: The root every key of snowfence is under (``/snowfence/<cluster>/...``); a text that
#: describes it with a placeholder (``/snowfence/<cluster>/``) is no key. A path such as
#: ``/etc/snowfence/`` has a letter before it.
ROOT_SPELLED = re.compile(r"(?<![\w.-])/snowfence/(?!<)")
#: The families of keys under a cluster's prefix: spelled as the start of a string (or of a
#: piece of an f-string), they name a key.
FAMILY = re.compile(r"^(workers|marks|used|nodes|regions)/")
#: The records of a cluster, a key only when added to a prefix (``prefix + "layout"``,
#: ``f"{prefix}layout"``): elsewhere the words are the fields of a record or of a status.
RECORD = re.compile(r"^(layout|watermark|region-claims)$")


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string statements of ``tree`` (docstrings, and text standing as a statement)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def key_literals(source: str) -> list[tuple[int, str]]:
    """Each etcd key literal of ``source``: (line, the text)."""
    tree = ast.parse(source)
    skip = docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if ROOT_SPELLED.search(node.value) or FAMILY.search(node.value):
                found.append((node.lineno, node.value))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            right = node.right
            if isinstance(right, ast.Constant) and isinstance(right.value, str) and RECORD.search(right.value):
                found.append((node.lineno, right.value))
        elif isinstance(node, ast.JoinedStr):
            for before, piece in zip(node.values, node.values[1:], strict=False):
                if (
                    isinstance(before, ast.FormattedValue)
                    and isinstance(piece, ast.Constant)
                    and RECORD.search(piece.value)
                ):
                    found.append((node.lineno, piece.value))
    return found


def offenders() -> list[str]:
    out = []
    for top in READ:
        for path in sorted(top.rglob("*.py")):
            if path == KEYS_MODULE or ".venv" in path.parts:
                continue
            for line, text in key_literals(path.read_text()):
                out.append(f"{path.relative_to(ROOT)}:{line}: {text!r}")
    return out


def test_no_etcd_key_is_spelled_outside_the_keys_module():
    found = offenders()
    assert not found, "etcd keys spelled outside src/snowfence/etcd/keys.py:\n" + "\n".join(found)


def test_the_rule_reads_every_way_a_key_is_spelled():
    """Each way a key was once spelled in the store, the cluster and preflight is caught;
    the words that are a record's fields, a placeholder and a docstring are not."""
    spelled = [
        'KEY = "/snowfence/region-claims"',
        'f"/snowfence/{cluster}/"',
        'f"{self.prefix}workers/{self.region}/{worker_id}"',
        'f"{self.prefix}marks/{self.region}/"',
        'self.prefix + "used/"',
        'client.get_prefix(self.prefix + "nodes/")',
        "f\"{self.prefix}nodes/{quote(name, safe='')}\"",
        'f"{self.prefix}regions/{region}"',
        'connection.prefix + "layout"',
        'self.prefix + "watermark"',
        'f"{prefix}layout"',
    ]
    for source in spelled:
        assert key_literals(source), source
    fine = [
        'status["layout"]',
        'mark.get("layout")',
        'setting("default", "Cluster name: the etcd key prefix /snowfence/<cluster>/.")',
        'def f():\n    """Keys under ``workers/`` and ``/snowfence/x/``."""',
        'f"{count} workers/s"',
        'open("/etc/snowfence/snowfence.toml")',
        'x = "the key of its own (used/)"',
    ]
    for source in fine:
        assert not key_literals(source), source


def test_the_keys_module_itself_spells_them(tmp_path):
    """The rule reads the keys module's own way of spelling keys as keys: it is exempt by
    name, not because its spelling slips through."""
    assert key_literals(KEYS_MODULE.read_text())


def test_the_keys_are_the_ones_a_running_cluster_holds():
    """The keys are data a running cluster already holds: moving their spelling changed none."""
    from snowfence.etcd.keys import REGION_CLAIMS, ClusterKeys

    k = ClusterKeys("west")
    assert k.prefix == "/snowfence/west/"
    assert (k.layout(), k.watermark()) == ("/snowfence/west/layout", "/snowfence/west/watermark")
    assert (k.nodes(), k.node("a/b c")) == ("/snowfence/west/nodes/", "/snowfence/west/nodes/a%2Fb%20c")
    assert (k.regions(), k.region(3)) == ("/snowfence/west/regions/", "/snowfence/west/regions/3")
    assert (k.claims(), k.claims(3), k.claim(3, 7)) == (
        "/snowfence/west/workers/",
        "/snowfence/west/workers/3/",
        "/snowfence/west/workers/3/7",
    )
    assert (k.marks(), k.marks(3), k.mark(3, 7)) == (
        "/snowfence/west/marks/",
        "/snowfence/west/marks/3/",
        "/snowfence/west/marks/3/7",
    )
    assert (k.uses(), k.uses(3), k.used(3, 7)) == (
        "/snowfence/west/used/",
        "/snowfence/west/used/3/",
        "/snowfence/west/used/3/7",
    )
    assert REGION_CLAIMS == "/snowfence/region-claims"
