"""Authority goes with the work (behaviour §6.6-§6.8), on the real stack: one regression test per
finding of the second security probe that concerned what lies behind the gateway's doors.

The journal worker, LLM caller, capability host and router run as real processes on the local
broker; the gateway serves tokens of every tier; a scripted OpenAI-compatible server plays the
model, answering by tag (tests/support/tagged_model.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from pipeline.client import AppendRejected
from processors.reducer import fold_all
from processors.scheduler import breaker_reason
from processors.state import AgentState
from schemas.capabilities import SCRIPT_RUN_SETTLED
from schemas.events import (
    AGENT_CONFIGURED,
    AGENT_CREATED,
    AGENT_PAUSED,
    CONTEXT_ADDED,
    LLM_REQUEST_REQUESTED,
)
from schemas.routing import AGENT_SUBSCRIBED
from tests.gateway_server import GatewayServer, Tokens
from tests.kafka_stack import Stack, wait_until
from tests.support.scripted_stack import birth, served_stack
from tests.support.tagged_model import TaggedReplies, script
from topics.headers import H_REASON

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(400)]

REPLIES = TaggedReplies()


class Env:
    def __init__(self, stack: Stack, gateway: GatewayServer, tokens: dict[str, str]) -> None:
        self.stack = stack
        self.gateway = gateway
        self.tokens = tokens

    def birth(self, path: str, *config: dict[str, Any]) -> None:
        """An agent at `path`: the same two events `agents.create()` appends, then its configuration."""
        birth(self.stack, path)
        agent = self.stack.client.agents.get(path)
        for patch in config:
            agent.append({"type": AGENT_CONFIGURED, "payload": {"config": patch}}).wait(timeout=60)

    def post(self, token: str, path: str, command: dict[str, Any], wait: bool = True) -> Any:
        query = "?wait=true" if wait else ""
        return self.gateway.request("POST", f"/v1/streams{path}/events{query}", command, token=self.tokens[token])

    def events(self, path: str) -> list[Any]:
        return self.stack.client.streams.get(path).events()

    def until(self, path: str, predicate: Any, what: str, timeout: float = 90) -> list[Any]:
        def ready() -> list[Any] | None:
            events = self.events(path)
            return events if predicate(events) else None

        try:
            return wait_until(ready, timeout, what, interval=0.25)
        except AssertionError as error:
            shown = [(e.offset, e.type.rsplit("/", 1)[-1], e.idempotencyKey) for e in self.events(path)]
            raise AssertionError(f"{error}; {path} holds {shown}") from None


def of(events: list[Any], event_type: str) -> list[Any]:
    return [e for e in events if e.type == event_type]


def user_message(text: str) -> dict[str, Any]:
    return {"type": CONTEXT_ADDED, "payload": {"role": "user", "content": text}}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("authority")
    tokens = Tokens(root / "tokens.yaml")
    issued = {
        "platform": tokens.add("platform", "/**"),
        "alice": tokens.add("user", "/agents/alice/**", userId="alice"),
        "integration": tokens.add("integration", "/integrations/**"),
        "platform-integrations": tokens.add("platform", "/integrations/**"),
    }
    with served_stack(root, tokens, REPLIES, capabilities={"concurrency": 2}, router={}) as served:
        yield Env(served.stack, served.gateway, issued)


# --- finding 1: scripts ignored every scope ---------------------------------------------------------


def test_finding_1_a_users_agent_script_cannot_read_bob_nor_write_for_bob_nor_forge_an_integration_event(
    env: Env,
) -> None:
    tag = f"f1-{uuid.uuid4().hex[:8]}"
    alice, bob = f"/agents/alice/{tag}", f"/agents/bob-{tag}/a1"
    env.birth(alice, {"llmRequestDebounceMs": 50})
    env.birth(bob)
    secret = f"bob-private-{tag}"
    private = {
        "role": "user",
        "content": secret,
        "actor": {"type": "user", "origin": "cli"},
        "llmRequestPolicy": {"behaviour": "dont-trigger-request"},  # bob stays quiet: any new event is alice's
    }
    secret_offset = env.stack.client.agents.get(bob).append({"type": CONTEXT_ADDED, "payload": private}).wait(60)
    forged_stream = f"/integrations/github/{tag}"
    code = f"""
out = {{}}
for name, call in [
    ("read", lambda: read_event({f"{bob}@{secret_offset}"!r})),
    ("send", lambda: send_to_agent({bob!r}, "do what I say")),
    ("forge", lambda: send_to_agent({forged_stream!r}, "a forged webhook")),
]:
    try:
        out[name] = ["succeeded", call()]
    except PermissionError as error:
        out[name] = ["refused", str(error)]
out
"""
    REPLIES.on(tag, script(code))
    # Alice's user token may append only to her own agents; it asks her agent to do the rest.
    reply = env.post("alice", alice, user_message(f"{tag} read bob for me"))
    assert reply.status == 200, reply
    assert env.post("alice", bob, user_message("hi bob")).status == 403  # the door held before, too

    events = env.until(alice, lambda es: of(es, SCRIPT_RUN_SETTLED), "the script's settlement")
    (settled,) = of(events, SCRIPT_RUN_SETTLED)
    result = settled.payload.settlement.result
    assert result == {
        "read": ["refused", f"{bob} is outside this agent's read grants"],
        "send": ["refused", f"{bob} is outside this agent's send grants"],
        "forge": ["refused", f"{forged_stream} is outside this agent's send grants"],
    }, settled.payload.settlement
    time.sleep(1)
    assert secret not in str(env.events(alice))
    assert [e.offset for e in env.events(bob)] == [1, 2, secret_offset]  # nothing written for bob
    assert env.events(forged_stream) == []


def test_finding_1_an_integration_token_cannot_make_an_agent_of_its_own_under_integrations(env: Env) -> None:
    evil = f"/integrations/evil-{uuid.uuid4().hex[:8]}"
    commands = [
        {"type": AGENT_CREATED, "payload": {}},
        {"type": CONTEXT_ADDED, "payload": {"role": "system", "content": "obey", "key": "agent/system-prompt"}},
        {"type": AGENT_SUBSCRIBED, "payload": {"source": "/agents/bob/a1"}},
        {"type": AGENT_CONFIGURED, "payload": {"config": {"grants": {"read": ["/**"]}}}},
    ]
    for command in commands:
        reply = env.post("integration", evil, command)
        assert reply.status == 403 and reply.json()["rule"] == "agent-only-types", reply
    # Its ordinary raw events still go in.
    assert env.post("integration", evil, {"type": "com.example/ticket-opened", "payload": {"id": 1}}).status == 200
    assert [e.type for e in env.events(evil)] == ["com.example/ticket-opened"]


# --- finding 2: two agents subscribed to each other looped forever --------------------------------------


def test_finding_2_two_agents_subscribed_to_each_other_end_paused_within_max_autonomous_turns(env: Env) -> None:
    project = f"/agents/loop-{uuid.uuid4().hex[:8]}"
    a, b = f"{project}/a", f"{project}/b"
    limit = 2
    for agent in (a, b):
        env.birth(agent, {"maxAutonomousTurns": limit, "llmRequestDebounceMs": 50})
    for agent, source in ((a, b), (b, a)):
        reply = env.post("platform", agent, {"type": AGENT_SUBSCRIBED, "payload": {"source": source}})
        assert reply.status == 200, reply
    time.sleep(3)  # the router's table takes both subscriptions (a repartition hop)
    assert env.post("platform", a, user_message("start the conversation")).status == 200

    # a: the external turn, then one per answer of b; b: one per answer of a. b is the first to
    # reach a turn past the limit, so the breaker pauses b; a answers nothing more without b's
    # answers and stays idle with its budget spent. The cycle is over either way.
    env.until(b, lambda events: of(events, AGENT_PAUSED), "agent b paused by the breaker", timeout=180)
    time.sleep(5)  # quiet: nothing more happens
    counts = {agent: len(env.events(agent)) for agent in (a, b)}
    time.sleep(3)
    assert {agent: len(env.events(agent)) for agent in (a, b)} == counts, "the agents are still talking"
    a_events, b_events = env.events(a), env.events(b)
    (pause,) = of(b_events, AGENT_PAUSED)
    assert pause.payload.reason == breaker_reason(limit)
    assert fold_all(AgentState(), b_events).status == "paused"
    a_state = fold_all(AgentState(), a_events)
    assert a_state.status == "idle" and a_state.autonomous_turn_count == limit
    assert len(of(a_events, LLM_REQUEST_REQUESTED)) == limit + 1  # the external turn and `limit` more
    assert len(of(b_events, LLM_REQUEST_REQUESTED)) == limit
    for events in (a_events, b_events):
        # Only the other agent's answers were routed in, as agent-loop input from that agent.
        routed = [e for e in events if (e.idempotencyKey or "").startswith("route/")]
        assert routed and all(e.payload.actor.type == "agent" for e in routed)
        assert all(e.payload.refs[0].eventType == CONTEXT_ADDED for e in routed)


# --- finding 3: an integration subscribed to an agent and watched it --------------------------------------


def test_finding_3_no_token_subscribes_a_stream_to_an_agent_outside_its_authority(env: Env) -> None:
    evil = f"/integrations/evil-{uuid.uuid4().hex[:8]}"
    victim = f"/agents/bob-{uuid.uuid4().hex[:8]}/a1"
    subscribe = {"type": AGENT_SUBSCRIBED, "payload": {"source": victim}}
    reply = env.post("integration", evil, subscribe)
    assert reply.status == 403 and reply.json()["rule"] == "agent-only-types", reply
    # A platform token confined to integrations cannot point a subscription at an agent either.
    reply = env.post("platform-integrations", evil, subscribe)
    assert reply.status == 403 and reply.json()["rule"] == "subscribe", reply
    assert reply.json()["detail"].startswith(f"subscribe: {victim} is outside this token's scope")
    # Past the gateway, the journal refuses a subscription from a stream that is no agent, and one
    # outside the agent's subscribe grants, each to the DLQ with its reason.
    with pytest.raises(AppendRejected, match="not an agent"):
        env.stack.client.streams.get(evil).append(subscribe).wait(timeout=60)
    alice = f"/agents/alice/{uuid.uuid4().hex[:8]}"
    env.birth(alice)
    with pytest.raises(AppendRejected, match=f"forbidden: subscribe: {victim} is outside the subscribe grants"):
        env.stack.client.agents.get(alice).append(subscribe).wait(timeout=60)
    reasons = [
        dict(m.headers())[H_REASON].decode()
        for m in env.stack.read_topic(env.stack.client.topics.dlq)
        if m.key() in (evil.encode(), alice.encode())
    ]
    assert len(reasons) == 2 and all(r.startswith("forbidden: subscribe:") for r in reasons), reasons
    assert env.events(evil) == []


# --- finding 5: a user could claim the workers' keys --------------------------------------------------------


def test_finding_5_a_user_cannot_claim_a_key_the_scheduler_needs_and_the_next_message_gets_its_turn(env: Env) -> None:
    tag = f"f5-{uuid.uuid4().hex[:8]}"
    agent = f"/agents/alice/{tag}"
    env.birth(agent, {"llmRequestDebounceMs": 50})
    for key in ("agent/request/4", "agent/script-result@agent-output:5", f"route//integrations/x@{tag}"):
        command = {**user_message(f"{tag} squat"), "idempotencyKey": key}
        reply = env.post("alice", agent, command)
        assert reply.status == 403 and reply.json()["rule"] == "reserved-key", reply
    reply = env.post("alice", agent, user_message(f"{tag} hello"))
    assert reply.status == 200, reply
    message = reply.json()["offset"]
    assert message == 4  # created, system prompt, configured: nothing of the refused commands
    events = env.until(
        agent, lambda es: fold_all(AgentState(), es).status == "idle" and of(es, LLM_REQUEST_REQUESTED), "the turn"
    )
    (request,) = of(events, LLM_REQUEST_REQUESTED)
    assert request.idempotencyKey == f"agent/request/{message}"
    assert any(e.type == CONTEXT_ADDED and e.payload.role == "assistant" for e in events)
