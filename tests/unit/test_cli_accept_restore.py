"""accept-restore: a dry run changes nothing; a store that did not go back needs --force."""

from __future__ import annotations

from pathlib import Path

from snowfence.cli import main


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_dry_run_changes_nothing_and_a_healthy_store_needs_force(tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    common = ["accept-restore", "--reason", "wiped on purpose", "--state-dir", str(state)]

    before = _files(state)
    assert main([*common, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run" in out and "layout record is gone" in out and "until" in out, out
    assert not any("genesis" in name or "layout" in name for name in _files(state)), _files(state)

    assert main(common) == 0  # the record is gone: a store that went back, accepted
    assert "accepted restore" in capsys.readouterr().out

    before = _files(state)
    assert main(common) == 78  # healthy now: no quarantine without --force
    captured = capsys.readouterr()
    assert "no sign of going back" in captured.err and "--force" in captured.err, captured.err
    assert len(captured.err.strip().splitlines()) == 1, captured.err
    assert _files(state) == before

    assert main([*common, "--dry-run"]) == 0
    assert "shows no sign of going back" in capsys.readouterr().out
    assert _files(state) == before

    assert main([*common, "--force"]) == 0
    assert "accepted restore" in capsys.readouterr().out
    assert _files(state) != before
