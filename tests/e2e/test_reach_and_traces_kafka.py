"""Findings of a security probe, each reproduced through the gateway on the real stack: the journal
worker, the LLM caller and the capability host run as processes on the local broker, the gateway
serves tokens of several tenants, and a scripted OpenAI-compatible server plays the model, answering
by tag (tests/support/tagged_model.py).

- 1 (behaviour §6.6, §3.3): a reference widened reads. Alice's user token, or an integration token
  scoped to her streams, appended an item to her agent with an event ref to Bob's stream or to an
  integration stream, and her agent's script then read that event. An item attaching a blob
  uploaded to Bob's stream put Bob's bytes into Alice's model request.
- 3 (behaviour §8): a version-01 `traceparent` with a 60 KB tail was copied onto every record of
  its batch, and a producer writing `agent-appends` directly got the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from schemas.capabilities import SCRIPT_RUN_SETTLED
from schemas.events import AGENT_CONFIGURED, CONTEXT_ADDED, LLM_REQUEST_SETTLED
from schemas.gateway import GITHUB_WEBHOOK_RECEIVED
from tests.gateway_server import Reply, Tokens
from tests.kafka_stack import BOOTSTRAP, read_committed, wait_until
from tests.support.files import multipart
from tests.support.scripted_stack import Served, birth, served_stack
from tests.support.tagged_model import TaggedReplies, received, script

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(400)]

REPLIES = TaggedReplies()
QUIET = {"llmRequestPolicy": {"behaviour": "dont-trigger-request"}}
PARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
HUGE = b"01" + PARENT[2:] + b"-" + b"x" * 60_000  # a later version's header with a 60 KB tail


class Env:
    def __init__(self, served: Served, tokens: dict[str, str]) -> None:
        self.stack = served.stack
        self.gateway = served.gateway
        self.llm = served.llm
        self.tokens = tokens

    def birth(self, path: str, *config: dict[str, Any]) -> None:
        birth(self.stack, path)
        agent = self.stack.client.agents.get(path)
        for patch in config:
            agent.append({"type": AGENT_CONFIGURED, "payload": {"config": patch}}).wait(timeout=60)

    def post(self, token: str, path: str, command: dict[str, Any]) -> Reply:
        return self.gateway.request("POST", f"/v1/streams{path}/events?wait=true", command, token=self.tokens[token])

    def batch(self, token: str, commands: list[dict[str, Any]], headers: dict[str, str] | None = None) -> Reply:
        body = b"\n".join(orjson.dumps(command) for command in commands)
        return self.gateway.request(
            "POST",
            "/v1/streams/-/events:batch?wait=true",
            token=self.tokens[token],
            raw=body,
            headers={"Content-Type": "application/x-ndjson", **(headers or {})},
        )

    def upload(self, token: str, path: str, filename: str, data: bytes) -> Reply:
        body, content_type = multipart(filename, data, "text/plain")
        headers, route = {"Content-Type": content_type}, f"/v1/streams{path}/files"
        return self.gateway.request("POST", route, token=self.tokens[token], raw=body, headers=headers)

    def events(self, path: str) -> list[Any]:
        return self.stack.client.streams.get(path).events()

    def until(self, path: str, predicate: Any, what: str, timeout: float = 90) -> list[Any]:
        def ready() -> list[Any] | None:
            events = self.events(path)
            return events if predicate(events) else None

        return wait_until(ready, timeout, what, interval=0.25)


def of(events: list[Any], event_type: str) -> list[Any]:
    return [e for e in events if e.type == event_type]


def event_ref(path: str, offset: int) -> dict[str, Any]:
    return {"type": "event", "streamPath": path, "offset": offset}


def item(payload: dict[str, Any]) -> dict[str, Any]:
    return {"type": CONTEXT_ADDED, "payload": payload}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("reach")
    tokens = Tokens(root / "tokens.yaml")
    issued = {
        "alice": tokens.add("user", "/agents/alice/**", userId="alice"),
        "alice-integration": tokens.add("integration", "/agents/alice/**"),
        "bob": tokens.add("user", "/agents/bob/**", userId="bob"),
    }
    with served_stack(root, tokens, REPLIES, capabilities={"concurrency": 2}, blob_dir=root / "blobs") as served:
        yield Env(served, issued)


# --- finding 1: a planted reference widened reads ---------------------------------------------------


def test_6_6_finding_1_a_ref_its_writer_could_not_read_is_refused_and_grants_alices_agent_nothing(env: Env) -> None:
    tag = f"f1-{uuid.uuid4().hex[:8]}"
    alice, notes = f"/agents/alice/{tag}", f"/agents/alice/{tag}-notes"
    bob, github = f"/agents/bob/{tag}", f"/integrations/github/{tag}"
    env.birth(alice, {"llmRequestDebounceMs": 50})
    env.birth(bob)
    client = env.stack.client
    secret = f"bob-private-{tag}"
    private = {"role": "user", "content": secret, "actor": {"type": "user", "origin": "cli"}, **QUIET}
    bob_offset = client.agents.get(bob).append(item(private)).wait(60)
    raw = f"raw-webhook-{tag}"
    delivery = {"event": "push", "delivery": tag, "payload": {"head_commit": {"message": raw}}}
    github_offset = client.streams.get(github).append({"type": GITHUB_WEBHOOK_RECEIVED, "payload": delivery}).wait(60)
    notes_offset = client.streams.get(notes).append({"type": "com.example/note", "payload": {"text": tag}}).wait(60)

    # The attack: refs planted by tokens that cannot read those streams themselves.
    planted = [
        ("alice", {"role": "user", "content": f"{tag} bob's", "refs": [event_ref(bob, bob_offset)], **QUIET}),
        (
            "alice-integration",
            {
                "role": "developer",
                "content": f"{tag} a push",
                "actor": {"type": "github", "login": "octocat"},
                "refs": [event_ref(github, github_offset)],
                **QUIET,
            },
        ),
    ]
    for token, payload in planted:
        reply = env.post(token, alice, item(payload))
        assert reply.status == 403 and reply.json()["rule"] == "refs", reply
        assert f"@{payload['refs'][0]['offset']}" in reply.json()["detail"]
    # A ref its writer could read itself still lets the agent read it.
    own = {"role": "user", "content": f"{tag} my notes", "refs": [event_ref(notes, notes_offset)], **QUIET}
    assert env.post("alice", alice, item(own)).status == 200

    targets = {"bob": f"{bob}@{bob_offset}", "github": f"{github}@{github_offset}", "notes": f"{notes}@{notes_offset}"}
    code = f"""
out = {{}}
for name, ref in {targets!r}.items():
    try:
        out[name] = ["read", read_event(ref)["payload"]]
    except PermissionError as error:
        out[name] = ["refused", str(error)]
out
"""
    REPLIES.on(tag, script(code))
    assert env.post("alice", alice, item({"role": "user", "content": f"{tag} read them all"})).status == 200

    events = env.until(alice, lambda es: of(es, SCRIPT_RUN_SETTLED), "the script's settlement")
    (settled,) = of(events, SCRIPT_RUN_SETTLED)
    assert settled.payload.settlement.result == {
        "bob": ["refused", f"{bob} is outside this agent's read grants"],
        "github": ["refused", f"{github} is outside this agent's read grants"],
        "notes": ["read", {"text": tag}],
    }, settled.payload.settlement
    journaled = str([e.payload for e in env.events(alice)])
    assert secret not in journaled and raw not in journaled


def test_3_3_finding_1_a_file_of_another_tenant_is_refused_and_never_reaches_alices_model(env: Env) -> None:
    tag = f"f1f-{uuid.uuid4().hex[:8]}"
    alice, uploads, bob = f"/agents/alice/{tag}", f"/agents/alice/{tag}-uploads", f"/agents/bob/{tag}"
    env.birth(alice, {"llmRequestDebounceMs": 50})
    secret = f"bob's private notes {tag}\n".encode()
    bobs = env.upload("bob", bob, "notes.txt", secret)
    assert bobs.status == 201, bobs
    attachment = bobs.json()
    assert env.gateway.request("GET", attachment["url"], token=env.tokens["alice"]).status == 404

    # The attack: Alice's item names the blob Bob uploaded, alone and in a batch.
    planted = {"role": "user", "content": f"{tag} summarise this", "files": [attachment]}
    reply = env.post("alice", alice, item(planted))
    assert reply.status == 403 and reply.json()["rule"] == "files", reply
    lines = env.batch("alice", [{"streamPath": alice, **item(planted)}])
    assert lines.status == 200 and lines.json()["results"][0]["rule"] == "files", lines

    # What her token could GET (uploaded to another stream of her scope) still reaches the model.
    mine = f"alice's own notes {tag}\n".encode()
    own = env.upload("alice", uploads, "mine.txt", mine)
    assert own.status == 201, own
    fine = {"role": "user", "content": f"{tag} and this one", "files": [own.json()]}
    assert env.post("alice", alice, item(fine)).status == 200
    env.until(alice, lambda es: of(es, LLM_REQUEST_SETTLED), "the turn answering her own file")
    sent = str([r.body for r in received(env.llm, tag)])
    assert mine.decode().strip() in sent
    assert secret.decode().strip() not in sent
    assert not [e for e in env.events(alice) if e.type == CONTEXT_ADDED and "summarise" in e.payload.content]


# --- finding 3: `traceparent` was copied raw -------------------------------------------------------


def test_8_finding_3_a_long_traceparent_is_carried_as_its_55_bytes_through_both_doors(env: Env) -> None:
    tag = f"f3-{uuid.uuid4().hex[:8]}"
    http, door = f"/agents/alice/{tag}", f"/agents/alice/{tag}-door"
    commands = [{"streamPath": http, **item({"role": "user", "content": str(n), **QUIET})} for n in range(40)]
    reply = env.batch("alice", commands, {"traceparent": HUGE.decode()})
    assert reply.status == 200 and reply.json()["failed"] == 0, reply

    # A producer with Kafka access writes the same header on a command of its own.
    topics = env.stack.client.topics
    command = {"streamPath": door, **item({"role": "user", "content": "raw", **QUIET}), "appendId": tag}
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "partitioner": "murmur2_random", "log_level": 3})
    producer.produce(topics.appends, key=door.encode(), value=orjson.dumps(command), headers=[("traceparent", HUGE)])
    assert producer.flush(10) == 0
    env.until(door, lambda events: len(events) == 1, "the producer's command journaled")

    for topic, expected in ((topics.journal, 41), (topics.results, 41)):
        records = [r for r in read_committed(topic) if r.key() in (http.encode(), door.encode())]
        assert len(records) == expected, (topic, len(records))
        carried = [dict(r.headers() or [])["traceparent"] for r in records]
        assert set(carried) == {PARENT}, (topic, {len(value) for value in carried})
