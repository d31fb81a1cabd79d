"""A client install (``pip install snowfence``) is pyzmq and orjson and nothing of a node's.

The wheel is built from this checkout and installed into a fresh virtualenv (no system
site-packages) with its dependencies only; that venv's ``snowfence`` then talks to a node
started from the test environment (which has the server extra), and refuses to be one.
pyzmq and orjson come from the package index, at the versions this environment runs (pip's
cache usually has them): without the index the test is skipped, except in CI, where it must run.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import netns
import pytest

ROOT = Path(__file__).resolve().parents[2]
#: A node's packages (the server extra) and the etcd extra's gRPC: none belongs in a client install.
NOT_FOR_CLIENTS = {"prometheus-client", "httptools", "setproctitle", "uvloop", "grpcio"}
#: What ``pip install`` prints when it cannot reach the index.
OFFLINE = re.compile(r"NewConnectionError|Temporary failure in name resolution|Network is unreachable|ConnectTimeout")


def ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def clean_env() -> dict:
    """This environment without what would let the client venv see the test environment's packages."""
    drop = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SNOWFENCE_")}


def run(*cmd, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=clean_env(), **kw)


def build_wheel(tmp: Path) -> Path:
    """The wheel of this checkout, built without fetching anything (as the packaging tests build it),
    from a copy of what a wheel is made of, so that nothing is written into the checkout."""
    src = tmp / "src-copy"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp / "dist"
    p = run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", out, src, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    (wheel,) = out.glob("snowfence-*.whl")
    return wheel


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory) -> Path:
    """The bin directory of a fresh venv with the wheel and its dependencies, and nothing else."""
    tmp = tmp_path_factory.mktemp("client-install")
    wheel = build_wheel(tmp)
    venv = tmp / "venv"
    p = run(sys.executable, "-m", "venv", venv)
    assert p.returncode == 0, p.stderr
    python = venv / "bin" / "python"
    # The wheel by its path (never a "snowfence" from the index); its dependencies at the versions
    # this environment runs, which pip's cache likely holds.
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in ("pyzmq", "orjson")]
    # pip reaches the index from the machine's network namespace, not the test process's own.
    p = run(
        python,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "-q",
        wheel,
        *pins,
        timeout=180,
        preexec_fn=netns.outside,
    )
    if p.returncode != 0 and OFFLINE.search(p.stdout + p.stderr) and not ci():
        pytest.skip(f"the package index is out of reach: {p.stderr.strip().splitlines()[-1]}")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return venv / "bin"


def test_a_client_install_has_no_server_packages(client_venv):
    p = run(client_venv / "python", "-m", "pip", "list", "--format", "json", "--disable-pip-version-check")
    assert p.returncode == 0, p.stderr
    names = {re.sub(r"[-_.]+", "-", d["name"]).lower() for d in json.loads(p.stdout)}
    assert {"snowfence", "pyzmq", "orjson"} <= names, names
    assert not names & NOT_FOR_CLIENTS, f"a client install pulled {sorted(names & NOT_FOR_CLIENTS)}"
    # Nor does it see the test environment's: the venv is its own.
    p = run(client_venv / "python", "-c", "import sys; print(sys.prefix != sys.base_prefix, sys.path)")
    assert p.stdout.startswith("True") and "site-packages" in p.stdout and str(ROOT / "src") not in p.stdout


def test_the_client_install_reserves_from_a_node_and_decodes(client_venv, nodes):
    node = nodes.start(workers=1)  # the test environment's snowfence, which has the server extra
    node.wait_ready()
    sf = client_venv / "snowfence"
    p = run(sf, "reserve", "5", "--connect", node.endpoint, "--timeout", "5")
    assert p.returncode == 0, p.stderr
    ids = [int(i) for i in p.stdout.split()]
    assert len(set(ids)) == 5 and ids == sorted(ids), p.stdout
    p = run(sf, "decode", str(ids[0]), "--connect", node.endpoint, "--timeout", "5")
    assert p.returncode == 0 and "worker=" in p.stdout, p.stderr
    p = run(sf, "status", "--connect", node.endpoint, "--timeout", "5", "--json")
    assert p.returncode == 0 and json.loads(p.stdout), p.stderr
    for args in (("--help",), ("-V",), ("completion", "bash")):
        p = run(sf, *args)
        assert p.returncode == 0 and p.stdout and not p.stderr, (args, p.stderr)
    # The asyncio client, on the standard loop (no uvloop here).
    code = """if True:
        import sys
        from snowfence import AsyncClient
        from snowfence.clients.aio import run

        async def main():
            async with AsyncClient(sys.argv[1]) as client:
                return (await client.reserve(1))[0].first

        print(run(main()))
    """
    p = run(client_venv / "python", "-c", code, node.endpoint)
    assert p.returncode == 0 and int(p.stdout) > ids[-1], p.stderr
    assert "Traceback" not in node.log()


@pytest.mark.parametrize("command", ["serve", "check-config"])
def test_a_client_install_refuses_to_be_a_node_in_one_line(client_venv, tmp_path, command):
    cmd = [client_venv / "snowfence", command, "--state-dir", tmp_path / "state", "--bind", f"ipc://{tmp_path}/n.sock"]
    # Its own process group: a node that did start (the extra's packages found after all) is
    # stopped with the workers it spawned.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{command} ran in a client install")
    p = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    assert p.returncode == 78, (p.returncode, p.stdout, p.stderr)  # EX_CONFIG, as etcd mode without its extra
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and "Traceback" not in p.stderr, p.stderr
    assert "pip install 'snowfence[server]'" in p.stderr, p.stderr
    assert not (tmp_path / "state").exists() and not (tmp_path / "n.sock").exists()
