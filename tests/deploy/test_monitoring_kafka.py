"""Every dashboard query against the real thing (docs/operations.md, "Dashboards and alerts"): a
stack of real processes (journal worker, LLM caller, capability host, router, the gateway) serves
its metrics ports, Debian's Prometheus scrapes them every second, a turn whose answer runs code
goes in through the gateway and a bad record goes to the dead-letter topic, and then every query
of the chart's dashboard and every alert expression is evaluated by that Prometheus. A query that
names a metric no process exports, that Prometheus refuses, or that returns no series fails.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from schemas.capabilities import SCRIPT_RUN_SETTLED
from schemas.events import CONTEXT_ADDED, LLM_REQUEST_SETTLED
from tests.gateway_server import GatewayServer, Tokens
from tests.kafka_stack import Stack, wait_until
from tests.support.monitoring import alert_rules, dashboard_queries, exported_series, metric_names
from tests.support.ports import free_port
from tests.support.scripted_llm import Reply
from tests.support.scripted_stack import SMALL_HOST, served_stack
from tests.support.tagged_model import SMALL_USAGE, TaggedReplies, script

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(420)]

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
ROUTER = TaggedReplies()


class Prometheus:
    """Debian's Prometheus server scraping `targets` every second, its data in `root`."""

    def __init__(self, root: Path, targets: dict[str, str]) -> None:
        if not Path(PROMETHEUS).exists():
            pytest.fail("prometheus is missing: run scripts/install.sh (Debian's prometheus package)", pytrace=False)
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [target]}]} for job, target in targets.items()
            ],
        }
        (root / "prometheus.yml").write_text(json.dumps(config))
        self.log = (root / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def get(self, path: str, **query: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}?{urllib.parse.urlencode(query)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:  # a bad query: Prometheus says why in the body
            return json.loads(error.read())

    def query(self, expr: str) -> Any:
        return self.get("/api/v1/query", query=expr)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        self.log.close()


@dataclass
class Running:
    stack: Stack
    gateway: GatewayServer
    user: str
    prometheus: Prometheus


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    root = tmp_path_factory.mktemp("monitoring")
    ports = {name: free_port() for name in ("journal", "caller", "capabilities", "router")}
    tokens = Tokens(root / "tokens.yaml")
    user = tokens.add("user", "/agents/**", userId="u-monitoring")
    with served_stack(
        root,
        tokens,
        ROUTER,
        partitions=2,
        metrics_port=ports["journal"],
        caller_metrics_port=ports["caller"],
        capabilities={**SMALL_HOST, "metrics_port": ports["capabilities"]},
        router={"metrics_port": ports["router"]},
    ) as served:
        targets = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
        targets["gateway"] = f"127.0.0.1:{served.gateway.port}"
        prometheus = Prometheus(root, targets)
        try:
            yield Running(served.stack, served.gateway, user, prometheus)
        finally:
            prometheus.close()


def test_every_dashboard_query_returns_series_and_every_alert_reads_scraped_metrics(running: Running) -> None:
    stack, gateway = running.stack, running.gateway
    tag = uuid.uuid4().hex[:8]
    ROUTER.on(tag, script("6 * 7"), Reply("It is 42.", usage=SMALL_USAGE))
    agent = stack.client.agents.create()
    body = {"type": CONTEXT_ADDED, "payload": {"role": "user", "content": f"{tag} compute"}}
    sent = gateway.request("POST", f"/v1/streams{agent.path}/events", body, token=running.user)
    assert sent.status in (200, 202), sent
    stack.produce_raw(b"not json", key=agent.path.encode())  # one dead letter

    def turn_done() -> bool:
        events = stack.client.streams.get(agent.path).events()
        runs = [e for e in events if e.type == SCRIPT_RUN_SETTLED]
        return bool(runs) and sum(e.type == LLM_REQUEST_SETTLED for e in events) >= 2

    wait_until(turn_done, 120, "the turn, its script run and the next turn")

    exported = exported_series()
    queries = dashboard_queries()
    alerts = [(rule["alert"], rule["expr"]) for rule in alert_rules()]
    # An alert's condition is rightly empty on a healthy stack: it must parse, and every metric it
    # reads must be scraped from some process.
    for name, expr in alerts:
        assert metric_names(expr) <= exported, (name, expr)
        queries += [(f"{name} reads {metric}", f"group({metric})") for metric in sorted(metric_names(expr))]
    for title, expr in queries:
        assert metric_names(expr) <= exported, (title, expr)

    def empty() -> list[str]:
        for name, expr in alerts:
            answer = running.prometheus.query(expr)
            assert answer["status"] == "success", (name, expr, answer)
        found = []
        for title, expr in queries:
            answer = running.prometheus.query(expr)
            assert answer["status"] == "success", (title, expr, answer)
            if not answer["data"]["result"]:
                found.append(f"{title}: {expr}")
        return found

    # Rates need two scrapes after a counter first moved; a second apart, so this settles quickly.
    deadline = time.monotonic() + 60
    left = empty()
    while left and time.monotonic() < deadline:
        time.sleep(1)
        left = empty()
    assert not left, "dashboard queries that return no series:\n" + "\n".join(left)
