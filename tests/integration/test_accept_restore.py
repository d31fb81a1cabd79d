"""accept-restore on etcd: a dry run writes nothing; a store that shows no sign of going back needs --force."""

from __future__ import annotations

import subprocess
import sys

from nodes import etcd_args


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snowfence", *args], capture_output=True, text=True, timeout=60)


def test_etcd_dry_run_and_a_healthy_store_refused_without_force(etcd):
    common = ("accept-restore", "--reason", "restored on purpose", *etcd_args(etcd, "healthy"))
    p = cli(*common, "--dry-run")
    assert p.returncode == 0 and "dry run" in p.stdout and "layout record is gone" in p.stdout, p.stdout + p.stderr
    assert not etcd.ctl("get", "--prefix", "/snowfence/healthy/", "--keys-only").stdout.strip()

    assert cli(*common).returncode == 0  # no layout record: accepted
    layout = etcd.ctl("get", "--prefix", "/snowfence/healthy/").stdout

    p = cli(*common)
    assert p.returncode == 78, p.stdout + p.stderr
    assert "no sign of going back" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    p = cli(*common, "--dry-run")
    assert p.returncode == 0 and "shows no sign of going back" in p.stdout, p.stdout + p.stderr
    assert etcd.ctl("get", "--prefix", "/snowfence/healthy/").stdout == layout

    p = cli(*common, "--force")
    assert p.returncode == 0 and "accepted restore" in p.stdout, p.stdout + p.stderr
    assert etcd.ctl("get", "--prefix", "/snowfence/healthy/").stdout != layout
