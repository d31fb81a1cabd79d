"""Which etcd releases a node warns of before it starts."""

from __future__ import annotations

import pytest

from snowfence.broker import preflight


@pytest.mark.parametrize("version", ["3.5.0", "3.5.1", "3.5.4", "3.5.4-rc.1"])
def test_the_etcd_releases_that_panic_on_a_read_only_transaction_timing_out_are_named(version):
    problem = preflight.etcd_version_problem(version)
    assert problem is not None and f"etcd {version} crashes" in problem and "14110" in problem


@pytest.mark.parametrize("version", ["3.4.23", "3.5.5", "3.5.17", "3.6.0", "", "not.a.version"])
def test_other_etcd_releases_are_not(version):
    assert preflight.etcd_version_problem(version) is None
