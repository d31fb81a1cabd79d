"""No request dropped on a clean stop: a worker asked to stop answers what was queued at it
before it lets its worker IDs go, and a rolling restart of every node of a cluster under load
from real clients costs them no timeout and leaves no request unanswered."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from checks import check_blocks, read_pairs
from nodes import TWO_HOPS, wait_for

from snowfence import protocol


def _replies(sock, want: set[int], within_s: float) -> dict[int, protocol.Reply]:
    """The replies to the request IDs ``want`` that come on ``sock`` within ``within_s``."""
    got: dict[int, protocol.Reply] = {}
    deadline = time.monotonic() + within_s
    while set(got) != want and time.monotonic() < deadline:
        if sock.poll(50):
            reply = protocol.decode_reply(sock.recv())
            got[reply.request_id] = reply
    return got


def test_a_worker_sent_sigterm_with_requests_queued_answers_them_all_then_exits(nodes, raw):
    node = nodes.start(workers=1, args=TWO_HOPS)
    node.wait_ready()
    [worker] = node.worker_pids()
    sock = raw(node.endpoint)
    # Stopped, so that what the broker sends it waits in its socket: at the SIGTERM, 20 requests
    # are queued at the worker (one ID each: well within what the broker may queue at one worker).
    os.kill(worker, signal.SIGSTOP)
    try:
        want = set(range(1, 21))
        for rid in sorted(want):
            sock.send(protocol.encode_reserve(rid, 1))
        time.sleep(0.3)  # the broker has placed them (its heartbeat bound, 3 s, is far off)
        os.kill(worker, signal.SIGTERM)
    finally:
        os.kill(worker, signal.SIGCONT)
    got = _replies(sock, want, 5.0)
    log = node.log()
    assert set(got) == want, f"unanswered: {sorted(want - set(got))}\n{node.log_tail()}"
    # Answered by the worker that was asked to stop, before it let its worker ID go.
    assert all(r.type == protocol.BLOCK for r in got.values()), {k: r.error for k, r in got.items() if r.error}
    wait_for(lambda: f"pid={worker}" in node.log() and "event=released" in node.log(), 10, what="the release")
    assert "signal received; draining" in log or "draining" in node.log(), log
    # The node goes on with a new worker.
    node.wait_ready(1)
    assert worker not in node.worker_pids()


STEADYLOAD = Path(__file__).resolve().parent.parent / "harness" / "steadyload.py"


def steady_load(endpoints: list[str], out: Path, stop_file: Path, seed: int) -> subprocess.Popen:
    """One client process reserving on ``endpoints`` (its first one first) until ``stop_file`` exists."""
    return subprocess.Popen(
        [sys.executable, str(STEADYLOAD), ",".join(endpoints), str(out), str(stop_file), str(seed), "2.0", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_rolling_restart_of_every_node_under_load_costs_clients_no_timeout_and_no_unanswered_request(nodes, tmp_path):
    # Three nodes on one host sharing one state directory (one region, worker IDs handed out
    # by its file locks), each restarted in turn as an operator rolls a new release out:
    # SIGTERM, wait for it to exit, start it again, wait until it serves, the next one.
    shared = tmp_path / "shared-state"
    ring = [nodes.start(f"n{i}", workers=1, state_dir=shared) for i in range(3)]
    for node in ring:
        node.wait_ready()
    endpoints = [node.endpoint for node in ring]
    stop_file = tmp_path / "stop-load"
    outs = [tmp_path / f"load{i}.bin" for i in range(3)]
    # Each client starts on another node, and fails over to the others in turn.
    loads = [steady_load(endpoints[i:] + endpoints[:i], outs[i], stop_file, i) for i in range(3)]
    try:
        time.sleep(0.5)
        for node in ring:
            assert node.stop(timeout_s=15) == 0, node.log_tail()
            node.start()
            node.wait_ready()
            time.sleep(0.2)  # the clients find it again before the next one goes
        time.sleep(0.3)
    finally:
        stop_file.touch()
        results = []
        for p in loads:
            try:
                stdout, stderr = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, stderr = p.communicate()
            results.append((p.returncode, stdout, stderr))
    figures = [json.loads(stdout.strip().splitlines()[-1]) for _, stdout, _ in results]
    logs = "\n".join(node.log_tail(15) for node in ring)
    for (code, _, stderr), f in zip(results, figures, strict=True):
        assert code == 0, stderr
        assert f["ids"] > 0 and f["errors"] == 0, (f, stderr)
        assert f["timeouts"] == 0 and f["unanswered"] == 0, (f, stderr, logs)
    check_blocks([read_pairs(o) for o in outs])  # 0 IDs issued twice
    for node in ring:  # each stop said it drained and let its worker IDs go
        assert "workers drain and release their worker IDs" in node.log()
