"""A claimed worker ID builds its own minter and keeper from the settings."""

from __future__ import annotations

from snowfence.config import Config
from snowfence.store.base import Lease
from snowfence.workers.core import Clocks, Held


def test_held_mints_only_above_the_claimed_mark_and_its_keeper_waits_to_be_started():
    config = Config(
        region=3, max_step_back_ms=7, reservation_window_s=9.0, max_reservation_window_s=9.0, loop_stall_s=4.0
    )
    lease = Lease(region=3, worker_id=12, token=5, mark_ms=123_456)
    seen = []
    held = Held.start(lease, config, Clocks(), on_step_back=lambda ms, refused: seen.append(ms), loop_ns=lambda: 0)
    assert held.lease is lease and held.state == "waiting"
    assert held.minter.worker_id == 12 and held.minter.region == 3
    assert held.minter.last_ms >= 123_456  # nothing at or below the previous owner's mark
    assert held.minter.max_step_back_ms == 7
    assert held.keeper.lease is lease and held.keeper.minter is held.minter
    assert held.keeper.window_ms == 9000
    assert held.keeper.renewals == 0 and not held.keeper.is_alive()
