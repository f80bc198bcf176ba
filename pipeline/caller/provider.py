"""One chat completion at the provider: the request body, the HTTP call and what its errors mean.

The body is rendered here from messages the `llm-requests` record already validated
(`schemas/requests.py`) and goes out in one aiohttp POST with the headers the openai client would
send (derived from it once); the answer is read as server-sent events whose JSON is decoded with
orjson. Going through the openai client's `post` cost about four fifths of the caller's CPU per
call in its own machinery (options, an httpx request and response around aiohttp, its SSE
wrappers; docs/architecture.md, "LLM caller"). What its errors mean stays the SDK's: an HTTP
error status raises `openai.APIStatusError` with the body it would carry, an error event in a
stream `openai.APIError`, a body that is not JSON `json.JSONDecodeError`.

Roles are sent as the record carries them: the journal worker already mapped them for the
transport (docs/behaviour.md §3.2). The output limit is named per transport (see `LIMIT_FIELD`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

import aiohttp
import httpx2
import openai
import orjson
from openai import AsyncOpenAI

from pipeline import tracing
from pipeline.settings import Settings
from processors import llm_outcomes
from schemas.requests import Transport

CHAT_PATH: Final = "/chat/completions"
DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"  # the openai client's, when no base URL is set
# OpenAI's newer models reject `max_tokens` (replaced by `max_completion_tokens`); OpenAI-compatible
# servers such as llama-cpp know only `max_tokens`.
LIMIT_FIELD: Final[dict[str, str]] = {"openai": "max_completion_tokens", "openai-compatible": "max_tokens"}
# The openai client's connection pool on its aiohttp transport: at most 1 000 connections, idle
# ones kept for 5 s.
MAX_CONNECTIONS: Final = 1000
KEEPALIVE_S: Final = 5.0

Usage = dict[str, int] | None
# What aiohttp raises when the peer closes the connection before the response is complete.
_HUNG_UP: Final = (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)
_AIOHTTP_TIMEOUTS: Final = (aiohttp.ServerTimeoutError, aiohttp.SocketTimeoutError)
_LONG_DIGITS: Final = re.compile("[0-9]{19}")  # see `_json`
_LONG_DIGITS_BYTES: Final = re.compile(b"[0-9]{19}")


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


def sdk_headers(api_key: str, base_url: str, timeout_s: float) -> dict[str, str]:
    """The headers `chat.completions.create` sends on the openai client's aiohttp transport, with
    `max_retries=0`: the transport's, the client's (platform, organization, project), its bearer
    authentication, and the per-request ones. Built inside the event loop: the platform headers
    name the async library."""
    http = httpx2.AsyncClient()
    client = AsyncOpenAI(api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout_s, http_client=http)
    headers = {name: value for name, value in http.headers.items() if name.lower() in ("accept-encoding", "connection")}
    headers.update((name, value) for name, value in client.default_headers.items() if isinstance(value, str))
    headers["Authorization"] = f"Bearer {api_key}"  # the client's bearer authentication, added per request
    headers["x-stainless-retry-count"] = "0"
    headers["x-stainless-read-timeout"] = str(float(timeout_s))
    return headers


class SseEvents:
    """Server-sent events from a byte stream, as the openai client decodes them: lines end at CR, LF
    or CRLF, `data` lines join with newlines, a blank line ends an event (one with no field set
    is none), `:` starts a comment, a single space after the colon is dropped."""

    def __init__(self) -> None:
        self._rest = b""
        self._event: str | None = None
        self._data: list[str] = []
        self._id: str | None = None  # never reset between events, as the SSE specification says
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> Iterator[tuple[str | None, str]]:
        """The (event name, data) of each event the chunk completes."""
        buffer = self._rest + chunk if self._rest else chunk
        # A CR at the very end may be the first half of a CRLF: wait for the next chunk.
        end = len(buffer) - 1 if buffer.endswith(b"\r") else len(buffer)
        cut = max(buffer.rfind(b"\n", 0, end), buffer.rfind(b"\r", 0, end))
        if cut < 0:
            self._rest = buffer
            return
        self._rest = buffer[cut + 1 :]
        yield from self._lines(buffer[: cut + 1])

    def finish(self) -> Iterator[tuple[str | None, str]]:
        """The events a stream without a final line end still completes (the SDK's decoder: the
        pending line is decoded, and nothing dispatches a last event without its blank line)."""
        rest, self._rest = self._rest, b""
        if rest:
            yield from self._lines(rest + b"\n")

    def _lines(self, complete: bytes) -> Iterator[tuple[str | None, str]]:
        for raw in complete.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")[:-1]:
            line = raw.decode("utf-8")
            if not line:
                if self._event is None and not self._data and not self._id and self._retry is None:
                    continue
                yield self._event, "\n".join(self._data)
                self._event, self._data, self._retry = None, [], None
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if field == "event":
                self._event = value or None
            elif field == "data":
                self._data.append(value)
            elif field == "id":
                if "\0" not in value:
                    self._id = value
            elif field == "retry":
                with contextlib.suppress(ValueError):
                    self._retry = int(value)


class Provider:
    """The HTTP session of one caller process. No retries: they are the journal's business
    (docs/behaviour.md §4.3)."""

    def __init__(self, settings: Settings) -> None:
        self.timeout_s = settings.llm_timeout_s
        self.max_tokens = settings.llm_max_tokens
        self.secrets = (settings.openai_api_key,)
        self.api_key = settings.openai_api_key or "agentstream-local"
        self.base_url = (settings.llm_base_url or DEFAULT_BASE_URL).rstrip("/")
        self.url = self.base_url + CHAT_PATH
        # What an error raised here refers to (`openai.APIError` wants the request it answers).
        self._request = httpx2.Request("POST", self.url)
        self._session: aiohttp.ClientSession | None = None
        self._headers: dict[str, str] = {}

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._headers = sdk_headers(self.api_key, self.base_url, self.timeout_s)
            connector = aiohttp.TCPConnector(
                limit=MAX_CONNECTIONS, keepalive_timeout=KEEPALIVE_S, ssl=httpx2.create_ssl_context()
            )
            # No session timeout: each call runs under `asyncio.timeout(timeout_s)`. Proxy variables
            # and ~/.netrc are not read, as on the openai client's aiohttp transport.
            self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def stream(self, model: str, transport: Transport, messages: list[dict[str, Any]], text: list[str]) -> Usage:
        """Stream the completion into `text` (what arrived stays there if the task is cancelled,
        which closes the connection); return the usage the provider reported, if any."""
        body = request_body(model, transport, messages, self.max_tokens, stream=True)
        usage: Usage = None
        chunks = 0
        session = self._open()
        async with asyncio.timeout(self.timeout_s):
            response = await session.post(self.url, data=body, headers=self._headers)
            try:
                if not 200 <= response.status < 300:
                    raise await self._status_error(response)
                events = SseEvents()
                done = False
                async for data in response.content.iter_any():
                    for event, data_text in events.feed(data):
                        if data_text.startswith("[DONE]"):
                            done = True
                            break
                        chunks += 1
                        chunk = self._event_json(event, data_text)
                        if chunk is None:
                            continue
                        usage = llm_outcomes.normalize_usage(chunk.get("usage")) or usage
                        self._take_choices(chunk.get("choices"), text)
                    if done:
                        break
                if not done:
                    for _ in events.finish():  # a last line without its blank line ends no event
                        pass
                else:
                    await response.read()  # the rest of the body, so the connection is reused
            except BaseException:
                response.close()  # a cancelled or failed stream closes its connection
                raise
            response.release()
        if chunks == 0:
            raise InvalidResponse("the provider's response is not a chat completion stream (no chunks)")
        return usage

    def _event_json(self, event: str | None, data: str) -> Mapping[str, Any] | None:
        """One event's chunk, or None for an event that carries none; an error event raises
        `openai.APIError`, as the SDK's stream does."""
        chunk = _json(data)
        if event is not None and event.startswith("thread."):  # the SDK wraps these; no chunk fields
            return None
        if isinstance(chunk, Mapping) and chunk.get("error"):
            error = chunk["error"]
            message = error.get("message") if isinstance(error, Mapping) else None
            if not message or not isinstance(message, str):
                message = "An error occurred during streaming"
            raise openai.APIError(message, self._request, body=error)
        if not isinstance(chunk, Mapping):
            raise InvalidResponse("the provider's stream holds an event that is not a JSON object")
        return chunk

    @staticmethod
    def _take_choices(choices: object, text: list[str]) -> None:
        """The first choice's text into `text` (and its finish reason onto the span)."""
        if not isinstance(choices, list):
            return
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

    async def complete(self, model: str, transport: Transport, messages: list[dict[str, Any]]) -> tuple[str, Usage]:
        """The whole completion at once: its text (never empty) and usage."""
        body = request_body(model, transport, messages, self.max_tokens, stream=False)
        session = self._open()
        async with asyncio.timeout(self.timeout_s):
            async with session.post(self.url, data=body, headers=self._headers) as response:
                if not 200 <= response.status < 300:
                    raise await self._status_error(response)
                raw = await response.read()
                media_type = response.headers.get("content-type", "*").split(";")[0]
                charset = response.charset
        # As the SDK's raw mode: a body labelled JSON is decoded, any other comes as text.
        answer: object = _json(raw) if media_type.endswith("json") else raw.decode(charset or "utf-8", "replace")
        if tracing.ON:
            choices = _mapping(answer).get("choices")
            _finish_reasons([_mapping(c).get("finish_reason") for c in choices] if isinstance(choices, list) else [])
        return completion_text(answer), llm_outcomes.normalize_usage(_mapping(answer).get("usage"))

    async def _status_error(self, response: aiohttp.ClientResponse) -> openai.APIStatusError:
        """The error the openai client raises for an HTTP error status: its message, and as body the
        decoded JSON's `error` member (or the whole JSON, or the text)."""
        text = (await response.read()).decode(response.charset or "utf-8", "replace").strip()
        body: Any = text
        try:
            body = json.loads(text)
            message = f"Error code: {response.status} - {body}"
        except Exception:
            message = text or f"Error code: {response.status}"
        data = body.get("error", body) if isinstance(body, Mapping) else body
        status = httpx2.Response(response.status, headers=list(response.raw_headers), request=self._request)
        return openai.APIStatusError(message, response=status, body=data)

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
    elif isinstance(error, aiohttp.ClientError):  # a redirect loop, a malformed response line...
        text = f"connection to the provider failed: {str(error) or type(error).__name__}"
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


def _json(data: str | bytes) -> Any:
    """JSON decoded as the openai client decodes it (the standard library's `json`): orjson first,
    which is faster; where it refuses (NaN, a byte order mark, lone surrogates...) `json` decides,
    and its error is the one raised. orjson reads an integer beyond 64 bits as a float, so text
    with a run of 19 digits goes to `json` alone."""
    long_number = _LONG_DIGITS_BYTES.search(data) if isinstance(data, bytes) else _LONG_DIGITS.search(data)
    if long_number is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


def _mapping(value: object) -> Mapping[str, Any]:
    """`value` if it is a JSON object, else an empty one: providers leave out or null any field."""
    return value if isinstance(value, Mapping) else {}


def _finish_reasons(reasons: list[Any]) -> None:
    """`gen_ai.response.finish_reasons` of the current `chat` span (docs/behaviour.md §8)."""
    named = [str(reason) for reason in reasons if reason]
    if named:
        tracing.current_span().set_attribute("gen_ai.response.finish_reasons", named)
