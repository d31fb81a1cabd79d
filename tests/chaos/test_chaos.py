"""The fault run, short profile (CI), and proof that the checker catches a broken guard.

The long profile runs outside pytest: `python tests/chaos/run.py --profile long --minutes 10`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import chaos  # noqa: E402


@pytest.mark.timeout(900)
def test_short_profile_nothing_is_minted_twice(tmp_path):
    verdict = chaos.run(tmp_path / "run", chaos.SHORT, seed=1)
    print(chaos.report(verdict))
    assert verdict.ok, chaos.report(verdict)
    assert verdict.ids > 1_000_000 and verdict.outcomes["ok"] > 1000
    assert {f["kind"] for f in verdict.faults} == set(chaos.FAULTS), "every fault kind was applied"
    never = [f["kind"] for f in verdict.faults if f["to_full_service_s"] is None]
    assert not never, f"no full service after {never}"


@pytest.mark.timeout(300)
def test_embedded_mode_with_its_state_directory_tampered_mints_nothing_twice(tmp_path):
    verdict = chaos.run(tmp_path / "run", chaos.EMBEDDED_SHORT, seed=1, nodes_count=2, embedded=True)
    print(chaos.report(verdict))
    assert verdict.ok, chaos.report(verdict)
    assert verdict.ids > 100_000 and verdict.outcomes["ok"] > 500
    assert [
        f["target"].split(":")[0].split(" of ")[0] for f in verdict.faults if f["kind"] == "state_dir_tampered"
    ] == list(chaos.TAMPERINGS), "every kind of tampering was applied"
    unnoticed = [f["target"] for f in verdict.faults if f["target"].endswith(": 0 let go")]
    assert not unnoticed, f"tampering no holder noticed: {unnoticed}"
    never = [f["kind"] for f in verdict.faults if f["to_full_service_s"] is None]
    assert not never, f"no full service after {never}"


@pytest.mark.timeout(300)
def test_skewed_takeover_with_the_mark_intact_repeats_nothing(tmp_path):
    verdict = chaos.skewed_takeover(tmp_path / "run")
    assert verdict.ok, chaos.report(verdict)
    assert verdict.ids > 100_000


@pytest.mark.timeout(300)
def test_the_checker_catches_a_broken_mark_wait(tmp_path):
    broken = chaos.broken_copy(tmp_path, "mark-wait")
    verdict = chaos.skewed_takeover(tmp_path / "run", pythonpath=broken)
    assert not verdict.ok, "with the high-water-mark wait disabled, the run must show repeated IDs"
    assert any("duplicate IDs" in v or "is not above" in v for v in verdict.violations)


@pytest.mark.timeout(300)
def test_a_claim_behind_the_watermark_mints_nothing_below_it(tmp_path):
    verdict = chaos.watermark_behind(tmp_path / "run")
    assert verdict.ok, chaos.report(verdict)
    assert verdict.watermarks > 20 and verdict.ids > 100_000


@pytest.mark.timeout(300)
def test_the_checker_catches_a_claim_that_ignores_the_watermark(tmp_path):
    broken = chaos.broken_copy(tmp_path, "watermark-claim")
    verdict = chaos.watermark_behind(tmp_path / "run", pythonpath=broken)
    assert any("below the watermark" in v for v in verdict.violations), chaos.report(verdict)
