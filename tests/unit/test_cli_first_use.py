"""What a new user runs into first on the command line: decode's bad inputs said in place, keygen's --dir, the
settings check-config prints and the ones it refuses as serve does, a TOML list for bind, and SNOWFENCE_*
variables nothing reads."""

from __future__ import annotations

import os

import orjson
import pytest

from snowfence import cli
from snowfence import config as cfg


def run(argv, capsys):
    try:
        status = cli.main(argv)
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, out, err


def test_decode_decodes_every_input_and_names_each_bad_one(capsys):
    status, out, err = run(["decode", "3", "-1", "x", "\u0661\u0662", "9223372036854775807", "--check"], capsys)
    lines = out.splitlines()
    assert status == 1 and len(lines) == 2, out
    assert lines[0].startswith("3  ") and lines[1].startswith("9223372036854775807  ")
    assert "INVALID: from the future" in lines[1]
    # Digits of another script are not read as decimal (str.isdigit and int() would take them).
    assert err.splitlines() == [
        "snowfence: '-1' is not a snowfence ID",
        "snowfence: 'x' is not a snowfence ID",
        "snowfence: '\u0661\u0662' is not a snowfence ID",
        "snowfence: 1 ID cannot be valid for the layout",
    ], err


def test_keygen_into_a_file_says_it_is_not_a_directory(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    status, out, err = run(["keygen", "alice", "--dir", str(tmp_path / "afile")], capsys)
    assert status == 78 and not out and err == f"snowfence: --dir {tmp_path / 'afile'} is not a directory\n"
    status, out, err = run(["keygen", "alice", "--dir", str(tmp_path / "afile" / "sub")], capsys)
    assert status == 78 and err.count("\n") == 1 and "--dir" in err, err
    assert run(["keygen", "alice", "--dir", str(tmp_path / "new")], capsys)[0] == 0
    assert sorted(os.listdir(tmp_path / "new")) == ["alice.key", "alice.key_secret"]


def test_check_config_shows_a_secret_commented_out_so_its_output_runs_as_a_config_file(tmp_path, capsys, monkeypatch):
    from snowfence.broker import preflight

    monkeypatch.setattr(preflight, "check", lambda config, create: None)  # no etcd to ask here
    monkeypatch.setenv("SNOWFENCE_ETCD_PASSWORD", "s3cret")
    argv = ["--etcd", "127.0.0.1:2379", "--etcd-user", "root", "--state-dir", str(tmp_path)]
    status, out, _ = run(["check-config", *argv], capsys)
    assert status == 0 and "s3cret" not in out and "***" not in out
    shown = [line for line in out.splitlines() if "etcd_password" in line]
    assert len(shown) == 1 and shown[0].startswith("# etcd_password = "), shown
    path = tmp_path / "shown.toml"
    path.write_text(out)
    # Fed back with the password from the environment, as a secret is best kept: the same settings.
    assert cfg.load(env={"SNOWFENCE_ETCD_PASSWORD": "s3cret"}, config_file=path).etcd_password == "s3cret"
    status, out, err = run(["check-config", "--config", str(path), "--json"], capsys)
    assert status == 0 and orjson.loads(out)["settings"]["etcd_password"]["value"] == "***"


@pytest.mark.skipif(not os.path.isdir("/proc/self") or os.geteuid() != 0, reason="as root, with /proc")
@pytest.mark.parametrize("flag", ["--state-dir", "--journal-dir"])
def test_check_config_refuses_the_kernels_filesystems_as_serve_does_even_as_root(tmp_path, capsys, flag):
    argv = ["--state-dir", str(tmp_path)] if flag == "--journal-dir" else []
    status, out, err = run(["check-config", *argv, flag, "/proc/snowfence-state"], capsys)
    assert status == 73 and not out and err.count("\n") == 1 and "the kernel's proc filesystem" in err, err
    status, out, err = run(["check-config", *argv, flag, "/sys/kernel/snowfence"], capsys)
    assert status == 73 and "sysfs" in err, err


def test_a_toml_list_for_bind_gets_what_the_flag_gets(tmp_path, capsys):
    path = tmp_path / "b.toml"
    path.write_text('bind = ["tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556"]\n')
    status, out, err = run(["check-config", "--config", str(path), "--state-dir", str(tmp_path)], capsys)
    assert status == 78 and not out and err.count("\n") == 1, err
    assert "a node binds one endpoint: run a node for each" in err and "transport" not in err, err
    path.write_text('state_dir = ["a"]\n')
    status, out, err = run(["check-config", "--config", str(path)], capsys)
    assert status == 78 and "state_dir" in err and "a string is expected" in err, err


def test_an_unknown_snowfence_variable_is_a_warning_naming_a_close_match(capsys, monkeypatch):
    monkeypatch.setenv("SNOWFENCE_CONECT", "tcp://10.0.0.1:5555")
    monkeypatch.setenv("SNOWFENCE_NOTHING_LIKE_IT", "1")
    status, out, err = run(["decode", "3"], capsys)
    assert status == 0 and out.startswith("3  ")
    assert err.splitlines() == [
        "snowfence: warning: SNOWFENCE_CONECT is not a snowfence variable and is ignored; did you mean "
        "SNOWFENCE_CONNECT?",
        "snowfence: warning: SNOWFENCE_NOTHING_LIKE_IT is not a snowfence variable and is ignored",
    ]
    # Every variable the package reads is known: each setting's, and the others.
    known = {cfg.env_name(name): "" for name in cfg.FIELDS} | {f"SNOWFENCE_{n}": "" for n in cfg.OTHER_ENV}
    assert cfg.unknown_env(known) == []
