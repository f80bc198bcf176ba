"""What the scheduler must NOT do (docs/behaviour.md §4.2, §4.3), on a `PartitionEngine` with a fake
clock: no sleeping, the clock jumps far past every deadline and the engine is asked what is due.

The engine runs as in the worker: its scheduler journals what it decides (`schedule`; an expiry goes
back in through the internal command topic), and the test plays the LLM caller by appending settlements. The broker
tests (tests/e2e/test_turns_kafka.py) keep one end-to-end check of each behaviour, waiting for what
does happen.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from processors.reducer import epoch_ms
from schemas import events as ev
from tests.support.engine_harness import NAMES, SYSTEM, EngineHarness, user

START_MS = 1_800_000_000_000
LATER_MS = 10**9  # much later than any debounce, backoff or expiry of these tests (about 11 days)


class Turns:
    """A partition engine whose clock the test moves."""

    def __init__(self) -> None:
        self.now_ms = START_MS
        self.h = EngineHarness()
        self.h.engine.clock_ms = lambda: self.now_ms

    async def append(self, *bodies: dict[str, Any], internal: bool = False) -> None:
        await self.h.handle(*(self.h.command(body, internal=internal) for body in bodies))
        await self.h.settle()

    async def born(self, first: dict[str, Any], **config: Any) -> None:
        """A created agent with a system prompt and `config`; then `first` (its trigger) at `now_ms`."""
        await self.append(SYSTEM, {"type": ev.AGENT_CREATED, "payload": {}}, configured(**config), first)

    async def tick(self, at_ms: int) -> list[dict[str, Any]]:
        """Move the clock to `at_ms` and journal whatever the scheduler appends then, as the worker's
        timer does (at once, or an expiry through the internal topic); returns those events."""
        self.now_ms = at_ms
        before = len(self.events())
        commands = [command for _, command in self.h.engine.schedule(at_ms)]
        if commands:
            await self.append(*commands, internal=True)
        await self.h.settle()
        return self.events()[before:]

    def events(self) -> list[dict[str, Any]]:
        return [orjson.loads(record.value) for record in self.h.kafka.on(NAMES.journal)]

    def of(self, *types: str) -> list[dict[str, Any]]:
        return [event for event in self.events() if event["type"] in types]

    def last_request(self) -> int:
        return self.of(ev.LLM_REQUEST_REQUESTED)[-1]["offset"]

    def calls(self) -> list[dict[str, Any]]:
        records = [orjson.loads(record.value) for record in self.h.kafka.on(NAMES.llm_requests)]
        return [record for record in records if record["kind"] == "call"]

    def at(self, offset: int) -> int:
        (event,) = [event for event in self.events() if event["offset"] == offset]
        return epoch_ms(event["createdAt"])


def configured(**config: Any) -> dict[str, Any]:
    return {"type": ev.AGENT_CONFIGURED, "payload": {"config": config}}


def failed(request_offset: int) -> dict[str, Any]:
    result = {"status": "failed", "errorMessage": "HTTP 500"}
    return {"type": ev.LLM_REQUEST_SETTLED, "payload": {"requestOffset": request_offset, "result": result}}


def succeeded(request_offset: int) -> dict[str, Any]:
    result = {"status": "succeeded", "text": "ok"}
    return {"type": ev.LLM_REQUEST_SETTLED, "payload": {"requestOffset": request_offset, "result": result}}


def developer(text: str) -> dict[str, Any]:
    return {"type": ev.CONTEXT_ADDED, "payload": {"role": "developer", "content": text}}  # agent-loop trigger


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_4_2_distributed_birth_requests_nothing_until_the_prompt_then_exactly_once() -> None:
    async def scenario() -> None:
        t = Turns()
        await t.append(user("are you there?"))
        (early,) = t.events()
        assert await t.tick(START_MS + LATER_MS) == []  # no agent/created, no prompt: queued forever
        await t.append({"type": ev.AGENT_CREATED, "payload": {"by": "test"}})
        assert await t.tick(START_MS + 2 * LATER_MS) == []  # created, still no prompt
        t.now_ms += 1
        await t.append(SYSTEM)
        (requested,) = await t.tick(t.now_ms)  # the trigger is long past its debounce: at once
        assert requested["idempotencyKey"] == f"agent/request/{early['offset']}"
        assert len(t.calls()) == 1
        await t.append(succeeded(t.last_request()), internal=True)
        assert await t.tick(t.now_ms + LATER_MS) == []  # answered: nothing else is ever scheduled
        assert len(t.of(ev.LLM_REQUEST_REQUESTED)) == 1 and len(t.calls()) == 1

    run(scenario())


def test_4_3_after_max_attempts_no_further_request_is_ever_made() -> None:
    async def scenario() -> None:
        t = Turns()
        policy = {"maxAttempts": 3, "backoffBaseMs": 300, "backoffMaxMs": 400}
        await t.born(user("please"), llmRequestDebounceMs=50, llmRequestRetryPolicy=policy)
        trigger_at = t.now_ms
        assert await t.tick(trigger_at + 49) == []
        assert len(await t.tick(trigger_at + 50)) == 1
        for backoff in (300, 400):  # min(base · 2^(failures-1), max) on top of the debounce
            await t.append(failed(t.last_request()), internal=True)
            failed_at = t.now_ms
            assert await t.tick(failed_at + 50 + backoff - 1) == []
            assert len(await t.tick(failed_at + 50 + backoff)) == 1
        await t.append(failed(t.last_request()), internal=True)
        assert await t.tick(t.now_ms + LATER_MS) == []  # attempt 3 of 3 failed: give up
        assert len(t.of(ev.LLM_REQUEST_REQUESTED)) == 3

    run(scenario())


def test_4_3_a_paused_agent_requests_nothing_until_external_input() -> None:
    async def scenario() -> None:
        t = Turns()
        await t.born(user("start"), maxAutonomousTurns=1, llmRequestDebounceMs=0)
        for feedback in ("loop 1", None):  # turn 1 external, turn 2 agent-loop (the one allowed)
            (request,) = await t.tick(t.now_ms)
            assert request["type"] == ev.LLM_REQUEST_REQUESTED
            await t.append(succeeded(t.last_request()), internal=True)
            if feedback is not None:
                await t.append(developer(feedback))
        await t.append(developer("loop 2"))  # would be autonomous turn 2
        (pause,) = await t.tick(t.now_ms)
        assert pause["type"] == ev.AGENT_PAUSED
        await t.append(developer("loop 3"))  # dropped while paused
        assert await t.tick(t.now_ms + LATER_MS) == []
        assert len(t.of(ev.LLM_REQUEST_REQUESTED)) == 2
        await t.append(user("continue"))
        external = t.events()[-1]["offset"]
        (resume,) = await t.tick(t.now_ms)
        assert resume["type"] == ev.AGENT_RESUMED
        (request,) = await t.tick(t.now_ms)
        assert request["idempotencyKey"] == f"agent/request/{external}"

    run(scenario())


def test_4_3_an_expired_request_is_settled_once_and_nothing_follows() -> None:
    async def scenario() -> None:
        t = Turns()
        await t.born(user("hello?"), llmRequestExpiryMs=2500, llmRequestDebounceMs=50)
        trigger_at = t.now_ms
        await t.tick(trigger_at + 50)
        (requested,) = t.of(ev.LLM_REQUEST_REQUESTED)
        assert await t.tick(trigger_at + 2499) == []  # open, not yet expired
        expiry = await t.tick(trigger_at + 2500)
        assert [c["idempotencyKey"] for c in expiry] == [
            f"agent/request/{requested['offset']}/expired",
            f"agent/request/{requested['offset']}/expiry-error",
        ]
        assert await t.tick(t.now_ms + LATER_MS) == []  # idle: not retried, nothing appended
        assert [e["type"] for e in t.events()[-2:]] == [ev.LLM_REQUEST_SETTLED, ev.STREAM_ERROR_OCCURRED]
        assert len(t.calls()) == 1

    run(scenario())


def test_4_3_a_settlement_journaled_before_the_expiry_wins_and_no_expiry_is_reported() -> None:
    """The caller produced R's settlement just before the scheduler decided R's expiry: the
    expiry commands queue behind it and are not journaled, so no expiry error is reported."""

    async def scenario() -> None:
        t = Turns()
        await t.born(user("hello?"), llmRequestExpiryMs=2500, llmRequestDebounceMs=50)
        trigger_at = t.now_ms
        await t.tick(trigger_at + 50)
        r = t.last_request()
        t.now_ms = trigger_at + 2500
        expiry = [command for _, command in t.h.engine.schedule(t.now_ms)]
        assert len(expiry) == 2
        await t.append(succeeded(r), internal=True)  # first in the internal topic
        await t.append(*expiry, internal=True)
        settlements = t.of(ev.LLM_REQUEST_SETTLED)
        assert [s["payload"]["result"]["status"] for s in settlements] == ["succeeded"]
        assert t.of(ev.STREAM_ERROR_OCCURRED) == []
        assert t.h.kafka.on(NAMES.dlq) == []

    run(scenario())
