"""Any client, driven through the suite's cases over the driver protocol of
tests/conformance/README.md: the suite starts the client's driver program once, sends it
one case per line (a JSON object naming the server's endpoint), and reads one answer per
line, which it checks against real servers as it checks its own wire requests.

By default the drivers of the example C client (``snowfence_client --driver``) and of the
Python client (``drivers/python_client.py``) run; ``CONFORMANCE_CLIENT='COMMAND ARGS'``
runs that command instead (one client)."""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sfwire

#: How long one case may take, from the line sent to the answer read (a hang fails the case).
ANSWER_TIMEOUT_S = 20
DRIVERS = Path(__file__).parent / "drivers"
#: The command of the client under test, when given (shell words).
GIVEN = os.environ.get("CONFORMANCE_CLIENT", "").strip()


class Driven:
    """One client's driver program: a case out on its stdin, its answer in from its stdout."""

    def __init__(self, argv: list[str], log: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SNOWFENCE_")}
        self.log = log
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                start_new_session=True,
            )
        self.buf = b""
        self.ids = iter(range(1, 1 << 62))

    def ask(self, case: dict) -> dict:
        case = {"id": next(self.ids), **case}
        self.proc.stdin.write(json.dumps(case).encode() + b"\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            assert left > 0, f"no answer to {case} within {ANSWER_TIMEOUT_S} s; stderr:\n{self.stderr()}"
            if select.select([self.proc.stdout], [], [], left)[0]:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
                assert chunk, f"the driver exited ({self.proc.poll()}) on {case}; stderr:\n{self.stderr()}"
                self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        answer = json.loads(line)
        assert isinstance(answer, dict) and answer.get("id") == case["id"], (case, answer)
        return answer

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


@pytest.fixture(scope="module", params=["given"] if GIVEN else ["c", "python"])
def client(request, tmp_path_factory) -> Driven:
    if request.param == "given":
        argv = shlex.split(GIVEN)
    elif request.param == "c":
        argv = [str(request.getfixturevalue("c_client")), "--driver"]
    else:
        argv = [sys.executable, str(DRIVERS / "python_client.py")]
    driven = Driven(argv, tmp_path_factory.mktemp("driven") / f"{request.param}.stderr")
    try:
        yield driven
    finally:
        driven.close()


@pytest.fixture(scope="module")
def tcp_node(start_node, tmp_path_factory):
    """A 1-worker node bound to tcp:// (so with a fast port a client may use), whose worker
    leaves rotation within a second of being stopped (and is not killed for it)."""
    args = ("--heartbeat-interval-s", "0.1", "--heartbeat-timeout-s", "0.5", "--worker-kill-after-s", "60")
    srv = start_node(tmp_path_factory.mktemp("driven-node"), workers=1, tcp=True, args=args)
    try:
        yield srv
    finally:
        srv.kill()


def supported(answer: dict) -> dict:
    if answer.get("unsupported") is True:
        # A client named by CONFORMANCE_CLIENT may leave a case out; the project's own
        # clients do every case, and one they stop doing fails here rather than skips.
        assert GIVEN, "the project's own client answered 'unsupported'"
        pytest.skip("the client does not support this case")
    assert "error" not in answer, answer
    return answer


def check_ids(texts: list, n: int, status: dict) -> list[int]:
    """``texts`` are ``n`` distinct IDs as decimal strings, minted by the node of ``status``."""
    assert isinstance(texts, list) and len(texts) == n, (n, texts[:5])
    assert all(isinstance(t, str) and t.isdigit() and t == str(int(t)) for t in texts), texts[:5]
    ids = [int(t) for t in texts]
    assert len(set(ids)) == n, "IDs are distinct"
    layout, workers = sfwire.Layout.of(status), sfwire.held_worker_ids(status)
    now_ms = time.time() * 1000
    for id_ in ids:
        d = layout.decode(id_)
        assert 0 < id_ < 2**63 and d.region == status["region"] and d.worker in workers, d
        assert abs(d.unix_ms - now_ms) < 60_000, d
    return ids


@pytest.mark.parametrize("n", [1, 10, 4096, 10_000])
def test_reserve_n_ids(client, tcp_node, n):
    answer = supported(client.ask({"case": "reserve", "endpoint": tcp_node.endpoint, "count": n}))
    check_ids(answer["ids"], n, tcp_node.status())


def test_reserve_over_an_ipc_endpoint(client, server):
    answer = supported(client.ask({"case": "reserve", "endpoint": server.endpoint, "count": 500}))
    check_ids(answer["ids"], 500, server.status())


def test_reserve_after_a_token_gives_ids_above_it(client, tcp_node):
    sock = sfwire.connect(tcp_node.ctx, tcp_node.endpoint)
    try:
        first, count = sfwire.request(sock, sfwire.reserve(1, 5)).block
    finally:
        sock.close(0)
    token = first + count - 1
    case = {"case": "reserve", "endpoint": tcp_node.endpoint, "count": 20, "after": str(token)}
    ids = check_ids(supported(client.ask(case))["ids"], 20, tcp_node.status())
    assert min(ids) > token


def test_nodes_lists_the_node_with_its_fast_port(client, tcp_node):
    nodes = supported(client.ask({"case": "nodes", "endpoint": tcp_node.endpoint}))["nodes"]
    assert nodes["cluster"] is None and [n["endpoints"] for n in nodes["nodes"]] == [[tcp_node.endpoint]]
    assert nodes["fast_port"] == tcp_node.status()["broker"]["fast_port"]["port"]


def test_watermark_is_a_promise_every_later_id_keeps(client, tcp_node):
    layout = sfwire.Layout.of(tcp_node.ready_status)
    deadline = time.monotonic() + 10
    while True:  # the node promises a watermark within seconds of its start
        answer = client.ask({"case": "watermark", "endpoint": tcp_node.endpoint})
        if answer.get("error") != {"code": "watermark_unavailable", "retriable": True}:
            break
        assert time.monotonic() < deadline, answer
        time.sleep(0.2)
    promise = supported(answer)["watermark"]
    unix_ms, lowest = promise["unix_ms"], promise["lowest"]
    assert type(unix_ms) is int and isinstance(lowest, str) and lowest.isdigit(), promise
    assert unix_ms <= time.time() * 1000
    ids = check_ids(
        supported(client.ask({"case": "reserve", "endpoint": tcp_node.endpoint, "count": 100}))["ids"],
        100,
        tcp_node.status(),
    )
    assert sfwire.watermark_breaches(layout, unix_ms, int(lowest), ids) == []


def in_rotation(node, want: bool) -> None:
    deadline = time.monotonic() + 10
    while node.status()["broker"]["workers_in_rotation"] != int(want):
        assert time.monotonic() < deadline, f"the worker did not {'come back to' if want else 'leave'} rotation"
        time.sleep(0.05)


def test_a_retriable_error_the_client_cannot_get_past_is_answered_by_its_code(client, tcp_node):
    # No worker in rotation, and more IDs than the broker mints itself: `unavailable` each try.
    [worker] = tcp_node.status()["workers"]
    os.kill(worker["pid"], signal.SIGSTOP)
    try:
        in_rotation(tcp_node, False)
        answer = client.ask({"case": "reserve", "endpoint": tcp_node.endpoint, "count": 4096})
    finally:
        os.kill(worker["pid"], signal.SIGCONT)
    assert answer.get("error") == {"code": "unavailable", "retriable": True}, answer
    in_rotation(tcp_node, True)


def test_an_unknown_case_is_answered_unsupported(client, tcp_node):
    answer = client.ask({"case": "no-such-case", "endpoint": tcp_node.endpoint})
    assert set(answer) == {"id", "unsupported"} and answer["unsupported"] is True, answer


# -- against a scripted server: what a client does with the replies a real one may send ----------


class Scripted:
    """A ROUTER on ipc:// that answers the i-th RESERVE (0, 1, ...) with ``answer(i, request_id,
    count)`` (a reply body), NODES with a node without a fast port, and nothing else."""

    def __init__(self, directory: Path, answer) -> None:
        import threading

        import zmq

        self.answer = answer
        self.reserves: list[tuple[int, int]] = []
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"ipc://{directory}/scripted.sock"
        self.sock.bind(self.endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        deadline = time.monotonic() + 2 * ANSWER_TIMEOUT_S
        while not self._stop.is_set() and time.monotonic() < deadline:
            if not self.sock.poll(20):
                continue
            ident, *frames = self.sock.recv_multipart()
            body = frames[-1]
            if len(body) < sfwire.HEADER_SIZE:
                continue
            _, type_, _, rid = sfwire.HEADER.unpack_from(body)
            if type_ == sfwire.NODES:
                node = {"node": "scripted", "endpoints": [self.endpoint]}
                doc = {"cluster": None, "nodes": [node], "fast_port": None}
                reply = sfwire.header(sfwire.NODES_REPLY, rid) + json.dumps(doc).encode()
            elif type_ == sfwire.RESERVE and len(body) >= 16:
                count = struct.unpack_from("!I", body, 12)[0]
                self.reserves.append((rid, count))
                reply = self.answer(len(self.reserves) - 1, rid, count)
            else:
                continue
            self.sock.send_multipart([ident, *frames[:-1], reply])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def scripted(tmp_path):
    made: list[Scripted] = []

    def make(answer) -> Scripted:
        made.append(Scripted(tmp_path, answer))
        return made[-1]

    yield make
    for s in made:
        s.close()


def block(rid: int, first: int, count: int) -> bytes:
    return sfwire.BLOCK_BODY.pack(1, sfwire.BLOCK, 0, rid, first, count)


def error(rid: int, code: str, retriable: bool) -> bytes:
    doc = {"code": code, "message": "scripted", "retriable": retriable}
    return sfwire.header(sfwire.ERROR, rid) + json.dumps(doc).encode()


def test_partial_grants_are_asked_again_until_the_count_is_reached(client, scripted):
    # Each reply grants at most 3 IDs, from its own millisecond's range.
    srv = scripted(lambda i, rid, n: block(rid, (1 << 40) + (i << 22), min(n, 3)))
    answer = client.ask({"case": "reserve", "endpoint": srv.endpoint, "count": 10})
    ids = [int(t) for t in answer["ids"]]
    assert len(ids) == 10 and len(set(ids)) == 10, answer
    assert len(srv.reserves) >= 4


def test_a_retriable_error_is_asked_again_and_an_unknown_code_judged_by_its_flag(client, scripted):
    def answer(i, rid, n):
        if i == 0:
            return error(rid, "unavailable", True)
        if i == 1:
            return error(rid, "a_code_from_the_future", True)
        return block(rid, (1 << 40) + (i << 22), n)

    srv = scripted(answer)
    answer = client.ask({"case": "reserve", "endpoint": srv.endpoint, "count": 5})
    assert len(answer.get("ids", [])) == 5 and len(srv.reserves) >= 3, answer


def test_a_non_retriable_error_is_not_asked_again(client, scripted):
    srv = scripted(lambda i, rid, n: error(rid, "bad_request", False))
    answer = client.ask({"case": "reserve", "endpoint": srv.endpoint, "count": 10})
    assert answer.get("error") == {"code": "bad_request", "retriable": False}, answer
    assert len(srv.reserves) == 1
