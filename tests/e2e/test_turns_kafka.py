"""End to end: turns on the real broker (docs/behaviour.md §4), with the journal worker and the LLM caller
running as real processes (`agentstream worker journal|caller`) and the scripted OpenAI-compatible
server answering.

The assertions are on the journal (the source of truth) and on what the provider received: every
request the server got must be exactly `render_messages` of the fold through its
`llm-request-requested` event R, on the `openai-compatible` transport, with R's createdAt as the
trailing timestamp (docs/behaviour.md §3).

One stack (isolated topics, one journal worker, one caller) and one scripted server serve the whole
module; each test has its own agent and its own tag. The server routes by tag: a test queues
responses for its tag, and requests carrying no queued response get the default answer with a
small usage report (below the compaction threshold of the scripted model's 200-token window).

The `model` tests run a second stack against the embedded model (scripts/model/start.sh).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from pipeline.client import Agent, Stream
from pipeline.settings import Settings
from processors.llm_outcomes import INTERRUPTED_PREFIX
from processors.reducer import epoch_ms, fold_all, state_through
from processors.render import DEFAULT_BUDGET, TIMESTAMP_PREFIX, render_request, turn_json
from processors.scheduler import breaker_reason
from processors.state import AgentState
from schemas.events import (
    AGENT_CONFIGURED,
    AGENT_CREATED,
    AGENT_PAUSED,
    AGENT_RESUMED,
    CONTEXT_ADDED,
    LLM_REQUEST_REQUESTED,
    LLM_REQUEST_SETTLED,
    STREAM_ERROR_OCCURRED,
    TOKEN_USAGE_REPORTED,
)
from schemas.requests import COMPACTION_INSTRUCTION, MAX_RECORD_BYTES
from tests.kafka_stack import REPO, Stack, wait_until
from tests.support.scripted_llm import (
    Fail,
    Hang,
    Reply,
    RequestRecord,
    Response,
    ScriptedLLM,
    SlowStream,
    last_user_text,
    prompt_tokens,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

MODEL = "scripted"
WIDE_MODEL = "scripted-wide"  # the default context window (128k tokens): items up to the general cap
CONTEXT_TOKENS = 200  # the scripted model's window: the compaction threshold is floor(200 * 0.5) = 100
BUDGETS = Settings.from_env({}, llm_context_tokens={MODEL: CONTEXT_TOKENS})  # render budgets per model
SMALL_USAGE = (20, 5)  # 25 tokens: below the threshold
TRANSPORT = "openai-compatible"
WAIT = 30.0  # seconds to wait for something the system does at once
API_KEY = "sk-proj-Turns0123456789abcdefXYZ"  # shaped like a real key: it must never be journaled


# --- the scripted provider, routed by tag ------------------------------------------------------------

Entry = Response | Callable[[dict[str, Any]], Response]


def request_text(body: Any) -> str:
    if not isinstance(body, dict):
        return ""
    return "\n".join(str(m.get("content", "")) for m in body.get("messages") or [] if isinstance(m, dict))


class Router:
    """The server's responder: the next queued response for the first tag found in the request,
    else the default answer (`ok: <last user message>` with a small usage)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._routes: dict[str, deque[Entry]] = {}

    def on(self, tag: str, *entries: Entry) -> None:
        with self._lock:
            self._routes.setdefault(tag, deque()).extend(entries)

    def __call__(self, body: dict[str, Any]) -> Response:
        text = request_text(body)
        entry: Entry | None = None
        with self._lock:
            for tag, queue in self._routes.items():
                if tag in text:
                    entry = queue.popleft() if queue else None
                    break
        if entry is None:
            return Reply(f"ok: {last_user_text(body)}", usage=SMALL_USAGE)
        return entry(body) if callable(entry) else entry


ROUTER = Router()


def received(llm: ScriptedLLM, tag: str) -> list[RequestRecord]:
    """The chat requests the server got for this tag, in arrival order."""
    return [r for r in llm.records if tag in request_text(r.body)]


def is_compaction(record: RequestRecord) -> bool:
    messages = record.body["messages"]
    return bool(messages) and messages[-1]["content"] == COMPACTION_INSTRUCTION


def calls(llm: ScriptedLLM, tag: str) -> list[RequestRecord]:
    return [r for r in received(llm, tag) if not is_compaction(r)]


# --- journal helpers ---------------------------------------------------------------------------------


def new_tag() -> str:
    return f"tag-{uuid.uuid4().hex[:10]}"


def user(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": CONTEXT_ADDED,
        "payload": {"role": "user", "content": text, "actor": {"type": "user", "origin": "cli"}, **extra},
    }


def developer(text: str) -> dict[str, Any]:
    """An actorless developer item: an agent-loop trigger (§4.1)."""
    return {"type": CONTEXT_ADDED, "payload": {"role": "developer", "content": text}}


def configured(**config: Any) -> dict[str, Any]:
    return {"type": AGENT_CONFIGURED, "payload": {"config": config}}


def of(events: list[Any], *types: str) -> list[Any]:
    return [e for e in events if e.type in types]


def items(events: list[Any], role: str | None = None) -> list[Any]:
    return [e for e in of(events, CONTEXT_ADDED) if role is None or e.payload.role == role]


def settlements(events: list[Any], request: int | None = None) -> list[Any]:
    return [e for e in of(events, LLM_REQUEST_SETTLED) if request is None or e.payload.requestOffset == request]


def journal_until(stream: Stream | Agent, predicate: Callable[[list[Any]], Any], what: str, timeout: float = WAIT):
    """The stream's events once `predicate(events)` holds."""
    stream = stream.stream if isinstance(stream, Agent) else stream

    def ready() -> list[Any] | None:
        events = stream.events()
        return events if predicate(events) else None

    return wait_until(ready, timeout, what, interval=0.2)


def settled_count(n: int) -> Callable[[list[Any]], bool]:
    return lambda events: len(settlements(events)) >= n


def rendered(events: list[Any], request: int) -> list[dict[str, Any]]:
    """§3: the messages of request R: the fold through R, R's createdAt as the timestamp."""
    (event,) = [e for e in events if e.offset == request]
    assert event.type == LLM_REQUEST_REQUESTED
    budget = BUDGETS.render_budget_for(event.payload.model)  # as the worker renders for that model
    return render_request(events, event, TRANSPORT, budget)


def call_records(stack: Stack, path: str) -> list[dict[str, Any]]:
    """The `llm-requests` records the journal processor published for the stream."""
    records = stack.read_topic(stack.client.topics.llm_requests)
    return [orjson.loads(m.value()) for m in records if m.key() == path.encode()]


def append_all(agent: Agent | Stream, *events: dict[str, Any]) -> list[int]:
    receipts = [agent.append(event) for event in events]
    return [receipt.wait(timeout=60) for receipt in receipts]


# --- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM(model=MODEL, default=ROUTER) as server:
        yield server


def _close(stack: Stack) -> None:
    caller = stack.caller
    if caller is not None and caller.poll() is None:
        caller.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        if caller.poll() is None:
            caller.send_signal(signal.SIGTERM)  # a second signal stops waiting for running calls
    stack.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, llm: ScriptedLLM) -> Iterator[Stack]:
    stack = Stack(
        tmp_path_factory.mktemp("turns"),
        openai_base_url=llm.base_url,
        openai_api_key=API_KEY,
        llm_transport=TRANSPORT,
        llm_model=MODEL,
        llm_context_tokens={MODEL: CONTEXT_TOKENS},
        session_timeout_s=6,  # a SIGKILLed caller's partitions move after 6 s (the broker's minimum)
    )
    try:
        stack.start_worker()
        stack.start_caller()
        # Warm up: both workers have their partitions once one turn went through.
        agent = stack.client.agents.create()
        agent.append(user(f"{new_tag()} warm up")).wait(timeout=120)
        journal_until(agent, settled_count(1), "the warm-up turn", timeout=120)
        yield stack
    finally:
        _close(stack)


@pytest.fixture
def kit(stack: Stack, llm: ScriptedLLM) -> Iterator[tuple[Stack, ScriptedLLM]]:
    yield stack, llm
    assert stack.worker is not None and stack.worker.poll() is None, "the journal worker died"
    assert stack.caller is not None and stack.caller.poll() is None, "the LLM caller died"


# --- 1. a full turn ---------------------------------------------------------------------------------


def test_4_2_4_3_full_turn_requested_answered_settled_and_usage_reported(kit: tuple[Stack, ScriptedLLM]) -> None:
    """§4.2: a user message triggers `llm-request-requested {model, expiresAt}` keyed
    `agent/request/<trigger>`; §4.3: success appends the assistant item (llmRequestOffset R), then
    `settled {succeeded}`, then `token-usage-reported`, keys derived from R; §3: the provider got
    exactly the rendered messages of the fold through R, the timestamp last."""
    stack, llm = kit
    tag = new_tag()
    ROUTER.on(tag, Reply("Hello, I am here.", usage=(42, 7)))
    agent = stack.client.agents.create()
    (message,) = append_all(agent, user(f"{tag} hello"))
    events = journal_until(agent, lambda es: of(es, TOKEN_USAGE_REPORTED), "the usage report")

    assert [e.offset for e in events] == list(range(1, len(events) + 1))
    assert [e.type for e in events] == [
        AGENT_CREATED,
        CONTEXT_ADDED,  # the base policy
        CONTEXT_ADDED,  # the message
        LLM_REQUEST_REQUESTED,
        CONTEXT_ADDED,  # the answer
        LLM_REQUEST_SETTLED,
        TOKEN_USAGE_REPORTED,
    ]
    trigger, requested, answer, settled, usage = events[2:]
    assert trigger.offset == message
    r = requested.offset
    assert requested.idempotencyKey == f"agent/request/{message}"
    assert requested.payload.model == MODEL
    assert requested.payload.expiresAt == epoch_ms(trigger.createdAt) + 600_000
    assert epoch_ms(requested.createdAt) >= epoch_ms(trigger.createdAt) + 250  # the default debounce

    assert answer.payload.role == "assistant" and answer.payload.content == "Hello, I am here."
    assert answer.payload.llmRequestOffset == r and answer.idempotencyKey == f"agent/request/{r}/assistant"
    assert settled.idempotencyKey == f"agent/request/{r}/settled"
    assert settled.payload.requestOffset == r and settled.payload.durationMs is not None
    assert settled.payload.result.model_dump(exclude_none=True) == {
        "status": "succeeded",
        "text": "Hello, I am here.",
        "usage": {"inputTokens": 42, "outputTokens": 7},
    }
    assert usage.idempotencyKey == f"agent/request/{r}/usage"
    assert usage.payload.model_dump(exclude_none=True) == {
        "llmRequestOffset": r,
        "model": MODEL,
        "maxContextTokens": CONTEXT_TOKENS,
        "inputTokens": 42,
        "outputTokens": 7,
    }

    (request,) = received(llm, tag)
    assert request.body["model"] == MODEL and request.body["stream"] is True
    messages = request.body["messages"]
    assert messages == rendered(events, r)
    assert messages[-1] == {"role": "system", "content": TIMESTAMP_PREFIX + requested.createdAt}
    assert messages[-2] == {"role": "user", "content": f"@{message} actor=user:cli\n{tag} hello"}
    assert not any(m["role"] == "developer" for m in messages)  # §3.2: openai-compatible
    state = fold_all(AgentState(), events)
    assert turn_json(state)["status"] == "idle"


# --- 2. distributed birth ----------------------------------------------------------------------------


def test_4_2_distributed_birth_one_request_after_the_system_prompt(kit: tuple[Stack, ScriptedLLM]) -> None:
    """§4.2 distributed birth: a message before `agent/created` and before the system prompt is
    reduced normally and its trigger waits (queued, never busy); when the prompt arrives exactly one
    request is made, after the prompt, and it contains the early message. (That nothing is requested
    before the prompt, however long it takes, is checked on a fake clock:
    tests/pipeline/journal/test_turns_clock.py.)"""
    stack, llm = kit
    tag = new_tag()
    stream = stack.client.streams.get(f"/agents/birth-{uuid.uuid4().hex[:10]}")
    (early,) = append_all(stream, user(f"{tag} are you there?"))
    assert turn_json(fold_all(AgentState(), stream.events()))["status"] == "queued"
    append_all(stream, {"type": AGENT_CREATED, "payload": {"by": "test"}})
    events = stream.events()
    assert [e.type for e in events] == [CONTEXT_ADDED, AGENT_CREATED]
    assert turn_json(fold_all(AgentState(), events))["status"] == "queued"

    (prompt,) = append_all(
        stream,
        {
            "type": CONTEXT_ADDED,
            "payload": {"role": "system", "content": "You are a test agent.", "key": "agent/system-prompt"},
        },
    )
    events = journal_until(stream, settled_count(1), "the first turn")
    (requested,) = of(events, LLM_REQUEST_REQUESTED)
    assert requested.offset == prompt + 1
    assert requested.idempotencyKey == f"agent/request/{early}"
    assert settlements(events)[0].payload.result.status == "succeeded"
    (request,) = received(llm, tag)
    assert request.body["messages"] == rendered(events, requested.offset)
    assert request.body["messages"][1:3] == [
        {"role": "system", "content": f'@{prompt} key="agent/system-prompt"\nYou are a test agent.'},
        {"role": "user", "content": f"@{early} actor=user:cli\n{tag} are you there?"},
    ]


# --- 3. debounce -------------------------------------------------------------------------------------


def test_4_2_debounce_coalesces_quick_messages_into_one_request(kit: tuple[Stack, ScriptedLLM]) -> None:
    """§4.2: triggers within the debounce make one request, named after the newest trigger, that
    contains all of them; the debounce counts from the first uncovered trigger, so messages that
    keep coming do not postpone the turn."""
    stack, llm = kit
    tag = new_tag()
    agent = stack.client.agents.create()
    append_all(agent, configured(llmRequestDebounceMs=1500))
    offsets = append_all(agent, *(user(f"{tag} part {i}") for i in range(3)))
    events = journal_until(agent, settled_count(1), "the coalesced turn")
    (requested,) = of(events, LLM_REQUEST_REQUESTED)
    first = next(e for e in events if e.offset == offsets[0])
    assert requested.idempotencyKey == f"agent/request/{offsets[-1]}"
    assert epoch_ms(requested.createdAt) >= epoch_ms(first.createdAt) + 1500
    (request,) = received(llm, tag)
    assert request.body["messages"] == rendered(events, requested.offset)
    users = [m["content"] for m in request.body["messages"] if m["role"] == "user"]
    assert users == [f"@{o} actor=user:cli\n{tag} part {i}" for i, o in enumerate(offsets)]

    # Continuous input: a message every 0.5 s; the turn still comes 1.5 s after the first of them.
    later = []
    for i in range(3):
        if i:
            time.sleep(0.5)
        later.append(agent.append(user(f"{tag} more {i}")))
    later_offsets = [receipt.wait(timeout=60) for receipt in later]
    events = journal_until(agent, settled_count(2), "the second turn")
    second = of(events, LLM_REQUEST_REQUESTED)[1]
    at = {e.offset: epoch_ms(e.createdAt) for e in events}
    assert second.idempotencyKey == f"agent/request/{later_offsets[-1]}"
    assert at[later_offsets[0]] + 1500 <= at[second.offset] < at[later_offsets[-1]] + 1500
    assert len(of(events, LLM_REQUEST_REQUESTED)) == 2


# --- 4. after-current-request -------------------------------------------------------------------------


def test_4_4_message_during_an_open_request_gets_the_next_turn(kit: tuple[Stack, ScriptedLLM]) -> None:
    """§4.2/§4.4 `after-current-request` (the default): a message that arrives while a request is
    open does not disturb it; it waits, and the next request answers it (with the first answer)."""
    stack, llm = kit
    tag = new_tag()
    ROUTER.on(tag, Reply("first answer", delay=2.0, usage=SMALL_USAGE))
    agent = stack.client.agents.create()
    (first,) = append_all(agent, user(f"{tag} first"))
    llm.wait_for(lambda rs: [r for r in rs if tag in request_text(r.body)], timeout=WAIT)
    (second,) = append_all(agent, user(f"{tag} second"))
    events = journal_until(agent, settled_count(2), "two turns")

    r1, r2 = of(events, LLM_REQUEST_REQUESTED)
    s1, s2 = settlements(events)
    assert r1.idempotencyKey == f"agent/request/{first}"
    assert r1.offset < second < s1.offset < r2.offset < s2.offset  # one open request at a time
    assert r2.idempotencyKey == f"agent/request/{second}"
    assert s1.payload.requestOffset == r1.offset and s1.payload.result.text == "first answer"
    assert s2.payload.requestOffset == r2.offset and s2.payload.result.status == "succeeded"

    one, two = received(llm, tag)
    assert one.completed and not one.disconnected
    assert one.body["messages"] == rendered(events, r1.offset)
    assert two.body["messages"] == rendered(events, r2.offset)
    assert f"{tag} second" not in request_text(one.body)
    (answer,) = [e for e in items(events, "assistant") if e.payload.llmRequestOffset == r1.offset]
    assert two.body["messages"][-3:-1] == [  # stream order: the message came before the answer
        {"role": "user", "content": f"@{second} actor=user:cli\n{tag} second"},
        {"role": "assistant", "content": f"@{answer.offset}\nfirst answer"},
    ]


# --- 5. interrupt ------------------------------------------------------------------------------------


def test_4_4_interrupt_aborts_the_call_and_journals_the_partial_output(kit: tuple[Stack, ScriptedLLM]) -> None:
    """§4.4 `interrupt-current-request`: the provider call is aborted (the server sees the client go
    away), the partial output is appended as an assistant item `[Response interrupted by the next
    message; partial output follows]\\n<partial>` without llmRequestOffset, then `settled {cancelled,
    interrupted-by-user-input, partialText}`; the interrupting item's trigger drives the next request,
    which contains the partial output and the interrupting message."""
    stack, llm = kit
    tag = new_tag()
    words = " ".join(f"word{i}" for i in range(60))
    ROUTER.on(tag, SlowStream(words, chunk_delay=0.2, usage=SMALL_USAGE))
    agent = stack.client.agents.create()
    (first,) = append_all(agent, user(f"{tag} tell me a long story"))
    llm.wait_for(lambda rs: [r for r in rs if tag in request_text(r.body) and r.chunks_sent >= 3], timeout=WAIT)
    (stop,) = append_all(
        agent, user(f"{tag} stop, new topic", llmRequestPolicy={"behaviour": "interrupt-current-request"})
    )
    cut = llm.wait_for_disconnect(timeout=WAIT)
    assert tag in request_text(cut.body) and not cut.completed
    events = journal_until(agent, settled_count(2), "the interrupted and the next turn")

    r1, r2 = of(events, LLM_REQUEST_REQUESTED)
    s1, s2 = settlements(events)
    result = s1.payload.result
    assert s1.payload.requestOffset == r1.offset and s1.idempotencyKey == f"agent/request/{r1.offset}/settled"
    assert (result.status, result.reason) == ("cancelled", "interrupted-by-user-input")
    partial = result.partialText
    assert partial and words.startswith(partial) and partial != words
    (partial_item,) = [e for e in items(events, "assistant") if e.offset < s1.offset]
    assert partial_item.payload.content == INTERRUPTED_PREFIX + partial
    assert INTERRUPTED_PREFIX == "[Response interrupted by the next message; partial output follows]\n"
    assert partial_item.payload.llmRequestOffset is None
    assert r1.offset < stop < partial_item.offset < s1.offset < r2.offset
    assert r2.idempotencyKey == f"agent/request/{stop}"
    assert s2.payload.result.status == "succeeded"

    one, two = received(llm, tag)
    assert one.index == cut.index and one.body["messages"] == rendered(events, r1.offset)
    assert two.body["messages"] == rendered(events, r2.offset)
    assert two.body["messages"][-3:-1] == [  # stream order: the interrupting message, then the partial
        {"role": "user", "content": f"@{stop} actor=user:cli\n{tag} stop, new topic"},
        {"role": "assistant", "content": f"@{partial_item.offset}\n{INTERRUPTED_PREFIX}{partial}"},
    ]
    assert r1.idempotencyKey == f"agent/request/{first}"


# --- 6. retries --------------------------------------------------------------------------------------


def test_4_3_failures_retry_with_backoff_then_give_up_and_a_new_message_starts_fresh(
    kit: tuple[Stack, ScriptedLLM],
) -> None:
    """§4.3 retries: each failure appends `settled {failed}` and `stream/error-occurred` ("… Retrying."
    while failures < maxAttempts, then "… Giving up; a new message starts fresh."); the failed
    settlement is the agent-loop trigger of the retry, delayed by the backoff; after maxAttempts no
    further request. Every error is transcribed as a developer item, actor integration
    "stream-error". A new message starts fresh."""
    stack, llm = kit
    tag = new_tag()
    ROUTER.on(tag, Fail(500), Fail(500), Fail(500))
    agent = stack.client.agents.create()
    append_all(
        agent,
        configured(
            llmRequestDebounceMs=50,
            llmRequestRetryPolicy={"maxAttempts": 3, "backoffBaseMs": 300, "backoffMaxMs": 400},
        ),
    )
    (message,) = append_all(agent, user(f"{tag} please"))
    # No fourth request after the third failure: checked on a fake clock
    # (tests/pipeline/journal/test_turns_clock.py); here the fresh message below gets the fourth
    # request.
    events = journal_until(agent, lambda es: len(of(es, STREAM_ERROR_OCCURRED)) >= 3, "three failures")

    requests = of(events, LLM_REQUEST_REQUESTED)
    failed = settlements(events)
    errors = of(events, STREAM_ERROR_OCCURRED)
    assert len(requests) == len(failed) == len(errors) == 3
    assert len(received(llm, tag)) == 3
    triggers = [message, failed[0].offset, failed[1].offset]
    assert [r.idempotencyKey for r in requests] == [f"agent/request/{t}" for t in triggers]
    reason = "HTTP 500 from the provider: scripted failure (500)"
    for k, (request, settled, error) in enumerate(zip(requests, failed, errors, strict=True), start=1):
        assert request.offset < settled.offset < error.offset
        assert settled.payload.requestOffset == request.offset
        assert settled.payload.result.model_dump() == {"status": "failed", "errorMessage": reason}
        head = f"LLM request @{request.offset} failed (attempt {k} of 3): {reason}."
        tail = "Retrying." if k < 3 else "Giving up; a new message starts fresh."
        assert error.payload.message == f"{head} {tail}"
    at = {e.offset: epoch_ms(e.createdAt) for e in events}
    # backoff min(base · 2^(failures-1), max) on top of the debounce: 300 ms, then 400 ms (capped)
    assert at[requests[1].offset] - at[failed[0].offset] >= 50 + 300
    assert at[requests[2].offset] - at[failed[1].offset] >= 50 + 400
    records = [r for r in call_records(stack, agent.path) if r["kind"] == "call"]
    assert [(r["attempt"], r["maxAttempts"]) for r in records] == [(1, 3), (2, 3), (3, 3)]

    state = fold_all(AgentState(), events)
    transcribed = [
        c.item for c in state.history.cells if c.item.actor is not None and c.item.actor.type == "integration"
    ]
    assert [(i.role, i.actor.name, i.llmRequestPolicy.behaviour, i.content) for i in transcribed] == [
        ("developer", "stream-error", "dont-trigger-request", f"Error on stream: {e.payload.message}") for e in errors
    ]
    assert turn_json(state)["status"] == "idle"
    retry = received(llm, tag)[1].body["messages"]
    assert retry == rendered(events, requests[1].offset)
    header = f'@{errors[0].offset} actor=integration:"stream-error"'
    assert {"role": "user", "content": f"{header}\nError on stream: {errors[0].payload.message}"} in retry

    (fresh,) = append_all(agent, user(f"{tag} try again"))
    events = journal_until(agent, settled_count(4), "the fresh turn")
    assert len(of(events, LLM_REQUEST_REQUESTED)) == 4
    request = of(events, LLM_REQUEST_REQUESTED)[3]
    assert request.idempotencyKey == f"agent/request/{fresh}"
    assert settlements(events)[3].payload.result.status == "succeeded"
    assert [r["attempt"] for r in call_records(stack, agent.path) if r["kind"] == "call"] == [1, 2, 3, 1]
    assert received(llm, tag)[3].body["messages"] == rendered(events, request.offset)


# --- 7. expiry ---------------------------------------------------------------------------------------


def test_4_3_expiry_settles_cancelled_expired_and_the_agent_is_idle(kit: tuple[Stack, ScriptedLLM]) -> None:
    """§4.3 expiry: an open request past expiresAt is settled `cancelled/expired` plus an error
    event; the agent is idle afterwards and nothing more is appended for that request (the caller
    drops the call: the provider sees the client go away)."""
    stack, llm = kit
    tag = new_tag()
    ROUTER.on(tag, Hang())
    agent = stack.client.agents.create()
    append_all(agent, configured(llmRequestExpiryMs=2500, llmRequestDebounceMs=50))
    (message,) = append_all(agent, user(f"{tag} hello?"))
    events = journal_until(agent, lambda es: of(es, STREAM_ERROR_OCCURRED), "the expiry")
    (requested,) = of(events, LLM_REQUEST_REQUESTED)
    (settled,) = settlements(events)
    (error,) = of(events, STREAM_ERROR_OCCURRED)
    r = requested.offset
    at_message = next(epoch_ms(e.createdAt) for e in events if e.offset == message)
    assert requested.payload.expiresAt == at_message + 2500
    assert epoch_ms(settled.createdAt) >= requested.payload.expiresAt
    assert settled.idempotencyKey == f"agent/request/{r}/expired"
    assert settled.payload.model_dump(exclude_none=True) == {
        "requestOffset": r,
        "result": {"status": "cancelled", "reason": "expired"},
    }
    assert error.payload.message == f"LLM request @{r} expired before it was answered; it was cancelled."
    assert settled.offset < error.offset
    assert turn_json(fold_all(AgentState(), events))["status"] == "idle"

    (hung,) = received(llm, tag)
    assert llm.wait_for(lambda rs: [x for x in rs if x.index == hung.index and x.disconnected], timeout=10), (
        "the caller kept the expired call open"
    )
    time.sleep(1.0)
    after = agent.stream.events()
    assert [e.offset for e in after] == [e.offset for e in events], "appends after the expiry settlement"


# --- 8. breaker --------------------------------------------------------------------------------------


def test_4_3_breaker_pauses_after_max_autonomous_turns_and_external_input_resumes(
    kit: tuple[Stack, ScriptedLLM],
) -> None:
    """§4.3 breaker: when an agent-loop trigger would open turn maxAutonomousTurns + 1 without
    external input, `agent/paused {reason: "autonomous turn limit reached (<n> consecutive turns
    without external input)", triggerOffset}` is appended and no request; an external trigger then
    appends `agent/resumed` and runs a turn."""
    stack, llm = kit
    tag = new_tag()
    agent = stack.client.agents.create()
    append_all(agent, configured(maxAutonomousTurns=1, llmRequestDebounceMs=50))
    (u1,) = append_all(agent, user(f"{tag} start"))
    journal_until(agent, settled_count(1), "the first turn")
    (d1,) = append_all(agent, developer(f"{tag} loop feedback 1"))  # agent-loop: autonomous turn 1
    events = journal_until(agent, settled_count(2), "the autonomous turn")
    assert of(events, LLM_REQUEST_REQUESTED)[1].idempotencyKey == f"agent/request/{d1}"
    (d2,) = append_all(agent, developer(f"{tag} loop feedback 2"))  # would be autonomous turn 2
    events = journal_until(agent, lambda es: of(es, AGENT_PAUSED), "the pause")
    (paused,) = of(events, AGENT_PAUSED)
    assert paused.payload.model_dump(exclude_none=True) == {
        "reason": "autonomous turn limit reached (1 consecutive turns without external input)",
        "triggerOffset": d2,
    }
    assert paused.payload.reason == breaker_reason(1) and paused.offset > d2
    # No request while paused, however long: checked on a fake clock
    # (tests/pipeline/journal/test_turns_clock.py).
    assert turn_json(fold_all(AgentState(), events))["status"] == "paused"

    (u2,) = append_all(agent, user(f"{tag} continue"))
    events = journal_until(agent, settled_count(3), "the resumed turn")
    (resumed,) = of(events, AGENT_RESUMED)
    r1, r2, r3 = of(events, LLM_REQUEST_REQUESTED)
    assert r1.idempotencyKey == f"agent/request/{u1}"
    assert paused.offset < u2 < resumed.offset < r3.offset
    assert r3.idempotencyKey == f"agent/request/{u2}"
    assert state_through(events, r2.offset).autonomous_turn_count == 1
    state = fold_all(AgentState(), events)
    assert not state.paused and state.autonomous_turn_count == 0
    assert settlements(events)[2].payload.result.status == "succeeded"
    last = received(llm, tag)[-1]
    assert last.body["messages"] == rendered(events, r3.offset)
    assert f"{tag} loop feedback 2" in request_text(last.body)  # recorded while paused


# --- 9. compaction -----------------------------------------------------------------------------------


def test_4_5_compaction_end_to_end(kit: tuple[Stack, ScriptedLLM]) -> None:
    """§4.5: usage of R at or over floor(maxContextTokens * compactionTriggerFraction) makes the
    caller summarize exactly R's messages plus a trailing instruction; the summary is journaled as a
    developer item with `compaction.replacesHistoryThrough = R`, key `agent/compact-context@<report>`;
    the next request carries the summary as a provider `user` message right after the system lane,
    then every history item after R (the answer to R included) verbatim; older history is gone."""
    stack, llm = kit
    tag = new_tag()
    summary = "The user greeted me with alpha; I answered."
    ROUTER.on(
        tag,
        Reply("answer one", usage=(150, 10)),  # 160 >= floor(200 * 0.5) = 100
        lambda body: (
            Reply(summary, usage=(30, 8))
            if body["messages"][-1]["content"] == COMPACTION_INSTRUCTION
            else Reply("not the summary request", usage=SMALL_USAGE)
        ),
        Reply("answer two", usage=SMALL_USAGE),
    )
    agent = stack.client.agents.create()
    append_all(agent, configured(compactionTriggerFraction=0.5, llmRequestDebounceMs=50))
    (u1,) = append_all(agent, user(f"{tag} alpha"))
    events = journal_until(agent, lambda es: items(es, "developer"), "the compaction summary")
    (requested,) = of(events, LLM_REQUEST_REQUESTED)
    r = requested.offset
    (report,) = of(events, TOKEN_USAGE_REPORTED)
    (summary_event,) = items(events, "developer")
    item = summary_event.payload
    assert report.payload.llmRequestOffset == r and report.payload.maxContextTokens == CONTEXT_TOKENS
    assert summary_event.idempotencyKey == f"agent/compact-context@{report.offset}"
    assert item.compaction.model_dump(exclude_none=True) == {
        "replacesHistoryThrough": r,
        "usage": {"inputTokens": 30, "outputTokens": 8},
    }
    assert item.llmRequestPolicy.behaviour == "dont-trigger-request" and item.key is None
    assert item.content == (
        f"[Earlier conversation history was compacted through @{r} (~160 tokens > 100). Summary:]\n\n{summary}"
    )
    turn, compaction = received(llm, tag)
    assert not is_compaction(turn) and is_compaction(compaction)
    assert not compaction.body.get("stream")
    assert compaction.body["messages"] == [
        *turn.body["messages"],
        {"role": "system", "content": COMPACTION_INSTRUCTION},
    ]
    assert turn.body["messages"] == rendered(events, r)

    (u2,) = append_all(agent, user(f"{tag} beta"))
    events = journal_until(agent, settled_count(2), "the turn after the compaction")
    assert len(of(events, LLM_REQUEST_REQUESTED)) == 2  # the summary itself triggered nothing
    r2 = of(events, LLM_REQUEST_REQUESTED)[1]
    assert r2.idempotencyKey == f"agent/request/{u2}"
    (answer,) = [e for e in items(events, "assistant") if e.payload.llmRequestOffset == r]
    messages = received(llm, tag)[2].body["messages"]
    assert messages == rendered(events, r2.offset)
    assert [m["role"] for m in messages] == ["system", "system", "user", "assistant", "user", "system"]
    assert messages[1]["content"].startswith('@2 key="agent/system-prompt"\n')
    assert messages[2:5] == [
        {"role": "user", "content": f"@{summary_event.offset}\n{item.content}"},
        {"role": "assistant", "content": f"@{answer.offset}\nanswer one"},
        {"role": "user", "content": f"@{u2} actor=user:cli\n{tag} beta"},
    ]
    assert f"{tag} alpha" not in request_text({"messages": messages})  # history through R is gone
    assert u1 < r < answer.offset < report.offset < summary_event.offset < u2


# --- 10. caller restart ------------------------------------------------------------------------------


def test_4_3_caller_killed_mid_call_ends_with_exactly_one_settlement(kit: tuple[Stack, ScriptedLLM]) -> None:
    """§4.3 (idempotency keys derive from R, so a retried caller cannot double-append): the caller is
    SIGKILLed while the provider hangs; the restarted caller repeats the call with the same
    messages; the journal ends with exactly one assistant item and one succeeded settlement for R."""
    stack, llm = kit
    tag = new_tag()
    ROUTER.on(tag, Hang(partial="thinking "), Reply("final answer", usage=SMALL_USAGE))
    agent = stack.client.agents.create()
    (message,) = append_all(agent, user(f"{tag} what now?"))
    llm.wait_for(lambda rs: [r for r in rs if tag in request_text(r.body) and r.chunks_sent >= 1], timeout=WAIT)
    stack.stop_caller(signal.SIGKILL)
    llm.wait_for(lambda rs: [r for r in rs if tag in request_text(r.body) and r.disconnected], timeout=10)
    stack.start_caller()
    events = journal_until(agent, settled_count(1), "the repeated call's settlement", timeout=90)
    time.sleep(1.5)  # let any duplicate appends land
    events = agent.stream.events()
    (requested,) = of(events, LLM_REQUEST_REQUESTED)
    r = requested.offset
    assert requested.idempotencyKey == f"agent/request/{message}"
    (settled,) = settlements(events)
    assert settled.payload.requestOffset == r and settled.payload.result.text == "final answer"
    assert [e.payload.content for e in items(events, "assistant")] == ["final answer"]
    assert items(events, "assistant")[0].payload.llmRequestOffset == r
    assert len(of(events, TOKEN_USAGE_REPORTED)) == 1
    first, second = received(llm, tag)
    assert first.disconnected and second.completed
    assert first.body["messages"] == second.body["messages"] == rendered(events, r)
    assert turn_json(fold_all(AgentState(), events))["status"] == "idle"


# --- 11. secrets, context overflow, oversized items ------------------------------------------------


def test_secrets_never_reach_the_journal_nor_the_next_request(kit: tuple[Stack, ScriptedLLM]) -> None:
    """Secrets never reach the journal: a provider that answers 401 quoting the request's
    Authorization header gets a failed settlement and an error event without the key, and the
    retry, which renders that error, does not carry it to the provider either."""
    stack, llm = kit
    tag = new_tag()
    ROUTER.on(tag, Fail(401, echo_headers=("authorization",)), Reply("fine now", usage=SMALL_USAGE))
    agent = stack.client.agents.create()
    append_all(
        agent,
        configured(
            llmRequestDebounceMs=50, llmRequestRetryPolicy={"maxAttempts": 3, "backoffBaseMs": 100, "backoffMaxMs": 200}
        ),
    )
    append_all(agent, user(f"{tag} hello"))
    events = journal_until(agent, settled_count(2), "the failure and the retry")
    first, retry = received(llm, tag)
    assert first.headers["Authorization"] == f"Bearer {API_KEY}" and first.status == 401
    failed, succeeded = settlements(events)
    error = "HTTP 401 from the provider: scripted failure (401) (authorization: Bearer [redacted])"
    assert failed.payload.result.errorMessage == error
    assert succeeded.payload.result.status == "succeeded"
    (stream_error,) = of(events, STREAM_ERROR_OCCURRED)
    assert error in stream_error.payload.message
    journal = orjson.dumps([e.model_dump(mode="json") for e in events]).decode()
    assert API_KEY not in journal and "Bearer sk-" not in journal
    assert retry.body["messages"] == rendered(events, of(events, LLM_REQUEST_REQUESTED)[1].offset)
    assert f"Error on stream: {stream_error.payload.message}" in request_text(retry.body)
    assert API_KEY not in request_text(retry.body)


def test_context_that_outgrows_the_model_recovers_by_itself(kit: tuple[Stack, ScriptedLLM]) -> None:
    """Context that outgrows the model recovers by itself: the request R that no longer fits the
    model's window (HTTP 400, llama-cpp-python's words) is summarized with the oldest history left
    out until the summary call fits; the summary replaces history through R, R settles failed
    ("compacted ... will be retried"), and the retry answers from the compacted context."""
    stack, llm = kit
    tag = new_tag()
    summary = f"{tag}: four long turns, then a final question about z."

    def respond(body: dict[str, Any]) -> Response:
        if body["messages"][-1]["content"] == COMPACTION_INSTRUCTION:
            return Reply(summary, usage=(30, 8))
        return Reply(f"ok: {last_user_text(body)[:40]}", usage=SMALL_USAGE)

    ROUTER.on(tag, *[respond] * 20)
    agent = stack.client.agents.create()
    append_all(
        agent,
        configured(
            llmRequestDebounceMs=50, llmRequestRetryPolicy={"maxAttempts": 3, "backoffBaseMs": 100, "backoffMaxMs": 200}
        ),
    )
    for i in range(4):
        append_all(agent, user(f"{tag} turn {i} " + "y" * 1200))
        journal_until(agent, settled_count(i + 1), f"turn {i}")
    window = prompt_tokens(received(llm, tag)[-1].body) + 200  # the next message (~310 tokens) will not fit
    llm.context_tokens, llm.overflow = window, "llama-cpp-python"
    try:
        (question,) = append_all(agent, user(f"{tag} final question " + "z" * 1200))
        events = journal_until(agent, settled_count(6), "the overflow and its retry")
    finally:
        llm.context_tokens = None

    requests = of(events, LLM_REQUEST_REQUESTED)
    assert len(requests) == 6
    r, retry = requests[4], requests[5]
    (compaction,) = [e for e in items(events) if e.payload.compaction is not None]
    failed, answered = settlements(events)[4:]
    (stream_error,) = of(events, STREAM_ERROR_OCCURRED)
    assert question < r.offset < compaction.offset < failed.offset < stream_error.offset < retry.offset
    assert compaction.idempotencyKey == f"agent/compact-context@overflow-{r.offset}"
    assert compaction.payload.compaction.replacesHistoryThrough == r.offset
    assert compaction.payload.llmRequestPolicy.behaviour == "dont-trigger-request"
    assert compaction.payload.content.startswith(
        f"[Earlier conversation history was compacted through @{r.offset} because request @{r.offset} exceeded "
        "the model's context window; the "
    )
    assert compaction.payload.content.endswith(f"Summary:]\n\n{summary}")
    assert failed.payload.requestOffset == r.offset and failed.payload.result.status == "failed"
    assert failed.payload.result.errorMessage.startswith(
        f"the request exceeded the model's context window, so the context was compacted through @{r.offset} and "
        "the request will be retried (HTTP 400 from the provider: This model's maximum context length is "
    )
    assert retry.idempotencyKey == f"agent/request/{failed.offset}"  # the failed settlement's trigger
    assert answered.payload.requestOffset == retry.offset and answered.payload.result.status == "succeeded"

    overflowed, *summaries, answer = received(llm, tag)[4:]
    assert overflowed.response == "context-overflow" and overflowed.body["messages"] == rendered(events, r.offset)
    assert summaries and all(is_compaction(s) for s in summaries)
    assert [s.response for s in summaries] == ["context-overflow"] * (len(summaries) - 1) + ["reply"]
    assert f"{tag} final question" in summaries[-1].body["messages"][-3]["content"]  # the newest item is kept
    assert prompt_tokens(summaries[-1].body) < window
    assert answer.body["messages"] == rendered(events, retry.offset)
    assert prompt_tokens(answer.body) < window
    assert answer.body["messages"][2] == {
        "role": "user",
        "content": f"@{compaction.offset}\n{compaction.payload.content}",
    }
    assert "y" * 100 not in request_text(answer.body)  # history through R is gone
    state = fold_all(AgentState(), events)
    assert turn_json(state)["status"] == "idle" and state.consecutive_llm_failures == 0


def test_items_larger_than_the_window_are_cut_and_the_request_still_publishes(kit: tuple[Stack, ScriptedLLM]) -> None:
    """An item larger than the window renders cut with a notice naming its offset, and no record
    the journal worker publishes may fail on size: two 600 KB items then a normal one make one
    request record of over 1 MB (Kafka's default limit) that is published, and the model answers.
    (The kit checks the worker is still up.)"""
    stack, llm = kit
    tag = new_tag()
    quiet = {"llmRequestPolicy": {"behaviour": "dont-trigger-request"}}
    agent = stack.client.agents.create()
    append_all(agent, configured(llm={"model": WIDE_MODEL}))
    first, second, third = append_all(
        agent, user("a" * 600_000, **quiet), user("b" * 600_000, **quiet), user("c" * 600_000, **quiet)
    )
    (question,) = append_all(agent, user(f"{tag} and now a normal question"))
    events = journal_until(agent, settled_count(1), "the turn", timeout=60)
    (requested,) = of(events, LLM_REQUEST_REQUESTED)
    (settled,) = settlements(events)
    assert settled.payload.result.status == "succeeded"
    assert settled.payload.result.text == f"ok: @{question} actor=user:cli\n{tag} and now a normal question"

    records = [m.value() for m in stack.read_topic(stack.client.topics.llm_requests) if m.key() == agent.path.encode()]
    (raw,) = [v for v in records if orjson.loads(v)["kind"] == "call"]
    assert 1_048_576 < len(raw) <= MAX_RECORD_BYTES  # over the old producer limit, within the topic's
    messages = orjson.loads(raw)["messages"]
    assert messages == rendered(events, requested.offset)
    cap = BUDGETS.render_budget_for(WIDE_MODEL).history_cap  # the model's window: 128k tokens
    for offset, message in ((first, messages[2]), (second, messages[3]), (third, messages[4])):
        assert message["content"].startswith(f"@{offset} actor=user:cli\n")
        assert message["content"].endswith(f"The journal keeps it whole at @{offset}.]")
        assert len(message["content"].encode()) <= cap <= DEFAULT_BUDGET.item_bytes
    (request,) = received(llm, tag)
    assert request.body["messages"] == messages


# --- 12. the embedded model --------------------------------------------------------------------------

MODEL_URL = f"http://127.0.0.1:{os.environ.get('AGENTSTREAM_MODEL_PORT', '18080')}/v1"  # scripts/model/start.sh
SMOLLM2 = "smollm2"
SMOLLM2_CONTEXT = 600  # so that the first turn (protocol + base policy + a message) crosses 50 %


@pytest.fixture(scope="module")
def embedded_model() -> Iterator[str]:
    """The embedded model server: started here if it is not running, and then stopped here."""
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "model" / "start.sh")], capture_output=True, text=True, timeout=300
    )
    if result.returncode != 0:
        pytest.fail(f"the embedded model did not start:\n{result.stdout}{result.stderr}")
    started = "already running" not in result.stdout
    try:
        yield MODEL_URL
    finally:
        if started:
            subprocess.run(["bash", str(REPO / "scripts" / "model" / "stop.sh")], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def model_stack(tmp_path_factory: pytest.TempPathFactory, embedded_model: str) -> Iterator[Stack]:
    stack = Stack(
        tmp_path_factory.mktemp("model"),
        openai_base_url=embedded_model,
        openai_api_key="local",
        llm_transport=TRANSPORT,  # llama-cpp rejects the developer role
        llm_model=SMOLLM2,
        llm_max_tokens=48,
        llm_context_tokens={SMOLLM2: SMOLLM2_CONTEXT},
        llm_stream=False,  # llama-cpp reports token usage only on non-streaming responses
    )
    try:
        stack.start_worker()
        stack.start_caller()
        yield stack
    finally:
        _close(stack)


@pytest.mark.model
def test_model_one_real_turn(model_stack: Stack) -> None:
    """§4.2/§4.3 against the embedded model (openai-compatible transport): one real turn, the
    request body is the rendered fold through R without any developer message."""
    agent = model_stack.client.agents.create()
    (message,) = append_all(agent, user("Say hello in one short sentence."))
    events = journal_until(agent, settled_count(1), "a real turn", timeout=180)
    (requested,) = of(events, LLM_REQUEST_REQUESTED)
    r = requested.offset
    assert requested.idempotencyKey == f"agent/request/{message}" and requested.payload.model == SMOLLM2
    (settled,) = settlements(events)
    assert settled.payload.result.status == "succeeded", settled.payload.result
    (answer,) = items(events, "assistant")
    assert answer.payload.llmRequestOffset == r and answer.payload.content.strip()
    assert answer.payload.content == settled.payload.result.text
    (record,) = [c for c in call_records(model_stack, agent.path) if c["kind"] == "call"]
    assert record["messages"] == rendered(events, r)
    assert record["transport"] == TRANSPORT
    assert {m["role"] for m in record["messages"]} <= {"system", "user", "assistant"}


@pytest.mark.model
def test_model_one_real_compaction(model_stack: Stack) -> None:
    """§4.5 against the embedded model: the first turn's usage crosses floor(600 * 0.5), so the
    caller summarizes request R and the summary replaces history through R. This needs the turn's
    token usage: the caller must report it (§4.3) for the compaction to be triggered at all."""
    agent = model_stack.client.agents.create()
    append_all(agent, configured(compactionTriggerFraction=0.5))
    append_all(agent, user("My name is Ada and my favourite colour is green. Say hi."))
    events = journal_until(agent, settled_count(1), "a real turn", timeout=180)
    (requested,) = of(events, LLM_REQUEST_REQUESTED)
    r = requested.offset
    (settled,) = settlements(events)
    assert settled.payload.result.status == "succeeded", settled.payload.result
    time.sleep(1.0)
    reports = of(agent.stream.events(), TOKEN_USAGE_REPORTED)
    assert reports, (
        "no token-usage-reported for the embedded model's turn: llama-cpp-python streams carry no usage "
        "(stream_options.include_usage is ignored) and the caller reports none, so §4.5 compaction can "
        f"never trigger on the embedded model (settlement: {settled.payload.result.model_dump()})"
    )
    (report,) = reports
    threshold = int(SMOLLM2_CONTEXT * 0.5)
    assert report.payload.inputTokens + report.payload.outputTokens >= threshold
    events = journal_until(agent, lambda es: items(es, "developer"), "the summary", timeout=180)
    (summary,) = items(events, "developer")
    assert summary.idempotencyKey == f"agent/compact-context@{report.offset}"
    assert summary.payload.compaction.replacesHistoryThrough == r
    assert summary.payload.content.startswith(f"[Earlier conversation history was compacted through @{r} ")
    state = fold_all(AgentState(), events)
    assert state.history.cells[0].item.compaction is not None
    assert all(c.offset > r for c in state.history.cells[1:])
