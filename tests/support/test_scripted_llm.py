"""The scripted OpenAI-compatible server, exercised through the real openai SDK (httpx2)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from tests.support.scripted_llm import (
    Drop,
    Fail,
    Garbage,
    Hang,
    Reply,
    ScriptedLLM,
    SlowStream,
    delay,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "hello there"},
]


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as server:
        yield server


def client(base_url: str, **kw: Any) -> AsyncOpenAI:
    # max_retries=0: the SDK would otherwise retry 429/5xx/connection errors by itself.
    kw.setdefault("max_retries", 0)
    return AsyncOpenAI(base_url=base_url, api_key="test-key", **kw)


async def complete(base_url: str, client_kw: dict[str, Any] | None = None, **kw: Any) -> Any:
    """One chat completion in a fresh, closed-afterwards client; a stream is read to the end."""
    kw.setdefault("messages", MESSAGES)
    async with client(base_url, **(client_kw or {})) as c:
        result = await c.chat.completions.create(model="m", **kw)
        if kw.get("stream"):
            return [chunk async for chunk in result]
        return result


def test_reply_usage_and_recorded_request(llm: ScriptedLLM) -> None:
    llm.push(Reply("hi!", usage=(12, 3)))
    result = asyncio.run(complete(llm.base_url))
    assert result.choices[0].message.content == "hi!"
    assert result.choices[0].finish_reason == "stop"
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (12, 3)
    (rec,) = llm.records
    assert rec.body["messages"] == MESSAGES
    assert rec.headers["Authorization"] == "Bearer test-key"
    assert rec.completed and not rec.disconnected and rec.status == 200
    assert llm.pending == 0


def test_default_echo_and_responses_usage_shape(llm: ScriptedLLM) -> None:
    result = asyncio.run(complete(llm.base_url))
    assert result.choices[0].message.content == "ok: hello there"
    assert result.usage.prompt_tokens > 0
    llm.push(Reply("x", usage=(7, 1), usage_shape="responses"), Reply("y", usage=None))
    shaped = asyncio.run(complete(llm.base_url))
    assert shaped.usage.prompt_tokens is None
    assert (shaped.usage.input_tokens, shaped.usage.output_tokens) == (7, 1)
    assert asyncio.run(complete(llm.base_url)).usage is None


@pytest.mark.parametrize(
    ("status", "exc"),
    [
        (429, openai.RateLimitError),
        (500, openai.InternalServerError),
        (503, openai.InternalServerError),
        (400, openai.BadRequestError),
    ],
)
def test_http_errors(llm: ScriptedLLM, status: int, exc: type[Exception]) -> None:
    llm.push(Fail(status))
    with pytest.raises(exc) as info:
        asyncio.run(complete(llm.base_url))
    assert info.value.status_code == status
    assert isinstance(info.value, openai.APIStatusError)


def test_sdk_retries_consume_the_script(llm: ScriptedLLM) -> None:
    # The SDK retries 429/5xx by itself unless max_retries=0; each retry is a new request.
    llm.push(Fail(500, headers=(("retry-after-ms", "10"),)), Reply("second"))
    result = asyncio.run(complete(llm.base_url, client_kw={"max_retries": 1}))
    assert result.choices[0].message.content == "second"
    assert [r.status for r in llm.records] == [500, 200]


def test_garbage(llm: ScriptedLLM) -> None:
    llm.push(Garbage("non-json"), Garbage("no-choices"))
    # Not an openai exception: the JSON decoder error escapes as is.
    with pytest.raises(json.JSONDecodeError):
        asyncio.run(complete(llm.base_url))
    # Parsed leniently: no exception, choices is None. Callers must validate.
    assert asyncio.run(complete(llm.base_url)).choices is None


def test_streaming_with_usage(llm: ScriptedLLM) -> None:
    llm.push(Reply("one two three", usage=(5, 3)))
    chunks = asyncio.run(complete(llm.base_url, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three"
    assert chunks[-1].choices == []
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (5, 3)
    (rec,) = llm.records
    assert rec.stream and rec.completed and rec.chunks_sent == 5  # 3 words + finish + usage


def test_slow_stream_and_delay(llm: ScriptedLLM) -> None:
    llm.push(SlowStream("a b c d", chunk_delay=0.05), delay(0.2, Reply("late")))

    async def run():
        async with client(llm.base_url) as c:
            started = time.monotonic()
            stream = await c.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            arrivals = [time.monotonic() - started async for ch in stream if ch.choices[0].delta.content]
            t0 = time.monotonic()
            late = await c.chat.completions.create(model="m", messages=MESSAGES)
            return arrivals, time.monotonic() - t0, late

    arrivals, late_elapsed, late = asyncio.run(run())
    assert len(arrivals) == 4 and arrivals[-1] >= 0.2
    assert late_elapsed >= 0.2 and late.choices[0].message.content == "late"


@pytest.mark.parametrize("stream", [True, False])
def test_cancelling_the_task_aborts_the_http_call(llm: ScriptedLLM, stream: bool) -> None:
    llm.push(Hang(partial="partial output"))
    seen: list[str] = []

    async def call():
        async with client(llm.base_url) as c:
            response = await c.chat.completions.create(model="m", messages=MESSAGES, stream=stream)
            if stream:
                async for chunk in response:
                    seen.append(chunk.choices[0].delta.content or "")

    async def run():
        task = asyncio.create_task(call())
        await llm.await_for(lambda rs: rs and (rs[0].chunks_sent == 2 or not stream))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    rec = llm.wait_for_disconnect(timeout=5)
    assert not rec.completed and not rec.aborted_by_server
    if stream:
        assert "".join(seen) == "partial output"


def test_timeout_and_connection_errors(llm: ScriptedLLM) -> None:
    llm.push(Hang(), Drop())
    with pytest.raises(openai.APITimeoutError):
        asyncio.run(complete(llm.base_url, timeout=0.3))
    assert llm.wait_for_disconnect(timeout=5).index == 0
    with pytest.raises(openai.APIConnectionError) as info:
        asyncio.run(complete(llm.base_url))
    assert not isinstance(info.value, openai.APITimeoutError)

    refused = ScriptedLLM().start()
    base_url = refused.base_url
    refused.stop()
    with pytest.raises(openai.APIConnectionError):
        asyncio.run(complete(base_url))


def test_llama_cpp_like_mode() -> None:
    # Like llama-cpp-python 0.3.36: `developer` messages get HTTP 500, streams carry no usage.
    with ScriptedLLM(developer_role="reject", stream_usage=False) as llm:
        llm.push(Reply("kept for the next request"))
        with pytest.raises(openai.InternalServerError) as info:
            asyncio.run(complete(llm.base_url, messages=[*MESSAGES, {"role": "developer", "content": "now"}]))
        assert "validation error" in info.value.message
        assert llm.records[0].response == "reject-developer"

        chunks = asyncio.run(complete(llm.base_url, stream=True, stream_options={"include_usage": True}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == "kept for the next request"
        assert all(c.usage is None for c in chunks)


def test_stop_ends_hanging_requests_quickly() -> None:
    llm = ScriptedLLM().start()
    llm.push(Hang())

    async def run():
        task = asyncio.create_task(complete(llm.base_url))
        await llm.await_requests(1)
        started = time.monotonic()
        await asyncio.to_thread(llm.stop)
        with pytest.raises(openai.APIConnectionError):
            await task
        return time.monotonic() - started

    assert asyncio.run(run()) < 3
    assert llm.records[0].aborted_by_server and not llm.records[0].disconnected


def test_standalone_instant_process() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.scripted_llm", "--port", "0", "--instant"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:")
        base_url = line.split()[-1]
        with urllib.request.urlopen(f"{base_url}/models", timeout=5) as resp:
            assert json.load(resp)["data"][0]["id"] == "scripted"

        async def run():
            async with client(base_url) as c:
                calls = (c.chat.completions.create(model="m", messages=MESSAGES) for _ in range(20))
                return await asyncio.gather(*calls)

        results = asyncio.run(run())
        assert {r.choices[0].message.content for r in results} == {"ok: hello there"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
