"""What pyproject.toml promises: one version, a license file, etcd as an extra."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

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
    assert "snowfence[etcd]" in PROJECT["optional-dependencies"]["test"]
