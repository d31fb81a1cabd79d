"""The allow-list read again when it changes (broker/auth.py ``Gatekeeper.reload``)."""

from __future__ import annotations

import shutil

import pytest
import zmq
import zmq.auth

from snowfence.broker.auth import Denials, Gatekeeper


@pytest.fixture
def keys(tmp_path):
    d = tmp_path / "keys"
    d.mkdir()
    for name in ("alice", "bob"):
        zmq.auth.create_certificates(str(d), name)
    allow = tmp_path / "allow"
    allow.mkdir()
    shutil.copy(d / "alice.key", allow / "alice.key")
    return d


def public(path) -> bytes:
    return zmq.auth.load_certificate(str(path))[0]


def test_reload_takes_a_changed_list_keeps_the_last_good_one_and_names_revoked_keys(keys, tmp_path, caplog):
    ctx = zmq.Context()
    gate = Gatekeeper(ctx, str(tmp_path / "allow"), Denials())
    gate.start()
    try:
        alice, bob = public(keys / "alice.key"), public(keys / "bob.key")
        assert set(gate.certs["*"]) == {alice}
        assert not gate.reload()  # nothing changed: nothing read, nothing logged
        shutil.copy(keys / "bob.key", tmp_path / "allow" / "bob.key")
        (tmp_path / "allow" / "alice.key").unlink()
        assert gate.reload()
        assert set(gate.certs["*"]) == {bob} and gate.revoked == {alice}
        (tmp_path / "allow" / "broken.key").write_text("not a certificate\n")
        assert not gate.reload() and not gate.reload()
        assert set(gate.certs["*"]) == {bob}  # the last list read stays in force
        assert sum("cannot read the allow-list" in r.getMessage() for r in caplog.records) == 1
        (tmp_path / "allow" / "broken.key").unlink()
        shutil.copy(keys / "alice.key", tmp_path / "allow" / "alice.key")
        assert gate.reload()
        assert set(gate.certs["*"]) == {alice, bob} and gate.revoked == frozenset()
    finally:
        gate.stop()
        ctx.term()
