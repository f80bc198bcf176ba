"""The chart's Grafana dashboard and Prometheus alerts, checked offline (docs/operations.md,
"Dashboards and alerts"): Debian's promtool checks the rule file and runs the unit tests of every
alert (tests/promtool/alerts.test.yaml); every query names only metrics the project exports; the
chart renders the dashboard into a ConfigMap for Grafana's sidecar and the rules into a
PrometheusRule, both off by default. tests/deploy/test_monitoring_kafka.py evaluates the queries
against a running stack."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.helm import by_kind, helm, render
from tests.support.monitoring import (
    ALERT_TESTS,
    ALERTS,
    ROOT,
    alert_rules,
    dashboard,
    dashboard_queries,
    exported_series,
    metric_names,
)

__all__ = ["helm"]  # the chart tests' helm fixture

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
ALERTS_WANTED = {
    "AgentstreamConsumerLagGrowing",
    "AgentstreamDeadLetters",
    "AgentstreamAgentsBusyTooLong",
    "AgentstreamScriptsStuck",
    "AgentstreamProviderErrors",
    "AgentstreamProducerFenced",
    "AgentstreamNoJournalProgress",
}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    if not Path(PROMTOOL).exists():
        pytest.fail("promtool is missing: run scripts/install.sh (Debian's prometheus package)", pytrace=False)
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)


def test_promtool_accepts_the_alert_rules() -> None:
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS_WANTED)} rules found" in result.stdout


def test_every_alert_has_promtool_unit_tests_that_pass() -> None:
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    tested = {case["alertname"] for test in tests for case in test["alert_rule_test"]}
    firing = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    quiet = {case["alertname"] for test in tests for case in test["alert_rule_test"] if not case["exp_alerts"]}
    assert {rule["alert"] for rule in alert_rules()} == ALERTS_WANTED == tested
    assert firing == quiet == ALERTS_WANTED, "each alert needs a case where it fires and one where it does not"
    result = promtool("test", "rules", str(ALERT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_runbook_in_the_operations_guide() -> None:
    guide = (ROOT / "docs" / "operations.md").read_text()
    runbooks = guide.split("\n### Alerts\n", 1)[1].split("\n## ", 1)[0]
    for rule in alert_rules():
        assert rule["annotations"]["runbook"] == f"docs/operations.md#alerts ({rule['alert']})"
        assert f"`{rule['alert']}`" in runbooks, f"docs/operations.md, Alerts, has no runbook for {rule['alert']}"


def test_dashboard_and_alerts_name_only_metrics_the_project_exports() -> None:
    exported = exported_series()
    expressions = [expr for _, expr in dashboard_queries()] + [rule["expr"] for rule in alert_rules()]
    for expr in expressions:
        named = metric_names(expr)
        assert named, expr
        assert named <= exported, f"not exported by any agentstream process: {sorted(named - exported)} in {expr}"


def test_the_dashboard_has_the_panels_an_operator_needs() -> None:
    titles = [panel["title"] for panel in dashboard()["panels"]]
    assert titles == [
        "Throughput per stage",
        "Consumer lag",
        "Append → journaled",
        "Turns",
        "Provider latency",
        "Dead letters by reason",
        "Fenced producers and repeated work",
        "Busy and stuck agents",
        "Token usage",
    ]
    for panel in dashboard()["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]


def _rendered(helm: tuple[str, dict[str, str]], tmp_path: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    return render(helm, tmp_path, values)[1]


def test_the_chart_renders_the_dashboard_and_rules_only_when_asked(
    helm: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    default = _rendered(helm, tmp_path, {})
    assert not by_kind(default, "PrometheusRule")
    assert not [c for c in by_kind(default, "ConfigMap") if "grafana_dashboard" in c["metadata"]["labels"]]

    values = {
        "metrics": {
            "grafanaDashboard": {"enabled": True, "namespace": "monitoring", "labels": {"team": "agents"}},
            "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        }
    }
    objects = _rendered(helm, tmp_path, values)
    (board,) = [c for c in by_kind(objects, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["metadata"]["labels"]["team"] == "agents" and board["metadata"]["namespace"] == "monitoring"
    assert json.loads(board["data"]["agentstream.json"]) == dashboard()
    (rule,) = by_kind(objects, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())  # the very file promtool tests
