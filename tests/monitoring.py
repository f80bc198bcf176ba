"""The chart's dashboard and alerts as tests read them (docs/operations.md, "Dashboards and alerts"):
the files, the metric names their queries use, and the metrics the project exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "helm" / "agentstream" / "monitoring"
DASHBOARD = MONITORING / "dashboard.json"
ALERTS = MONITORING / "alerts.yaml"
ALERT_TESTS = ROOT / "tests" / "promtool" / "alerts.test.yaml"
# Grafana's rate window variable, as a fixed window for a Prometheus that scrapes every second.
RATE_WINDOW = "1m"

_METRIC = re.compile(r"\bagentstream_[a-z0-9_]+")
_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target, the rate window filled in."""
    return [
        (panel["title"], target["expr"].replace("$__rate_interval", RATE_WINDOW))
        for panel in dashboard()["panels"]
        for target in panel["targets"]
    ]


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def metric_names(expr: str) -> set[str]:
    return set(_METRIC.findall(expr))


def exported_series() -> set[str]:
    """Every series name the project's processes export (docs/reference.md, "Metrics")."""
    from tests.test_reference_docs import _metrics

    names = set()
    for name, (kind, _) in _metrics().items():
        base = name.removesuffix("_total")
        names.update(base + suffix for suffix in _SUFFIXES[kind])
    return names
