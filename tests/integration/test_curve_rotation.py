"""Keys that change while a node serves: an allow-list read again when it changes
(``--curve-allow-poll-s``) and a second server key on a second endpoint
(``--curve-next-secret-key``, ``--curve-next-bind``), with real ``snowfence serve`` nodes."""

from __future__ import annotations

import re
import shutil
import threading
import time

import pytest
from nodes import wait_for
from test_edges import run_snowfence
from test_operations import get, health

from snowfence import Client
from snowfence.errors import HandshakeRefused, Timeout

POLL_S = 0.2


def keygen(name: str, directory) -> None:
    proc = run_snowfence("keygen", name, "--dir", str(directory))[0]
    assert proc.returncode == 0, proc.stderr


def served(endpoint: str, server_key, client_key, timeout_s: float = 2.0) -> bool:
    """Whether a new client of ``client_key`` gets an ID within ``timeout_s`` (a key the node
    refuses, or a server key that is not the node's, is told so by name)."""
    try:
        with Client(
            endpoint,
            timeout_s=timeout_s,
            retries=0,
            discover=False,
            server_key=str(server_key),
            client_key=str(client_key),
        ) as c:
            return sum(b.count for b in c.reserve(1)) == 1
    except HandshakeRefused:
        return False


class Steady:
    """A client of a kept key reserving in a loop on one connection; every error is kept."""

    def __init__(self, endpoint: str, server_key, client_key) -> None:
        self.client = Client(
            endpoint, timeout_s=2.0, discover=False, server_key=str(server_key), client_key=str(client_key)
        )
        self.errors: list[BaseException] = []
        self.ids = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.ids += sum(b.count for b in self.client.reserve(8))
            except BaseException as exc:  # noqa: BLE001 - any error fails the test
                self.errors.append(exc)
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.client.close()


@pytest.fixture
def keys(tmp_path):
    d = tmp_path / "keys"
    for name in ("server", "next", "alice", "bob", "carol"):
        keygen(name, d)
    allow = tmp_path / "allow"
    allow.mkdir()
    for name in ("alice", "carol"):
        shutil.copy(d / f"{name}.key", allow / f"{name}.key")
    return d


def test_the_allow_list_changes_without_a_restart(nodes, keys, tmp_path):
    allow = tmp_path / "allow"
    node = nodes.start(
        workers=1,
        bind="tcp://127.0.0.1:0",
        args=(
            "--curve-secret-key", str(keys / "server.key_secret"), "--curve-allow", str(allow),
            "--curve-allow-poll-s", str(POLL_S), "--metrics-bind", "127.0.0.1:0",
        ),
    )  # fmt: skip
    endpoint = node.wait_bound()
    server = keys / "server.key"
    wait_for(lambda: served(endpoint, server, keys / "alice.key_secret"), 20, what="alice served")
    assert served(endpoint, server, keys / "carol.key_secret")
    assert not served(endpoint, server, keys / "bob.key_secret", timeout_s=0.5)
    alice = Steady(endpoint, server, keys / "alice.key_secret")
    # carol connected before her key is taken off: her connection stays open, and is cut off too.
    carol = Client(
        endpoint,
        timeout_s=0.5,
        retries=0,
        discover=False,
        server_key=str(server),
        client_key=str(keys / "carol.key_secret"),
    )
    assert sum(b.count for b in carol.reserve(1)) == 1
    try:
        # bob in, carol out: both within the poll interval, for new connections.
        shutil.copy(keys / "bob.key", allow / "bob.key")
        (allow / "carol.key").unlink()
        changed = time.monotonic()
        wait_for(lambda: "1 added, 1 removed" in node.log(), 5, what="the reload logged")
        assert time.monotonic() - changed < POLL_S + 1.0
        assert served(endpoint, server, keys / "bob.key_secret")
        assert not served(endpoint, server, keys / "carol.key_secret", timeout_s=0.5)
        with pytest.raises(Timeout):  # on the connection made before: her requests go unanswered
            carol.reserve(1)
        # Dropped by the routing core's gate, and counted: in STATUS and in the metrics.
        with Client(endpoint, timeout_s=2.0, discover=False, server_key=str(server),
                    client_key=str(keys / "alice.key_secret")) as c:  # fmt: skip
            assert c.status()["broker"]["counters"]["revoked_dropped"] >= 1
        metrics = health(node)
        wait_for(
            lambda: re.search(r'snowfence_requests_dropped_total\{why="revoked"\} [1-9]', get(metrics, "/metrics")[1]),
            5,
            what="the revoked key's requests in the metrics",
        )
        # A list that cannot be read leaves the last one in force, said once.
        (allow / "broken.key").write_text("not a certificate\n")
        wait_for(lambda: "event=curve_allow_unreadable" in node.log(), 5, what="the unreadable list logged")
        time.sleep(3 * POLL_S)
        assert served(endpoint, server, keys / "bob.key_secret")
        assert node.log().count("event=curve_allow_unreadable") == 1
        (allow / "broken.key").unlink()
        wait_for(lambda: node.log().count("event=curve_allow_reloaded") == 2, 5, what="the second reload")
        assert "0 added, 0 removed" in node.log()
    finally:
        alice.stop()
        carol.close()
    assert not alice.errors, alice.errors[:3]
    assert alice.ids > 0
    assert node.log().count("event=curve_allow_reloaded") == 2  # each change once, not every look


def test_the_allow_list_is_read_again_by_default(nodes, keys, tmp_path):
    """Without --curve-allow-poll-s a key added is let in and a key taken off turned away, in about a second."""
    allow = tmp_path / "allow"
    node = nodes.start(
        workers=1,
        bind="tcp://127.0.0.1:0",
        args=("--curve-secret-key", str(keys / "server.key_secret"), "--curve-allow", str(allow)),
    )
    endpoint = node.wait_bound()
    server = keys / "server.key"
    wait_for(lambda: served(endpoint, server, keys / "alice.key_secret"), 20, what="alice served")
    assert not served(endpoint, server, keys / "bob.key_secret", timeout_s=0.5)
    shutil.copy(keys / "bob.key", allow / "bob.key")
    (allow / "alice.key").unlink()
    wait_for(lambda: "1 added, 1 removed" in node.log(), 5, what="the reload logged")
    assert served(endpoint, server, keys / "bob.key_secret")
    assert not served(endpoint, server, keys / "alice.key_secret", timeout_s=0.5)


def test_a_second_server_key_on_a_second_endpoint(nodes, keys, tmp_path):
    node = nodes.start(
        workers=1,
        bind="tcp://127.0.0.1:0",
        args=(
            "--curve-secret-key", str(keys / "server.key_secret"), "--curve-allow", str(tmp_path / "allow"),
            "--curve-next-secret-key", str(keys / "next.key_secret"), "--curve-next-bind", "tcp://127.0.0.1:0",
        ),
    )  # fmt: skip
    endpoint = node.wait_bound()
    found = wait_for(lambda: re.search(r"next server key \S+ is served on (tcp://\S+)", node.log()), 5)
    next_endpoint = found.group(1)
    assert next_endpoint != endpoint
    wait_for(lambda: served(endpoint, keys / "server.key", keys / "alice.key_secret"), 20, what="served")
    old = Steady(endpoint, keys / "server.key", keys / "alice.key_secret")
    new = Steady(next_endpoint, keys / "next.key", keys / "carol.key_secret")
    try:
        # Each endpoint serves its own key, and the allow-list holds on both.
        assert not served(endpoint, keys / "next.key", keys / "alice.key_secret", timeout_s=0.5)
        assert not served(next_endpoint, keys / "server.key", keys / "alice.key_secret", timeout_s=0.5)
        assert not served(next_endpoint, keys / "next.key", keys / "bob.key_secret", timeout_s=0.5)
        time.sleep(0.5)
    finally:
        old.stop()
        new.stop()
    assert not old.errors and not new.errors, (old.errors[:3], new.errors[:3])
    assert old.ids > 0 and new.ids > 0
    # The node still says, and advertises, its first endpoint.
    with Client(
        endpoint, timeout_s=2.0, discover=False, server_key=str(keys / "server.key"),
        client_key=str(keys / "alice.key_secret"),
    ) as c:  # fmt: skip
        assert c.status()["broker"]["bind"] == endpoint
