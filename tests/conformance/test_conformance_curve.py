"""CURVE for clients, per docs/PROTOCOL.md ("Encryption and authentication (CURVE)"): the key
files ``snowfence keygen`` writes and how a client reads them; a client with the server's
public key and a key pair of its own gets in (with ``--curve-allow``: only one whose public
key is in the directory when the node starts); a refused client hears nothing; and a node
with CURVE has no fast port.

The keys are read from the files as the document describes them, with no snowfence code.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sfwire
import zmq
from zmq.utils import z85

#: Long enough for a CURVE handshake and a reply on a loaded machine; a refusal is this long a silence.
SILENCE_MS = 700


def keygen(name: str, directory: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNOWFENCE_")}
    proc = subprocess.run(
        [sys.executable, "-m", "snowfence", "keygen", name, "--dir", str(directory)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr


def read_keys(path: Path) -> dict[str, bytes]:
    """The keys of a certificate file as the document describes it: ``#`` comments, and
    ``public-key = "..."`` / ``secret-key = "..."`` lines under the ``curve`` section."""
    keys, section = {}, None
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            section = line.strip()
            continue
        found = re.fullmatch(r'\s+(public-key|secret-key) = "(.{40})"', line)
        if section == "curve" and found:
            keys[found.group(1)] = found.group(2).encode()
    return keys


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    """server.key(_secret), alice.key(_secret) and bob.key(_secret), and allow/ holding alice.key alone."""
    d = tmp_path_factory.mktemp("keys")
    for name in ("server", "alice", "bob"):
        keygen(name, d)
    (d / "allow").mkdir()
    shutil.copy(d / "alice.key", d / "allow" / "alice.key")
    return d


@pytest.fixture(scope="module")
def allow_node(start_node, tmp_path_factory, keys):
    """A node with CURVE and an allow-list read once, at start (``--curve-allow-poll-s 0``; the
    default reads it again every second), bound to tcp:// (``--fast-bind auto``)."""
    args = (
        "--curve-secret-key",
        str(keys / "server.key_secret"),
        "--curve-allow",
        str(keys / "allow"),
        "--curve-allow-poll-s",
        "0",
    )
    srv = _curve_node(start_node, tmp_path_factory.mktemp("curve"), args, keys, tcp=True)
    try:
        shutil.copy(keys / "bob.key", keys / "allow" / "bob.key")  # after the start: not read
        yield srv
    finally:
        srv.kill()


def _curve_node(start_node, directory: Path, args, keys: Path, tcp: bool = False):
    """A started CURVE node; readiness is asked with alice's key pair (STATUS as the suite asks it)."""
    alice = read_keys(keys / "alice.key_secret")
    server_key = read_keys(keys / "server.key")["public-key"]
    original = sfwire.socket

    def curve_socket(ctx, kind=zmq.DEALER, timeout_ms=3000):
        sock = original(ctx, kind, timeout_ms)
        sock.curve_serverkey = server_key
        sock.curve_publickey = alice["public-key"]
        sock.curve_secretkey = alice["secret-key"]
        return sock

    sfwire.socket = curve_socket  # the Server's STATUS polls go through sfwire.connect
    try:
        return start_node(directory, workers=1, args=args, tcp=tcp)
    finally:
        sfwire.socket = original


def client(node, server_key: bytes | None, pair: tuple[bytes, bytes] | None) -> zmq.Socket:
    sock = sfwire.socket(node.ctx, zmq.DEALER, SILENCE_MS)
    if server_key is not None:
        sock.curve_serverkey = server_key
        sock.curve_publickey, sock.curve_secretkey = pair
    sock.connect(node.endpoint)
    return sock


def answered(node, server_key, pair, body: bytes) -> sfwire.Reply | None:
    sock = client(node, server_key, pair)
    try:
        sock.send(body)
        if not sock.poll(SILENCE_MS):
            return None
        return sfwire.parse(sfwire.body_of(sock.recv_multipart()))
    finally:
        sock.close(0)


def pair_of(path: Path) -> tuple[bytes, bytes]:
    keys = read_keys(path)
    return keys["public-key"], keys["secret-key"]


# -- the key files -------------------------------------------------------------------------------


def test_keygen_writes_the_public_key_alone_and_a_secret_file_for_its_owner_only(keys):
    public, secret = read_keys(keys / "server.key"), read_keys(keys / "server.key_secret")
    assert set(public) == {"public-key"} and set(secret) == {"public-key", "secret-key"}
    assert public["public-key"] == secret["public-key"]
    assert all(len(k) == 40 for k in (*public.values(), *secret.values()))
    assert len(z85.decode(public["public-key"])) == 32
    assert stat.S_IMODE((keys / "server.key_secret").stat().st_mode) == 0o600
    # The secret key is the public key's: libzmq derives one from the other.
    assert zmq.curve_public(secret["secret-key"]) == public["public-key"]


# -- who gets in -------------------------------------------------------------------------------------


def test_a_client_with_the_server_key_and_an_allowed_key_pair_is_served(allow_node, keys):
    server_key = read_keys(keys / "server.key")["public-key"]
    reply = answered(allow_node, server_key, pair_of(keys / "alice.key_secret"), sfwire.reserve(1, 5))
    assert reply is not None and reply.request_id == 1 and reply.block[1] >= 1


@pytest.mark.parametrize("who", ["unlisted-key-pair", "no-curve", "another-server-key", "listed-after-start"])
def test_a_refused_client_hears_nothing(allow_node, keys, who):
    server_key = read_keys(keys / "server.key")["public-key"]
    alice = pair_of(keys / "alice.key_secret")
    if who == "unlisted-key-pair":
        args = (server_key, zmq.curve_keypair())
    elif who == "no-curve":
        args = (None, None)
    elif who == "another-server-key":
        args = (zmq.curve_keypair()[0], alice)
    else:  # bob.key went into the directory after the node started
        assert (keys / "allow" / "bob.key").exists()
        args = (server_key, pair_of(keys / "bob.key_secret"))
    assert answered(allow_node, *args, sfwire.reserve(2, 1)) is None  # no ERROR: silence
    # ... while an allowed client is served as before.
    assert answered(allow_node, server_key, alice, sfwire.status(3)) is not None


def test_the_node_logs_a_client_it_turned_away(allow_node, keys):
    server_key = read_keys(keys / "server.key")["public-key"]
    assert answered(allow_node, server_key, zmq.curve_keypair(), sfwire.reserve(1, 1)) is None
    deadline = time.monotonic() + 3
    while "curve_denied" not in allow_node.log_tail(400):
        assert time.monotonic() < deadline, allow_node.log_tail()
        time.sleep(0.05)


def test_a_curve_node_has_no_fast_port_and_no_http_door(allow_node, keys):
    server_key = read_keys(keys / "server.key")["public-key"]
    alice = pair_of(keys / "alice.key_secret")
    assert allow_node.endpoint.startswith("tcp://")  # a tcp:// bind, which has one without CURVE
    status = answered(allow_node, server_key, alice, sfwire.status(4)).json
    nodes = answered(allow_node, server_key, alice, sfwire.nodes(5)).json
    assert status["broker"]["fast_port"] is None
    assert nodes["fast_port"] is None and [n["fast_port"] for n in nodes["nodes"]] == [None]
    assert status["broker"]["http_port"] is None
    assert nodes["http_port"] is None and [n["http_port"] for n in nodes["nodes"]] == [None]


def test_without_an_allow_list_any_key_pair_with_the_server_key_gets_in(start_node, tmp_path, keys):
    srv = _curve_node(start_node, tmp_path, ("--curve-secret-key", str(keys / "server.key_secret")), keys)
    try:
        server_key = read_keys(keys / "server.key")["public-key"]
        reply = answered(srv, server_key, zmq.curve_keypair(), sfwire.reserve(1, 1))
        assert reply is not None and reply.block[1] == 1
        assert answered(srv, None, None, sfwire.reserve(2, 1)) is None  # still CURVE only
    finally:
        srv.kill()


@pytest.mark.parametrize("flag, needle", [("--fast-bind", "fast"), ("--http-bind", "http")])
def test_a_node_with_curve_and_a_fixed_fast_port_or_http_door_refuses_to_start(
    keys, tmp_path, unused_port, flag, needle
):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNOWFENCE_")}
    cmd = [sys.executable, "-m", "snowfence", "serve", "--bind", f"ipc://{tmp_path}/sf.sock"]
    cmd += ["--state-dir", str(tmp_path / "state"), "--workers", "1"]
    cmd += ["--curve-secret-key", str(keys / "server.key_secret"), flag, f"127.0.0.1:{unused_port()}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=30, start_new_session=True)
    assert proc.returncode == 78, (proc.returncode, proc.stderr)
    assert needle in proc.stderr.lower() and "Traceback" not in proc.stderr
