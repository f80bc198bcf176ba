"""One chat completion at the provider: the request body, the HTTP call and what its errors mean.

The body is rendered here from messages the `llm-requests` record already validated
(`schemas/requests.py`) and goes out through the openai client's public `post`, not through
`chat.completions.create`: `create` walks every message through the SDK's typed request transform,
about two thirds of the caller's CPU per call (docs/architecture.md, "LLM caller"). Everything else
stays the SDK's: authentication, headers, timeouts, error types, SSE decoding and the response models.

Roles are sent as the record carries them: the journal worker already mapped them for the
transport (docs/behaviour.md §3.2). The output limit is named per transport (see `LIMIT_FIELD`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from typing import Any, Final

import aiohttp
import httpx2
import openai
import orjson
from openai import AsyncOpenAI, AsyncStream, DefaultAioHttpClient

from pipeline import tracing
from pipeline.settings import Settings
from processors import llm_outcomes
from schemas.requests import Transport

CHAT_PATH: Final = "/chat/completions"
# OpenAI's newer models reject `max_tokens` (replaced by `max_completion_tokens`); OpenAI-compatible
# servers such as llama-cpp know only `max_tokens`.
LIMIT_FIELD: Final[dict[str, str]] = {"openai": "max_completion_tokens", "openai-compatible": "max_tokens"}
# The request options `create` passes for this endpoint: bearer authentication only.
_OPTIONS: Final[Any] = {"security": {"bearer_auth": True}}
# Chunks and completions come back as the SDK's decoded JSON (`cast_to=object`): building a
# `ChatCompletionChunk` model per chunk cost more than the rest of the caller's parsing together.
_CHUNKS: Final = AsyncStream[object]

Usage = dict[str, int] | None
# What each transport raises when the peer closes the connection before the response is complete.
_HUNG_UP: Final = (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, httpx2.RemoteProtocolError)
_AIOHTTP_TIMEOUTS: Final = (aiohttp.ServerTimeoutError, aiohttp.SocketTimeoutError)


class InvalidResponse(Exception):
    """The provider answered, but not with a usable chat completion."""


def request_body(
    model: str, transport: Transport, messages: list[dict[str, Any]], max_tokens: int, *, stream: bool
) -> bytes:
    """The JSON body of a chat completion request, as `create` would send it (stream: with usage)."""
    body: dict[str, Any] = {"model": model, "messages": messages, LIMIT_FIELD[transport]: max_tokens}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


class Provider:
    """The openai client of one caller process, with `max_retries=0`: retries are the journal's
    business (docs/behaviour.md §4.3)."""

    def __init__(self, settings: Settings) -> None:
        self.timeout_s = settings.llm_timeout_s
        self.max_tokens = settings.llm_max_tokens
        self.secrets = (settings.openai_api_key,)
        self.client = AsyncOpenAI(
            base_url=settings.llm_base_url,
            # The SDK's aiohttp transport: the same client behaviour for about a fifth less CPU per
            # call than its default httpx pool (docs/architecture.md, "LLM caller").
            http_client=DefaultAioHttpClient(),
            api_key=settings.openai_api_key or "agentstream-local",
            max_retries=0,
            timeout=settings.llm_timeout_s,
        )

    async def close(self) -> None:
        await self.client.close()

    async def stream(self, model: str, transport: Transport, messages: list[dict[str, Any]], text: list[str]) -> Usage:
        """Stream the completion into `text` (what arrived stays there if the task is cancelled,
        which closes the connection); return the usage the provider reported, if any."""
        body = request_body(model, transport, messages, self.max_tokens, stream=True)
        usage: Usage = None
        chunks = 0
        async with asyncio.timeout(self.timeout_s):
            stream = await self.client.post(
                CHAT_PATH, cast_to=object, content=body, options=_OPTIONS, stream=True, stream_cls=_CHUNKS
            )
            try:
                async for chunk in stream:
                    chunks += 1
                    if not isinstance(chunk, Mapping):
                        raise InvalidResponse("the provider's stream holds an event that is not a JSON object")
                    usage = llm_outcomes.normalize_usage(chunk.get("usage")) or usage
                    choices = chunk.get("choices")
                    if not isinstance(choices, list):
                        continue
                    for choice in choices:
                        if not isinstance(choice, Mapping) or choice.get("index", 0) not in (0, None):
                            continue
                        content = _mapping(choice.get("delta")).get("content")
                        if isinstance(content, str) and content:
                            if tracing.ON and not text:  # the first token (docs/behaviour.md §8)
                                tracing.current_span().add_event("gen_ai.first_token")
                            text.append(content)
                        if tracing.ON and choice.get("finish_reason"):
                            _finish_reasons([choice.get("finish_reason")])
            finally:
                with contextlib.suppress(Exception):
                    await stream.close()
        if chunks == 0:
            raise InvalidResponse("the provider's response is not a chat completion stream (no chunks)")
        return usage

    async def complete(self, model: str, transport: Transport, messages: list[dict[str, Any]]) -> tuple[str, Usage]:
        """The whole completion at once: its text (never empty) and usage."""
        body = request_body(model, transport, messages, self.max_tokens, stream=False)
        async with asyncio.timeout(self.timeout_s):
            response = await self.client.post(CHAT_PATH, cast_to=object, content=body, options=_OPTIONS)
        if tracing.ON:
            choices = _mapping(response).get("choices")
            _finish_reasons([_mapping(c).get("finish_reason") for c in choices] if isinstance(choices, list) else [])
        return completion_text(response), llm_outcomes.normalize_usage(_mapping(response).get("usage"))

    def describe(self, error: BaseException) -> str:
        return describe_error(error, self.timeout_s, self.secrets)


def completion_text(response: object) -> str:
    """The text of a non-streaming chat completion (the SDK's decoded JSON), or InvalidResponse."""
    if isinstance(response, (str, bytes)):  # a body not labelled JSON: the SDK hands it over as text
        with contextlib.suppress(ValueError):
            response = orjson.loads(response)
    if not isinstance(response, Mapping):
        raise InvalidResponse("the provider's response is not a chat completion (not a JSON object)")
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        raise InvalidResponse("the provider's response has no choices")
    content = _mapping(_mapping(choices[0]).get("message")).get("content")
    if not isinstance(content, str) or not content.strip():
        raise InvalidResponse("the provider returned an empty response")
    return content


def describe_error(error: BaseException, timeout_s: float, secrets: tuple[str | None, ...] = ()) -> str:
    """One line a person can act on; never a traceback, never a credential (`secrets`: the
    configured API key; credential-shaped text goes too)."""
    if isinstance(error, openai.APIStatusError):
        text = f"HTTP {error.status_code} from the provider: {_provider_message(error)}"
    elif (failure := _connection_failure(error)) is not None:  # before timeouts: see `_connection_failure`
        text = f"connection to the provider failed: {failure}"
    elif isinstance(error, (openai.APITimeoutError, TimeoutError)):
        text = f"no complete response from the provider within {timeout_s:g}s"
    elif isinstance(error, openai.APIConnectionError):
        cause = error.__cause__
        detail = (str(cause) or type(cause).__name__) if cause is not None else str(error)
        text = f"connection to the provider failed: {detail}"
    elif isinstance(error, openai.APIError):
        text = f"the provider reported an error: {error.message}"
    elif isinstance(error, json.JSONDecodeError):
        text = f"the provider's response is not valid JSON ({error.msg} at char {error.pos})"
    elif isinstance(error, InvalidResponse):
        text = str(error)
    else:
        text = f"unexpected error calling the provider ({type(error).__name__}: {error})"
    return llm_outcomes.one_line(llm_outcomes.scrub(text, secrets))


def _connection_failure(error: BaseException) -> str | None:
    """What went wrong with the connection, if that is what failed, whichever HTTP transport saw it.
    The aiohttp transport maps refused connections and hang-ups onto the SDK's timeout error, so
    the cause chain decides, not the error's type."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, _HUNG_UP):
            return "the provider closed the connection before the response was complete"
        if isinstance(cause, aiohttp.ClientConnectionError) and not isinstance(cause, _AIOHTTP_TIMEOUTS):
            return str(cause) or type(cause).__name__
        cause = cause.__cause__ or cause.__context__
    return None


def is_overflow(error: BaseException, described: str) -> bool:
    """Whether the provider refused the request for exceeding the model's context window."""
    return isinstance(error, openai.APIStatusError) and llm_outcomes.is_context_overflow(
        error.status_code, error.body, described
    )


def error_body(error: BaseException) -> Any:
    """The provider's error body (the overflow ratio reads the window size from it), if any."""
    return error.body if isinstance(error, openai.APIStatusError) else None


def _provider_message(error: openai.APIStatusError) -> str:
    body: Any = error.body
    if isinstance(body, Mapping):
        inner = body.get("error")
        if isinstance(inner, Mapping) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(body.get("message"), str):
            return str(body["message"])
        if isinstance(inner, str):
            return inner
        return json.dumps(body)[:300]
    if isinstance(body, str) and body.strip():
        return body
    message = str(error.message or "")
    return message.split(" - ", 1)[1] if " - " in message else (message or "no details")


def _mapping(value: object) -> Mapping[str, Any]:
    """`value` if it is a JSON object, else an empty one: providers leave out or null any field."""
    return value if isinstance(value, Mapping) else {}


def _finish_reasons(reasons: list[Any]) -> None:
    """`gen_ai.response.finish_reasons` of the current `chat` span (docs/behaviour.md §8)."""
    named = [str(reason) for reason in reasons if reason]
    if named:
        tracing.current_span().set_attribute("gen_ai.response.finish_reasons", named)
