"""CURVE keys, read the same way by the broker (its key pair) and by clients (the server's
public key, their own key pair): what each accepts, and what each says about a bad file."""

from __future__ import annotations

import pytest
import zmq
import zmq.auth

from snowfence.broker import auth
from snowfence.curve import Curve, load_key_pair, load_public_key
from snowfence.errors import ConfigError


@pytest.fixture
def keys(tmp_path):
    zmq.auth.create_certificates(tmp_path, "server")
    zmq.auth.create_certificates(tmp_path, "client")
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "junk").write_bytes(b"\xff\xfe not a certificate\n")
    (tmp_path / "short.key").write_text('metadata\ncurve\n    public-key = "tooshort"\n')
    return tmp_path


def test_the_broker_and_a_client_of_the_same_key_pair_agree_on_it(keys):
    public, secret = auth.load_server_key(str(keys / "server.key_secret"))
    assert load_public_key(str(keys / "server.key")) == public
    assert load_public_key(public) == load_public_key(public.decode()) == public  # the key itself
    curve = Curve.for_client(keys / "server.key", keys / "client.key_secret")
    assert curve.server_public == public and (curve.public, curve.secret) == load_key_pair(
        keys / "client.key_secret", "client key"
    )
    assert Curve.for_client(str(keys / "server.key")).public != curve.public  # a session key pair


@pytest.mark.parametrize(
    "name, words",
    [
        ("nosuch.key_secret", "no such file"),
        ("empty", "is not a CURVE key certificate"),
        ("junk", "is not a CURVE key certificate"),
        ("short.key", "is not a CURVE key (40 Z85 characters)"),
        ("server.key", "holds no secret key; give the .key_secret file"),
    ],
)
def test_a_bad_key_file_is_named_alike_on_both_sides(keys, name, words):
    path = str(keys / name)
    with pytest.raises(ConfigError) as broker:
        auth.load_server_key(path)
    with pytest.raises(ValueError) as client:
        Curve.for_client(keys / "server.key", path)
    for caught in (broker, client):
        assert path in str(caught.value) and words in str(caught.value), str(caught.value)


@pytest.mark.parametrize("key", ["Z" * 39, "short", b"\x00" * 40])
def test_a_server_key_that_is_no_key_is_refused(key):
    with pytest.raises(ValueError):
        load_public_key(key)


def test_the_peers_of_a_node_talk_to_it_as_clients_of_its_own_key_pair(keys):
    config = type("C", (), {"curve_secret_key": str(keys / "server.key_secret"), "curve_allow": ""})()
    server = auth.CurveServer(zmq.Context.instance(), config, auth.Denials())
    try:
        peers = server.for_peers()
        assert isinstance(peers, Curve) and peers.server_public == peers.public == server.public
    finally:
        server.close()
