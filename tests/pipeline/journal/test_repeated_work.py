"""A platform writer repeating work (docs/behaviour.md §5.2 "the other writers", docs/architecture.md
"Fencing"): a repeat under the same idempotency key with another body keeps the first event, is
answered `rejected`, and goes to the dead-letter topic only when it came from agent-appends.
Broker-free: the journal worker's partition engine over in-memory Kafka."""

from __future__ import annotations

import asyncio

import orjson

from schemas.events import CONTEXT_ADDED, LLM_REQUEST_SETTLED
from tests.support.engine_harness import NAMES, EngineHarness
from topics.headers import H_REASON


def settled(duration_ms: int, append_id: str) -> dict[str, object]:
    return {
        "type": LLM_REQUEST_SETTLED,
        "payload": {"requestOffset": 7, "durationMs": duration_ms, "result": {"status": "failed", "errorMessage": "x"}},
        "idempotencyKey": "agent/request/7/settled",
        "appendId": append_id,
    }


def run_twice(*, internal: bool) -> EngineHarness:
    harness = EngineHarness()

    async def scenario() -> None:
        await harness.handle(harness.command(settled(1200, "first"), internal=internal))
        await harness.handle(harness.command(settled(1350, "second"), internal=internal))
        await harness.settle()

    asyncio.run(scenario())
    assert harness.fatal == []
    return harness


def outcomes(harness: EngineHarness) -> dict[str, str]:
    results = harness.kafka.outcomes(NAMES.results)
    return {result["appendId"]: result["status"] for result in results}


def test_5_2_an_internal_writers_repeat_with_another_body_keeps_the_first_and_is_not_dead_lettered() -> None:
    harness = run_twice(internal=True)
    (event,) = [orjson.loads(record.value) for record in harness.kafka.on(NAMES.journal)]
    assert event["payload"]["durationMs"] == 1200
    assert outcomes(harness) == {"first": "journaled", "second": "rejected"}
    assert harness.kafka.on(NAMES.dlq) == []


def test_5_2_a_key_reused_with_another_body_on_the_public_topic_is_dead_lettered_as_a_conflict() -> None:
    harness = EngineHarness()

    def user(text: str) -> dict[str, object]:
        return {"type": CONTEXT_ADDED, "payload": {"role": "user", "content": text}, "idempotencyKey": "web/msg/1"}

    async def scenario() -> None:
        await harness.handle(harness.command(user("hello")), harness.command(user("hello again")))
        await harness.settle()

    asyncio.run(scenario())
    (event,) = [orjson.loads(record.value) for record in harness.kafka.on(NAMES.journal)]
    assert event["payload"]["content"] == "hello"
    (dead,) = harness.kafka.on(NAMES.dlq)
    assert dead.headers[H_REASON].startswith(b"idempotency key 'web/msg/1' already names a different event at @1")
