"""What pyproject.toml promises: one version, a license file, the server and etcd extras, a typed package, and an
sdist that holds the whole project (docs, tests, deployment files)."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

import snowfence

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_version_is_written_once():
    assert "version" not in PROJECT and "version" in PROJECT["dynamic"]
    assert importlib.metadata.version("snowfence") == snowfence.__version__
    written = re.findall(r"\b\d+\.\d+\.\d+\b", (ROOT / "pyproject.toml").read_text())
    assert snowfence.__version__ not in written


def test_license_file_matches_the_declared_license():
    assert PROJECT["license"] == "MIT" and PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Copyright (c) the snowfence authors" in text
    assert "Programming Language :: Python :: 3.11" in PROJECT["classifiers"]


def test_the_etcd_client_is_an_extra_the_tests_install():
    base = " ".join(PROJECT["dependencies"])
    assert not re.search(r"etcd|grpc|protobuf", base), base
    etcd = " ".join(PROJECT["optional-dependencies"]["etcd"])
    assert "etcd-sdk-python" in etcd and "grpcio" in etcd and "protobuf" in etcd
    assert "snowfence[server,etcd]" in PROJECT["optional-dependencies"]["test"]


def test_a_node_s_packages_are_the_server_extra_and_a_client_needs_only_pyzmq_and_orjson():
    """``pip install snowfence`` is a client install; a node's is ``pip install 'snowfence[server]'``
    (tests/integration/test_client_install.py installs the wheel and uses it)."""
    names = [re.match(r"[A-Za-z0-9_.-]+", dep).group(0) for dep in PROJECT["dependencies"]]
    assert names == ["pyzmq", "orjson"], names
    server = " ".join(PROJECT["optional-dependencies"]["server"])
    assert all(name in server for name in ("prometheus-client", "httptools", "setproctitle", "uvloop")), server


def tracked_files() -> list[str] | None:
    """The files of this checkout under version control; None outside a git checkout."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        return None
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [name for name in out.decode().split("\0") if name and (ROOT / name).exists()]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """An sdist and a wheel built from a copy of the checkout (its tracked files), and the wheel built
    again from the sdist, as a package index's users would."""
    tmp = tmp_path_factory.mktemp("build")
    names = tracked_files()
    if names is None:
        pytest.skip("not a git checkout: nothing to compare the sdist with")
    src = tmp / "checkout"
    for name in names:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    out = tmp / "dist"
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out), str(src)],
                   check=True, capture_output=True)  # fmt: skip
    (sdist,) = out.glob("*.tar.gz")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(sdist)],
                   check=True, capture_output=True)  # fmt: skip
    (wheel,) = out.glob("*.whl")
    return names, sdist, wheel


def test_the_sdist_carries_every_tracked_file_docs_tests_and_deploy_included(built):
    names, sdist, _ = built
    with tarfile.open(sdist) as tar:
        top = f"snowfence-{snowfence.__version__}/"
        inside = {m.name.removeprefix(top) for m in tar.getmembers() if m.isfile()}
    missing = sorted(set(names) - inside - {".gitignore"})
    assert not missing, f"not in the sdist: {missing}"
    required = ["docs/OPERATIONS.md", "tests/conftest.py", "tests/harness/nodes.py", "examples/pipeline.py",
                "deploy/systemd/snowfence.service", "deploy/kubernetes/snowfence.yaml", "LICENSE",
                "src/snowfence/py.typed"]  # fmt: skip
    assert not [name for name in required if name not in inside]
    assert not [n for n in inside if "__pycache__" in n or n.endswith((".pyc", ".so"))]


def test_the_wheel_is_typed_and_claims_no_home_page_it_does_not_have(built):
    _, _, wheel = built
    with zipfile.ZipFile(wheel) as whl:
        files = set(whl.namelist())
        (metadata,) = [n for n in files if n.endswith(".dist-info/METADATA")]
        meta = whl.read(metadata).decode()
    assert "snowfence/py.typed" in files, "PEP 561: type checkers read the package's annotations"
    assert not [n for n in files if n.startswith(("tests/", "docs/", "deploy/"))], "those are for the sdist"
    # The project has no public home page, repository or tracker yet: no URL is invented for one.
    assert "Project-URL:" not in meta and "Home-page:" not in meta
    assert "urls" not in PROJECT
