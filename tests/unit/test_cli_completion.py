"""`snowfence completion bash|zsh|fish`: a script made from the parser, listing every command and flag, that
each shell reads and completes with."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess

import pytest

from snowfence.cli import build_parser, main


def _script(capsys) -> str:
    assert main(["completion", "bash"]) == 0
    return capsys.readouterr().out


def test_the_script_lists_every_flag_of_serve(capsys):
    script = _script(capsys)
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    serve_line = next(line for line in script.splitlines() if line.strip().startswith("serve)"))
    flags = {o for a in commands["serve"]._actions for o in a.option_strings}
    assert len(flags) > 30
    missing = sorted(flag for flag in flags if f" {flag} " not in serve_line.replace('"', " "))
    assert not missing, missing
    for name in commands:
        assert f"        {name}) opts=" in script, name


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_a_flag_of_serve(capsys, tmp_path):
    path = tmp_path / "snowfence.bash"
    path.write_text(_script(capsys))
    probe = (
        f"source {path}; COMP_WORDS=(snowfence serve --metrics-b); COMP_CWORD=2; _snowfence; "
        'printf "%s\\n" "${COMPREPLY[@]}"; COMP_WORDS=(snowfence acc); COMP_CWORD=1; _snowfence; '
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["--metrics-bind", "accept-restore"], out.stdout


def _shell_script(capsys, shell: str) -> str:
    assert main(["completion", shell]) == 0
    return capsys.readouterr().out


def _flags_of(command: str) -> set[str]:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    return {o for a in commands[command]._actions for o in a.option_strings}


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts_list_every_command_and_flag(capsys, shell):
    script = _shell_script(capsys, shell)
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name in commands:
        assert (f"        {name}) opts=(" if shell == "zsh" else f"-f -a {name} -d ") in script, name
    for flag in _flags_of("serve"):
        shown = f" {flag} " if shell == "zsh" else f"'__fish_seen_subcommand_from serve' -l {flag[2:]}\n"
        assert shown in script.replace("(", " ").replace(")", " ") or flag == "-h", flag


@pytest.mark.skipif(shutil.which("zsh") is None and not os.environ.get("CI"), reason="no zsh")
def test_zsh_reads_the_script_and_completes_a_flag_and_a_command(capsys, tmp_path):
    path = tmp_path / "_snowfence"
    path.write_text(_shell_script(capsys, "zsh"))
    assert subprocess.run(["zsh", "-n", str(path)], capture_output=True, timeout=10).returncode == 0
    # compadd and compdef stand in for the completion system's own: what the function offers is printed.
    probe = (
        f"compdef() {{ :; }}; compadd() {{ shift; print -l -- $@ }}; source {path}; "
        "words=(snowfence serve --metrics-b); CURRENT=3; _snowfence | grep -x -- --metrics-bind; "
        "words=(snowfence acc); CURRENT=2; _snowfence | grep -x accept-restore"
    )
    out = subprocess.run(["zsh", "-f", "-c", probe], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["--metrics-bind", "accept-restore"], out.stdout


@pytest.mark.skipif(shutil.which("fish") is None and not os.environ.get("CI"), reason="no fish")
def test_fish_reads_the_script_and_completes_a_flag_and_a_command(capsys, tmp_path):
    path = tmp_path / "snowfence.fish"
    path.write_text(_shell_script(capsys, "fish"))
    assert subprocess.run(["fish", "-n", str(path)], capture_output=True, timeout=10).returncode == 0
    probe = f"source {path}; complete -C 'snowfence serve --metrics-b'; complete -C 'snowfence acc'"
    out = subprocess.run(["fish", "--no-config", "-c", probe], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert [line.split("\t")[0] for line in out.stdout.splitlines()] == ["--metrics-bind", "accept-restore"], out.stdout
