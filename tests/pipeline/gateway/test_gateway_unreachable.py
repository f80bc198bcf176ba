"""The HTTP gateway when Kafka is unreachable (docs/behaviour.md §7.1: 503 when Kafka is
unreachable), without a broker: the gateway points at a port where nothing listens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from pipeline.settings import Settings
from schemas.events import CONTEXT_ADDED
from tests.gateway_server import PULL_REQUEST_OPENED, GatewayServer, Tokens, github_headers

GITHUB_SECRET = "gh-webhook-secret"


def user_item(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": CONTEXT_ADDED, "payload": {"role": "user", "content": text, **extra}}


def test_kafka_unreachable_answers_503_on_the_write_path_and_on_readyz(tmp_path: Path) -> None:
    """A gateway pointed at a port where nothing listens (the shared broker is never stopped)."""
    import socket

    with socket.socket() as probe:  # a free port, closed again: nothing listens there
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    tokens = Tokens(tmp_path / "tokens.yaml")
    token = tokens.add("user", "/agents/**")
    tokens.secret("github", "42", GITHUB_SECRET)
    settings = Settings.from_env({}, bootstrap_servers=f"127.0.0.1:{dead}", topic_prefix="unreachable-")
    with GatewayServer(settings, tokens.path) as gateway:
        ready = gateway.request("GET", "/readyz")
        assert ready.status == 503 and ready.json()["status"] == "unavailable", ready
        assert gateway.request("GET", "/healthz").status == 200
        reply = gateway.request("POST", "/v1/streams/agents/a1/events", user_item("hi"), token=token)
        assert reply.status == 503 and reply.json()["error"] == "kafka_unavailable", reply
        body = orjson.dumps(PULL_REQUEST_OPENED)
        hook = gateway.request(
            "POST", "/v1/webhooks/github/42", raw=body, headers=github_headers(GITHUB_SECRET, body, "ping", "d-1")
        )
        assert hook.status == 503, hook
        # The gate still answers first: a refused command is 403 whatever Kafka's state.
        refused = gateway.request(
            "POST",
            "/v1/streams/agents/a1/events",
            {"type": CONTEXT_ADDED, "payload": {"role": "system", "content": "x"}},
            token=token,
        )
        assert refused.status == 403
