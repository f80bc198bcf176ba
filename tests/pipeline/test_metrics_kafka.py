"""Prometheus metrics: scrape /metrics of both workers after a real turn and check the counters moved."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from schemas.events import CONTEXT_ADDED, TOKEN_USAGE_REPORTED
from tests.kafka_stack import Stack, wait_until
from tests.support.ports import free_port
from tests.support.scripted_llm import Reply, ScriptedLLM

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def lags(samples: dict) -> dict[tuple[str, str], float]:
    """agentstream_consumer_lag summed per (group, topic)."""
    found: dict[tuple[str, str], float] = {}
    for (name, labels), sample in samples.items():
        if name == "agentstream_consumer_lag":
            key = (dict(labels)["group"], dict(labels)["topic"])
            found[key] = found.get(key, 0.0) + sample
    return found


def test_counters_move_after_a_turn(tmp_path: Path) -> None:
    journal_port, caller_port = free_port(), free_port()
    with ScriptedLLM() as llm:
        llm.script(Reply("hello back", usage=(120, 7)))
        stack = Stack(
            tmp_path / "data",
            partitions=2,
            metrics_port=journal_port,
            caller_metrics_port=caller_port,
            openai_base_url=llm.base_url,
            openai_api_key="test",
            llm_transport="openai-compatible",
            llm_model="scripted",
        )
        try:
            stack.start_worker()
            stack.start_caller()
            agent = stack.client.agents.create()
            agent.append({"type": CONTEXT_ADDED, "payload": {"role": "user", "content": "hi"}}).wait(timeout=120)
            wait_until(
                lambda: any(e.type == TOKEN_USAGE_REPORTED for e in agent.stream.events()),
                timeout=120,
                what="the turn to finish",
            )
            # Bad input, to see the DLQ counter move.
            stack.produce_raw(b"not json", key=agent.path.encode())
            samples = wait_until(
                lambda: (
                    (s := scrape(journal_port))
                    and value(s, "agentstream_tokens_total", kind="input") >= 120
                    and value(s, "agentstream_dlq_records_total", reason="not_a_command") >= 1
                    and s
                ),
                timeout=60,
                what="journal worker metrics",
            )
            assert value(samples, "agentstream_events_journaled_total", type="context-added") >= 3
            assert value(samples, "agentstream_events_journaled_total", type="llm-request-requested") == 1
            assert value(samples, "agentstream_events_journaled_total", type="llm-request-settled") == 1
            assert value(samples, "agentstream_llm_requests_opened_total") == 1
            assert value(samples, "agentstream_llm_requests_settled_total", status="succeeded") == 1
            assert value(samples, "agentstream_tokens_total", kind="output") == 7
            assert value(samples, "agentstream_open_requests") == 0
            assert value(samples, "agentstream_render_seconds_count") == 1
            # One command in 16 is timed, the first one too.
            assert value(samples, "agentstream_fold_seconds_count") >= 1
            caller = scrape(caller_port)
            assert value(caller, "agentstream_provider_request_seconds_count", outcome="succeeded") == 1
            # Each member reports its consumer group's lag per partition: the journal worker on
            # agent-appends, the caller on llm-requests (from its first unfinished record).
            names = stack.client.topics
            journal_group, caller_group = stack.settings.app_id, stack.settings.caller_group
            wait_until(
                lambda: lags(scrape(journal_port)) == {(journal_group, names.appends): 0.0},
                timeout=30,
                what="the journal worker's lag on agent-appends, all handled",
            )
            wait_until(
                lambda: lags(scrape(caller_port)) == {(caller_group, names.llm_requests): 0.0},
                timeout=30,
                what="the caller's lag on llm-requests, all handled",
            )
        finally:
            stack.close()
