"""No call without a deadline: whatever the node does (refuses the key, speaks CURVE when
the client does not or the other way round, refuses the connection, accepts it and says
nothing, is stopped, dies mid-reply), every call of Client, AsyncClient and the command
line ends within its bound, and says why when the client can know it.

Each client makes several calls in a row in a process of its own (``calls.py``): a call
that hangs (the second did, once a refused handshake had left the DEALER with nowhere to
send) fails the test by its watchdog instead of stalling the suite. Nodes are shared by
the tests of this module where they do not interfere.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import leftovers
import pytest
import zmq
import zmq.auth
from nodes import Node, wait_for

from snowfence import Client
from snowfence.errors import KeyRefused

CALLS = str(Path(__file__).resolve().parent.parent / "harness" / "calls.py")
#: Each attempt's timeout in these tests.
T = 0.4
#: What a loaded two-core machine may add to a call's bound (process start, scheduling).
SLACK_S = 1.5
#: How long a call may take before it counts as hung.
WATCHDOG_S = 15.0
KINDS = ("sync", "async", "cli")
#: A region per node of this module: one host serves a region from one home, and the
#: module's shared nodes run beside each test's own.
REGIONS = {"curve": 0, "plain": 1, "doomed": 2, "restarted": 3, "late": 4}


class Caller:
    """A client (``kind``: sync or async) in a process of its own, making the calls it is told."""

    def __init__(self, kind: str, endpoint: str, **kw) -> None:
        settings = {"kind": kind, "endpoint": endpoint, "timeout_s": T, "retries": 0, **kw}
        self.proc = subprocess.Popen(
            [sys.executable, CALLS, json.dumps(settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        leftovers.register_process(self.proc.pid, group=True, what=f"{kind} client calls")

    def call(self, what: str = "reserve 1", watchdog_s: float = WATCHDOG_S) -> dict:
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], watchdog_s)
        if not ready:
            self.close()
            pytest.fail(f"{what!r} still running after {watchdog_s} s: the call hangs")
        line = self.proc.stdout.readline()
        if not line:
            self.close()
            pytest.fail(f"the client process died: {self.proc.stderr.read()}")
        return json.loads(line)

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            pipe.close()


def cli_call(endpoint: str, *extra: str, what: str = "reserve 1") -> dict:
    """One ``snowfence`` command, as :meth:`Caller.call` reports a call."""
    args = [sys.executable, "-m", "snowfence", *what.split(), "--connect", endpoint, "--timeout", str(T)]
    args += ["--retries", "0", *extra]
    started = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=WATCHDOG_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"snowfence {what} still running after {WATCHDOG_S} s: the call hangs")
    took = time.monotonic() - started
    assert "Traceback" not in err, err
    if proc.returncode == 0:
        return {"ok": True, "s": took}
    code = err.split(":")[1].strip() if err.startswith("snowfence: ") and err.count(":") >= 2 else None
    return {"ok": False, "code": code, "message": err.strip(), "s": took, "exit": proc.returncode}


def calls(kind: str, endpoint: str, n: int = 3, what: str = "reserve 1", **kw) -> list[dict]:
    """``n`` calls in a row by one client of ``kind`` (the command line: one process each)."""
    if kind == "cli":
        extra = []
        if kw.get("server_key"):
            extra += ["--server-key", kw["server_key"]]
        if kw.get("client_key"):
            extra += ["--client-key", kw["client_key"]]
        return [cli_call(endpoint, *extra, what=what) for _ in range(min(n, 2))]
    caller = Caller(kind, endpoint, **kw)
    try:
        return [caller.call(what) for _ in range(n)]
    finally:
        caller.close()


def within(results: list[dict], bound_s: float) -> None:
    for r in results:
        assert r["s"] < bound_s + SLACK_S, f"a call took {r['s']:.2f} s, bound {bound_s} s: {r}"


def codes(results: list[dict]) -> list:
    return [r.get("code") for r in results]


def free_port() -> int:
    """A port nothing listens on (just freed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    for name in ("server", "alice", "mallory", "carol"):
        zmq.auth.create_certificates(str(d), name)
    return d


@pytest.fixture(scope="module")
def allow(tmp_path_factory, keys) -> Path:
    d = tmp_path_factory.mktemp("allow")
    for name in ("alice", "carol"):
        shutil.copy(keys / f"{name}.key", d / f"{name}.key")
    return d


def started(node: Node, **client) -> Node:
    node.start()
    node.wait_bound()

    def serves() -> bool:
        with Client(node.endpoint, timeout_s=1.0, retries=0, discover=False, **client) as c:
            return any(w.get("in_rotation") for w in c.status()["workers"])

    wait_for(serves, 30, what=f"{node.name} to serve; log:\n{node.log_tail()}")
    return node


@pytest.fixture(scope="module")
def curve_node(tmp_path_factory, keys, allow):
    node = Node(
        tmp_path_factory.mktemp("curve"),
        "curve",
        workers=1,
        bind="tcp://127.0.0.1:0",
        args=(
            "--curve-secret-key", str(keys / "server.key_secret"), "--curve-allow", str(allow),
            "--curve-allow-poll-s", "0.2", "--region", str(REGIONS["curve"]),
        ),
    )  # fmt: skip
    try:
        yield started(node, server_key=str(keys / "server.key"), client_key=str(keys / "alice.key_secret"))
    finally:
        node.close()


@pytest.fixture(scope="module")
def plain_node(tmp_path_factory):
    node = Node(
        tmp_path_factory.mktemp("plain"), "plain", workers=1, bind="tcp://127.0.0.1:0",
        args=("--region", str(REGIONS["plain"])),
    )  # fmt: skip
    try:
        yield started(node)
    finally:
        node.close()


# -- refused handshakes: a named error within one timeout, every time ---------------------


@pytest.mark.parametrize("kind", KINDS)
def test_an_unlisted_key_is_told_so_on_every_call(kind, curve_node, keys):
    results = calls(kind, curve_node.endpoint, server_key=str(keys / "server.key"),
                    client_key=str(keys / "mallory.key_secret"))  # fmt: skip
    assert codes(results) == ["key_refused"] * len(results), results
    assert "refused this client's key" in results[0]["message"]
    within(results, T)
    if kind == "cli":
        assert all(r["exit"] == 78 for r in results), results  # a setting to fix, not a node to wait for
    else:
        assert not results[0]["retriable"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_plain_client_of_a_curve_node_is_told_to_give_the_server_key(kind, curve_node):
    results = calls(kind, curve_node.endpoint, what="status" if kind != "cli" else "reserve 1")
    assert codes(results) == ["curve_required"] * len(results), results
    assert "uses CURVE: give server_key" in results[0]["message"]
    within(results, T)


@pytest.mark.parametrize("kind", KINDS)
def test_a_curve_client_of_a_plain_node_is_told_the_node_does_not_use_curve(kind, plain_node, keys):
    results = calls(kind, plain_node.endpoint, server_key=str(keys / "server.key"))
    assert codes(results) == ["curve_not_used"] * len(results), results
    assert "does not use CURVE" in results[0]["message"]
    within(results, T)


@pytest.mark.parametrize("kind", ("sync", "async"))
def test_a_wrong_server_key_is_named(kind, curve_node, keys):
    results = calls(kind, curve_node.endpoint, server_key=str(keys / "alice.key"),
                    client_key=str(keys / "alice.key_secret"))  # fmt: skip
    assert codes(results) == ["server_key_wrong"] * len(results), results
    within(results, T)


def change_allow_list(node: Node, change) -> None:
    """Make ``change`` to the allow-list and wait until the node has read it again."""
    before = node.log().count("event=curve_allow_reloaded")
    change()
    wait_for(lambda: node.log().count("event=curve_allow_reloaded") > before, 5, what="the reload")


@pytest.mark.parametrize("kind", ("sync", "async"))
def test_a_key_revoked_while_the_client_runs(kind, curve_node, keys, allow):
    caller = Caller(kind, curve_node.endpoint, server_key=str(keys / "server.key"),
                    client_key=str(keys / "carol.key_secret"))  # fmt: skip
    try:
        assert caller.call()["ok"]
        change_allow_list(curve_node, (allow / "carol.key").unlink)
        try:
            results = [caller.call() for _ in range(4)]
        finally:
            change_allow_list(curve_node, lambda: shutil.copy(keys / "carol.key", allow / "carol.key"))
    finally:
        caller.close()
    # The connection open before stays open and its requests go unanswered: a timeout (or
    # a retry on a new connection, refused); then every call is refused by name.
    assert set(codes(results[:1])) <= {"timeout", "key_refused"}, results
    assert codes(results[1:]) == ["key_refused"] * 3, results
    within(results, T)


def test_a_key_revoked_is_refused_by_the_command_line(curve_node, keys, allow):
    secure = {"server_key": str(keys / "server.key"), "client_key": str(keys / "mallory.key_secret")}
    change_allow_list(curve_node, lambda: shutil.copy(keys / "mallory.key", allow / "mallory.key"))
    try:
        assert calls("cli", curve_node.endpoint, n=1, **secure)[0]["ok"]
    finally:
        change_allow_list(curve_node, (allow / "mallory.key").unlink)
    assert codes(calls("cli", curve_node.endpoint, **secure)) == ["key_refused"] * 2


# -- nodes that are not there, or say nothing ------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_port_that_refuses_connections_fails_at_once(kind):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    results = calls(kind, endpoint, timeout_s=5.0) if kind != "cli" else calls(kind, endpoint)
    assert codes(results) == ["connection_refused"] * len(results), results
    assert "refused the connection" in results[0]["message"]
    if kind != "cli":
        # Not a timeout of 5 s: the refusal is seen in one round trip.
        assert all(r["s"] < 0.5 + SLACK_S for r in results), results


@pytest.fixture
def silent_listener():
    """A TCP port that accepts connections and never says a word."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"tcp://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("kind", KINDS)
def test_a_node_that_accepts_and_never_answers_times_out_each_call(kind, silent_listener):
    results = calls(kind, silent_listener)
    assert codes(results) == ["timeout"] * len(results), results
    assert "handshake never finished" in results[0]["message"]
    within(results, T)


@pytest.mark.parametrize("kind", KINDS)
def test_a_stopped_node_times_out_each_call(kind, plain_node):
    caller = Caller(kind, plain_node.endpoint) if kind != "cli" else None
    try:
        if caller is not None:
            assert caller.call()["ok"]  # connected and answered before it stops
        os.killpg(plain_node.pgid, signal.SIGSTOP)
        try:
            if caller is not None:
                results = [caller.call() for _ in range(3)]
            else:
                results = calls(kind, plain_node.endpoint)
        finally:
            os.killpg(plain_node.pgid, signal.SIGCONT)
    finally:
        if caller is not None:
            caller.close()
    assert codes(results) == ["timeout"] * len(results), results
    # Each call: its own attempt, and (a client that heard the node) the NODES asked first.
    within(results, T)


@pytest.mark.parametrize("kind", ("sync", "async"))
def test_a_node_killed_mid_reply(kind, tmp_path):
    node = Node(tmp_path, "doomed", workers=1, bind="tcp://127.0.0.1:0", args=("--region", str(REGIONS["doomed"])))
    try:
        started(node)
        caller = Caller(kind, node.endpoint, timeout_s=T, retries=2)
        try:
            assert caller.call()["ok"]
            caller.proc.stdin.write("reserve 50000000\n")  # many round trips: the kill lands mid-call
            caller.proc.stdin.flush()
            time.sleep(0.3)
            node.kill()
            ready, _, _ = select.select([caller.proc.stdout], [], [], WATCHDOG_S)
            assert ready, "the call in flight when the node died hangs"
            killed = json.loads(caller.proc.stdout.readline())
            after = [caller.call() for _ in range(3)]
        finally:
            caller.close()
    finally:
        node.close()
    assert not killed["ok"] and killed["code"] in ("connection_refused", "timeout"), killed
    assert codes(after) == ["connection_refused"] * 3, after
    # retries=2: at most three attempts, each a timeout at worst, plus back-off.
    within([killed], 3 * T + 2 * 1.0)
    within(after, 3 * T + 2 * 1.0)


@pytest.mark.parametrize("kind", ("sync", "async"))
def test_a_key_dropped_while_the_node_restarts_is_refused_not_hung(kind, tmp_path, keys):
    # The client's connection comes back on its own after the restart, and its handshake is
    # refused: that leaves its socket with nowhere to send, and a send without a deadline
    # waited there for ever.
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    shutil.copy(keys / "carol.key", allowed / "carol.key")
    secure = {"server_key": str(keys / "server.key"), "client_key": str(keys / "carol.key_secret")}
    args = ("--curve-secret-key", str(keys / "server.key_secret"), "--curve-allow", str(allowed))
    args += ("--region", str(REGIONS["restarted"]))
    node = Node(tmp_path, "restarted", workers=1, bind="tcp://127.0.0.1:0", args=args)
    try:
        started(node, **secure)
        caller = Caller(kind, node.endpoint, **secure)
        try:
            assert caller.call()["ok"]
            node.kill()
            (allowed / "carol.key").unlink()
            node.bind = node.endpoint  # the same port again
            node.start()
            wait_for(lambda: node.log().count("snowfence serving on") == 2, 30, what="the restart")
            time.sleep(1.0)  # the client's connection is back, and refused
            results = [caller.call() for _ in range(3)]
        finally:
            caller.close()
    finally:
        node.close()
    assert codes(results) == ["key_refused"] * 3, [r.get("message") for r in results]
    within(results, T)


# -- the transport's own guards: a send never waits past its deadline -------------------


@pytest.fixture
def refusing_router():
    """A ZeroMQ CURVE server whose ZAP handler refuses every key: once it has refused a
    DEALER's handshake, that DEALER has nowhere to send (libzmq takes its pipe away), the
    state a client meets when a node refuses it between two of its sends."""
    from zmq.auth.thread import ThreadAuthenticator

    ctx = zmq.Context()
    public, secret = zmq.curve_keypair()
    auth = ThreadAuthenticator(ctx)
    auth.start()

    class Nobody:
        def callback(self, domain, key):
            return False

    auth.configure_curve_callback(domain="*", credentials_provider=Nobody())
    router = ctx.socket(zmq.ROUTER)
    router.curve_server = True
    router.curve_secretkey, router.curve_publickey = secret, public
    port = router.bind_to_random_port("tcp://127.0.0.1")
    yield f"tcp://127.0.0.1:{port}", public.decode()
    router.close(0)
    auth.stop()
    ctx.term()


@pytest.mark.timeout(30)
def test_a_send_on_a_refused_connection_ends_at_once(refusing_router):
    # A blocking send there waits for ever. The client's sends never block: this one
    # learns why from the monitor (not read before it) and ends at once.
    from snowfence.clients.blocking import _Lost

    endpoint, server_key = refusing_router
    with Client(endpoint, timeout_s=T, server_key=server_key) as client:
        # Whether libzmq takes the pipe away after a refusal is a race of its own: connect
        # until it has (the socket then says it cannot take a message).
        for _ in range(50):
            sock = client._socket()
            time.sleep(0.2)  # the handshake is refused meanwhile; the monitor is not read
            if not sock.getsockopt(zmq.EVENTS) & zmq.POLLOUT:
                break
            client._reset(rotate=False)
        else:
            pytest.skip("libzmq kept the refused connection's pipe every time")
        started_s = time.monotonic()
        with pytest.raises(_Lost) as lost:
            client._send_by(sock, b"x", time.monotonic_ns() + int(20e9))
        assert time.monotonic() - started_s < 5
        assert lost.value.error.code == "key_refused"
        # And the calls themselves, one after another.
        for _ in range(3):
            with pytest.raises(KeyRefused):
                client.reserve(1)


@pytest.mark.timeout(30)
def test_an_async_send_with_no_room_ends_at_its_deadline(refusing_router):
    import asyncio

    from snowfence import AsyncClient

    endpoint, server_key = refusing_router

    async def main() -> float:
        async with AsyncClient(endpoint, timeout_s=T, server_key=server_key) as client:
            for _ in range(50):  # until libzmq has taken the pipe away (see above)
                sock = client._socket()
                await asyncio.sleep(0.2)  # refused: no room will ever come
                if not sock.getsockopt(zmq.EVENTS) & zmq.POLLOUT:
                    break
                client._reset(rotate=False)
            else:
                pytest.skip("libzmq kept the refused connection's pipe every time")
            waiter = asyncio.get_running_loop().create_future()  # nothing ends it but the deadline
            started_s = time.monotonic()
            await client._send_late(sock, b"x", waiter, time.monotonic_ns() + int(T * 1e9))
            took = time.monotonic() - started_s
            # A request sent before the monitor has told (its news on the way): the send
            # ends by the deadline, and the request times out as if unanswered.
            client._watch.error = None
            pending, frame = client._core.reserve(1, time.monotonic_ns() + int(T * 1e9))
            future = await asyncio.wait_for(client._ask(pending, frame), T + 5)
            assert not future.done()
            client._reset(rotate=False)
            for _ in range(3):
                with pytest.raises(KeyRefused):
                    await client.reserve(1)
            return took

    assert asyncio.run(main()) < T + SLACK_S


# -- a client that starts before its node -------------------------------------------------


def test_a_loader_started_before_its_node_waits_for_it_with_a_time_budget(tmp_path):
    # On ipc://: nothing there until it starts.
    node = Node(tmp_path, "late", workers=1, args=("--region", str(REGIONS["late"])))
    cli = subprocess.Popen(
        [sys.executable, "-m", "snowfence", "reserve", "3", "--connect", node.endpoint, "--timeout", "0.5",
         "--retry-for", "40"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    leftovers.register_process(cli.pid, group=True, what="snowfence reserve")
    callers = [Caller(kind, node.endpoint, timeout_s=0.5, retry_for_s=40.0) for kind in ("sync", "async")]
    try:
        for caller in callers:
            caller.proc.stdin.write("reserve 3\n")
            caller.proc.stdin.flush()
        time.sleep(1.0)  # they are refused meanwhile, and retry
        assert cli.poll() is None
        node.start()
        out, err = cli.communicate(timeout=WATCHDOG_S + 40)
        assert cli.returncode == 0 and len(out.split()) == 3, err
        for caller in callers:
            ready, _, _ = select.select([caller.proc.stdout], [], [], WATCHDOG_S + 40)
            assert ready, "a client waiting for its node hangs"
            assert json.loads(caller.proc.stdout.readline())["ok"]
            assert caller.call()["ok"]
    finally:
        for caller in callers:
            caller.close()
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.communicate()
        node.close()


@pytest.mark.parametrize("kind", ("sync", "async"))
def test_a_time_budget_ends_the_call_when_it_has_passed(kind, tmp_path):
    results = calls(kind, f"ipc://{tmp_path}/nobody.sock", n=2, timeout_s=0.3, retry_for_s=1.0)
    assert codes(results) == ["connection_refused"] * 2, results
    # Refused at once each time, retried with back-off until the budget has passed.
    assert all(1.0 <= r["s"] < 1.0 + 1.0 + SLACK_S for r in results), results
