"""What an operator meets at the edges: a port that is taken, no server, bad keys.

Every case runs the real ``snowfence`` command in its own process (group) and
looks only at what a person would see: the exit status, stderr, and what is
left on disk.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

EX_CONFIG = 78


def run_snowfence(*args, env=None, timeout_s: float = 20.0) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``python -m snowfence ARGS`` in its own process group; kill the group if it outlives ``timeout_s``."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "snowfence", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"snowfence {' '.join(args)} still running after {timeout_s} s; stderr:\n{err}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # workers it may have left
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), time.monotonic() - started


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("kind", ["port in use", "ipc directory missing"])
def test_serve_that_cannot_bind_exits_78_at_once_and_leaves_nothing(tmp_path, taken_port, kind):
    work = tmp_path / "work"
    work.mkdir()
    bind = f"tcp://127.0.0.1:{taken_port}" if kind == "port in use" else f"ipc://{tmp_path}/no-such-dir/x.sock"
    env = {"TMPDIR": str(work), "XDG_RUNTIME_DIR": str(work)}
    before = tree(tmp_path)
    p, took_s = run_snowfence(
        "serve", "--bind", bind, "--state-dir", str(tmp_path / "state"), "--workers", "1", env=env, timeout_s=15
    )
    assert p.returncode == EX_CONFIG, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    reason = "Address already in use" if kind == "port in use" else "No such file or directory"
    assert bind in lines[0] and reason in lines[0], lines[0]
    assert "Traceback" not in p.stderr
    assert took_s < 10, f"took {took_s:.1f} s to give up"
    # Nothing left behind: no run directory, no socket file, not even the empty directories the start
    # made (the state directory, its journal, the base run directories go in).
    left = tree(tmp_path) - before
    assert not left, f"left behind: {sorted(left)}"


def test_serve_with_an_unusable_metrics_port_exits_78_and_leaves_nothing(tmp_path, taken_port):
    work = tmp_path / "work"
    work.mkdir()
    p, _ = run_snowfence(
        "serve",
        "--bind",
        f"ipc://{tmp_path}/ok.sock",
        "--metrics-bind",
        f"127.0.0.1:{taken_port}",
        "--state-dir",
        str(tmp_path / "state"),
        "--workers",
        "1",
        env={"TMPDIR": str(work), "XDG_RUNTIME_DIR": str(work)},
        timeout_s=15,
    )
    assert p.returncode == EX_CONFIG and f"127.0.0.1:{taken_port}" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "ok.sock").exists()
    assert not [p for p in work.rglob("*") if not p.is_dir() or p.name.startswith("snowfence-")]


def test_invalid_settings_exit_78_with_one_line(tmp_path):
    (tmp_path / "utf16.toml").write_bytes(b"\xff\xfe" + "workers = 1\n".encode("utf-16-le"))
    for args in (
        ("serve", "--bind", "garbage"),
        ("serve", "--workers", "many"),
        ("serve", "--config", str(tmp_path / "missing.toml")),
        ("serve", "--config", str(tmp_path / "utf16.toml")),
    ):
        p, _ = run_snowfence(*args, "--state-dir", str(tmp_path / "state"), timeout_s=15)
        assert p.returncode == EX_CONFIG, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, (args, p.stderr)
    # A command line that cannot be read is a usage error, as for any Unix tool.
    p, _ = run_snowfence("serve", "--no-such-flag", "--state-dir", str(tmp_path / "state"), timeout_s=15)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    p, _ = run_snowfence("serve", env={"SNOWFENCE_REGION": "99", "SNOWFENCE_STATE_DIR": str(tmp_path / "s")})
    assert p.returncode == EX_CONFIG and "region" in p.stderr, p.stderr


@pytest.mark.parametrize("command", ["reserve", "status"])
def test_no_server_is_named_after_one_timeout_per_endpoint(tmp_path, command):
    endpoints = [f"ipc://{tmp_path}/a.sock", f"ipc://{tmp_path}/b.sock"]
    args = ["reserve", "3"] if command == "reserve" else ["status"]
    p, took_s = run_snowfence(*args, "--connect", ",".join(endpoints), "--timeout", "1")
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "is snowfence serve running at" in lines[0] and all(ep in lines[0] for ep in endpoints), lines[0]
    assert "CURVE" not in lines[0]
    # One timeout per endpoint (2 x 1 s), not the six rounds of retries (6 s) a reachable server gets;
    # the slack is for starting Python on a busy machine.
    assert took_s < 2 * 1 + 3, f"took {took_s:.1f} s"


def test_no_server_with_curve_keys_says_the_connection_was_refused(tmp_path):
    p, _ = run_snowfence("keygen", "server", "--dir", str(tmp_path))
    assert p.returncode == 0, p.stderr
    p, _ = run_snowfence(
        "reserve", "1", "--connect", f"ipc://{tmp_path}/none.sock", "--timeout", "0.3",
        "--server-key", str(tmp_path / "server.key"),
    )  # fmt: skip
    assert p.returncode == 1 and "connection_refused" in p.stderr and "is snowfence serve running" in p.stderr, p.stderr


def test_serve_help_and_the_serving_line_read_right(nodes):
    p, _ = run_snowfence("serve", "--help")
    assert p.returncode == 0
    assert "default )" not in p.stdout and "default ;" not in p.stdout
    assert "(env SNOWFENCE_ETCD)" in " ".join(p.stdout.split())
    node = nodes.start(workers=1)
    node.wait_ready()
    serving = next(line for line in node.log().splitlines() if "snowfence serving on" in line)
    assert "1 worker)" in serving and "1 workers" not in serving, serving


def test_curve_denials_are_logged_once_per_interval_counted_and_named_to_the_client(nodes, tmp_path):
    import hashlib
    import re

    import zmq.auth
    from nodes import wait_for
    from test_operations import get, health
    from zmq.utils import z85

    from snowfence import Client
    from snowfence.errors import CurveRequired, KeyRefused

    for name, where in (("server", "keys"), ("alice", "alice"), ("mallory", "mallory")):
        assert run_snowfence("keygen", name, "--dir", str(tmp_path / where))[0].returncode == 0
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "alice.key").write_text((tmp_path / "alice" / "alice.key").read_text())
    server_public = str(tmp_path / "keys" / "server.key")
    node = nodes.start(
        workers=1,
        args=(
            "--bind", "tcp://127.0.0.1:0", "--metrics-bind", "127.0.0.1:0",
            "--curve-secret-key", str(tmp_path / "keys" / "server.key_secret"), "--curve-allow", str(allowed),
        ),
    )  # fmt: skip
    m = wait_for(lambda: re.search(r"snowfence serving on (tcp://127\.0\.0\.1:\d+)", node.log()), 20, what="serving")
    endpoint = m.group(1)
    addr = health(node)
    with Client(
        endpoint, timeout_s=2.0, server_key=server_public, client_key=str(tmp_path / "alice" / "alice.key_secret")
    ) as alice:  # noqa: E501
        wait_for(lambda: any(w["state"] == "ready" for w in alice.status()["workers"]), 20)
    mallory_secret = str(tmp_path / "mallory" / "mallory.key_secret")
    with pytest.raises(KeyRefused, match="refused this client's key"):
        with Client(endpoint, timeout_s=0.5, server_key=server_public, client_key=mallory_secret) as mallory:
            mallory.reserve(1)
    with pytest.raises(CurveRequired, match="uses CURVE: give server_key"):
        with Client(endpoint, timeout_s=0.5) as c:  # no CURVE at all
            c.status()

    def counts():
        text = get(addr, "/metrics")[1]
        found = dict(re.findall(r'snowfence_curve_denials_total\{reason="(\w+)"\} ([\d.]+)', text))
        return found if float(found.get("not_allowed", 0)) >= 1 and float(found.get("handshake", 0)) >= 1 else None

    wait_for(counts, 5, what="both kinds of denial counted")
    public, _ = zmq.auth.load_certificate(str(tmp_path / "mallory" / "mallory.key"))
    print_ = "sha256:" + hashlib.sha256(z85.decode(public)).hexdigest()[:16]
    lines = [line for line in node.log().splitlines() if "event=curve_denied" in line]
    # Many denials (a denied client keeps reconnecting), one line per 10 s.
    assert len(lines) == 1, lines
    assert print_ in lines[0] and "127.0.0.1" in lines[0] and "not in" in lines[0], lines[0]
    assert public.decode() not in lines[0], lines[0]  # the fingerprint only, never the key


def test_bench_plot_without_matplotlib_fails_before_the_run(tmp_path):
    from blockimport import blocking_env

    env = blocking_env(tmp_path, "matplotlib")
    # No server at the endpoint: a run would end in "is snowfence serve running".
    p = subprocess.run(
        [sys.executable, "-m", "snowfence", "bench", "--connect", f"ipc://{tmp_path}/none.sock", "--timeout", "5",
         "--plot", str(tmp_path / "out.png")],
        capture_output=True, text=True, timeout=30, env=env,
    )  # fmt: skip
    assert p.returncode == EX_CONFIG and "matplotlib" in p.stderr and "running" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_without_the_etcd_extra_embedded_mode_works_and_etcd_mode_names_the_extra(nodes, tmp_path):
    from blockimport import blocking_env

    env = blocking_env(tmp_path, "pyetcd", "grpc")
    for args in (("serve", "--state-dir", str(tmp_path / "s")), ("status",)):
        p = subprocess.run(
            [sys.executable, "-m", "snowfence", *args, "--etcd", "http://127.0.0.1:2379"],
            capture_output=True, text=True, timeout=30, env=env,
        )  # fmt: skip
        assert p.returncode == EX_CONFIG, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1 and "pip install 'snowfence[etcd]'" in p.stderr, p.stderr
    # Embedded mode, the clients and decode never touch the etcd client.
    node = nodes.start(workers=1, env=env)
    node.wait_ready()
    p = subprocess.run(
        [sys.executable, "-m", "snowfence", "reserve", "2", "--connect", node.endpoint],
        capture_output=True, text=True, timeout=30, env=env,
    )  # fmt: skip
    assert p.returncode == 0 and len(p.stdout.split()) == 2, p.stderr
    assert "pyetcd" not in node.log() and "Traceback" not in node.log()


def test_the_asyncio_client_names_a_missing_server_as_the_blocking_one_does(tmp_path):
    from snowfence import AsyncClient
    from snowfence.clients.aio import run
    from snowfence.errors import ConnectionRefused

    endpoints = [f"ipc://{tmp_path}/a.sock", f"ipc://{tmp_path}/b.sock"]

    async def main() -> list[str]:
        messages = []
        async with AsyncClient(endpoints, timeout_s=0.5) as client:
            for call in (lambda: client.reserve(5), client.status):
                started = time.monotonic()
                with pytest.raises(ConnectionRefused) as caught:
                    await call()
                messages.append((str(caught.value), time.monotonic() - started))
        return messages

    for message, took_s in run(main()):
        assert "is snowfence serve running at" in message and all(ep in message for ep in endpoints), message
        assert took_s < 0.5 + 1.5, f"took {took_s:.1f} s: {message}"  # refused: no timeout waited


def test_a_client_that_waits_for_its_server_is_carried_over_its_start(nodes):
    from snowfence import Client

    node = nodes.new(workers=1)  # not started yet
    with Client(node.endpoint, timeout_s=0.5, retries=40, wait_for_server=True) as client:
        import threading

        starter = threading.Timer(1.5, node.start)  # after three timeouts
        starter.start()
        try:
            assert sum(b.count for b in client.reserve(10)) == 10
        finally:
            starter.join()


@pytest.mark.parametrize("where", ["flag", "env", "file"])
def test_a_metrics_bind_without_a_host_is_one_config_error_line_wherever_it_is_set(tmp_path, where):
    work = tmp_path / "work"
    work.mkdir()
    env = {"TMPDIR": str(work), "XDG_RUNTIME_DIR": str(work)}
    args = ["serve", "--bind", f"ipc://{tmp_path}/ok.sock", "--state-dir", str(tmp_path / "state"), "--workers", "1"]
    if where == "flag":
        args += ["--metrics-bind", "9650"]
    elif where == "env":
        env["SNOWFENCE_METRICS_BIND"] = "9650"
    else:
        (tmp_path / "node.toml").write_text('metrics_bind = "9650"\n')
        args += ["--config", str(tmp_path / "node.toml")]
    p, _ = run_snowfence(*args, env=env, timeout_s=15)
    assert p.returncode == EX_CONFIG, p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert "metrics_bind '9650'" in p.stderr and "HOST:PORT" in p.stderr, p.stderr
    assert not (tmp_path / "ok.sock").exists()
    assert not [p for p in work.rglob("*") if not p.is_dir() or p.name.startswith("snowfence-")]


def test_a_log_level_in_capitals_and_metrics_on_ipv6_loopback(nodes):
    import re

    from nodes import wait_for
    from test_operations import get

    node = nodes.start(workers=1, env={"SNOWFENCE_LOG_LEVEL": "DEBUG"}, args=("--metrics-bind", "[::1]:0"))
    node.wait_ready()
    m = wait_for(lambda: re.search(r"metrics and health on http://(\[::1\]:\d+)/", node.log()), 10, what="address")
    wait_for(lambda: get(m.group(1), "/readyz")[0] == 200, 10, what="ready on [::1]")
    assert "snowfence_ids_total" in get(m.group(1), "/metrics")[1]
    assert "DEBUG" in node.log() and "event=spawned" in node.log(), node.log_tail()  # debug lines are on


def test_reserve_piped_into_decode_and_decode_dash_read_stdin(nodes, tmp_path):
    node = nodes.start(workers=1)
    node.wait_ready()
    snowfence = [sys.executable, "-m", "snowfence"]
    reserve = subprocess.Popen([*snowfence, "reserve", "5", "--connect", node.endpoint], stdout=subprocess.PIPE)
    decode = subprocess.run([*snowfence, "decode"], stdin=reserve.stdout, capture_output=True, text=True, timeout=30)
    reserve.stdout.close()
    assert reserve.wait(30) == 0 and decode.returncode == 0, decode.stderr
    lines = decode.stdout.splitlines()
    assert len(lines) == 5 and all("region=0" in line and "worker=" in line for line in lines), lines
    ids = [int(line.split()[0]) for line in lines]
    assert ids == sorted(set(ids))
    p = subprocess.run([*snowfence, "decode", "-", "--json"], input=f"{ids[0]}\n", capture_output=True, text=True,
                       timeout=30)  # fmt: skip
    assert p.returncode == 0 and f'"id":"{ids[0]}"' in p.stdout, p.stderr


def test_a_fenced_node_says_fenced_once_and_status_says_etcd_is_down_in_plain_words(nodes, etcd):
    from nodes import FAST_LEASES, etcd_args, wait_for

    node = nodes.start(workers=1, args=etcd_args(etcd, "test", *FAST_LEASES))
    node.wait_ready()
    etcd.pause()
    try:
        wait_for(lambda: node.status()["workers"][0]["state"] == "fenced", 10, what="fenced")
        p, _ = run_snowfence("reserve", "1", "--connect", node.endpoint, "--no-discover", "--timeout", "1")
        assert p.returncode == 1 and p.stderr.startswith("snowfence: fenced: "), p.stderr
        assert p.stderr.count("fenced:") == 1 and p.stderr.count("\n") == 1, p.stderr
        p, _ = run_snowfence("status", *etcd_args(etcd, "test", "--etcd-timeout-s", "0.5"))
        assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
        assert f"cannot reach etcd at {','.join(etcd.endpoints)}" in p.stderr and "census" not in p.stderr, p.stderr
        assert "Traceback" not in p.stderr
    finally:
        etcd.resume()


def test_serve_with_an_epoch_in_the_future_is_a_config_error_at_once(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    p, took_s = run_snowfence(
        "serve", "--epoch", "2030-01-01", "--bind", f"ipc://{tmp_path}/ok.sock", "--state-dir", str(tmp_path / "state"),
        "--workers", "1", env={"TMPDIR": str(work), "XDG_RUNTIME_DIR": str(work)}, timeout_s=20,
    )  # fmt: skip
    assert p.returncode == EX_CONFIG and p.stderr.count("\n") == 1, p.stderr
    assert "epoch 2030-01-01T00:00:00.000Z is in the future" in p.stderr, p.stderr
    assert took_s < 10 and not (tmp_path / "ok.sock").exists() and not (tmp_path / "state").exists()
    assert not [p for p in work.rglob("*") if not p.is_dir() or p.name.startswith("snowfence-")]


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory this process cannot write: a read-only tmpfs as root, mode 0555 otherwise."""
    path = tmp_path / "ro"
    if os.geteuid() != 0:
        path.mkdir()
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    from disk import Tmpfs

    disk = Tmpfs(path, "1m")
    (path / "state").mkdir()
    disk.remount("ro")
    yield path
    disk.unmount()


@pytest.mark.parametrize("inside", [False, True])
def test_serve_on_a_read_only_state_dir_refuses_before_it_says_serving(tmp_path, read_only_dir, inside):
    work = tmp_path / "work"
    work.mkdir()
    state = read_only_dir / "state" if inside else read_only_dir / "new"
    p, took_s = run_snowfence(
        "serve", "--bind", f"ipc://{tmp_path}/ok.sock", "--state-dir", str(state), "--workers", "1",
        env={"TMPDIR": str(work), "XDG_RUNTIME_DIR": str(work)}, timeout_s=20,
    )  # fmt: skip
    assert p.returncode == 73, p.stderr
    assert p.stderr.count("\n") == 1 and "serving" not in p.stderr, p.stderr
    assert f"state directory {state} is not usable" in p.stderr, p.stderr
    assert took_s < 10 and not (tmp_path / "ok.sock").exists()
    assert not [p for p in work.rglob("*") if not p.is_dir() or p.name.startswith("snowfence-")]


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


@pytest.mark.parametrize("when", ["measuring", "warming up", "starting"])
def test_ctrl_c_during_bench_exits_130_with_what_was_measured_and_no_traceback(nodes, when):
    from leftovers import group_alive
    from nodes import wait_for

    node = nodes.start(workers=1)
    node.wait_ready()
    warmup = "0.2" if when == "measuring" else "60"
    proc = subprocess.Popen(
        [sys.executable, "-m", "snowfence", "bench", "--connect", node.endpoint, "--duration", "60", "--warmup",
         warmup, "--clients", "2", "--depth", "1", "--batch", "4096"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        if when == "starting":
            # Just after the first client process was made: it is still importing, where a
            # Ctrl-C that reached it would end it with a traceback.
            wait_for(lambda: _children(proc.pid), 30, interval_s=0.001, what="a bench client process")
            time.sleep(0.1)  # past the interpreter's start, inside the imports
        else:
            # Client processes up and sending (the node counts their IDs).
            wait_for(lambda: node.status()["broker"]["counters"]["requests"] > 50, 30, what="bench sending")
            time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)  # the whole group, as from a terminal
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    if when == "measuring":
        assert "interrupted after" in out and "unique       yes" in out, out
        ids_per_s = float(re.search(r"IDs/s\s+([\d,]+)", out).group(1).replace(",", ""))
        assert ids_per_s > 0, out
    else:
        assert not out and err.strip() == "snowfence: interrupted during the warm-up: nothing was measured", err
    wait_for(lambda: not group_alive(proc.pid), 5, what="the client processes to be gone")
