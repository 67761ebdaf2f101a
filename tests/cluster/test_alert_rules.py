"""Alert rules: promtool checks them and runs their unit tests; every alert has a test; every series they read is
exported; the PrometheusRule the chart renders carries exactly this file."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from rlfleet.runtime.metrics import serve_metrics
from rlfleet.runtime.ports import free_port
from tests.cluster.chart import by_kind, render
from tests.cluster.exported import names_in_exposition, names_in_promql, scrape, sdk_registry
from tests.cluster.tools import need_binary, need_module

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/helm/rlfleet/files/alerts.rules.yaml"
RULE_TESTS = Path(__file__).resolve().parent / "promtool" / "alerts.test.yaml"
REQUIRED = {"RlfleetTrainerStalled", "RlfleetBufferStarved", "RlfleetBufferFull", "RlfleetReplicaStaleVersion",
            "RlfleetWeightSyncFailures"}


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_check_rules() -> None:
    promtool = need_binary("promtool")
    proc = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_test_rules() -> None:
    promtool = need_binary("promtool")
    proc = subprocess.run([promtool, "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_is_tested_and_the_issue_alerts_exist() -> None:
    alerts = {r["alert"] for r in _rules() if "alert" in r}
    assert REQUIRED <= alerts
    tested = {t["alertname"] for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for t in case.get("alert_rule_test", [])}
    assert alerts <= tested, f"alerts without a promtool test: {sorted(alerts - tested)}"
    for rule in _rules():
        if "alert" in rule:
            assert rule["annotations"]["runbook"].startswith("docs/cluster.md#")


def test_rules_read_only_exported_series() -> None:
    port = free_port()
    serve_metrics(sdk_registry(), port, addr="127.0.0.1")
    live = names_in_exposition(scrape(port))
    for rule in _rules():
        used = names_in_promql(rule["expr"])
        assert used and used <= live, f"{rule.get('alert') or rule.get('record')}: {sorted(used - live)}"


def test_runbook_anchors_exist_in_the_cluster_guide() -> None:
    guide = (ROOT / "docs/cluster.md").read_text().lower()
    for rule in _rules():
        if "alert" in rule:
            assert f"### {rule['alert'].lower()}" in guide, rule["alert"]


def test_prometheus_rule_renders_this_file() -> None:
    need_module("helm_python")
    objects = render({"metrics": {"prometheusRule": {"enabled": True}}})
    (rule,) = by_kind(objects, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    assert not by_kind(render(), "PrometheusRule")


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_alert_has_severity(name: str) -> None:
    rule = next(r for r in _rules() if r.get("alert") == name)
    assert rule["labels"]["severity"] in ("warning", "critical")
