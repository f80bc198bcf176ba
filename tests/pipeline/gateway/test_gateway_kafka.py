"""Integration: the HTTP gateway against the real local broker and a real journal worker.

Requests go over loopback HTTP to uvicorn (uvloop, httptools) serving the gateway; commands go
through Kafka to an `agentstream worker journal` process. Each stream path is used by one test
only, so tests share one stack.
"""

from __future__ import annotations

import http.client
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import yaml

from schemas.events import AGENT_PAUSED, CONTEXT_ADDED, LLM_REQUEST_SETTLED
from schemas.gateway import GITHUB_WEBHOOK_RECEIVED, SLACK_WEBHOOK_RECEIVED
from tests.gateway_server import (
    PULL_REQUEST_OPENED,
    GatewayServer,
    Tokens,
    github_headers,
    request,
    slack_headers,
)
from tests.kafka_stack import Stack, wait_until
from topics.headers import H_APPEND_ID

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

GITHUB_SECRET = "gh-webhook-secret"
SLACK_SECRET = "slack-signing-secret"


class Env:
    def __init__(self, stack: Stack, gateway: GatewayServer, tokens: Tokens) -> None:
        self.stack = stack
        self.gateway = gateway
        self.tokens = tokens
        self.user = tokens.add("user", "/agents/**", userId="u-7")
        self.integration = tokens.add("integration", "/agents/**", "/integrations/**")
        self.agent = tokens.add("agent", "/agents/**", agentPath="/agents/script-runner")
        self.platform = tokens.add("platform", "/**")
        self.narrow = tokens.add("user", "/agents/team-a/*")

    def post(self, path: str, body: Any, token: str | None, *, wait: bool = False, **kw: Any) -> Any:
        query = "?wait=true" if wait else ""
        return self.gateway.request("POST", f"/v1/streams{path}/events{query}", body, token=token, **kw)

    def events(self, path: str) -> list[Any]:
        return self.stack.client.streams.get(path).events()

    def records(self, topic: str, key: str) -> list[Any]:
        return [m for m in self.stack.read_topic(topic) if m.key() == key.encode()]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("gateway")
    stack = Stack(root / "data")
    stack.start_worker()
    tokens = Tokens(root / "tokens.yaml")
    tokens.secret("github", "42", GITHUB_SECRET)
    tokens.secret("slack", "T0001", SLACK_SECRET)
    settings = stack.settings.model_copy(update={"gateway_wait_timeout_s": 90.0})
    try:
        with GatewayServer(settings, tokens.path) as gateway:
            environment = Env(stack, gateway, tokens)
            gateway.wait_ready()
            yield environment
    finally:
        stack.close()


def user_item(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": CONTEXT_ADDED, "payload": {"role": "user", "content": text, **extra}}


def developer_item(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": CONTEXT_ADDED, "payload": {"role": "developer", "content": text, **extra}}


def agent_path() -> str:
    return f"/agents/{uuid.uuid4().hex[:12]}"


# --- appends and the append gate over HTTP ------------------------------------------------------


def test_an_append_answers_202_with_its_append_id_and_wait_answers_the_journaled_offset(env: Env) -> None:
    path = agent_path()
    accepted = env.post(path, user_item("first"), env.user)
    assert accepted.status == 202, accepted
    assert accepted.json()["streamPath"] == path and accepted.json()["appendId"]
    journaled = env.post(path, user_item("second"), env.user, wait=True)
    assert journaled.status == 200, journaled
    assert journaled.json() == {"streamPath": path, "offset": 2, "duplicate": False}


def test_wait_reports_a_duplicate_idempotency_key_and_a_conflicting_body_is_409(env: Env) -> None:
    path = agent_path()
    command = {**user_item("once"), "idempotencyKey": "k1"}
    first = env.post(path, command, env.user, wait=True)
    again = env.post(path, command, env.user, wait=True)
    assert first.json()["duplicate"] is False and again.json() == {**first.json(), "duplicate": True}
    conflict = env.post(path, {**user_item("other"), "idempotencyKey": "k1"}, env.user, wait=True)
    assert conflict.status == 409 and conflict.json()["error"] == "idempotency_conflict", conflict


def test_a_user_token_appends_user_items_with_the_actor_stamped_from_the_token(env: Env) -> None:
    path = agent_path()
    assert env.post(path, user_item("hi"), env.user, wait=True).status == 200
    assert env.post(path, {"type": AGENT_PAUSED, "payload": {"reason": "lunch"}}, env.user, wait=True).status == 200
    first = env.events(path)[0]
    assert first.payload.actor.model_dump(exclude_none=True) == {"type": "user", "origin": "web", "userId": "u-7"}


@pytest.mark.parametrize(
    ("field", "payload", "rule"),
    [
        ("an actor", {"role": "user", "actor": {"type": "user", "origin": "cli"}}, "user-actor-stamped"),
        ("a key", {"role": "user", "key": "slot"}, "user-no-key"),
        (
            "a compaction",
            {
                "role": "developer",
                "compaction": {"replacesHistoryThrough": 1},
                "llmRequestPolicy": {"behaviour": "dont-trigger-request"},
            },
            "user-no-compaction",
        ),
        ("an llmRequestOffset", {"role": "user", "llmRequestOffset": 3}, "user-no-llm-request-offset"),
        ("the system role", {"role": "system"}, "user-role"),
        ("the developer role", {"role": "developer"}, "user-role"),
    ],
)
def test_a_user_token_cannot_set_actor_key_compaction_llm_request_offset_or_other_roles(
    env: Env, field: str, payload: dict[str, Any], rule: str
) -> None:
    path = agent_path()
    reply = env.post(path, {"type": CONTEXT_ADDED, "payload": {"content": "x", **payload}}, env.user)
    assert reply.status == 403, (field, reply)
    assert reply.json()["error"] == "forbidden" and reply.json()["rule"] == rule
    assert env.records(env.stack.client.topics.appends, path) == []  # nothing produced


def test_an_integration_token_sends_raw_events_and_integration_items_but_no_other_roles_or_actors(env: Env) -> None:
    stream = f"/integrations/crm/{uuid.uuid4().hex[:8]}"
    raw = env.post(stream, {"type": "events.iterate.com/crm/ticket-opened", "payload": {"id": 7}}, env.integration)
    assert raw.status == 202, raw
    path = agent_path()
    item = developer_item("ticket 7 opened", actor={"type": "integration", "name": "crm"})
    assert env.post(path, item, env.integration, wait=True).status == 200
    refused = {
        "integration-role": {"type": CONTEXT_ADDED, "payload": {"role": "system", "content": "obey"}},
        "integration-actor": developer_item("x", actor={"type": "agent", "path": "/agents/boss"}),
        "integration-agent-types": {"type": AGENT_PAUSED, "payload": {}},
    }
    for rule, command in refused.items():
        reply = env.post(path, command, env.integration)
        assert reply.status == 403 and reply.json()["rule"] == rule, (rule, reply)
    assert len(env.records(env.stack.client.topics.appends, path)) == 1


def test_an_agent_token_sends_developer_items_stamped_with_its_agent_path(env: Env) -> None:
    path = agent_path()
    assert env.post(path, developer_item("build finished"), env.agent, wait=True).status == 200
    (event,) = env.events(path)
    assert event.payload.actor.model_dump() == {"type": "agent", "path": "/agents/script-runner"}
    reply = env.post(path, user_item("pretend to be a user"), env.agent)
    assert reply.status == 403 and reply.json()["rule"] == "agent-role"


def test_worker_only_commands_need_a_platform_token_and_go_to_the_internal_topic(env: Env) -> None:
    path = agent_path()
    settled = {
        "type": LLM_REQUEST_SETTLED,
        "payload": {"requestOffset": 1, "result": {"status": "failed", "errorMessage": "x"}},
    }
    for token in (env.user, env.integration, env.agent):
        assert env.post(path, settled, token).status == 403
    assert env.post(path, settled, env.platform).status == 202
    topics = env.stack.client.topics
    assert len(env.records(topics.internal_appends, path)) == 1
    assert env.records(topics.appends, path) == []


def test_a_token_outside_its_scope_is_403_and_unknown_or_missing_tokens_are_401(env: Env) -> None:
    inside = env.post("/agents/team-a/bot", user_item("hi"), env.narrow)
    assert inside.status == 202, inside
    outside = env.post("/agents/team-b/bot", user_item("hi"), env.narrow)
    assert outside.status == 403 and outside.json()["rule"] == "scope"
    assert env.post(agent_path(), user_item("hi"), "ast_not-a-token").status == 401
    missing = env.post(agent_path(), user_item("hi"), None)
    assert missing.status == 401 and missing.headers["www-authenticate"] == "Bearer"


# --- bad input ------------------------------------------------------------------------------------


def test_malformed_json_is_400_naming_the_problem(env: Env) -> None:
    reply = env.post(agent_path(), None, env.user, raw=b'{"type": ')
    assert reply.status == 400 and reply.json()["error"] == "invalid_json", reply
    shape = env.post(agent_path(), {"type": CONTEXT_ADDED}, env.user)
    assert shape.status == 400 and "payload" in shape.json()["detail"], shape
    item = env.post(agent_path(), {"type": CONTEXT_ADDED, "payload": {"role": "user"}}, env.user)
    assert item.status == 400 and "content" in item.json()["detail"], item
    bad_path = env.gateway.request("POST", "/v1/streams/agents/a..b%20c/events", user_item("x"), token=env.user)
    assert bad_path.status == 400 and "stream path" in bad_path.json()["detail"], bad_path


def test_a_body_over_the_size_limit_is_413_and_an_event_over_the_event_limit_too(env: Env) -> None:
    limit = env.gateway.settings.gateway_max_body_bytes
    huge = user_item("x" * (limit + 10))
    reply = env.post(agent_path(), huge, env.user)
    assert reply.status == 413 and reply.json()["error"] == "too_large", reply
    event_limit = env.gateway.settings.max_event_bytes
    big_event = user_item("y" * (event_limit + 1))
    assert len(orjson.dumps(big_event)) < limit
    reply = env.post(agent_path(), big_event, env.user)
    assert reply.status == 413 and "over maxEventBytes" in reply.json()["detail"], reply


def test_an_ndjson_batch_journals_its_good_lines_and_answers_each_bad_line_with_its_error(env: Env) -> None:
    path = agent_path()
    lines = [
        orjson.dumps({"streamPath": path, **user_item("one")}),
        b'{"streamPath": "' + path.encode() + b'", "type": ',  # malformed JSON
        orjson.dumps({"streamPath": path, **user_item("two")}),
        orjson.dumps({"streamPath": path, "type": CONTEXT_ADDED, "payload": {"role": "system", "content": "x"}}),
        orjson.dumps({"streamPath": "no-slash", **user_item("three")}),
        b"",
        orjson.dumps({"streamPath": path, **user_item("four")}),
    ]
    reply = env.gateway.request(
        "POST",
        "/v1/streams/-/events:batch?wait=true",
        raw=b"\n".join(lines),
        token=env.user,
        headers={"Content-Type": "application/x-ndjson"},
    )
    assert reply.status == 200, reply
    body = reply.json()
    assert body["accepted"] == 3 and body["failed"] == 3
    by_line = {result["line"]: result for result in body["results"]}
    assert sorted(by_line) == [1, 2, 3, 4, 5, 7]  # one result per non-blank line, in order
    assert [r["line"] for r in body["results"]] == [1, 2, 3, 4, 5, 7]
    assert [by_line[n]["offset"] for n in (1, 3, 7)] == [1, 2, 3]
    assert by_line[2]["error"] == "invalid_json" and by_line[2]["status"] == 400
    assert by_line[4]["rule"] == "user-role" and by_line[4]["status"] == 403
    assert by_line[5]["error"] == "invalid_command" and "stream path" in by_line[5]["detail"]
    assert [e.payload.content for e in env.events(path)] == ["one", "two", "four"]


def test_a_batch_over_ten_thousand_lines_is_413(env: Env) -> None:
    line = orjson.dumps({"streamPath": "/agents/x", **user_item("x")})
    reply = env.gateway.request("POST", "/v1/streams/-/events:batch", raw=b"\n".join([line] * 10_001), token=env.user)
    assert reply.status == 413 and "10000" in reply.json()["detail"], reply


# --- webhooks -------------------------------------------------------------------------------------


def test_a_signed_github_webhook_reaches_the_integration_stream_once_even_when_redelivered(env: Env) -> None:
    body = orjson.dumps(PULL_REQUEST_OPENED)
    delivery = str(uuid.uuid4())
    headers = github_headers(GITHUB_SECRET, body, "pull_request", delivery)
    for _ in range(3):  # GitHub's "Redeliver" sends the same delivery id
        reply = env.gateway.request("POST", "/v1/webhooks/github/42", raw=body, headers=headers)
        assert reply.status == 202, reply
        assert reply.json()["streamPath"] == "/integrations/github/42"
    events = wait_until(
        lambda: [e for e in env.events("/integrations/github/42") if e.idempotencyKey == f"github/delivery/{delivery}"],
        60,
        "the webhook event",
    )
    time.sleep(1)  # let any (wrong) second copy land before counting
    events = [e for e in env.events("/integrations/github/42") if e.idempotencyKey == f"github/delivery/{delivery}"]
    assert len(events) == 1
    assert events[0].type == GITHUB_WEBHOOK_RECEIVED
    assert events[0].payload == {"event": "pull_request", "delivery": delivery, "payload": PULL_REQUEST_OPENED}


def test_a_github_webhook_with_a_bad_signature_is_401_and_nothing_is_produced(env: Env) -> None:
    body = orjson.dumps(PULL_REQUEST_OPENED)
    headers = github_headers("the-wrong-secret", body, "pull_request", str(uuid.uuid4()))
    reply = env.gateway.request("POST", "/v1/webhooks/github/4242", raw=body, headers=headers)
    assert reply.status == 401 and reply.json()["error"] == "bad_signature", reply
    unsigned = {k: v for k, v in headers.items() if k != "X-Hub-Signature-256"}
    assert env.gateway.request("POST", "/v1/webhooks/github/42", raw=body, headers=unsigned).status == 401
    wrong = github_headers("the-wrong-secret", body, "pull_request", str(uuid.uuid4()))
    assert env.gateway.request("POST", "/v1/webhooks/github/42", raw=body, headers=wrong).status == 401
    assert env.records(env.stack.client.topics.appends, "/integrations/github/4242") == []
    for record in env.records(env.stack.client.topics.appends, "/integrations/github/42"):
        delivery = orjson.loads(record.value())["payload"]["delivery"]
        assert delivery not in (headers["X-GitHub-Delivery"], wrong["X-GitHub-Delivery"])


def test_slack_answers_url_verification_and_appends_signed_events_once_per_event_id(env: Env) -> None:
    challenge = orjson.dumps({"type": "url_verification", "challenge": "c-123", "token": "legacy"})
    reply = env.gateway.request(
        "POST", "/v1/webhooks/slack/T0001", raw=challenge, headers=slack_headers(SLACK_SECRET, challenge)
    )
    assert reply.status == 200 and reply.json() == {"challenge": "c-123"}, reply
    event_id = f"Ev{uuid.uuid4().hex[:10]}"
    callback = {
        "type": "event_callback",
        "team_id": "T0001",
        "event_id": event_id,
        "event": {"type": "message", "user": "U123", "text": "deploy is red", "channel": "C1", "ts": "1.2"},
    }
    body = orjson.dumps(callback)
    for _ in range(2):  # Slack retries with the same event_id
        sent = env.gateway.request(
            "POST", "/v1/webhooks/slack/T0001", raw=body, headers=slack_headers(SLACK_SECRET, body)
        )
        assert sent.status == 200, sent
    stale = slack_headers(SLACK_SECRET, body, timestamp=int(time.time()) - 6 * 60)
    assert env.gateway.request("POST", "/v1/webhooks/slack/T0001", raw=body, headers=stale).status == 401
    events = wait_until(
        lambda: [e for e in env.events("/integrations/slack/T0001") if e.idempotencyKey == f"slack/event/{event_id}"],
        60,
        "the slack event",
    )
    assert len(events) == 1 and events[0].type == SLACK_WEBHOOK_RECEIVED
    assert events[0].payload == {"payload": callback}


# --- operations -----------------------------------------------------------------------------------


def test_docs_health_and_metrics_are_served_and_metrics_never_carry_stream_paths(env: Env) -> None:
    assert env.gateway.request("GET", "/healthz").json() == {"status": "ok"}
    assert env.gateway.request("GET", "/readyz").status == 200
    assert env.gateway.request("GET", "/docs").status == 200
    spec = env.gateway.request("GET", "/openapi.json").json()
    assert {"/v1/streams/{path}/events", "/v1/streams/-/events:batch", "/v1/webhooks/github/{install}"} <= set(
        spec["paths"]
    )
    secret_path = f"/agents/metrics-{uuid.uuid4().hex[:8]}"
    env.post(secret_path, user_item("hi"), env.user)
    env.post(secret_path, {"type": CONTEXT_ADDED, "payload": {"role": "system", "content": "x"}}, env.user)
    text = env.gateway.request("GET", "/metrics").body.decode()
    assert 'agentstream_gateway_requests_total{route="/v1/streams/{path}/events",status="202"}' in text
    assert 'agentstream_gateway_refusals_total{rule="user-role"}' in text
    assert "agentstream_gateway_request_seconds_bucket" in text
    assert "agentstream_gateway_request_bytes_total" in text
    assert secret_path.split("/")[-1] not in text
    missing = env.gateway.request("GET", "/v1/nothing")
    assert missing.status == 404 and missing.json()["error"] == "not_found"


def test_a_bounded_load_every_202_is_journaled_exactly_once(env: Env) -> None:
    """20 concurrent keep-alive clients x 100 requests over loopback."""
    clients, per_client = 20, 100
    paths = [f"/agents/load-{uuid.uuid4().hex[:8]}-{i}" for i in range(clients)]
    accepted: list[list[str]] = [[] for _ in range(clients)]
    failures: list[Any] = []

    def run(index: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", env.gateway.port, timeout=120)
        try:
            for n in range(per_client):
                reply = request(
                    env.gateway.port,
                    "POST",
                    f"/v1/streams{paths[index]}/events",
                    user_item(f"message {n}"),
                    token=env.user,
                    connection=connection,
                )
                if reply.status == 202:
                    accepted[index].append(reply.json()["appendId"])
                else:
                    failures.append(reply)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)
    assert not failures, failures[:3]
    sent = {append_id for ids in accepted for append_id in ids}
    assert len(sent) == clients * per_client

    def journaled_ids() -> list[str]:
        ids = []
        for record in env.stack.read_topic(env.stack.client.topics.journal):
            headers = dict(record.headers() or ())
            if record.key().decode() in paths:
                ids.append(headers[H_APPEND_ID].decode())
        return ids

    ids = wait_until(lambda: (found := journaled_ids()) and len(found) >= len(sent) and found, 120, "the load")
    assert sorted(ids) == sorted(sent)  # every 202 journaled, none twice
    for path in paths:
        offsets = [e.offset for e in env.events(path)]
        assert offsets == list(range(1, per_client + 1))


# --- Kafka unreachable ----------------------------------------------------------------------------


def test_a_token_from_token_create_works_once_its_printed_entry_is_in_the_tokens_file(env: Env) -> None:
    """`agentstream token create` prints the token once and the entry; the gateway re-reads the file."""
    import subprocess

    from tests.kafka_stack import BIN

    result = subprocess.run(
        [
            str(BIN / "agentstream"),
            "token",
            "create",
            "--tier",
            "agent",
            "--scope",
            "/agents/**",
            "--agent-path",
            "/agents/minted",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = result.stdout.splitlines()
    token = lines[0].rsplit(" ", 1)[-1]
    entry = yaml.safe_load("\n".join(line[2:] for line in lines[2:]))[0]
    assert entry["sha256"] != token and token not in result.stdout.split("\n", 1)[1]
    path = agent_path()
    assert env.post(path, developer_item("before"), token).status == 401
    env.tokens.entries.append(entry)
    env.tokens.write()
    reply = wait_until(
        lambda: (r := env.post(path, developer_item("after"), token, wait=True)).status == 200 and r, 30, "the reload"
    )
    assert reply.json()["offset"] == 1
    (event,) = env.events(path)
    assert event.payload.actor.model_dump() == {"type": "agent", "path": "/agents/minted"}
