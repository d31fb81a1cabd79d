"""Whatever a person types, the ``snowfence`` command answers with at most one
error line and a meaningful exit status, never a traceback.

A property-based test drives argument parsing and every check the command makes
before (or instead of) talking to a server: each subcommand gets argv built from
good values, bad values and junk. Nothing listens at the endpoints it is given,
and the timeouts it may pick are short, so a command that passes validation
fails fast with "is snowfence serve running". ``serve`` stops where the broker
would start.
"""

from __future__ import annotations

import io
import logging
import string
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snowfence import cli

EXIT_STATUSES = {0, 1, 2, 73, 78}
JUNK = st.text(alphabet=string.ascii_letters + string.punctuation + " \t\u00e9\u2603", max_size=12)


def values(good, bad):
    return st.one_of(st.sampled_from(good), st.sampled_from(bad), JUNK)


BAD_NUMBERS = ["-1", "0", "1e20", "99999999999999999999999", "nan", "inf", "-inf", "1e400", "", "0x10", "1.5.2"]
BAD_ENDPOINTS = [
    "127.0.0.1:5555",
    "tcp://garbage",
    "tcp://127.0.0.1:99999",
    "tcp://*:5555",
    "udp://127.0.0.1:5555",
    "ipc://",
    "ipc://" + "x" * 200,
    ",",
    "tcp://a b:1",
]


def client_flags(tmp):
    nowhere = [f"ipc://{tmp}/nobody.sock", f"ipc://{tmp}/a.sock,ipc://{tmp}/b.sock", "tcp://127.0.0.1:9"]
    keys = [str(tmp / "server.key"), str(tmp / "client.key_secret"), str(tmp / "server.key_secret")]
    bad_keys = [str(tmp / "nosuch.key"), str(tmp), str(tmp / "junk.key"), "/dev/null", "Z" * 40, "short"]
    return {
        "--connect": values(nowhere, BAD_ENDPOINTS),
        "--timeout": values(["0.05", "0.02"], BAD_NUMBERS),
        "--server-key": values(keys, bad_keys),
        "--client-key": values(keys, bad_keys),
    }


LAYOUT_FLAGS = {
    "--epoch": values(["1704067200000", "2024-01-01T00:00:00Z"], ["yesterday", "-5", "1e30", "2024-13-01"]),
    "--time-bits": values(["41", "40"], BAD_NUMBERS + ["64", "70"]),
    "--region-bits": values(["3", "4"], BAD_NUMBERS),
    "--worker-bits": values(["7", "6"], BAD_NUMBERS),
    "--sequence-bits": values(["12"], BAD_NUMBERS),
    "--shard-bits": values(["0", "2"], BAD_NUMBERS + ["63"]),
}


def command_flags(command: str, tmp) -> tuple[list, dict]:
    """(positional strategies, {flag: value strategy}) for one subcommand."""
    ints = values(["1", "5", "4096", "1000001"], BAD_NUMBERS)
    retries = {"--retries": values(["0", "3"], BAD_NUMBERS + ["1000001", "2.5"])}
    if command == "reserve":
        flags = {
            **client_flags(tmp),
            **retries,
            "--format": values(["text", "json", "binary", "blocks"], ["xml", "TEXT"]),
            "--after": values(["0", "1", str(2**63 - 1), "123456789012345678"], BAD_NUMBERS + [str(2**63), "-1"]),
            "--chunk": ints,
        }
        return [ints], flags
    if command == "status":
        return [], {**client_flags(tmp), **retries, **LAYOUT_FLAGS}
    if command == "bench":
        flags = {
            **client_flags(tmp),
            "--duration": values(["0.1"], BAD_NUMBERS),
            "--warmup": values(["0", "0.1"], BAD_NUMBERS),
            "--batch": values(["1", "4096"], BAD_NUMBERS + ["4097"]),
            "--clients": values(["1", "2"], BAD_NUMBERS + ["100000"]),
            "--depth": values(["1", "16"], BAD_NUMBERS),
            "--rate": values(["0", "100"], BAD_NUMBERS),
        }
        return [], flags
    if command == "decode":
        ids = st.one_of(st.integers(-(2**70), 2**70).map(str), JUNK, st.sampled_from(["\u00b2", " 7 ", ""]))
        return [ids], LAYOUT_FLAGS
    if command == "keygen":
        names = values(["alice", "server"], ["", ".hidden", "../up", "a/b", "x\0y"])
        return [names], {"--dir": st.sampled_from([str(tmp / "keys"), str(tmp / "server.key")])}
    # serve: every setting, good and bad.
    return [], {
        "--bind": values([f"ipc://{tmp}/serve.sock", "tcp://127.0.0.1:0", "tcp://*:5555"], BAD_ENDPOINTS),
        "--workers": values(["1", "2", "0"], BAD_NUMBERS + ["129"]),
        "--region": values(["0", "7"], BAD_NUMBERS + ["8"]),
        "--etcd": values(["http://127.0.0.1:2379"], ["127.0.0.1:2379", "ftp://x:1", "http://nohost"]),
        "--config": values([str(tmp / "good.toml")], [str(tmp / "bad.toml"), str(tmp / "nosuch.toml"), str(tmp)]),
        "--lease-ttl-s": values(["10", "4"], BAD_NUMBERS),
        "--fence-after-s": values(["5", "2"], BAD_NUMBERS),
        "--metrics-bind": values(["127.0.0.1:0", ""], ["127.0.0.1:99999", "nohost", ":x", "[::1]"]),
        "--log-level": values(["info", "debug"], ["loud"]),
        "--partition-minting": values(["true", "no"], ["maybe"]),
        "--curve-secret-key": values([str(tmp / "server.key_secret")], [str(tmp / "server.key"), str(tmp / "x")]),
        **LAYOUT_FLAGS,
    }


@st.composite
def argv_for(draw, command: str, tmp):
    positionals, flags = command_flags(command, tmp)
    argv = [command] + [draw(p) for p in positionals if draw(st.booleans()) or command != "decode"]
    if command == "keygen":
        argv += ["--dir", str(tmp / "keys")]  # never the current directory
    if command in ("reserve", "status", "bench"):
        # Nothing listens here, and the wait is short, unless the draw below overrides them.
        argv += ["--connect", f"ipc://{tmp}/nobody.sock", "--timeout", "0.05"]
    for flag in draw(st.lists(st.sampled_from(sorted(flags)), max_size=4)):
        argv += [flag, draw(flags[flag])]
    if draw(st.integers(0, 9)) == 0:  # now and then, a stray token anywhere
        argv.insert(draw(st.integers(0, len(argv))), draw(st.one_of(JUNK, st.sampled_from(["--", "-h", "--json"]))))
    return argv


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli-input")
    assert cli.main(["keygen", "server", "--dir", str(tmp)]) == 0
    assert cli.main(["keygen", "client", "--dir", str(tmp)]) == 0
    (tmp / "junk.key").write_bytes(b"\xff\xfe not a certificate\n")
    (tmp / "good.toml").write_text("region = 1\n")
    (tmp / "bad.toml").write_text("region = [\n")
    return tmp


@pytest.fixture
def no_broker(monkeypatch):
    """``serve`` stops where the broker would start; the logging it set up is undone afterwards."""
    from snowfence.broker import main

    started = []
    monkeypatch.setattr(main, "serve", lambda config: started.append(config) or 0)
    yield started
    logging.getLogger("snowfence").handlers[:] = []


@pytest.mark.parametrize("command", ["reserve", "status", "bench", "decode", "keygen", "serve"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_argv_gets_an_exit_status_and_at_most_one_error_line(command, data, keys, no_broker, capsys):
    argv = data.draw(argv_for(command, keys), label="argv")
    try:
        with mock.patch("sys.stdin", io.StringIO("")):  # decode with no IDs reads them from stdin
            status = cli.main(argv)
    except SystemExit as exc:  # argparse: --help, or a usage error
        status = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    assert status in EXIT_STATUSES, (argv, status, err)
    if command == "decode" and status == 1:
        assert all("not a snowfence ID" in line for line in err.splitlines()), (argv, err)
    elif status != 0:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("snowfence"), (argv, status, err)
    if status == 1 and command in ("reserve", "status", "bench"):
        # Validation passed, so the only way to fail is that nobody answered.
        assert "is snowfence serve running" in err, (argv, err)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["reserve", "1", "--connect", "udp://127.0.0.1:5555"], "udp://127.0.0.1:5555"),
        (["reserve", "1", "--after", "-1"], "--after"),
        (["reserve", "1", "--after", "1e20"], "--after"),
        (["reserve", "1", "--after", str(2**64)], "--after"),
        (["reserve", "1", "--server-key", "nosuch.key"], "nosuch.key"),
        (["status", "--client-key", "nosuch.key_secret", "--server-key", "Z" * 40], "nosuch.key_secret"),
        (["serve", "--bind", "garbage"], "garbage"),
        (["reserve", "1", "--timeout", "nan"], "--timeout"),
        (["reserve", "1", "--retries", "-1"], "--retries"),
        (["status", "--retries", "many"], "--retries"),
    ],
)
def test_the_reported_cases_exit_78_naming_what_is_wrong(argv, needle, no_broker, capsys):
    try:
        status = cli.main(argv)
    except SystemExit as exc:
        status = exc.code
    err = capsys.readouterr().err
    assert status == 78 and needle in err and len(err.strip().splitlines()) == 1, (status, err)
    assert not no_broker  # serve stopped before starting anything


def run_cli(argv, capsys, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    try:
        status = cli.main(argv)
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    return status, out, err


def test_snowfence_alone_prints_the_help(capsys):
    status, out, err = run_cli([], capsys)
    assert status == 0 and not err
    assert out.startswith("usage: snowfence") and all(c in out for c in ("serve", "reserve", "decode", "check-config"))


IDS = [121057962826403840, 121057962826403841, 121057962830598144]


@pytest.mark.parametrize(
    "argv, stdin",
    [
        (["decode"], "".join(f"{i}\n" for i in IDS)),  # what `snowfence reserve 3` prints
        (["decode", "-"], f"  {IDS[0]} {IDS[1]}\n\n{IDS[2]}"),
        (["decode", "-", "--json"], "[" + ",".join(f'"{i}"' for i in IDS) + "]\n"),  # `reserve 3 --json`
        (["decode", str(IDS[0]), "-"], f"{IDS[1]}\n{IDS[2]}\n"),
    ],
)
def test_decode_reads_ids_from_stdin(argv, stdin, capsys, monkeypatch):
    status, out, err = run_cli(argv, capsys, stdin, monkeypatch)
    assert status == 0 and not err, err
    lines = out.splitlines()
    assert [line.split()[0] if "--json" not in argv else line.split('"')[3] for line in lines] == list(map(str, IDS))


def test_decode_with_nothing_to_read_says_so(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin.isatty", lambda: True, raising=False)
    status, out, err = run_cli(["decode"], capsys)
    assert status == 78 and "give IDs" in err and err.count("\n") == 1, err


def test_decode_from_stdin_names_what_is_not_an_id_and_goes_on(capsys, monkeypatch):
    status, out, err = run_cli(["decode"], capsys, f"{IDS[0]}\nhello\n{IDS[1]}\n", monkeypatch)
    assert status == 1 and len(out.splitlines()) == 2 and err.strip() == "snowfence: 'hello' is not a snowfence ID"


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["reserve", "99999999999999999999999"], "at most 9,223,372,036,854,775,807"),
        (["reserve", str(2**63)], "at most"),
        (["bench", "--rate", "0"], "--rate"),
        (["bench", "--rate", "-1"], "--rate"),
    ],
)
def test_counts_and_rates_out_of_bounds_are_refused(argv, needle, capsys):
    status, out, err = run_cli(argv, capsys)
    assert status == 78 and needle in err and err.count("\n") == 1, (status, err)


def test_keygen_refuses_to_replace_a_key_pair_without_force(tmp_path, capsys):
    assert run_cli(["keygen", "server", "--dir", str(tmp_path)], capsys)[0] == 0
    public, secret = tmp_path / "server.key", tmp_path / "server.key_secret"
    before = (public.read_bytes(), secret.read_bytes())
    assert oct(secret.stat().st_mode & 0o777) == "0o600"
    status, out, err = run_cli(["keygen", "server", "--dir", str(tmp_path)], capsys)
    assert status == 73 and "--force" in err and str(public) in err and err.count("\n") == 1, (status, err)
    assert (public.read_bytes(), secret.read_bytes()) == before, "nothing changed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server.key", "server.key_secret"]
    secret.unlink()  # half a pair is still a pair someone may rely on
    status, _, err = run_cli(["keygen", "server", "--dir", str(tmp_path)], capsys)
    assert status == 73 and public.read_bytes() == before[0] and not secret.exists(), err
    status, out, _ = run_cli(["keygen", "server", "--dir", str(tmp_path), "--force"], capsys)
    assert status == 0 and public.read_bytes() != before[0] and secret.exists()
    assert oct(secret.stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server.key", "server.key_secret"]
