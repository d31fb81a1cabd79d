"""`snowfence completion bash`: a script made from the parser, listing every command and flag."""

from __future__ import annotations

import argparse
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
