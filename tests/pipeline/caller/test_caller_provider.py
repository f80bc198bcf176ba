"""The caller's provider call (`pipeline/caller/provider.py`) against the scripted OpenAI-compatible
server, without a broker (docs/behaviour.md §3.2, §4.3, §4.4, §4.5).

The provider sends its own rendered body in one aiohttp POST; the first tests hold it to what
`chat.completions.create` would have sent, header for header and field for field.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from pipeline.caller.provider import InvalidResponse, Provider, error_body, is_overflow
from pipeline.settings import Settings
from processors import llm_outcomes
from schemas.requests import Message, Transport
from tests.support.scripted_llm import Drop, Fail, Garbage, Hang, Reply, ScriptedLLM

API_KEY = "sk-proj-Provider0123456789abcdefXYZ"
TIMEOUT_S = 2.0
# The same words whichever HTTP transport noticed the hang-up (the aiohttp one calls it a timeout).
HUNG_UP = "connection to the provider failed: the provider closed the connection before the response was complete"
MAX_TOKENS = 64

# One message of every role the journal worker renders, non-ASCII text and an attached file.
MESSAGES = [
    Message(role="system", content='You are terse.\nNever say "never".'),
    Message(role="developer", content="@3\nCurrent date and time (UTC): 2026-12-02T10:13:51.123Z"),
    Message(role="user", content="@5 actor=user:cli\nBe kind ✓ — ünïcødé", files=[{"path": "notes.md", "size": 12}]),
    Message(role="assistant", content="@6\nplan B"),
    Message(role="user", content="@7 actor=user:cli\nwhat did we decide?"),
]
WIRE = llm_outcomes.provider_messages(MESSAGES)


@pytest.fixture(scope="module")
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as server:
        yield server


@pytest.fixture(autouse=True)
def fresh(llm: ScriptedLLM) -> None:
    llm.reset()
    llm.context_tokens = None


def settings(llm: ScriptedLLM) -> Settings:
    return Settings.from_env(
        {},
        openai_base_url=llm.base_url,
        openai_api_key=API_KEY,
        llm_timeout_s=TIMEOUT_S,
        llm_max_tokens=MAX_TOKENS,
    )


def run(llm: ScriptedLLM, work: Callable[[Provider], Awaitable[Any]]) -> Any:
    """`await work(provider)` on a fresh loop with a fresh provider (closed afterwards)."""

    async def main() -> Any:
        provider = Provider(settings(llm))
        try:
            return await work(provider)
        finally:
            await provider.close()

    return asyncio.run(main())


def run_sdk(llm: ScriptedLLM, call: Callable[[AsyncOpenAI], Awaitable[Any]]) -> None:
    """The same request through `chat.completions.create`, as the caller sent it before."""

    async def main() -> None:
        async with AsyncOpenAI(base_url=llm.base_url, api_key=API_KEY, max_retries=0, timeout=TIMEOUT_S) as sdk:
            result = await call(sdk)
            if hasattr(result, "__aiter__"):
                async for _ in result:
                    pass

    asyncio.run(main())


def named(headers: dict[str, str]) -> dict[str, str]:
    """Headers by lower-case name: HTTP header names are case-insensitive."""
    return {name.lower(): value for name, value in headers.items()}


def limit(transport: Transport) -> dict[str, int]:
    return {"max_completion_tokens" if transport == "openai" else "max_tokens": MAX_TOKENS}


# --- the request ------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["openai", "openai-compatible"])
def test_a_streamed_call_sends_what_create_would_send(llm: ScriptedLLM, transport: Transport) -> None:
    """Same headers (authentication included), same body: every role as rendered, the output limit
    named for the transport, streaming with usage."""
    run(llm, lambda p: p.stream("m-1", transport, WIRE, []))
    run_sdk(
        llm,
        lambda sdk: sdk.chat.completions.create(
            model="m-1", messages=WIRE, stream=True, stream_options={"include_usage": True}, **limit(transport)
        ),
    )
    ours, sdks = llm.records
    assert named(ours.headers) == named(sdks.headers)
    assert ours.body == sdks.body
    assert ours.headers["Authorization"] == f"Bearer {API_KEY}"
    assert ours.headers["Content-Type"] == "application/json"
    assert ours.body == {
        "model": "m-1",
        "messages": WIRE,
        "stream": True,
        "stream_options": {"include_usage": True},
        **limit(transport),
    }


@pytest.mark.parametrize("transport", ["openai", "openai-compatible"])
def test_a_whole_completion_sends_what_create_would_send(llm: ScriptedLLM, transport: Transport) -> None:
    run(llm, lambda p: p.complete("m-2", transport, WIRE))
    run_sdk(llm, lambda sdk: sdk.chat.completions.create(model="m-2", messages=WIRE, **limit(transport)))
    ours, sdks = llm.records
    assert named(ours.headers) == named(sdks.headers)
    assert ours.body == sdks.body == {"model": "m-2", "messages": WIRE, **limit(transport)}
    assert not ours.stream


def test_roles_go_out_as_rendered_with_file_hints() -> None:
    """§3.2: the journal worker mapped roles for the transport; the caller never remaps them."""
    assert [m["role"] for m in WIRE] == ["system", "developer", "user", "assistant", "user"]
    assert (
        WIRE[2]["content"]
        == "@5 actor=user:cli\nBe kind ✓ — ünïcødé\n[attached file: notes.md (unknown type, 12 bytes) notes.md]"
    )


def test_a_summary_call_ends_with_the_instruction_in_the_transports_role(llm: ScriptedLLM) -> None:
    """§4.5 and §3.2: request R's messages byte for byte, then the instruction: developer on
    openai, system on openai-compatible."""
    for transport, role in (("openai", "developer"), ("openai-compatible", "system")):
        messages = llm_outcomes.compaction_messages(MESSAGES, transport)  # type: ignore[arg-type]
        run(llm, lambda p, t=transport, m=messages: p.complete("m-3", t, m))
        body = llm.records[-1].body
        assert body["messages"][:-1] == WIRE
        assert body["messages"][-1]["role"] == role


# --- answers ------------------------------------------------------------------------------------------


def test_a_stream_collects_the_text_and_the_usage(llm: ScriptedLLM) -> None:
    llm.push(Reply("one two three", usage=(12, 3)), Reply("no usage", usage=None))
    text: list[str] = []
    usage = run(llm, lambda p: p.stream("m", "openai-compatible", WIRE, text))
    assert text == ["one ", "two ", "three"]
    assert usage == {"inputTokens": 12, "outputTokens": 3}
    assert run(llm, lambda p: p.stream("m", "openai-compatible", WIRE, [])) is None


def test_a_whole_completion_returns_text_and_usage(llm: ScriptedLLM) -> None:
    llm.push(Reply("all at once", usage=(9, 2), usage_shape="responses"))
    assert run(llm, lambda p: p.complete("m", "openai", WIRE)) == (
        "all at once",
        {"inputTokens": 9, "outputTokens": 2},
    )


def test_cancelling_a_stream_closes_the_connection_and_keeps_the_partial_text(llm: ScriptedLLM) -> None:
    """§4.4: an interrupt aborts the HTTP call; what arrived stays for the partial output."""
    llm.push(Hang(partial="Partial answer so far"))
    text: list[str] = []

    async def interrupted(provider: Provider) -> None:
        task = asyncio.create_task(provider.stream("m", "openai-compatible", WIRE, text))
        await llm.await_for(lambda rs: rs and rs[0].chunks_sent >= 4, timeout=10)
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await llm.await_for(lambda rs: rs[0].disconnected or None, timeout=10)

    run(llm, interrupted)
    assert "".join(text) == "Partial answer so far"
    assert llm.records[0].disconnected and not llm.records[0].completed


# --- errors -------------------------------------------------------------------------------------------


async def failure(provider: Provider, stream: bool) -> str:
    """The one-line description of the error the call raised."""
    try:
        if stream:
            await provider.stream("m", "openai-compatible", WIRE, [])
        else:
            await provider.complete("m", "openai-compatible", WIRE)
    except Exception as error:
        return provider.describe(error)
    raise AssertionError("the call did not fail")


@pytest.mark.parametrize(
    ("response", "stream", "expected"),
    [
        (Fail(429), True, "HTTP 429 from the provider: scripted failure (429)"),
        (Fail(503), False, "HTTP 503 from the provider: scripted failure (503)"),
        (Fail(400, body={"message": "bad field"}), True, "HTTP 400 from the provider: bad field"),
        (
            Fail(502, body="<html>bad gateway</html>", content_type="text/html"),
            False,
            "HTTP 502 from the provider: <html>bad gateway</html>",
        ),
        (Garbage("non-json"), True, "the provider's response is not a chat completion stream (no chunks)"),
        (Garbage("non-json"), False, "the provider's response is not valid JSON (Expecting value at char 0)"),
        (Garbage("no-choices"), False, "the provider's response has no choices"),
        (Reply(" ", usage=None), False, "the provider returned an empty response"),
        (Hang(partial="never finished"), True, f"no complete response from the provider within {TIMEOUT_S:g}s"),
        (Hang(), False, f"no complete response from the provider within {TIMEOUT_S:g}s"),
        (Drop(partial="cut"), True, HUNG_UP),
        (Drop(partial="cut"), False, HUNG_UP),
        (Drop(), True, HUNG_UP),
        (Drop(), False, HUNG_UP),
        (
            Fail(401, echo_headers=("authorization",)),
            True,
            "HTTP 401 from the provider: scripted failure (401) (authorization: Bearer [redacted])",
        ),
    ],
)
def test_each_failure_is_described_in_one_scrubbed_line(
    llm: ScriptedLLM, response: Any, stream: bool, expected: str
) -> None:
    """§4.3: what the error event says; never a traceback, never the API key."""
    llm.push(response)
    text = run(llm, lambda p: failure(p, stream))
    assert text.startswith(expected), text
    assert "\n" not in text and API_KEY not in text


@pytest.mark.parametrize("stream", [True, False])
def test_4_3_a_refused_connection_is_a_connection_failure_not_a_timeout(stream: bool) -> None:
    """§4.3: nothing listens on the provider's port; the error says so at once (the aiohttp
    transport reports it as a connect timeout, which would blame a slow provider)."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def main() -> str:
        provider = Provider(
            Settings.from_env({}, openai_base_url=f"http://127.0.0.1:{port}/v1", openai_api_key=API_KEY)
        )
        try:
            return await failure(provider, stream)
        finally:
            await provider.close()

    text = asyncio.run(main())
    assert text.startswith(f"connection to the provider failed: Cannot connect to host 127.0.0.1:{port}"), text
    assert "within" not in text


def test_an_answer_without_text_is_an_invalid_response(llm: ScriptedLLM) -> None:
    llm.push(Garbage("no-choices"))
    with pytest.raises(InvalidResponse):
        run(llm, lambda p: p.complete("m", "openai-compatible", WIRE))


@pytest.mark.parametrize("style", ["llama-cpp-python", "openai", "llama.cpp"])
def test_a_request_over_the_window_is_an_overflow_with_its_body(llm: ScriptedLLM, style: Any) -> None:
    """§4.5: the refusal is recognised (so the caller compacts) and its body is kept for the ratio."""
    llm.context_tokens, llm.overflow = 10, style

    async def refused(provider: Provider) -> tuple[bool, Any, float | None]:
        with pytest.raises(openai.APIStatusError) as info:
            await provider.stream("m", "openai-compatible", WIRE, [])
        text = provider.describe(info.value)
        body = error_body(info.value)
        return is_overflow(info.value, text), body, llm_outcomes.overflow_ratio(body, text)

    overflowed, body, ratio = run(llm, refused)
    assert overflowed and body is not None
    assert ratio is not None and 0 < ratio < 1


def test_other_refusals_are_not_overflows(llm: ScriptedLLM) -> None:
    llm.push(Fail(400, body={"error": {"message": "unknown field", "code": "invalid_request"}}), Fail(500))

    async def refused(provider: Provider) -> list[bool]:
        verdicts = []
        for _ in range(2):
            with pytest.raises(openai.APIStatusError) as info:
                await provider.complete("m", "openai-compatible", WIRE)
            verdicts.append(is_overflow(info.value, provider.describe(info.value)))
        return verdicts

    assert run(llm, refused) == [False, False]
    assert not is_overflow(TimeoutError(), "context length exceeded")
