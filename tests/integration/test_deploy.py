"""The deployment files speak of metrics the service actually exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from nodes import wait_for
from test_operations import get, health

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md"


def exported(text: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_alerts_dashboard_and_docs_name_only_exported_metrics(nodes):
    peer = nodes.start("peer", workers=1)
    # With a peer, so that the peer clock metrics are exported (and checked against the docs) too.
    node = nodes.start(workers=1, args=("--metrics-bind", "127.0.0.1:0", "--peers", peer.endpoint))
    node.wait_ready()
    addr = health(node)
    # The broker snapshots its workers' reports twice a second: wait for one with a ready
    # worker ID and a measured peer.
    code, text = wait_for(
        lambda: (
            lambda r: (
                r
                if 'snowfence_worker_ids{state="ready"} 1.0' in r[1] and "snowfence_peer_clock_offset_seconds{" in r[1]
                else None
            )
        )(get(addr, "/metrics")),
        10,
        what="a snapshot with a ready worker and a peer offset",
    )
    assert code == 200
    names = exported(text)
    names |= {n.removesuffix("_count") for n in names if n.endswith("_count")}  # a histogram's own name
    dashboard = json.loads((DEPLOY / "grafana" / "snowfence-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    alerts = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    docs = OPERATIONS.read_text()
    for source, where in ((exprs, "dashboard"), (alerts, "alerts"), (docs, "OPERATIONS.md")):
        used = set(re.findall(r"snowfence_[a-z_]+[a-z]", source))
        missing = sorted(u for u in used if u not in names)
        assert not missing, f"{where} names metrics the service does not export: {missing}"
    for alert in re.findall(r"alert: (\w+)", alerts):
        assert f"### {alert}" in docs, f"no runbook entry for {alert}"
    documented = set(re.findall(r"`(snowfence_[a-z_]+)`", docs))
    families = {
        n.removesuffix("_total").removesuffix("_bucket").removesuffix("_count").removesuffix("_sum") for n in names
    }
    undocumented = sorted(f for f in families if not any(d.startswith(f) for d in documented))
    assert not undocumented, f"metrics missing from OPERATIONS.md: {undocumented}"
