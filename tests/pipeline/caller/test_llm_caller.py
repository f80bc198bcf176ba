"""Integration: the LLM caller worker against the real local broker and the scripted provider
(docs/behaviour.md §3.2, §4.3, §4.4, §4.5). No mocks: records go into a real `llm-requests` topic, the caller
calls a real HTTP server through the openai SDK, and the tests read the append commands it wrote to
`agent-appends` (the journal worker is not needed for that).

Most tests share one caller (a background thread with its own event loop) on one isolated topic
set; the restart test runs the caller as real processes that it SIGKILLs and SIGTERMs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from pipeline.caller import LlmCaller
from pipeline.settings import Settings
from processors import llm_outcomes
from schemas.events import (
    CONTEXT_ADDED,
    LLM_REQUEST_SETTLED,
    STREAM_ERROR_OCCURRED,
    TOKEN_USAGE_REPORTED,
    AppendCommand,
    parse_consumed_input,
)
from schemas.requests import COMPACTION_INSTRUCTION
from tests.kafka_stack import BOOTSTRAP, REPO, Stack, wait_until
from tests.support.scripted_llm import (
    LLAMA_CPP_DEVELOPER_BODY,
    Drop,
    Fail,
    Garbage,
    Hang,
    OverflowStyle,
    Reply,
    ScriptedLLM,
    SlowStream,
    last_user_text,
    prompt_tokens,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

TIMEOUT_S = 3.0  # the shared caller's llm_timeout_s
API_KEY = "sk-proj-Scripted0123456789abcdefXYZ"  # shaped like a real key: it must never be journaled
MODEL = "m-small"
CONTEXT_TOKENS = 4096

SHORT = {
    CONTEXT_ADDED: "context",
    LLM_REQUEST_SETTLED: "settled",
    TOKEN_USAGE_REPORTED: "usage",
    STREAM_ERROR_OCCURRED: "error",
}


# --- fixtures and helpers ----------------------------------------------------------------------------


def caller_settings(stack: Stack, llm: ScriptedLLM, **overrides: Any) -> Settings:
    values = stack.settings.model_dump()
    values.update(
        openai_base_url=llm.base_url,
        openai_api_key=API_KEY,
        llm_transport="openai-compatible",
        llm_timeout_s=TIMEOUT_S,
        llm_max_in_flight=8,
        llm_max_tokens=64,
        llm_context_tokens={MODEL: CONTEXT_TOKENS},
        caller_group=f"caller-{uuid.uuid4().hex[:8]}",
        log_level="INFO",
    )
    values.update(overrides)
    return Settings.from_env({}, **values)


class CallerThread:
    """The caller in this process: its own thread and event loop."""

    def __init__(self, settings: Settings, **options: Any) -> None:
        options = {"commit_interval_s": 0.1, "shutdown_timeout_s": 5, **options}
        self.caller = LlmCaller(settings, **options)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="llm-caller", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self.caller.serve())
        except BaseException as error:
            self.error = error

    def start(self) -> CallerThread:
        self.thread.start()
        assert self.caller.ready.wait(60), "the caller got no partitions"
        return self

    def stop(self) -> None:
        self.caller.request_stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the caller did not stop"


@pytest.fixture(scope="module")
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as server:
        yield server


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(tmp_path_factory.mktemp("caller"))
    try:
        yield stack
    finally:
        stack.close()


@pytest.fixture(scope="module")
def shared_caller(stack: Stack, llm: ScriptedLLM) -> Iterator[CallerThread]:
    caller = CallerThread(caller_settings(stack, llm)).start()
    yield caller
    caller.stop()
    assert caller.error is None, caller.error


@pytest.fixture
def kit(stack: Stack, llm: ScriptedLLM, shared_caller: CallerThread) -> Iterator[tuple[Stack, ScriptedLLM]]:
    llm.reset()
    yield stack, llm
    assert shared_caller.error is None and shared_caller.thread.is_alive(), "the caller crashed"


def new_path() -> str:
    return f"/agents/caller-{uuid.uuid4().hex[:10]}"


def conversation(tag: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": 'You are terse.\nNever say "never".'},
        {"role": "system", "content": '@2 key="agent/system-prompt"\nBe kind ✓ — ünïcødé'},
        {"role": "user", "content": f"@5 actor=user:cli\n{tag}"},
    ]


def call(path: str, offset: int, tag: str | None = None, **kw: Any) -> dict[str, Any]:
    return {
        "kind": "call",
        "streamPath": path,
        "requestOffset": offset,
        "model": kw.pop("model", MODEL),
        "transport": kw.pop("transport", "openai-compatible"),
        "expiresAt": kw.pop("expiresAt", int(time.time() * 1000) + 600_000),
        "attempt": kw.pop("attempt", 1),
        "maxAttempts": kw.pop("maxAttempts", 3),
        "messages": kw.pop("messages", None) or conversation(tag or f"{path} @{offset}"),
    }


def cancel(path: str, offset: int) -> dict[str, Any]:
    return {"kind": "cancel", "streamPath": path, "requestOffset": offset, "reason": "interrupted-by-user-input"}


def produce(stack: Stack, *records: dict[str, Any] | tuple[str, bytes]) -> None:
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "partitioner": "murmur2_random", "log_level": 3})
    for record in records:
        key, value = record if isinstance(record, tuple) else (record["streamPath"], json.dumps(record).encode())
        producer.produce(stack.client.topics.llm_requests, key=key.encode(), value=value)
    assert producer.flush(10) == 0


def appends(stack: Stack, path: str) -> list[dict[str, Any]]:
    """The append commands for `path`, in produced order, each checked against the event contract."""
    commands = [
        json.loads(m.value())
        for m in stack.read_topic(stack.client.topics.internal_appends)
        if m.key() == path.encode()
    ]
    for command in commands:
        AppendCommand.model_validate(command)
        parse_consumed_input({k: command[k] for k in ("type", "payload", "idempotencyKey")})
    return commands


def wait_appends(stack: Stack, path: str, n: int, timeout: float = 20.0) -> list[dict[str, Any]]:
    def enough() -> list[dict[str, Any]] | None:
        commands = appends(stack, path)
        return commands if len(commands) >= n else None

    return wait_until(enough, timeout, f"{n} appends for {path}", interval=0.2)


def shape(commands: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(SHORT.get(c["type"], c["type"]), c["idempotencyKey"]) for c in commands]


def by_tag(table: dict[str, Any]) -> Callable[[dict[str, Any]], Any]:
    """A script entry answering by the request's last user message (for concurrent streams)."""

    def respond(body: dict[str, Any]) -> Any:
        return table[last_user_text(body).split("\n", 1)[1]]

    return respond


def requests_for(llm: ScriptedLLM, tag: str) -> list[Any]:
    return [r for r in llm.records if r.body and last_user_text(r.body).endswith(tag)]


# --- the worker ------------------------------------------------------------------------------------


def test_success_appends_assistant_settlement_and_usage_in_order(kit: tuple[Stack, ScriptedLLM]) -> None:
    """§4.3: assistant item, then settled {succeeded}, then token usage; keys derive from R."""
    stack, llm = kit
    path = new_path()
    llm.push(Reply("Hello there,\nfriend.", usage=(42, 5)))
    record = call(path, 7)
    produce(stack, record)
    commands = wait_appends(stack, path, 3)
    assert shape(commands) == [
        ("context", "agent/request/7/assistant"),
        ("settled", "agent/request/7/settled"),
        ("usage", "agent/request/7/usage"),
    ]
    assistant, settled, usage = (c["payload"] for c in commands)
    assert assistant == {"role": "assistant", "content": "Hello there,\nfriend.", "llmRequestOffset": 7}
    assert isinstance(settled.pop("durationMs"), int)
    assert settled == {
        "requestOffset": 7,
        "result": {
            "status": "succeeded",
            "text": "Hello there,\nfriend.",
            "usage": {"inputTokens": 42, "outputTokens": 5},
        },
    }
    assert usage == {
        "llmRequestOffset": 7,
        "model": MODEL,
        "maxContextTokens": CONTEXT_TOKENS,
        "inputTokens": 42,
        "outputTokens": 5,
    }
    (request,) = llm.records
    assert request.body["messages"] == record["messages"]  # byte for byte, roles as given
    assert request.body["model"] == MODEL and request.body["max_tokens"] == 64
    assert request.body["stream"] is True and request.body["stream_options"] == {"include_usage": True}
    time.sleep(0.5)
    assert len(appends(stack, path)) == 3


def test_usage_in_both_shapes_and_none(kit: tuple[Stack, ScriptedLLM]) -> None:
    """§4.3: chat- and responses-shaped usage give the same report; no usage, no report."""
    stack, llm = kit
    chat, responses, none = new_path(), new_path(), new_path()
    llm.push(
        *[
            by_tag(
                {
                    chat: Reply(
                        "chat shape",
                        usage={
                            "prompt_tokens": 20,
                            "completion_tokens": 4,
                            "total_tokens": 24,
                            "prompt_tokens_details": {"cached_tokens": 8},
                            "completion_tokens_details": {"reasoning_tokens": 1},
                        },
                    ),
                    responses: Reply(
                        "responses shape",
                        usage={
                            "input_tokens": 20,
                            "output_tokens": 4,
                            "total_tokens": 24,
                            "input_tokens_details": {"cached_tokens": 8},
                            "output_tokens_details": {"reasoning_tokens": 1},
                        },
                    ),
                    none: Reply("no usage", usage=None),
                }
            )
        ]
        * 3
    )
    produce(stack, call(chat, 3, chat), call(responses, 3, responses), call(none, 3, none))
    expected = {"inputTokens": 20, "outputTokens": 4, "cachedInputTokens": 8, "reasoningOutputTokens": 1}
    for path in (chat, responses):
        commands = wait_appends(stack, path, 3)
        assert commands[1]["payload"]["result"]["usage"] == expected
        assert commands[2]["payload"] == {
            "llmRequestOffset": 3,
            "model": MODEL,
            "maxContextTokens": CONTEXT_TOKENS,
            **expected,
        }
    commands = wait_appends(stack, none, 2)
    assert shape(commands) == [("context", "agent/request/3/assistant"), ("settled", "agent/request/3/settled")]
    assert "usage" not in commands[1]["payload"]["result"]
    time.sleep(0.5)
    assert len(appends(stack, none)) == 2


def test_provider_failures_settle_failed_with_an_error_event(kit: tuple[Stack, ScriptedLLM]) -> None:
    """§4.3: 429, 5xx, garbage, timeouts and dropped connections are failures, never crashes;
    the error event says "Retrying." below maxAttempts and "Giving up" at it."""
    stack, llm = kit
    cases = {
        # path: (response, attempt, expected errorMessage (prefix))
        new_path(): (Fail(429), 1, "HTTP 429 from the provider: scripted failure (429)"),
        new_path(): (
            Fail(500, body=LLAMA_CPP_DEVELOPER_BODY),
            3,
            "HTTP 500 from the provider: 7 validation errors: {'type': 'literal_error'",
        ),
        new_path(): (
            Fail(502, body="<html>bad gateway</html>", content_type="text/html"),
            2,
            "HTTP 502 from the provider: <html>bad gateway</html>",
        ),
        new_path(): (Garbage("non-json"), 2, "the provider's response is not a chat completion stream"),
        new_path(): (Garbage("no-choices"), 1, "the provider's response is not a chat completion stream"),
        new_path(): (Reply("", usage=None), 1, "the provider returned an empty response"),
        new_path(): (
            Hang(partial="never finished"),
            3,
            f"no complete response from the provider within {TIMEOUT_S:g}s",
        ),
        new_path(): (Drop(partial="cut"), 2, "connection to the provider failed: the provider closed the connection"),
    }
    llm.push(*[by_tag({path: response for path, (response, _, _) in cases.items()})] * len(cases))
    produce(stack, *(call(path, 12, path, attempt=attempt, maxAttempts=3) for path, (_, attempt, _) in cases.items()))
    for path, (_, attempt, expected) in cases.items():
        commands = wait_appends(stack, path, 2, timeout=TIMEOUT_S + 20)
        assert shape(commands) == [("settled", "agent/request/12/settled"), ("error", "agent/request/12/error")], path
        result = commands[0]["payload"]["result"]
        assert result["status"] == "failed"
        error = result["errorMessage"]
        assert error.startswith(expected), (expected, error)
        assert "\n" not in error and "Traceback" not in error
        tail = "Retrying." if attempt < 3 else "Giving up; a new message starts fresh."
        assert commands[1]["payload"] == {
            "message": f"LLM request @12 failed (attempt {attempt} of 3): {error}. {tail}"
        }
    time.sleep(0.3)
    assert all(len(appends(stack, path)) == 2 for path in cases)


def test_cancel_aborts_the_http_call_and_appends_the_partial(kit: tuple[Stack, ScriptedLLM]) -> None:
    """§4.4: interrupt-current-request aborts the provider call (the server sees the disconnect),
    appends the partial output without llmRequestOffset, then settled {cancelled}."""
    stack, llm = kit
    path = new_path()
    llm.push(Hang(partial="Partial answer so far"))
    produce(stack, call(path, 11))
    llm.wait_for(lambda rs: rs and rs[0].chunks_sent >= 4, timeout=15)
    produce(stack, cancel(path, 11))
    gone = llm.wait_for_disconnect(timeout=10)
    assert gone.disconnected and not gone.completed
    commands = wait_appends(stack, path, 2)
    assert shape(commands) == [("context", "agent/request/11/partial"), ("settled", "agent/request/11/settled")]
    assert commands[0]["payload"] == {
        "role": "assistant",
        "content": "[Response interrupted by the next message; partial output follows]\nPartial answer so far",
    }
    assert commands[1]["payload"] == {
        "requestOffset": 11,
        "result": {
            "status": "cancelled",
            "reason": "interrupted-by-user-input",
            "partialText": "Partial answer so far",
        },
    }
    # A cancel for a call that already settled does nothing.
    produce(stack, cancel(path, 11))
    time.sleep(1.0)
    assert len(appends(stack, path)) == 2


def test_cancel_for_a_call_not_started_yet_settles_without_calling(kit: tuple[Stack, ScriptedLLM]) -> None:
    """§4.4: a cancel for a call still waiting behind its stream's running call settles it as
    cancelled exactly once and the provider never sees it."""
    stack, llm = kit
    path = new_path()
    llm.push(Hang())
    produce(stack, call(path, 20, "first"))
    llm.wait_for_requests(1, timeout=15)
    produce(stack, call(path, 21, "second"), cancel(path, 21))
    commands = wait_appends(stack, path, 1)
    assert shape(commands) == [("settled", "agent/request/21/settled")]
    assert commands[0]["payload"] == {
        "requestOffset": 21,
        "result": {"status": "cancelled", "reason": "interrupted-by-user-input"},
    }
    produce(stack, cancel(path, 20))  # the running one (no partial text: nothing was streamed)
    llm.wait_for_disconnect(timeout=10)
    commands = wait_appends(stack, path, 2)
    assert shape(commands)[1] == ("settled", "agent/request/20/settled")
    assert commands[1]["payload"]["result"] == {"status": "cancelled", "reason": "interrupted-by-user-input"}
    time.sleep(0.5)
    assert len(llm.records) == 1 and len(appends(stack, path)) == 2


def settled_notice(path: str, offset: int) -> dict[str, Any]:
    return {"kind": "settled", "streamPath": path, "requestOffset": offset}


def test_a_settled_notice_stops_the_call_for_r_and_nothing_is_appended(kit: tuple[Stack, ScriptedLLM]) -> None:
    """R settled in the journal (e.g. by an earlier run of a restarted caller): a running call for R
    is stopped (the server sees the disconnect), a waiting one is never made; neither appends."""
    stack, llm = kit
    running, waiting = new_path(), new_path()
    table = {"running": Hang(partial="half an answer"), "blocker": Hang()}  # whichever arrives first
    llm.push(by_tag(table), by_tag(table))
    produce(stack, call(running, 30, "running"), call(waiting, 40, "blocker"))
    llm.wait_for(lambda rs: len(rs) == 2 and requests_for(llm, "running")[0].chunks_sent >= 1, timeout=15)
    index = llm.records.index(requests_for(llm, "running")[0])
    # The cancel ends the blocker (only its own settlement goes out); sent at once, behind the notice
    # on the same stream, so the blocker never reaches the shared caller's 3 s timeout meanwhile.
    produce(
        stack,
        call(waiting, 41, "waiting"),
        settled_notice(waiting, 41),
        settled_notice(running, 30),
        cancel(waiting, 40),
    )
    gone = llm.wait_for_disconnect(timeout=10, index=index)
    assert gone.disconnected and not gone.completed
    wait_appends(stack, waiting, 1)
    time.sleep(1.0)
    assert shape(appends(stack, waiting)) == [("settled", "agent/request/40/settled")]
    assert appends(stack, running) == []
    assert requests_for(llm, "waiting") == []


def test_compaction_sends_exact_messages_plus_instruction(kit: tuple[Stack, ScriptedLLM]) -> None:
    """§4.5 and §3.2: request R's messages byte for byte plus the summary instruction (developer on
    openai, system on openai-compatible); the summary item replaces history through R."""
    stack, llm = kit
    compatible, native, failing = new_path(), new_path(), new_path()
    messages = [
        *conversation("what did we decide?"),
        {"role": "assistant", "content": "@6\nWe decided on plan B."},
        {"role": "system", "content": "Current date and time (UTC): 2026-12-02T10:13:51.123Z"},
    ]
    llm.push(
        *[
            by_tag(
                {
                    "what did we decide?": Reply("Goal: plan B (@6).", usage=(100, 20)),
                }
            )
        ]
    )

    def compact(path: str, transport: str, report: int) -> dict[str, Any]:
        return {
            "kind": "compact",
            "streamPath": path,
            "requestOffset": 9,
            "reportOffset": report,
            "model": MODEL,
            "transport": transport,
            "tokens": 3000,
            "threshold": 2048,
            "messages": messages
            if transport == "openai-compatible"
            else [{**m, "role": "developer"} if m["content"].startswith("Current") else m for m in messages],
        }

    produce(stack, compact(compatible, "openai-compatible", 12))
    commands = wait_appends(stack, compatible, 1)
    assert shape(commands) == [("context", "agent/compact-context@12")]
    assert commands[0]["payload"] == {
        "role": "developer",
        "content": "[Earlier conversation history was compacted through @9 (~3000 tokens > 2048). Summary:]\n\n"
        "Goal: plan B (@6).",
        "compaction": {"replacesHistoryThrough": 9, "usage": {"inputTokens": 100, "outputTokens": 20}},
        "llmRequestPolicy": {"behaviour": "dont-trigger-request"},
    }
    (request,) = llm.records
    assert request.body["messages"] == [*messages, {"role": "system", "content": COMPACTION_INSTRUCTION}]
    assert not request.body.get("stream")

    llm.reset()
    llm.push(Reply("Summary two.", usage=None))
    native_record = compact(native, "openai", 14)
    produce(stack, native_record)
    commands = wait_appends(stack, native, 1)
    assert commands[0]["payload"]["compaction"] == {"replacesHistoryThrough": 9}
    (request,) = llm.records
    assert request.body["messages"] == [
        *native_record["messages"],
        {"role": "developer", "content": COMPACTION_INSTRUCTION},
    ]
    assert request.body["max_completion_tokens"] == 64 and "max_tokens" not in request.body

    llm.reset()
    llm.push(Fail(500))
    produce(stack, compact(failing, "openai-compatible", 15))
    llm.wait_for(lambda rs: rs and not rs[0].open, timeout=15)
    time.sleep(1.0)
    assert appends(stack, failing) == []  # a failed summary appends nothing


def test_one_call_per_stream_while_streams_run_concurrently(kit: tuple[Stack, ScriptedLLM]) -> None:
    """A stream's next call waits for its running call; different streams run at the same time."""
    stack, llm = kit
    a, b = new_path(), new_path()
    llm.push(*[lambda body: SlowStream(f"answer to {last_user_text(body)[-25:]}", chunk_delay=0.15)] * 4)
    produce(stack, call(a, 4, f"{a} @4"), call(b, 4, f"{b} @4"), call(a, 8, f"{a} @8"), call(b, 8, f"{b} @8"))
    for path in (a, b):
        commands = wait_appends(stack, path, 6)
        assert [key for _, key in shape(commands)] == [
            f"agent/request/{r}/{what}" for r in (4, 8) for what in ("assistant", "settled", "usage")
        ]
    for path in (a, b):
        first, second = sorted(
            requests_for(llm, f"{path} @4") + requests_for(llm, f"{path} @8"), key=lambda r: r.received_at
        )
        assert last_user_text(first.body).endswith("@4")
        assert first.finished_at is not None and second.received_at >= first.finished_at, (
            "two calls of one stream overlapped"
        )
    (a4,), (b4,) = requests_for(llm, f"{a} @4"), requests_for(llm, f"{b} @4")
    assert max(a4.received_at, b4.received_at) < min(a4.finished_at, b4.finished_at), "streams did not run concurrently"


def test_stale_expired_and_unparsable_records_are_skipped(kit: tuple[Stack, ScriptedLLM]) -> None:
    """Stale offsets (already handled, older) and expired requests are not called; records that do
    not parse are logged and skipped; none of them stops the caller."""
    stack, llm = kit
    path = new_path()
    produce(stack, call(path, 9, "first"))
    wait_appends(stack, path, 3)
    produce(
        stack,
        call(path, 9, "repeated"),
        call(path, 4, "older"),
        call(path, 12, "expired", expiresAt=int(time.time() * 1000) - 1),
        (path, b"not json at all"),
        (path, json.dumps({"kind": "explode", "streamPath": path}).encode()),
        (path, json.dumps({**call(path, 13), "order": 1}).encode()),
        call(path, 15, "latest"),
    )
    commands = wait_appends(stack, path, 6)
    assert [key for _, key in shape(commands)] == [
        f"agent/request/{r}/{what}" for r in (9, 15) for what in ("assistant", "settled", "usage")
    ]
    assert commands[3]["payload"]["content"] == "ok: @5 actor=user:cli\nlatest"
    assert [last_user_text(r.body).split("\n")[1] for r in llm.records] == ["first", "latest"]


def test_rebalance_abandons_the_running_call_and_it_runs_again(tmp_path: Path, llm: ScriptedLLM) -> None:
    """A revoked partition's running call is abandoned after a grace (nothing appended, record not
    committed); when the partition is assigned again, to this caller, the call runs again."""
    stack = Stack(tmp_path / "data", partitions=2)
    settings = caller_settings(stack, llm, llm_timeout_s=30.0)
    caller = CallerThread(settings, rebalance_grace_s=1.0, session_timeout_ms=6000)
    other = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": settings.caller_group,
            "partition.assignment.strategy": "roundrobin",
            "log_level": 3,
        }
    )
    try:
        caller.start()
        llm.reset()
        llm.push(Hang(partial="lost "))
        path = new_path()
        produce(stack, call(path, 5))
        llm.wait_for(lambda rs: rs and rs[0].chunks_sent >= 1, timeout=15)
        llm.push(Reply("after the rebalance", usage=(5, 2)))
        # Another member joins the caller's group, subscribed to a different topic: the (eager)
        # rebalance revokes every llm-requests partition and assigns them all back to the caller.
        other.subscribe([stack.client.topics.dlq])
        wait_until(lambda: (other.poll(0.1), other.assignment())[1], 30, "the other member's assignment")
        assert llm.wait_for_disconnect(timeout=15).index == 0
        commands = wait_appends(stack, path, 3, timeout=30)
        assert shape(commands) == [
            ("context", "agent/request/5/assistant"),
            ("settled", "agent/request/5/settled"),
            ("usage", "agent/request/5/usage"),
        ]
        assert commands[0]["payload"]["content"] == "after the rebalance"
        assert [r.completed for r in llm.records] == [False, True]
    finally:
        other.close()
        caller.stop()
        stack.close()
    assert caller.error is None, caller.error


# --- secrets and context overflow ----------------------------------------------------------------


@contextlib.contextmanager
def window(llm: ScriptedLLM, tokens: int, style: OverflowStyle = "llama-cpp-python") -> Iterator[None]:
    """The scripted model refuses requests over `tokens` in `style`'s words, for the block."""
    llm.context_tokens, llm.overflow = tokens, style
    try:
        yield
    finally:
        llm.context_tokens = None


def long_conversation(r: int) -> list[dict[str, str]]:
    """Request R's messages: the system messages, ten ~100-token history items, the question, the
    timestamp (about 1 100 tokens as the scripted model counts)."""
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"@{10 + i}\nturn {i} " + "y" * 400}
        for i in range(10)
    ]
    return [
        *conversation("unused")[:2],
        *history,
        {"role": "user", "content": f"@{r - 1} actor=user:cli\nwhat did we decide?"},
        {"role": "system", "content": "Current date and time (UTC): 2026-12-02T10:13:51.123Z"},
    ]


def test_secrets_never_reach_the_journal_when_the_provider_echoes_the_authorization_header(
    kit: tuple[Stack, ScriptedLLM], caplog: pytest.LogCaptureFixture
) -> None:
    """Secrets never reach the journal: a 401 that quotes the request's Authorization header is
    settled and reported without the key, and the caller's log does not carry it either."""
    stack, llm = kit
    caplog.set_level(logging.INFO, logger="agentstream.caller")
    path = new_path()
    llm.push(Fail(401, echo_headers=("authorization",)))
    produce(stack, call(path, 6))
    commands = wait_appends(stack, path, 2)
    (request,) = llm.records
    assert request.headers["Authorization"] == f"Bearer {API_KEY}"  # what the server echoed
    assert shape(commands) == [("settled", "agent/request/6/settled"), ("error", "agent/request/6/error")]
    error = "HTTP 401 from the provider: scripted failure (401) (authorization: Bearer [redacted])"
    assert commands[0]["payload"]["result"] == {"status": "failed", "errorMessage": error}
    assert commands[1]["payload"]["message"] == f"LLM request @6 failed (attempt 1 of 3): {error}. Retrying."
    assert API_KEY not in json.dumps(commands)
    assert error in caplog.text and API_KEY not in caplog.text


def test_context_that_outgrows_the_model_is_compacted_and_r_settles_failed_to_be_retried(
    kit: tuple[Stack, ScriptedLLM],
) -> None:
    """Context that outgrows the model recovers by itself: a call refused for exceeding the context
    window (each server's words) is summarized from R's messages with the oldest history left out
    until the summary call fits (the system messages and the last ones always kept), then the
    summary item replaces history through R and R settles failed saying it will be retried."""
    stack, llm = kit
    for r, style in ((31, "llama-cpp-python"), (32, "openai"), (33, "llama.cpp")):
        llm.reset()
        path = new_path()
        record = call(path, r, messages=long_conversation(r))
        llm.push(Reply(f"We decided on plan B (@10) [{style}].", usage=(500, 12)))
        with window(llm, 600, style):
            produce(stack, record)
            commands = wait_appends(stack, path, 3)
        assert shape(commands) == [
            ("context", f"agent/compact-context@overflow-{r}"),
            ("settled", f"agent/request/{r}/settled"),
            ("error", f"agent/request/{r}/error"),
        ], style
        refused, *summaries = llm.records
        assert refused.response == "context-overflow" and refused.body["messages"] == record["messages"]
        accepted = summaries[-1]
        assert all(s.response == "context-overflow" for s in summaries[:-1]) and accepted.response == "reply"
        sent = accepted.body["messages"]
        assert prompt_tokens(accepted.body) < 600
        assert sent[:2] == record["messages"][:2]  # the system messages
        assert sent[-3:] == [*record["messages"][-2:], {"role": "system", "content": COMPACTION_INSTRUCTION}]
        notice = re.fullmatch(
            r"\[(\d+) older messages \(@10 to @(\d+)\) are left out here: with them the request exceeds the "
            r"model's context window\.\]",
            sent[2]["content"],
        )
        assert notice is not None and sent[2]["role"] == "system", sent[2]
        dropped = int(notice[1])
        assert int(notice[2]) == 10 + dropped - 1 and 0 < dropped <= 10
        assert sent[3:-3] == record["messages"][2 + dropped : -2]  # the newest history, verbatim

        summary, settled, error = (c["payload"] for c in commands)
        assert summary == {
            "role": "developer",
            "content": f"[Earlier conversation history was compacted through @{r} because request @{r} exceeded "
            f"the model's context window; the {dropped} oldest messages, @10 to @{9 + dropped}, did not fit in the "
            f"summary call and are not summarized. Summary:]\n\nWe decided on plan B (@10) [{style}].",
            "compaction": {"replacesHistoryThrough": r, "usage": {"inputTokens": 500, "outputTokens": 12}},
            "llmRequestPolicy": {"behaviour": "dont-trigger-request"},
        }
        message = settled["result"]["errorMessage"]
        assert settled["result"]["status"] == "failed" and message.startswith(
            f"the request exceeded the model's context window, so the context was compacted through @{r} and the "
            "request will be retried (HTTP 400 from the provider: "
        ), message
        assert error["message"].startswith(f"LLM request @{r} failed (attempt 1 of 3): ")
        assert error["message"].endswith(". Retrying.")


def test_a_failed_summary_call_appends_nothing_beyond_the_failed_settlement(kit: tuple[Stack, ScriptedLLM]) -> None:
    """When no summary call fits (the system messages and the newest alone are over the window) or a
    summary call fails otherwise, R settles failed (with its error event) and nothing else."""
    stack, llm = kit
    tiny, broken = new_path(), new_path()
    with window(llm, 40):
        produce(stack, call(tiny, 41, messages=long_conversation(41)))
        commands = wait_appends(stack, tiny, 2)
        assert 2 <= len(llm.records) <= 1 + llm_outcomes.MAX_SUMMARY_CALLS
        assert all(r.response == "context-overflow" for r in llm.records)
        assert shape(commands) == [("settled", "agent/request/41/settled"), ("error", "agent/request/41/error")]
        assert commands[0]["payload"]["result"]["errorMessage"].startswith(
            "the request exceeded the model's context window and compacting the context failed (HTTP 400 from the "
            "provider: This model's maximum context length is 40 tokens."
        )

        llm.reset()
        llm.script(Fail(500))  # the first summary call fails for another reason: no more calls
    with window(llm, 600):
        produce(stack, call(broken, 42, messages=long_conversation(42)))
        commands = wait_appends(stack, broken, 2)
        assert [r.response for r in llm.records] == ["context-overflow", "fail"]
    assert shape(commands) == [("settled", "agent/request/42/settled"), ("error", "agent/request/42/error")]
    assert (
        "compacting the context failed (HTTP 500 from the provider: scripted failure (500))"
        in (commands[0]["payload"]["result"]["errorMessage"])
    )
    time.sleep(0.5)
    assert len(appends(stack, tiny)) == 2 and len(appends(stack, broken)) == 2


def test_a_compaction_whose_summary_call_is_over_the_window_leaves_out_the_oldest_history(
    kit: tuple[Stack, ScriptedLLM],
) -> None:
    """§4.5 with a summary call that exceeds the window itself: it is retried with the oldest
    history left out, and the summary item says what it does not cover."""
    stack, llm = kit
    path = new_path()
    record = {
        "kind": "compact",
        "streamPath": path,
        "requestOffset": 31,
        "reportOffset": 34,
        "model": MODEL,
        "transport": "openai-compatible",
        "tokens": 1200,
        "threshold": 300,
        "messages": long_conversation(31),
    }
    llm.push(Reply("Plan B (@10).", usage=None))
    with window(llm, 600):
        produce(stack, record)
        commands = wait_appends(stack, path, 1)
    assert shape(commands) == [("context", "agent/compact-context@34")]
    first, *_, accepted = llm.records
    assert first.body["messages"] == [*record["messages"], {"role": "system", "content": COMPACTION_INSTRUCTION}]
    assert first.response == "context-overflow" and accepted.response == "reply"
    content = commands[0]["payload"]["content"]
    assert re.fullmatch(
        r"\[Earlier conversation history was compacted through @31 \(~1200 tokens > 300; the \d+ oldest messages, "
        r"@10 to @\d+, did not fit in the summary call and are not summarized\)\. Summary:\]\n\nPlan B \(@10\)\.",
        content,
    ), content
    assert commands[0]["payload"]["compaction"] == {"replacesHistoryThrough": 31}


# --- restarts --------------------------------------------------------------------------------------


class CallerProcess:
    """`run(settings)` in a real process (the CLI wiring is not this module's business)."""

    def __init__(self, settings: Settings, log_path: Path) -> None:
        env = dict(os.environ)
        env.pop("OPENAI_API_KEY", None)
        for name, value in settings.model_dump(mode="json").items():
            if value is not None:
                env[f"AGENTSTREAM_{name.upper()}"] = json.dumps(value) if isinstance(value, dict) else str(value)
        self.log_path = log_path
        self.offset = log_path.stat().st_size if log_path.exists() else 0
        code = (
            "from pipeline.caller import run; from pipeline.settings import Settings; "
            "run(Settings.from_env(), shutdown_timeout_s=10, session_timeout_ms=6000, commit_interval_s=0.1)"
        )
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", code], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[self.offset :]

    def wait_ready(self, timeout: float = 60) -> None:
        wait_until(lambda: "assigned [" in self.log() or self.process.poll() is not None, timeout, "partitions")
        assert self.process.poll() is None, self.log()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)


def test_restart_mid_call_neither_loses_nor_duplicates_the_settlement(tmp_path: Path, llm: ScriptedLLM) -> None:
    """At-least-once: a caller killed mid-call leaves the record uncommitted; the next caller repeats
    the call and appends the settlement once. A SIGTERM lets a running call finish and commits it,
    so the next caller does not repeat it."""
    stack = Stack(tmp_path / "data", partitions=2)
    settings = caller_settings(stack, llm, llm_timeout_s=30.0)
    log_path = tmp_path / "caller.log"
    processes: list[CallerProcess] = []
    try:
        llm.reset()
        llm.push(Hang(partial="thinking "))
        first = CallerProcess(settings, log_path)
        processes.append(first)
        first.wait_ready()
        path = new_path()
        record = call(path, 7)
        produce(stack, record)
        llm.wait_for(lambda rs: rs and rs[0].chunks_sent >= 1, timeout=20)
        first.stop(signal.SIGKILL)
        llm.wait_for_disconnect(timeout=10)
        assert appends(stack, path) == []

        llm.push(Reply("final answer", usage=(20, 5)))
        second = CallerProcess(settings, log_path)
        processes.append(second)
        commands = wait_appends(stack, path, 3, timeout=60)
        assert shape(commands) == [
            ("context", "agent/request/7/assistant"),
            ("settled", "agent/request/7/settled"),
            ("usage", "agent/request/7/usage"),
        ]
        assert commands[0]["payload"]["content"] == "final answer"
        first_request, second_request = llm.records
        assert first_request.body["messages"] == second_request.body["messages"] == record["messages"]

        # Graceful stop: the running call finishes, its appends are flushed and its record committed.
        llm.reset()
        llm.push(SlowStream("slow but sure", chunk_delay=0.3, usage=(9, 3)))
        slow = new_path()
        produce(stack, call(slow, 9))
        llm.wait_for_requests(1, timeout=20)
        assert second.stop(signal.SIGTERM) == 0, second.log()
        assert [key for _, key in shape(appends(stack, slow))] == [
            "agent/request/9/assistant",
            "agent/request/9/settled",
            "agent/request/9/usage",
        ]
        third = CallerProcess(settings, log_path)
        processes.append(third)
        third.wait_ready()
        later = new_path()
        produce(stack, call(later, 3))
        wait_appends(stack, later, 3, timeout=30)
        assert len(llm.records) == 2  # the slow call was not repeated
        assert third.stop(signal.SIGTERM) == 0, third.log()
        # Every idempotency key of the restarted stream was appended exactly once.
        keys = [c["idempotencyKey"] for c in appends(stack, path)]
        assert sorted(keys) == sorted(set(keys))
    finally:
        for process in processes:
            if process.process.poll() is None:
                process.process.kill()
                process.process.wait(10)
        stack.close()
