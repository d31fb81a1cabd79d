"""The guide's examples run against a real server and do what they say."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import orjson

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_bulk_loader_writes_rows_with_unique_ids(nodes, tmp_path):
    node = nodes.start(workers=2)
    node.wait_ready()
    out = tmp_path / "rows.csv"
    p = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "bulk_loader.py"),
            "--connect",
            node.endpoint,
            "--rows",
            "50000",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    with open(out) as f:
        rows = list(csv.DictReader(f))
    ids = [int(r["id"]) for r in rows]
    assert len(ids) == 50_000 and len(set(ids)) == 50_000


def test_pipeline_stamps_every_event(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    p = subprocess.run(
        [sys.executable, str(EXAMPLES / "pipeline.py"), "--events", "20000"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SNOWFENCE_CONNECT": node.endpoint},  # the examples take it as the CLI does
    )
    assert p.returncode == 0, p.stderr
    assert "stamped 20000 events" in p.stderr


def test_load_test_script_runs_and_checks_every_id(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    env = {
        **os.environ,
        "DURATION": "1",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "SNOWFENCE_CONNECT": node.endpoint,
    }
    p = subprocess.run(["sh", str(EXAMPLES / "load_test.sh")], capture_output=True, timeout=120, env=env)
    assert b"\r" not in p.stderr  # bench's progress line is for terminals only (text mode would hide a \r)
    p = subprocess.CompletedProcess(p.args, p.returncode, p.stdout.decode(), p.stderr.decode())
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("unique       yes") == 2
    result = orjson.loads(p.stdout[p.stdout.index("{") :])
    assert result["check"]["unique"] and result["requests_per_s"] > 0


def test_windows_close_on_the_watermark_and_no_event_comes_late(nodes):
    node = nodes.start(workers=2)
    node.wait_ready()
    p = subprocess.run(
        [sys.executable, str(EXAMPLES / "windows.py"), "--seconds", "12"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SNOWFENCE_CONNECT": node.endpoint},
    )
    assert p.returncode == 0, p.stderr
    windows = [line for line in p.stdout.splitlines() if line.startswith("window ")]
    assert len(windows) >= 3 and all(int(line.split(": ")[1].split()[0]) > 0 for line in windows), p.stdout
    starts = [int(line.split()[1].rstrip(":")) for line in windows]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)  # each second closed once, in order
    assert "late events: 0" in p.stderr


def test_the_examples_say_in_one_line_that_no_node_answered():
    """No node at the endpoint (a mistyped address, a node not started): one line naming the cause, not a
    traceback: the connection was refused, said at once."""
    import socket

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        runs = {
            name: subprocess.Popen(
                [sys.executable, str(EXAMPLES / name), "--connect", endpoint, *extra],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name, extra in (
                ("pipeline.py", ["--events", "10"]),
                ("bulk_loader.py", ["--rows", "10"]),
                ("windows.py", ["--seconds", "1"]),
            )
        }
        for name, proc in runs.items():
            try:
                out, err = proc.communicate(timeout=60)
            finally:
                proc.kill()
            assert proc.returncode == 1, (name, err)
            assert "Traceback" not in err and err.count("\n") == 1, (name, err)
            assert err.startswith(f"{name[:-3]}: connection_refused: ") and endpoint in err, (name, err)
