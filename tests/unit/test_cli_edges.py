"""Everyday edges of the command line, the settings and the clients' Python API: what a
person (or systemd) gets for a config file that is not UTF-8, a masked secret fed back,
an endpoint without a scheme, a usage error, -V, a bad count, a closed client and a
damaged layout.json."""

from __future__ import annotations

import asyncio

import pytest

from snowfence import AsyncClient, Client, __version__, cli
from snowfence import config as cfg
from snowfence.errors import ConfigError, SnowfenceError


def run(argv, capsys):
    try:
        status = cli.main(argv)
    except SystemExit as exc:  # argparse: --version, --help, or a usage error
        status = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, out, err


def test_a_config_file_that_is_not_utf8_is_one_line_and_exit_78(tmp_path, capsys):
    path = tmp_path / "f.toml"
    path.write_bytes(b"\xff\xfe" + "region = 1\n".encode("utf-16-le"))
    status, out, err = run(["check-config", "--config", str(path), "--state-dir", str(tmp_path)], capsys)
    assert status == 78 and not out
    assert err.count("\n") == 1 and "not UTF-8" in err and str(path) in err, err


def test_check_configs_masked_password_fed_back_is_refused_not_taken_as_the_password(tmp_path, capsys, monkeypatch):
    from snowfence.broker import preflight

    monkeypatch.setattr(preflight, "check", lambda config, create: None)  # no etcd to ask here
    monkeypatch.setenv("SNOWFENCE_ETCD_PASSWORD", "s3cret")
    argv = ["--etcd", "127.0.0.1:2379", "--etcd-user", "root", "--state-dir", str(tmp_path)]
    status, out, err = run(["check-config", *argv], capsys)
    assert status == 0, err
    assert "s3cret" not in out and "# etcd_password = (set, not shown)" in out
    path = tmp_path / "shown.toml"
    # The mask of --json (or of an older release's output) in a config file.
    path.write_text(out + 'etcd_password = "***"\n')
    monkeypatch.delenv("SNOWFENCE_ETCD_PASSWORD")
    status, out, err = run(["check-config", "--config", str(path)], capsys)
    assert status == 78 and not out and err.count("\n") == 1, err
    assert "etcd_password" in err and "mask" in err and "SNOWFENCE_ETCD_PASSWORD" in err, err
    # The real password in the environment wins over the file's mask, as any setting does.
    monkeypatch.setenv("SNOWFENCE_ETCD_PASSWORD", "s3cret")
    status, out, err = run(["check-config", "--config", str(path)], capsys)
    assert status == 0, err


def test_endpoints_without_a_scheme_take_the_usual_one():
    assert cfg.etcd_endpoint("127.0.0.1:2379") == cfg.EtcdEndpoint("127.0.0.1", 2379, False)
    assert cfg.etcd_endpoint("[::1]:2379") == cfg.EtcdEndpoint("[::1]", 2379, False)
    assert cfg.load(flags={"etcd": "10.0.0.1:2379,10.0.0.2:2379"}, env={}).etcd == ("10.0.0.1:2379", "10.0.0.2:2379")
    with pytest.raises(ConfigError, match="HOST:PORT"):
        cfg.etcd_endpoint("localhost")

    class Args:
        connect = "127.0.0.1:6001, ipc:///run/x.sock"

    assert cli.node.endpoints_of(Args) == ["tcp://127.0.0.1:6001", "ipc:///run/x.sock"]
    with Client("127.0.0.1:6001", discover=False) as c:
        assert c.endpoint == "tcp://127.0.0.1:6001"
    with pytest.raises(ValueError, match="not a ZeroMQ endpoint"):
        Client("nowhere")


@pytest.mark.parametrize(
    "argv",
    [["--no-such-flag"], ["reserve", "1", "--no-such-flag"], ["id-at"], ["reserve", "1", "--connect"], ["nosuch"]],
)
def test_usage_errors_exit_2_with_one_line(argv, capsys):
    status, out, err = run(argv, capsys)
    assert status == 2 and not out and err.count("\n") == 1 and "--help" in err, (status, err)


def test_a_value_argparse_refuses_stays_a_configuration_error(capsys):
    status, _, err = run(["reserve", "1", "--timeout", "-1"], capsys)
    assert status == 78 and "--timeout" in err
    status, _, err = run(["reserve", "1", "--format", "xml"], capsys)
    assert status == 78 and "invalid choice" in err


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_dash_capital_v_prints_the_version(flag, capsys):
    status, out, _ = run([flag], capsys)
    assert status == 0 and out == f"snowfence {__version__}\n"


@pytest.mark.parametrize(
    "n, error",
    [
        (1.5, TypeError),
        ("3", TypeError),
        (True, TypeError),
        (0, ValueError),
        (-1, ValueError),
        (1 << 63, ValueError),
        (10**12, ValueError),  # hours of reserving, its memory growing: bounded, named
        ((1 << 30) + 1, ValueError),
    ],
)
def test_a_bad_count_is_a_type_or_value_error_for_both_clients(n, error):
    with Client("tcp://127.0.0.1:9", discover=False) as c:
        with pytest.raises(error):
            c.reserve(n)
    if isinstance(n, int) and n > 1:
        with Client("tcp://127.0.0.1:9", discover=False) as c, pytest.raises(ValueError, match=r"1,073,741,824"):
            c.reserve(n)

    async def aio():
        async with AsyncClient("tcp://127.0.0.1:9", discover=False) as c:
            with pytest.raises(error):
                await c.reserve(n)

    asyncio.run(aio())


def test_a_closed_client_refuses_use_rather_than_reopening():
    c = Client("tcp://127.0.0.1:9", discover=False, timeout_s=0.1, retries=0)
    c.close()
    for call in (lambda: c.reserve(1), c.status, c.watermark):
        with pytest.raises(SnowfenceError, match="closed"):
            call()
    assert c._sock is None

    async def aio():
        a = AsyncClient("tcp://127.0.0.1:9", discover=False, timeout_s=0.1, retries=0)
        await a.close()
        for call in (lambda: a.reserve(1), a.status):
            with pytest.raises(SnowfenceError, match="closed"):
                await call()
        assert a._sock is None

    asyncio.run(aio())


def test_a_damaged_layout_json_says_how_to_recover_and_that_works(tmp_path, capsys):
    state = tmp_path / "state"
    assert run(["accept-restore", "--state-dir", str(state), "--reason", "first"], capsys)[0] == 0
    layout = state / "layout.json"
    layout.write_text('{"time_bits": ')
    status, out, err = run(["accept-restore", "--state-dir", str(state), "--reason", "damaged"], capsys)
    assert status == 73 and err.count("\n") == 1, err
    assert "move it out of the state directory" in err and "accept-restore" in err, err
    layout.rename(tmp_path / "layout.json.damaged")  # as the message says
    status, out, err = run(["accept-restore", "--state-dir", str(state), "--reason", "damaged"], capsys)
    assert status == 0 and "accepted restore" in out, err
