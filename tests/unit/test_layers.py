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


def importers_of(target: str) -> set[str]:
    return {m for m, found in MODULES.items() if any(f == target or f.startswith(target + ".") for f in found)}


@pytest.mark.parametrize(
    "module, never",
    [
        # The broker holds no client code; CURVE keys are shared through snowfence.curve.
        ("snowfence.broker", "snowfence.clients"),
        # The broker's membership is the cluster's records, not a worker's lease store.
        ("snowfence.broker", "snowfence.etcd.store"),
        ("snowfence.etcd.cluster", "snowfence.etcd.store"),
        ("snowfence.etcd.store", "snowfence.etcd.cluster"),
        # The routing core has no sockets (the router's are its adapter) and asks
        # nothing of the workers' package (the refusals both answer with are shared).
        ("snowfence.broker.routing", "zmq"),
        ("snowfence.broker.routing", "snowfence.workers"),
        # The supervisor is driven by the broker's loop and knows nothing of it.
        ("snowfence.broker.supervisor", "snowfence.broker.main"),
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
        # The broker's own worker ID, and the store the settings name for it.
        "snowfence.broker.main": {"snowfence.workers.inline", "snowfence.workers.main"},
    }
    for module, found in MODULES.items():
        if not module.startswith("snowfence.broker"):
            continue
        used = {f for f in found if f.startswith("snowfence.workers.")}
        modules = {".".join(f.split(".")[:3]) for f in used}
        assert modules <= allowed.get(module, set()), (module, modules)


def test_the_lease_store_is_the_workers_and_the_cluster_records_the_brokers():
    store_users = importers_of("snowfence.etcd.store")
    assert all(m.startswith("snowfence.workers.") or m == "snowfence.cli" for m in store_users), store_users
    cluster_users = importers_of("snowfence.etcd.cluster")
    assert cluster_users == {"snowfence.broker.membership", "snowfence.cli"}, cluster_users


#: The modules that hold sockets (docs/ARCHITECTURE.md, "Layers"): the rest decide without them.
SOCKET_ADAPTERS = {
    "snowfence.broker.main",
    "snowfence.broker.router",
    "snowfence.broker.auth",
    "snowfence.broker.peers",
    "snowfence.workers.main",
    "snowfence.clients.blocking",
    "snowfence.clients.aio",
    "snowfence.clients.core",  # ClientBase opens both clients' DEALER socket; its round policy imports none
    "snowfence.curve",
    "snowfence.bench",
    "snowfence.cli",
}


def test_only_the_socket_adapters_import_zmq():
    assert importers_of("zmq") <= SOCKET_ADAPTERS, importers_of("zmq") - SOCKET_ADAPTERS
    assert "snowfence.workers.core" not in importers_of("zmq")
    assert "snowfence.broker.routing" not in importers_of("zmq")


def test_the_simulator_runs_the_worker_and_routing_cores_and_keeps_no_copy_of_either_loop():
    sim = (SRC.parent / "tests" / "sim" / "sim.py").read_text()
    assert "from snowfence.workers.core import" in sim and "WorkerCore(" in sim
    assert "next_state(" not in sim and "\nTICK_NS =" not in sim and "class Held" not in sim
    assert "from snowfence.broker.routing import Routing" in sim and "Routing(" in sim
    # The worker is picked by the routing core, never by the simulator.
    assert "def pick" not in sim and ".rotation" not in sim
