"""The chart's dashboard and alerts as tests read them (docs/operations.md, "Dashboards and alerts"):
the files, the metric names their queries use, and the metrics the project exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
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


def exported_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """name (a counter's with `_total`) -> (type, label names) of every metric the project's
    processes define (docs/reference.md, "Metrics")."""
    from prometheus_client.metrics import MetricWrapperBase

    from pipeline import metrics, router
    from pipeline.gateway import metrics as gateway_metrics

    found = {}
    for module in (metrics, gateway_metrics, router):
        for value in vars(module).values():
            if isinstance(value, MetricWrapperBase):
                family = value.describe()[0]
                name = family.name + ("_total" if family.type == "counter" else "")
                found[name] = (family.type, value._labelnames)
    return found


def exported_series() -> set[str]:
    """Every series name the project's processes export (docs/reference.md, "Metrics")."""
    names = set()
    for name, (kind, _) in exported_metrics().items():
        base = name.removesuffix("_total")
        names.update(base + suffix for suffix in _SUFFIXES[kind])
    return names
