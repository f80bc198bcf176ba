"""Integration: webhook -> integration stream -> router -> subscribed agents, all real.

The gateway (uvicorn over loopback), the journal worker and the router (`agentstream worker
router`, a Faust process) run against the local broker with their own topic prefix and app ids.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka.admin import AdminClient

from pipeline.router import decode_routes
from schemas.events import AGENT_CREATED, CONTEXT_ADDED
from schemas.gateway import GITHUB_WEBHOOK_RECEIVED
from schemas.routing import AGENT_SUBSCRIBED, AGENT_UNSUBSCRIBED
from tests.gateway_server import PULL_REQUEST_OPENED, GatewayServer, Tokens, github_headers
from tests.kafka_stack import BIN, BOOTSTRAP, Stack, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

GITHUB_SECRET = "router-test-secret"
SOURCE = "/integrations/github/7"


class RouterEnv:
    def __init__(
        self, stack: Stack, gateway: GatewayServer, platform: str, app_id: str, start_router: Callable[[], None]
    ) -> None:
        self.start_router = start_router
        self.stack = stack
        self.gateway = gateway
        self.platform = platform
        self.app_id = app_id

    def append(self, path: str, event_type: str, payload: dict[str, Any]) -> int:
        reply = self.gateway.request(
            "POST", f"/v1/streams{path}/events?wait=true", {"type": event_type, "payload": payload}, token=self.platform
        )
        assert reply.status == 200, reply
        return int(reply.json()["offset"])

    def create(self, *agents: str) -> None:
        """Only agents subscribe (behaviour §6.6): `agent/created` first."""
        for agent in agents:
            self.append(agent, AGENT_CREATED, {})

    def subscribers(self) -> set[str]:
        """The router table's current subscribers of SOURCE, read from its changelog topic."""
        latest = None
        for record in self.stack.read_topic(f"{self.app_id}-subscriptions-changelog"):
            if record.key() == SOURCE.encode():
                latest = record.value()
        return set(decode_routes(latest)) if latest else set()

    def webhook(self, delivery: str, body: dict[str, Any]) -> None:
        raw = orjson.dumps(body)
        headers = github_headers(GITHUB_SECRET, raw, "pull_request", delivery)
        reply = self.gateway.request("POST", "/v1/webhooks/github/7", raw=raw, headers=headers)
        assert reply.status == 202, reply

    def source_offset(self, delivery: str) -> int:
        def find() -> int | None:
            for event in self.stack.client.streams.get(SOURCE).events():
                if event.idempotencyKey == f"github/delivery/{delivery}":
                    return int(event.offset)
            return None

        return int(wait_until(find, 60, f"delivery {delivery} in {SOURCE}"))

    def routed(self, agent: str) -> list[Any]:
        return [
            e
            for e in self.stack.client.streams.get(agent).events()
            if e.type == CONTEXT_ADDED and (e.idempotencyKey or "").startswith("route/")
        ]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[RouterEnv]:
    stack = Stack(tmp_path / "data")
    stack.start_worker()
    app_id = f"agentstream-router-test-{uuid.uuid4().hex[:8]}"
    tokens = Tokens(tmp_path / "tokens.yaml")
    platform = tokens.add("platform", "/**")
    tokens.secret("github", "7", GITHUB_SECRET)
    routers: list[subprocess.Popen[bytes]] = []
    log = (tmp_path / "router.log").open("ab")

    def start_router() -> None:
        router_env = {**stack.env(), "AGENTSTREAM_ROUTER_APP_ID": app_id, "AGENTSTREAM_ROUTER_METRICS_PORT": "0"}
        command = [str(BIN / "agentstream"), "worker", "router"]
        routers.append(subprocess.Popen(command, env=router_env, stdout=log, stderr=subprocess.STDOUT))

    try:
        with GatewayServer(stack.settings, tokens.path) as gateway:
            gateway.wait_ready()
            yield RouterEnv(stack, gateway, platform, app_id, start_router)
    finally:
        for router in routers:
            router.terminate()
            try:
                router.wait(30)
            except subprocess.TimeoutExpired:
                router.kill()
                router.wait(10)
        log.close()
        stack.close()
        _delete_router_topics(app_id, stack.settings.topic_prefix)


def _delete_router_topics(app_id: str, prefix: str) -> None:
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP, "log_level": 3})
    names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(app_id) or prefix in t]
    if names:
        for future in admin.delete_topics(names, operation_timeout=10).values():
            with contextlib.suppress(Exception):
                future.result()


def test_every_subscribed_agent_gets_one_summary_with_the_ref_and_an_unsubscribed_agent_gets_nothing_after(
    env: RouterEnv,
) -> None:
    agents = [f"/agents/sub-{uuid.uuid4().hex[:8]}-{n}" for n in range(3)]
    first, second, bystander = agents
    env.start_router()
    policy = {"behaviour": "dont-trigger-request"}
    env.create(first, second)
    for agent in (first, second):
        env.append(
            agent,
            AGENT_SUBSCRIBED,
            {"source": SOURCE, "eventTypes": [GITHUB_WEBHOOK_RECEIVED], "llmRequestPolicy": policy},
        )
    env.append(bystander, CONTEXT_ADDED, {"role": "developer", "content": "not subscribed"})
    wait_until(lambda: env.subscribers() == {first, second}, 120, "the router to hold both subscriptions")

    # A signed pull_request delivery, redelivered: journaled once, routed once to each subscriber.
    delivery = str(uuid.uuid4())
    for _ in range(2):
        env.webhook(delivery, PULL_REQUEST_OPENED)
    offset = env.source_offset(delivery)
    for agent in (first, second):
        (item,) = wait_until(lambda agent=agent: env.routed(agent), 120, f"the summary in {agent}")
        assert item.idempotencyKey == f"route/{SOURCE}@{offset}"
        item_payload = item.payload
        assert item_payload.role == "developer"
        assert "octocat opened pull request #1347" in item_payload.content
        assert item_payload.actor.model_dump(exclude_none=True) == {
            "type": "github",
            "login": "octocat",
            "senderType": "User",
        }
        (ref,) = item_payload.refs
        assert ref.model_dump() == {
            "type": "event",
            "streamPath": SOURCE,
            "offset": offset,
            "eventType": GITHUB_WEBHOOK_RECEIVED,
        }
        assert item_payload.llmRequestPolicy.behaviour == "dont-trigger-request"
    assert env.routed(bystander) == []

    # The second agent unsubscribes; the next delivery reaches the first agent only.
    env.append(second, AGENT_UNSUBSCRIBED, {"source": SOURCE})
    wait_until(lambda: env.subscribers() == {first}, 120, "the router to drop the unsubscribed agent")
    later = str(uuid.uuid4())
    env.webhook(later, {**PULL_REQUEST_OPENED, "action": "reopened"})
    later_offset = env.source_offset(later)
    wait_until(lambda: len(env.routed(first)) == 2, 120, "the second summary in the subscribed agent")
    time.sleep(1)  # grace for a (wrong) item to the unsubscribed agent to land before looking
    assert [e.idempotencyKey for e in env.routed(first)] == [
        f"route/{SOURCE}@{offset}",
        f"route/{SOURCE}@{later_offset}",
    ]
    assert len(env.routed(second)) == 1  # the item from before it unsubscribed, nothing after
    assert env.routed(bystander) == []

    # Only subscription events were repartitioned by source (not every journal record).
    repartitioned = [
        orjson.loads(r.value())["type"] for r in env.stack.read_topic(f"{env.app_id}-subscriptions-repartition")
    ]
    assert sorted(repartitioned) == sorted([AGENT_SUBSCRIBED, AGENT_SUBSCRIBED, AGENT_UNSUBSCRIBED])


def test_a_router_started_after_the_subscription_and_the_event_still_routes_the_event_once(env: RouterEnv) -> None:
    """Whichever the router meets first on restart over a backlog, the subscription or the source
    event journaled after it, the subscriber gets the event once."""
    agent = f"/agents/late-{uuid.uuid4().hex[:8]}"
    env.create(agent)
    env.append(agent, AGENT_SUBSCRIBED, {"source": SOURCE})
    delivery = str(uuid.uuid4())
    env.webhook(delivery, PULL_REQUEST_OPENED)
    offset = env.source_offset(delivery)
    env.start_router()
    (item,) = wait_until(lambda: env.routed(agent), 120, "the summary routed after the router started")
    assert item.idempotencyKey == f"route/{SOURCE}@{offset}"
