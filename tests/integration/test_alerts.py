"""Every alert rule in deploy/prometheus/alerts.yml, run by ``promtool test rules``:
for each alert one history that must fire it and one that must not; and each
rule's runbook_url leads to its own entry in docs/OPERATIONS.md.

The not-firing cases sit just on the safe side of each threshold, where a rule
that compares the wrong series (or the right ones with the wrong labels) fires.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
OPERATIONS = ROOT / "docs" / "OPERATIONS.md"
NODE = {"instance": "n1:9464", "job": "snowfence"}


def series(name: str, values: str, **labels) -> dict:
    text = ",".join(f'{k}="{v}"' for k, v in {**NODE, **labels}.items())
    return {"series": f"{name}{{{text}}}", "values": values}


def alert(severity: str, summary: str, **labels) -> dict:
    return {"exp_labels": {"severity": severity, **labels, **NODE}, "exp_annotations": {"summary": summary}}


def case(eval_time: str, input_series: list, expected: list | None = None, interval: str = "1m") -> dict:
    return {"interval": interval, "eval_time": eval_time, "input_series": input_series, "exp_alerts": expected or []}


def requests(ok: str, refused: str, unavailable: str = "0+0x30") -> list:
    return [
        series("snowfence_requests_total", ok, result="ok"),
        series("snowfence_requests_total", refused, result="refused"),
        series("snowfence_requests_total", unavailable, result="unavailable"),
        series("snowfence_requests_total", "0+0x30", result="overloaded"),
    ]


def up(values: str, job: str = "snowfence", instance: str = NODE["instance"]) -> dict:
    return {"series": f'up{{instance="{instance}",job="{job}"}}', "values": values}


#: alert -> (a history that fires it, one that must not).
CASES = {
    "SnowfenceTargetDown": (
        case(
            "3m",
            [up("1 0 0 0 0 0"), up("1x5", instance="n2:9464")],
            [alert("page", "Prometheus cannot scrape n1:9464: the node is down or unreachable")],
        ),
        # Another job's target down, and one scrape of ours missed: not this alert.
        case("3m", [up("1 1 0 1 1 1"), up("0x5", job="other", instance="x:9100")]),
    ),
    "SnowfenceTargetAbsent": (
        case(
            "7m",
            [up("1x10", job="other", instance="x:9100")],
            [
                {
                    "exp_labels": {"severity": "page", "job": "snowfence"},
                    "exp_annotations": {"summary": "Prometheus has no snowfence target to scrape (job snowfence)"},
                }
            ],
        ),
        # Present but down is SnowfenceTargetDown's.
        case("7m", [up("0x10")]),
    ),
    "SnowfenceMetricsMissing": (
        case(
            "7m",
            [up("1x10"), series("snowfence_build_info", "1x10", version="0.1.0", instance="n2:9464")],
            [
                {
                    "exp_labels": {"severity": "ticket", **NODE},
                    "exp_annotations": {"summary": "n1:9464 answers scrapes but exports no snowfence metrics"},
                }
            ],
        ),
        case("7m", [up("1x10"), series("snowfence_build_info", "1x10", version="0.1.0")]),
    ),
    "SnowfenceNotReady": (
        case(
            "2m",
            [series("snowfence_workers_in_rotation", "0x5")],
            [alert("page", "No worker of n1:9464 is in rotation")],
        ),
        case("2m", [series("snowfence_workers_in_rotation", "1x5")]),
    ),
    "SnowfenceEtcdUnreachable": (
        # Every worker ID of an etcd node renews late: one alert for the node, the cause.
        case(
            "2m",
            [
                series("snowfence_lease_renewal_age_seconds", "4x5", worker_id="3"),
                series("snowfence_lease_renewal_age_seconds", "6x5", worker_id="4"),
                series("snowfence_node_info", "1x5", cluster="c", region="0", mode="etcd"),
            ],
            [
                {
                    "exp_labels": {"severity": "page", "instance": NODE["instance"]},
                    "exp_annotations": {
                        "summary": "etcd is out of reach of n1:9464: no worker ID renewed its lease for 4 s"
                    },
                }
            ],
        ),
        # One worker ID late while another renews (SnowfenceLeaseRenewalSlow's), or an embedded node.
        case(
            "2m",
            [
                series("snowfence_lease_renewal_age_seconds", "4x5", worker_id="3"),
                series("snowfence_lease_renewal_age_seconds", "0.5x5", worker_id="4"),
                series("snowfence_node_info", "1x5", cluster="c", region="0", mode="etcd"),
                series("snowfence_lease_renewal_age_seconds", "9x5", worker_id="1", instance="n2:9464"),
                series("snowfence_node_info", "1x5", cluster="", region="0", mode="embedded", instance="n2:9464"),
            ],
        ),
    ),
    "SnowfenceFenced": (
        case(
            "2m",
            [series("snowfence_worker_ids", "2x5", state="fenced")],
            [alert("page", "2 worker IDs on n1:9464 are fenced: etcd renewals failing", state="fenced")],
        ),
        case(
            "2m",
            [
                series("snowfence_worker_ids", "0x5", state="fenced"),
                series("snowfence_worker_ids", "3x5", state="ready"),
            ],
        ),
    ),
    "SnowfenceClockUnsafe": (
        case(
            "2m",
            [series("snowfence_worker_ids", "1x5", state="clock_unsafe")],
            [alert("page", "Worker IDs on n1:9464 refuse for their clock", state="clock_unsafe")],
        ),
        case("2m", [series("snowfence_worker_ids", "0x5", state="clock_unsafe")]),
    ),
    "SnowfenceClockStepBack": (
        case(
            "4m",
            [series("snowfence_clock_step_back_seconds_count", "0 0 1 1 1 1")],
            [alert("ticket", "The wall clock of n1:9464 stepped back")],
        ),
        case("4m", [series("snowfence_clock_step_back_seconds_count", "3x5")]),
    ),
    "SnowfenceClockForwardJump": (
        case(
            "4m",
            [series("snowfence_clock_forward_jumps_total", "0 0 0 1 1 1")],
            [alert("ticket", "The wall clock of n1:9464 jumped forward")],
        ),
        case("4m", [series("snowfence_clock_forward_jumps_total", "1x5")]),
    ),
    "SnowfenceClockUnsynchronized": (
        case(
            "12m",
            [series("snowfence_clock_synchronized", "0x15")],
            [alert("ticket", "The kernel reports the clock of n1:9464 unsynchronised")],
        ),
        case("12m", [series("snowfence_clock_synchronized", "1x15")]),
    ),
    "SnowfenceLayoutEnding": (
        # A layout that ends 1 s short of 2 years (63,115,200 s) after time 0 has had under 2 years left all along;
        # one that ends 2 years after 2h (7,200 s) has exactly 2 left then, and had more before.
        case(
            "2h",
            [series("snowfence_layout_end_timestamp_seconds", "63115199x150")],
            [alert("ticket", "The ID layout of n1:9464 ends in 2.00 years")],
        ),
        case("2h", [series("snowfence_layout_end_timestamp_seconds", "63122400x150")]),
    ),
    "SnowfenceWorkerIdPoolLow": (
        # 12 of 128 free is under 10%; 13 is not. Per region: region 1, all free, does not hide region 0.
        case(
            "20m",
            [
                series("snowfence_worker_id_pool", "100x25", region="0", state="held"),
                series("snowfence_worker_id_pool", "16x25", region="0", state="quarantined"),
                series("snowfence_worker_id_pool", "12x25", region="0", state="free"),
                series("snowfence_worker_id_pool", "128x25", region="1", state="free"),
            ],
            [alert("ticket", "Region 0 has under 10% of its worker IDs free (seen by n1:9464)", region="0")],
        ),
        case(
            "20m",
            [
                series("snowfence_worker_id_pool", "100x25", region="0", state="held"),
                series("snowfence_worker_id_pool", "15x25", region="0", state="quarantined"),
                series("snowfence_worker_id_pool", "13x25", region="0", state="free"),
            ],
        ),
    ),
    "SnowfenceLeaseRenewalSlow": (
        case(
            "2m",
            [
                series("snowfence_lease_renewal_age_seconds", "4x5", worker_id="3"),
                series("snowfence_lease_renewal_age_seconds", "0.5x5", worker_id="4"),
            ],
            # Aggregated by instance: one alert per node, not one per worker ID.
            [
                {
                    "exp_labels": {"severity": "ticket", "instance": NODE["instance"]},
                    "exp_annotations": {"summary": "Lease renewals on n1:9464 are late (4 s; fence at 5 s)"},
                }
            ],
        ),
        case("2m", [series("snowfence_lease_renewal_age_seconds", "2.5x5", worker_id="3")]),
    ),
    "SnowfenceReservationLow": (
        case(
            "2m",
            [series("snowfence_reservation_headroom_seconds", "0.5x5", worker_id="3")],
            [
                {
                    "exp_labels": {"severity": "ticket", "instance": NODE["instance"]},
                    "exp_annotations": {"summary": "The time high-water mark of n1:9464 is barely ahead of its clock"},
                }
            ],
        ),
        case("2m", [series("snowfence_reservation_headroom_seconds", "4x5", worker_id="3")]),
    ),
    "SnowfenceWorkerRestarts": (
        case(
            "20m",
            [series("snowfence_worker_restarts_total", "0+1x25")],
            [alert("ticket", "Workers of n1:9464 keep restarting")],
        ),
        # Two restarts in a quarter of an hour: not yet a pattern.
        case("20m", [series("snowfence_worker_restarts_total", "0x10 1 2 2 2 2 2 2 2 2 2 2 2 2 2")]),
    ),
    "SnowfenceLeasesLost": (
        case(
            "10m",
            [series("snowfence_leases_lost_total", "0x5 1x10")],
            [alert("ticket", "n1:9464 lost worker-ID leases")],
        ),
        case("10m", [series("snowfence_leases_lost_total", "2x15")]),
    ),
    "SnowfenceRefusing": (
        # 20% refused or unavailable.
        case(
            "15m",
            requests(ok="0+4800x20", refused="0+900x20", unavailable="0+300x20"),
            [alert("ticket", "More than 5% of requests to n1:9464 are refused")],
        ),
        # 1% refused: a rule that matches refusals against 5% of themselves fires here.
        case("15m", requests(ok="0+5940x20", refused="0+60x20")),
    ),
    "SnowfenceWatermarkStalled": (
        case(
            "10m",
            [series("snowfence_watermark_lag_seconds", "1.5x3 61x10")],
            [alert("ticket", "The watermark of n1:9464 is more than a minute behind")],
        ),
        # A minute behind at most, or not yet for five minutes.
        case("10m", [series("snowfence_watermark_lag_seconds", "1.5x5 60x3 70x2")]),
    ),
    "SnowfenceOverloaded": (
        case(
            "15m",
            [series("snowfence_requests_total", "0+60x20", result="overloaded")],
            [alert("ticket", "Clients of n1:9464 exceed the in-flight limit", result="overloaded")],
        ),
        case(
            "15m",
            [
                series("snowfence_requests_total", "0x20", result="overloaded"),
                series("snowfence_requests_total", "0+6000x20", result="ok"),
            ],
        ),
    ),
}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("promtool is not installed, and CI must run the alert tests (apt-get install prometheus)")
        pytest.skip("promtool not installed (Debian: apt-get install --no-install-recommends prometheus)")
    return path


def test_every_alert_rule_has_a_firing_and_a_quiet_case():
    rules = re.findall(r"^\s*- alert: (\w+)", RULES.read_text(), flags=re.M)
    assert rules and len(rules) == len(set(rules))
    assert sorted(CASES) == sorted(rules), "every alert needs cases here, and only alerts that exist"
    for name, (firing, quiet) in CASES.items():
        assert firing["exp_alerts"] and not quiet["exp_alerts"], name


def runbook(name: str) -> str:
    return f"docs/OPERATIONS.md#{name.lower()}"


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown document (outside code blocks)."""
    out, seen, fenced = set(), Counter(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"#{1,6} +(.+?)\s*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            out.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
            seen[slug] += 1
    return out


def test_every_rule_links_its_own_runbook_entry_and_the_anchor_exists():
    rules = [r for group in yaml.safe_load(RULES.read_text())["groups"] for r in group["rules"]]
    docs = OPERATIONS.read_text()
    targets = anchors(docs)
    assert "snowfencenotready" in targets and "metrics" in targets  # the anchors are computed as GitHub does
    for rule in rules:
        url = rule["annotations"].get("runbook_url")
        assert url == runbook(rule["alert"]), f"{rule['alert']}: runbook_url {url!r}"
        path, _, anchor = url.partition("#")
        assert (ROOT / path).resolve() == OPERATIONS.resolve()
        assert anchor in targets, f"{rule['alert']}: no heading in OPERATIONS.md has the anchor #{anchor}"
        assert f"### {rule['alert']}\n" in docs, f"no runbook entry for {rule['alert']}"


INHIBIT = ROOT / "deploy" / "prometheus" / "alertmanager-inhibit.yml"
#: A matcher as Alertmanager's ``source_matchers`` and ``target_matchers`` take it.
MATCHER = re.compile(r'^(\w+)(=~|!~|!=|=)"([^"]*)"$')


def inhibited(matchers: list, alerts: list[str]) -> set[str]:
    """The alerts of ``alerts`` a list of matchers on alertname selects (as Alertmanager
    does: a regular expression matches the whole name)."""
    selected = set(alerts)
    for text in matchers:
        m = MATCHER.match(text)
        assert m, f"not an Alertmanager matcher: {text!r}"
        label, op, value = m.groups()
        assert label == "alertname", f"{text!r}: snowfence's inhibitions select alerts by name"
        if op in ("=", "!="):
            hits = {a for a in alerts if a == value}
        else:
            hits = {a for a in alerts if re.fullmatch(value, a)}
        selected &= hits if op in ("=", "=~") else set(alerts) - hits
        if op == "=~":
            assert len(hits) == len(value.split("|")), f"{text!r} names an alert alerts.yml does not have"
        elif op == "=":
            assert hits, f"{text!r} names an alert alerts.yml does not have"
    return selected


def test_the_inhibition_rules_silence_an_etcd_outages_symptoms_by_alerts_that_exist():
    rules = [r for group in yaml.safe_load(RULES.read_text())["groups"] for r in group["rules"]]
    alerts = [r["alert"] for r in rules]
    severity = {r["alert"]: r["labels"]["severity"] for r in rules}
    doc = yaml.safe_load(INHIBIT.read_text())
    assert set(doc) == {"inhibit_rules"} and doc["inhibit_rules"], doc
    silenced = {}
    for rule in doc["inhibit_rules"]:
        assert set(rule) <= {"source_matchers", "target_matchers", "equal"}, rule
        sources = inhibited(rule["source_matchers"], alerts)
        targets = inhibited(rule["target_matchers"], alerts)
        assert sources and targets and not sources & targets, rule
        # Only on the same node: an outage seen from one node silences nothing of another.
        assert rule["equal"] == ["instance"], rule
        for source in sources:
            silenced.setdefault(source, set()).update(targets)
    symptoms = {"SnowfenceFenced", "SnowfenceLeaseRenewalSlow", "SnowfenceReservationLow"}
    assert symptoms <= silenced["SnowfenceEtcdUnreachable"], silenced
    # The cause outranks what it silences, or a page would hide behind a ticket.
    assert all(severity[source] == "page" for source in silenced), silenced
    docs = OPERATIONS.read_text()
    entry = docs.split("### SnowfenceEtcdUnreachable\n", 1)[1].split("\n### ", 1)[0]
    assert "alertmanager-inhibit.yml" in entry and all(t in entry for t in silenced["SnowfenceEtcdUnreachable"])


def test_alert_rules_pass_promtool(tmp_path):
    tool = promtool()
    check = subprocess.run([tool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = []
    for name, pair in CASES.items():
        for c in pair:
            # Every alert carries its runbook link besides its summary.
            expected = [
                {**a, "exp_annotations": {**a["exp_annotations"], "runbook_url": runbook(name)}}
                for a in c["exp_alerts"]
            ]
            tests.append(
                {
                    "interval": c["interval"],
                    "input_series": c["input_series"],
                    "alert_rule_test": [{"eval_time": c["eval_time"], "alertname": name, "exp_alerts": expected}],
                }
            )
    spec = tmp_path / "alerts_test.yml"  # JSON is YAML
    spec.write_text(json.dumps({"rule_files": [str(RULES)], "evaluation_interval": "15s", "tests": tests}, indent=1))
    run = subprocess.run([tool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
