"""The keepers' renewal_failed, renewed and lease_lost log lines: sentences naming where the
lease is kept, at most one line of a kind every 30 s for all of a process's worker IDs."""

from __future__ import annotations

import logging

from snowfence.config import Config
from snowfence.workers.core import KEEPER_LINE_EVERY_S, KeeperLines


def lines(caplog):
    out = [(r.event, r.getMessage(), r.fields) for r in caplog.records if getattr(r, "event", None)]
    caplog.clear()
    return out


def test_an_etcd_outage_is_one_sentence_a_kind_naming_the_endpoints_not_a_line_per_worker_id(caplog, tmp_path):
    now = [0]
    config = Config(etcd=("10.0.0.1:2379", "http://10.0.0.2:2379"), state_dir=str(tmp_path))
    keeper_lines = KeeperLines(config, lambda: now[0])
    caplog.set_level(logging.WARNING, logger="snowfence")
    # Eight worker IDs failing every 0.25 s to 2 s for 10 s: one line.
    for tick in range(40):
        now[0] = tick * 250_000_000
        keeper_lines(
            "renewal_failed",
            {"worker_id": tick % 8, "reason": "UNAVAILABLE: connection refused", "failures": tick // 8 + 1},
        )
    ((event, message, fields),) = lines(caplog)
    assert event == "renewal_failed" and fields["worker_id"] == 0
    assert message.startswith("worker ID 0 could not renew its lease with etcd at 10.0.0.1:2379, http://10.0.0.2:2379")
    assert "UNAVAILABLE: connection refused" in message
    # The next, 30 s after the first, counts those held back and their worker IDs.
    now[0] = int(KEEPER_LINE_EVERY_S * 1e9)
    keeper_lines("renewal_failed", {"worker_id": 3, "reason": "no leader", "failures": 9})
    ((event, message, fields),) = lines(caplog)
    assert fields["held_back"] == 39 and "39 more like it, for worker IDs 0, 1, 2, 3, 4, 5, 6, 7" in message
    # Each kind has its own pace; other events pass as they are.
    for worker_id in range(8):
        keeper_lines("renewed", {"worker_id": worker_id, "after_failures": 5})
        keeper_lines("renewed_late", {"worker_id": worker_id, "latency_s": 2.0})
    logged = lines(caplog)
    assert [e for e, _, _ in logged] == ["renewed"] + ["renewed_late"] * 8
    assert (
        logged[0][1] == "worker ID 0 renewed its lease with etcd at 10.0.0.1:2379, http://10.0.0.2:2379 again, "
        "after 5 failed renewals"
    )


def test_embedded_a_lost_lease_names_the_state_directory(caplog, tmp_path):
    keeper_lines = KeeperLines(Config(state_dir=str(tmp_path)), lambda: 5)
    caplog.set_level(logging.WARNING, logger="snowfence")
    keeper_lines("lease_lost", {"worker_id": 2, "reason": "the lock file was replaced"})
    ((event, message, _),) = lines(caplog)
    assert event == "lease_lost"
    assert message == (
        f"worker ID 2 lost its lease with the state directory {tmp_path} and mints no more with it: "
        "the lock file was replaced"
    )
