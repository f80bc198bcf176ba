"""One turn's trace, read back from a real Jaeger (docs/behaviour.md §8): the journal worker, the LLM
caller and the capability host run as real processes exporting to Jaeger v1.75.0 over OTLP/HTTP,
the gateway runs in this process with tracing on, and the scripted model answers at the HTTP edge
with code that the capability host runs. A user message goes in through the gateway with an HTTP
`traceparent` of the test's own, and the whole turn must come back from Jaeger's query API as one
trace under it: the span names, the tree, the parent links across processes and the GenAI
attributes of the provider call. A routed event (the router, exporting too) starts a trace of its
own linked to its source's, and the console's timeline links a request's trace.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipeline import tracing
from pipeline.router import decode_routes
from processors.traceparent import encode
from schemas.capabilities import SCRIPT_RUN_REQUESTED, SCRIPT_RUN_SETTLED, SCRIPT_RUN_STARTED
from schemas.events import CONTEXT_ADDED, LLM_REQUEST_REQUESTED, LLM_REQUEST_SETTLED, TOKEN_USAGE_REPORTED
from schemas.routing import AGENT_SUBSCRIBED
from tests.gateway_server import GatewayServer, Tokens
from tests.kafka_stack import Stack, wait_until
from tests.support.jaeger import Jaeger
from tests.support.scripted_llm import Reply
from tests.support.scripted_stack import MODEL, SMALL_HOST, served_stack
from tests.support.tagged_model import SMALL_USAGE, TaggedReplies, script

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(420)]

ROUTER = TaggedReplies()


class TracedStack(Stack):
    """A test stack whose worker processes export their spans to `otlp_endpoint`."""

    otlp_endpoint = ""

    def env(self) -> dict[str, str]:
        return {
            **super().env(),
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.otlp_endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within moments, not every 5 s
        }


@dataclass
class Env:
    stack: Stack  # a TracedStack
    gateway: GatewayServer
    user: str
    platform: str
    jaeger: Jaeger


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("traces")
    jaeger = Jaeger(root)
    # This process's spans (the gateway's) go to the same Jaeger: the exporter reads os.environ.
    saved = {name: os.environ.get(name) for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_BSP_SCHEDULE_DELAY")}
    os.environ.update({"OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"})
    try:
        assert tracing.configure("gateway")
        TracedStack.otlp_endpoint = jaeger.otlp_endpoint
        tokens = Tokens(root / "tokens.yaml")
        user = tokens.add("user", "/agents/**", userId="u-traces")
        platform = tokens.add("platform", "/**")
        with served_stack(
            root, tokens, ROUTER, stack_type=TracedStack, partitions=2, capabilities=SMALL_HOST
        ) as served:
            yield Env(served.stack, served.gateway, user, platform, jaeger)
    finally:
        tracing.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        jaeger.close()


# --- reading a trace -----------------------------------------------------------------------------


@dataclass
class Span:
    id: str
    name: str
    service: str
    parent: str | None
    tags: dict[str, Any]
    events: list[str]


def spans_of(trace: dict[str, Any]) -> dict[str, Span]:
    services = {key: process["serviceName"] for key, process in trace["processes"].items()}
    found = {}
    for raw in trace["spans"]:
        parents = [r["spanID"] for r in raw.get("references") or () if r["refType"] == "CHILD_OF"]
        found[raw["spanID"]] = Span(
            raw["spanID"],
            raw["operationName"],
            services[raw["processID"]],
            parents[0] if parents else None,
            {tag["key"]: tag["value"] for tag in raw.get("tags") or ()},
            [field["value"] for log in raw.get("logs") or () for field in log["fields"] if field["key"] == "event"],
        )
    return found


def journal_span(spans: dict[str, Span], event_type: str) -> Span:
    (found,) = [
        s
        for s in spans.values()
        if s.name == "agentstream.journal" and s.tags.get("agentstream.event.type") == event_type
    ]
    return found


# --- the turn ------------------------------------------------------------------------------------


def test_8_one_turn_is_one_trace_across_gateway_journal_caller_and_capability_host(env: Env) -> None:
    tag = uuid.uuid4().hex[:8]
    ROUTER.on(tag, script("6 * 7"), Reply("It is 42.", usage=SMALL_USAGE))
    agent = env.stack.client.agents.create()

    trace_id, root_span = random.getrandbits(128), random.getrandbits(64)
    parent = encode(trace_id, root_span, 1).decode()
    body = {"type": CONTEXT_ADDED, "payload": {"role": "user", "content": f"{tag} compute"}}
    sent = env.gateway.request(
        "POST", f"/v1/streams{agent.path}/events?wait=true", body, token=env.user, headers={"traceparent": parent}
    )
    assert sent.status == 200, sent
    message = sent.json()["offset"]

    def done() -> bool:
        events = env.stack.client.streams.get(agent.path).events()
        return (
            any(e.type == SCRIPT_RUN_SETTLED for e in events)
            and sum(e.type == LLM_REQUEST_SETTLED for e in events) >= 2
        )

    wait_until(done, 120, "the answer, its script run and the turn after it")

    wanted = {"agentstream.append", "agentstream.schedule", "chat scripted", "agentstream.script"}

    def complete() -> dict[str, Span] | None:
        trace = env.jaeger.trace(f"{trace_id:032x}")
        if trace is None:
            return None
        spans = spans_of(trace)
        names = {s.name for s in spans.values()}
        types = {s.tags.get("agentstream.event.type") for s in spans.values()}
        needed = {SCRIPT_RUN_SETTLED, LLM_REQUEST_SETTLED, TOKEN_USAGE_REPORTED, SCRIPT_RUN_STARTED}
        # Each process exports its own spans in batches: a child may reach Jaeger before its parent.
        parents_in = all(s.parent in spans or s.parent == f"{root_span:016x}" for s in spans.values())
        return spans if wanted <= names and needed <= types and parents_in else None

    spans = wait_until(complete, 60, "the whole turn in Jaeger")

    # The HTTP request's traceparent is continued: the gateway's append span is its child.
    (append,) = [s for s in spans.values() if s.name == "agentstream.append"]
    assert append.parent == f"{root_span:016x}" and append.service == "agentstream-gateway"
    assert append.tags["agentstream.stream.path"] == agent.path and append.tags["agentstream.door"] == "gateway"

    def parent_of(span: Span) -> Span:
        assert span.parent in spans, f"{span.name} ({span.service}) has no parent in the trace"
        return spans[span.parent]

    # append (gateway) → journal (the message) → schedule → journal (the request)
    message_span = next(
        s
        for s in spans.values()
        if s.name == "agentstream.journal" and s.tags.get("agentstream.journal.offset") == message
    )
    assert parent_of(message_span) is append and message_span.service == "agentstream-journal"
    assert message_span.tags["agentstream.outcome"] == "journaled"
    assert message_span.tags["agentstream.stream.path"] == agent.path
    schedules = [s for s in spans.values() if s.name == "agentstream.schedule"]
    first_schedule = next(s for s in schedules if parent_of(s) is message_span)
    assert first_schedule.tags["agentstream.schedule.reason"] == "llm-request-requested: external trigger"
    assert first_schedule.tags["agentstream.trigger.offset"] == message
    requests = [s for s in spans.values() if s.tags.get("agentstream.event.type") == LLM_REQUEST_REQUESTED]
    request = next(s for s in requests if parent_of(s) is first_schedule)

    # → chat <model> in the caller, with the GenAI attributes
    chats = [s for s in spans.values() if s.name == "chat scripted"]
    chat = next(s for s in chats if parent_of(s) is request)
    assert chat.service == "agentstream-caller"
    assert chat.tags["gen_ai.operation.name"] == "chat" and chat.tags["gen_ai.request.model"] == MODEL
    assert (chat.tags["gen_ai.usage.input_tokens"], chat.tags["gen_ai.usage.output_tokens"]) == SMALL_USAGE
    assert json.loads(chat.tags["gen_ai.response.finish_reasons"]) == ["stop"]
    assert chat.tags["span.kind"] == "client" and "gen_ai.first_token" in chat.events

    # → the caller's outcomes journaled, children of the call
    for event_type in (LLM_REQUEST_SETTLED, TOKEN_USAGE_REPORTED):
        outcome = next(
            s for s in spans.values() if s.tags.get("agentstream.event.type") == event_type and s.parent == chat.id
        )
        assert outcome.service == "agentstream-journal"
    answer = next(
        s for s in spans.values() if s.parent == chat.id and s.tags.get("agentstream.event.type") == CONTEXT_ADDED
    )

    # → the run request (a follow-up of the answer) → the script in the capability host → its events
    run_request = journal_span(spans, SCRIPT_RUN_REQUESTED)
    assert parent_of(run_request) is answer
    (run,) = [s for s in spans.values() if s.name == "agentstream.script"]
    assert parent_of(run) is run_request and run.service == "agentstream-capabilities"
    assert run.tags["agentstream.script.execution_id"] == f"agent-output:{answer.tags['agentstream.journal.offset']}"
    for event_type in (SCRIPT_RUN_STARTED, SCRIPT_RUN_SETTLED):
        assert parent_of(journal_span(spans, event_type)) is run

    # Every span of the turn is in this one trace, and each parent link that crosses a process
    # joins the processes the record travelled between.
    crossings = {(parent_of(s).service, s.service) for s in spans.values() if s.parent in spans}
    assert {
        ("agentstream-gateway", "agentstream-journal"),
        ("agentstream-journal", "agentstream-caller"),
        ("agentstream-caller", "agentstream-journal"),
        ("agentstream-journal", "agentstream-capabilities"),
        ("agentstream-capabilities", "agentstream-journal"),
    } <= crossings
    assert {s.service for s in spans.values()} == {
        "agentstream-gateway",
        "agentstream-journal",
        "agentstream-caller",
        "agentstream-capabilities",
    }


def test_8_a_routed_event_starts_a_trace_of_its_own_linked_to_its_sources(env: Env) -> None:
    """The router's `agentstream.route` span starts the routed command's trace and links to the
    trace of the source event it routes; the subscriber's journal span is its child."""
    env.stack.start_router()  # TracedStack: it exports too
    source = f"/integrations/traces/{uuid.uuid4().hex[:8]}"
    subscriber = env.stack.client.agents.create()
    # Its birth must be journaled before the gateway's subscribe, which another producer sends.
    birth = env.stack.client.streams.get(subscriber.path)
    wait_until(lambda: len(birth.events()) >= 2, 60, "the subscriber's birth journaled")

    def append(path: str, event_type: str, payload: dict[str, Any], traceparent: str | None = None) -> int:
        headers = {"traceparent": traceparent} if traceparent else None
        body = {"type": event_type, "payload": payload}
        reply = env.gateway.request(
            "POST", f"/v1/streams{path}/events?wait=true", body, token=env.platform, headers=headers
        )
        assert reply.status == 200, reply
        return int(reply.json()["offset"])

    append(
        subscriber.path, AGENT_SUBSCRIBED, {"source": source, "llmRequestPolicy": {"behaviour": "dont-trigger-request"}}
    )

    def subscribed() -> bool:
        latest = None
        for record in env.stack.read_topic(f"{env.stack.router_app_id}-subscriptions-changelog"):
            if record.key() == source.encode():
                latest = record.value()
        return bool(latest) and subscriber.path in decode_routes(latest)

    wait_until(subscribed, 120, "the router to hold the subscription")
    source_trace = random.getrandbits(128)
    append(source, "test.traces/ping", {"n": 1}, encode(source_trace, random.getrandbits(64), 1).decode())

    def routed() -> bool:
        events = env.stack.client.streams.get(subscriber.path).events()
        return any(e.type == CONTEXT_ADDED and (e.idempotencyKey or "").startswith("route/") for e in events)

    wait_until(routed, 120, "the routed item in the subscriber")

    def route_trace() -> tuple[Span, dict[str, Span]] | None:
        found = env.jaeger.get("/api/traces?service=agentstream-router&lookback=1h&limit=100")
        for trace in (found or {}).get("data") or ():
            for raw in trace["spans"]:
                links = [r for r in raw.get("references") or () if r["refType"] == "FOLLOWS_FROM"]
                if raw["operationName"] == "agentstream.route" and any(
                    r["traceID"] == f"{source_trace:032x}" for r in links
                ):
                    spans = spans_of(trace)
                    children = [s for s in spans.values() if s.parent == raw["spanID"]]
                    if children:  # the subscriber's journal span arrived too
                        return spans[raw["spanID"]], spans
        return None

    route, spans = wait_until(route_trace, 60, "the route span linked to the source's trace")
    assert route.service == "agentstream-router" and route.parent is None  # a trace of its own
    assert route.tags["agentstream.stream.path"] == source and route.tags["agentstream.routed"] == 1
    (journaled,) = [s for s in spans.values() if s.parent == route.id]
    assert journaled.name == "agentstream.journal" and journaled.service == "agentstream-journal"
    assert journaled.tags["agentstream.stream.path"] == subscriber.path
    assert journaled.tags["agentstream.event.type"] == CONTEXT_ADDED


def test_8_the_console_timeline_links_the_trace_in_jaeger(env: Env, tmp_path: Path) -> None:
    """With AGENTSTREAM_JAEGER_UI_URL set, a request's page links to its trace (the traceparent of
    the request's journal record names it)."""
    from urllib.parse import urlencode

    from tests.gateway_server import request as http

    settings = env.stack.settings.model_copy(update={"jaeger_ui_url": env.jaeger.ui_url})
    tokens = Tokens(tmp_path / "tokens.yaml")
    user = tokens.add("user", "/agents/**", userId="u-console")
    agent = env.stack.client.agents.create()
    trace_id = random.getrandbits(128)
    with GatewayServer(settings, tokens.path) as gateway:
        gateway.wait_ready()
        body = {"type": CONTEXT_ADDED, "payload": {"role": "user", "content": "link me"}}
        parent = encode(trace_id, random.getrandbits(64), 1).decode()
        sent = gateway.request(
            "POST", f"/v1/streams{agent.path}/events?wait=true", body, token=user, headers={"traceparent": parent}
        )
        assert sent.status == 200, sent

        def request_offset() -> int | None:
            events = env.stack.client.streams.get(agent.path).events()
            return next((e.offset for e in events if e.type == LLM_REQUEST_REQUESTED), None)

        offset = wait_until(request_offset, 60, "the request")
        form = urlencode({"token": user}).encode()
        login = http(
            gateway.port,
            "POST",
            "/console/login",
            raw=form,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        cookie = login.headers["set-cookie"].split(";", 1)[0]
        page_path = "/console/agent/request?" + urlencode({"path": agent.path, "offset": offset})

        def page() -> str | None:
            answer = http(gateway.port, "GET", page_path, headers={"Cookie": cookie})
            return answer.body.decode() if answer.status == 200 and 'id="trace-link"' in answer.body.decode() else None

        html = wait_until(page, 60, "the request page with its timeline")
    assert f'href="{env.jaeger.ui_url}/trace/{trace_id:032x}"' in html
