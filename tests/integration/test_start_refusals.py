"""What serve refuses, check-config refuses too, and serve refuses it before it says it
serves: a layout other than the one the store recorded (a state directory's, an etcd
cluster's), a journal directory it cannot write, two endpoints in --bind, a layout that
has ended or ends within min_layout_years_left. Real processes:
check-config and serve as an operator runs them, systemd's end of sd_notify a socket."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from nodes import etcd_args
from test_lifecycle import NotifySocket

from snowfence.config import Config
from snowfence.ids import MS_PER_YEAR, format_unix_ms
from snowfence.store import open_store

OTHER_LAYOUT = ("--time-bits", "42", "--sequence-bits", "11")


def snowfence(*args, env=None, timeout=30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snowfence", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture
def recorded(tmp_path):
    """A state directory whose store recorded the default layout."""
    state = tmp_path / "state"
    store = open_store(Config(state_dir=str(state)))
    store.check_layout(store.layout)
    store.close()
    return state


ENDED = ("--time-bits", "30", "--region-bits", "8", "--worker-bits", "13")
SHORT = ("--time-bits", "36", "--region-bits", "2", "--worker-bits", "13")


def refusals(tmp_path, state):
    (tmp_path / "file").write_text("")
    ends_in = time.time_ns() // 1_000_000 - 2**36 + MS_PER_YEAR // 2  # an epoch whose layout ends in half a year
    return [
        ((*OTHER_LAYOUT,), 78, "was created for layout"),
        (("--journal-dir", str(tmp_path / "file" / "journal")), 73, "journal directory"),
        (("--bind", "tcp://127.0.0.1:5555,tcp://127.0.0.1:5556"), 78, "names 2 endpoints; a node binds one"),
        # 30 time bits from 2000-01-01: 2**30 ms, about 12 days, long gone.
        (("--epoch", "2000-01-01", *ENDED), 78, "the layout ended at 2000-01-13T10:15:41.824Z (30 time bits)"),
        # 36 time bits that end half a year from now, one year the least by default.
        (("--epoch", str(ends_in), *SHORT), 78, f"the layout ends at {format_unix_ms(ends_in + 2**36)}, 0.50 years"),
        # With the minimum off, the same layout passes this check and meets the next: the store's layout.
        (("--epoch", str(ends_in), *SHORT, "--min-layout-years-left", "0"), 78, "was created for layout"),
    ]


def test_check_config_refuses_what_serve_refuses(tmp_path, recorded):
    assert snowfence("check-config", "--state-dir", str(recorded)).returncode == 0
    for args, status, words in refusals(tmp_path, recorded):
        p = snowfence("check-config", "--state-dir", str(recorded), *args)
        assert p.returncode == status and words in p.stderr, (args, p.returncode, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_serve_refuses_them_before_it_says_it_serves_or_is_ready(tmp_path, recorded):
    notify = NotifySocket(tmp_path / "notify")
    try:
        env = {**os.environ, "NOTIFY_SOCKET": notify.path}
        for args, status, words in refusals(tmp_path, recorded):
            p = snowfence(
                "serve",
                "--state-dir",
                str(recorded),
                "--workers",
                "1",
                "--bind",
                f"ipc://{tmp_path}/n.sock",
                *args,
                env=env,
            )
            assert p.returncode == status and words in p.stderr, (args, p.returncode, p.stderr)
            assert "serving" not in p.stderr, p.stderr
        notify.sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            notify.sock.recv(4096)  # READY=1 was never sent
    finally:
        notify.close()


def test_a_port_in_use_leaves_nothing_behind_but_what_was_there(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        bind = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        env = {**os.environ, "SNOWFENCE_CONECT": "tcp://127.0.0.1:1"}  # a typo: warned about, even here
        env.pop("XDG_RUNTIME_DIR", None)
        env.pop("RUNTIME_DIRECTORY", None)
        new = tmp_path / "new"
        p = snowfence("serve", "--state-dir", str(new / "state"), "--workers", "1", "--bind", bind, env=env)
        assert p.returncode == 78 and "Address already in use" in p.stderr and "serving" not in p.stderr, p.stderr
        assert "SNOWFENCE_CONECT is not a snowfence variable" in p.stderr and "SNOWFENCE_CONNECT?" in p.stderr
        assert not new.exists()  # not the state directory, its run/ and journal/, nor the parent made for it
        # A state directory that was there stays, with what it held; what this start made in it goes.
        kept = tmp_path / "kept"
        kept.mkdir()
        (kept / "note").write_text("mine")
        p = snowfence("serve", "--state-dir", str(kept), "--workers", "1", "--bind", bind, env=env)
        assert p.returncode == 78, p.stderr
        assert sorted(os.listdir(kept)) == ["note"]


def test_check_config_refuses_a_layout_other_than_the_etcd_cluster_s(nodes, etcd):
    node = nodes.start("a", workers=1, args=etcd_args(etcd))
    node.wait_ready()
    state = str(node.dir / "elsewhere")
    same = snowfence("check-config", "--state-dir", state, *etcd_args(etcd))
    assert same.returncode == 0, same.stderr
    other = snowfence("check-config", "--state-dir", state, *etcd_args(etcd), *OTHER_LAYOUT)
    assert other.returncode == 78 and "cluster 'test' uses layout" in other.stderr, other.stderr
