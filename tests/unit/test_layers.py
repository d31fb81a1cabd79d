"""Which module may import which: the arrows of docs/ARCHITECTURE.md, read from the
source (imports inside functions count too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it, as absolute names."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            prefix = f"{base}.{node.module}" if node.level and node.module else (node.module or base)
            found.add(prefix)
            found.update(f"{prefix}.{alias.name}" for alias in node.names)  # a submodule, or a name in one
    return found


MODULES = {module_name(p): imports(p) for p in SRC.rglob("*.py")}


def arrows(path: Path) -> set[str]:
    """The modules of src that ``path`` imports (anywhere in it, those only for type checking
    too): ``from a import b`` points at ``a.b`` where that is a module, else at ``a``. A
    package's ``__init__`` counts only when a name of its own is imported from it."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)  # ``import a.b`` names a module
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            prefix = f"{base}.{node.module}" if node.level and node.module else (node.module or base)
            for alias in node.names:
                target = f"{prefix}.{alias.name}"
                found.add(target if target in MODULES else prefix)
    return {f for f in found if f in MODULES} - {module_name(path)}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph`` (module -> the modules it imports): each set of
    modules that reach one another, sorted (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in graph.get(module, ()):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def test_no_module_imports_itself_round_a_circle():
    """A circle of imports works only in some orders of import, and says two modules hold one
    job between them: what both need belongs in the lower one."""
    graph = {module_name(p): arrows(p) for p in SRC.rglob("*.py")}
    assert sum(map(len, graph.values())) > 100, "the import graph was not read"
    assert cycles(graph) == []


def test_the_circle_finder_finds_a_circle_however_long_and_only_circles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "e"}, "e": set()}) == [["a", "b"], ["c", "d"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"c"}}) == []


def importers_of(target: str) -> set[str]:
    return {m for m, found in MODULES.items() if any(f == target or f.startswith(target + ".") for f in found)}


@pytest.mark.parametrize(
    "module, never",
    [
        # The broker holds no client code; CURVE keys are shared through snowfence.curve.
        ("snowfence.broker", "snowfence.clients"),
        ("snowfence.clients", "snowfence.broker"),
        # The broker's membership is the cluster's records, not a worker's lease store.
        ("snowfence.broker", "snowfence.store.etcd"),
        ("snowfence.etcd.cluster", "snowfence.store.etcd"),
        ("snowfence.store.etcd", "snowfence.etcd.cluster"),
        # The routing core has no sockets (the router's are its adapter) and asks
        # nothing of the workers' package (the refusals both answer with are shared).
        ("snowfence.broker.routing", "zmq"),
        # The routing core's gate and the HTTP door's requests decide without a socket.
        ("snowfence.broker.gate", "zmq"),
        ("snowfence.broker.gate", "socket"),
        ("snowfence.broker.doors.http_requests", "socket"),
        ("snowfence.broker.doors.http_requests", "select"),
        ("snowfence.broker.doors.addresses", "socket"),
        ("snowfence.broker.routing", "snowfence.workers"),
        # The supervisor is driven by the broker's loop and knows nothing of it.
        ("snowfence.broker.supervisor", "snowfence.broker.main"),
        # The node's decisions have no sockets and know nothing of the loop that steps them.
        ("snowfence.broker.nodecore", "zmq"),
        ("snowfence.broker.nodecore", "snowfence.broker.main"),
        # decode and the clients never import etcd code.
        ("snowfence.clients", "snowfence.etcd"),
        ("snowfence.ids", "snowfence.etcd"),
        ("snowfence.curve", "snowfence.broker"),
        ("snowfence.curve", "snowfence.clients"),
    ],
)
def test_a_module_never_imports_what_it_must_not(module, never):
    offenders = {m for m in importers_of(never) if m == module or m.startswith(module + ".")}
    assert not offenders, f"{sorted(offenders)} import {never}"


def test_of_the_workers_package_the_broker_imports_only_exit_statuses_and_its_own_worker_id():
    allowed = {
        # What a worker's exit status means (the supervisor halts or restarts on it).
        "snowfence.broker.supervisor": {"snowfence.workers.exits"},
        # The broker's own worker ID is held as a worker holds one: the worker core and its keeper.
        "snowfence.broker.own": {"snowfence.workers.core", "snowfence.workers.minter", "snowfence.workers.keeper"},
    }
    for module, found in MODULES.items():
        if not module.startswith("snowfence.broker"):
            continue
        used = {f for f in found if f.startswith("snowfence.workers.")}
        modules = {".".join(f.split(".")[:3]) for f in used}
        assert modules <= allowed.get(module, set()), (module, modules)
    assert "snowfence.workers.main" not in {f for found in MODULES.values() for f in found if f}, (
        "the worker process module is imported by nothing (it is run as a process)"
    )


def test_the_lease_store_is_the_workers_and_the_cluster_records_the_brokers():
    cluster_users = importers_of("snowfence.etcd.cluster")
    assert cluster_users == {"snowfence.broker.membership", "snowfence.cli.cluster"}, cluster_users


#: The layers from the bottom up (docs/ARCHITECTURE.md, "Layers"): a module imports only its
#: own layer's and the ones below it. The foundation (settings, errors, the ID layout, logs,
#: the wire) is below all of them.
LAYERS = [
    {
        "snowfence.config",
        "snowfence.errors",
        "snowfence.ids",
        "snowfence.logs",
        "snowfence.latency",
        "snowfence.protocol",
        "snowfence.curve",
    },
    {"snowfence.etcd"},  # the transport: the client library, the cluster's keys and records
    {"snowfence.store"},  # leases, genesis, journal, the two stores, open_store
    {"snowfence.workers", "snowfence.refusals", "snowfence.clock"},
    # The broker and the clients side by side (neither imports the other: see below).
    {"snowfence.broker", "snowfence.clients"},
    {"snowfence.cli", "snowfence.bench", "snowfence.__main__", "snowfence"},
]


def layer_of(module: str) -> int | None:
    """The layer of ``module`` (the innermost package named wins: ``snowfence`` itself is
    the top, ``snowfence.x`` is x's)."""
    best = None
    for i, layer in enumerate(LAYERS):
        for m in layer:
            if (module == m or module.startswith(m + ".")) and (best is None or len(m) > best[1]):
                best = (i, len(m))
    return None if best is None else best[0]


def test_every_module_has_a_layer():
    assert not {m for m in MODULES if layer_of(m) is None}


@pytest.mark.parametrize("layer", range(len(LAYERS)))
def test_each_layer_imports_nothing_above_it(layer):
    offenders = []
    for module, found in MODULES.items():
        if layer_of(module) != layer:
            continue
        for f in found:
            if not f.startswith("snowfence.") or f == "snowfence.__version__":
                continue  # the package itself (its version) is imported before any module of it
            theirs = layer_of(f)
            if theirs is None or theirs > layer:
                offenders.append((module, f))
    assert not offenders, offenders


def test_stores_are_built_in_one_place():
    """Every holder opens its store with ``open_store``: the store classes are imported by
    nothing but it (and the store layer's own modules)."""
    for store_module in ("snowfence.store.files", "snowfence.store.etcd"):
        users = {m for m in importers_of(store_module) if not m.startswith("snowfence.store.")}
        assert users == {"snowfence.store"}, (store_module, users)


#: The modules that hold sockets (docs/ARCHITECTURE.md, "Layers"): the rest decide without them.
SOCKET_ADAPTERS = {
    "snowfence.broker.main",
    "snowfence.broker.doors.zmq",
    "snowfence.broker.auth",
    "snowfence.broker.peers",
    "snowfence.workers.main",
    "snowfence.clients.blocking",
    "snowfence.clients.aio",
    "snowfence.clients.core",  # ClientBase opens both clients' DEALER socket; its round policy imports none
    "snowfence.curve",
    "snowfence.bench",
    "snowfence.cli.keygen",  # makes a CURVE key pair with pyzmq's zmq.auth
}


def test_only_the_socket_adapters_import_zmq():
    assert importers_of("zmq") <= SOCKET_ADAPTERS, importers_of("zmq") - SOCKET_ADAPTERS
    assert "snowfence.workers.core" not in importers_of("zmq")
    assert "snowfence.broker.routing" not in importers_of("zmq")


def test_a_node_s_processes_import_no_client_and_the_package_still_names_every_client():
    """The package names its clients lazily: a worker process (and the broker) starts without
    importing them, or asyncio, and ``from snowfence import Client`` still works."""
    import subprocess
    import sys

    probe = (
        "import sys, snowfence.workers.main; "
        "print(sorted(m for m in sys.modules if m.startswith('snowfence.clients') or m == 'asyncio'))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
    names = "from snowfence import AsyncClient, Block, Client, Watermark, as_array, as_numpy; import snowfence; "
    names += "print(snowfence.Client.__module__); snowfence.nosuch"
    p = subprocess.run([sys.executable, "-c", names], capture_output=True, text=True)
    assert p.stdout.strip() == "snowfence.clients.blocking", p
    assert "AttributeError: module 'snowfence' has no attribute 'nosuch'" in p.stderr, p.stderr
