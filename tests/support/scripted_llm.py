"""A scripted, deterministic OpenAI-compatible chat server for tests and benchmarks.

openai 3.x talks through ``httpx2``, so tests run the real SDK against a real local HTTP server
instead of mocking the transport (docs/architecture.md).

Serves, on 127.0.0.1 and an ephemeral port by default:

* ``POST /v1/chat/completions``: non-streaming and ``stream: true`` (SSE in the OpenAI chunk
  format, with a final usage chunk when ``stream_options.include_usage`` is set);
* ``GET /v1/models``.

Each chat request takes the next response from a script (FIFO) that the test sets; when the
script is empty the default responder answers (``ok: <last user message>``). Every request is
recorded (parsed JSON body, headers, whether the client disconnected mid-response).

In-process use (sync pytest; the server runs its own event loop in a background thread and the
API is thread-safe)::

    with ScriptedLLM() as llm:
        llm.push(Reply("hello", usage=(12, 3)), Fail(429), Hang(partial="par"))
        client = AsyncOpenAI(base_url=llm.base_url, api_key="test", max_retries=0)
        ...
        rec = llm.wait_for_disconnect(timeout=5)

``ScriptedLLM(developer_role="reject", stream_usage=False)`` behaves like the embedded
llama-cpp-python server: a ``developer`` message gets HTTP 500, streams carry no usage chunk.

``ScriptedLLM(context_tokens=N, overflow="llama-cpp-python" | "openai" | "llama.cpp")`` refuses a
chat request larger than an N-token window (tokens counted as ceil(chars / 4) per message, like
the auto usage) with HTTP 400 in that server's words, without consuming the script.
``Fail(401, echo_headers=("authorization",))`` quotes request headers in its error message, like
a provider or proxy that echoes credentials back.

Content parts are checked as the chat API checks them (``content_part_problem``): ``text``,
``image_url`` with an image data URL and ``file`` with a filename and a PDF data URL, the last two
in user messages only; anything else is HTTP 400 (docs/behaviour.md §3.3).

Inside a running event loop use ``await llm.astart()`` / ``await llm.astop()`` instead (then
use the async waiters ``await llm.await_requests(...)``, never the blocking ones).

Standalone (benchmarks)::

    python -m tests.support.scripted_llm --port 18090 --instant

prints ``listening on http://127.0.0.1:<port>/v1`` and answers every request instantly with the
default responder, keeping no per-request records.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import itertools
import json
import math
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal

from aiohttp import web

# --------------------------------------------------------------------------------------------
# Script entries
# --------------------------------------------------------------------------------------------

UsageSpec = dict[str, Any] | tuple[int, int] | Literal["auto"] | None


@dataclasses.dataclass(frozen=True)
class Reply:
    """A normal answer. Streamed word by word when the request has ``stream: true``.

    ``usage``: ``"auto"`` (default) computes deterministic counts (ceil(chars / 4) over the
    request's message contents and over ``text``); a ``(input, output)`` tuple is rendered in
    ``usage_shape``; a dict is sent verbatim; ``None`` omits usage entirely.
    ``usage_shape``: ``"chat"`` (prompt_tokens/completion_tokens/total_tokens) or
    ``"responses"`` (input_tokens/output_tokens/total_tokens).
    """

    text: str
    usage: UsageSpec = "auto"
    usage_shape: Literal["chat", "responses"] = "chat"
    finish_reason: str = "stop"
    delay: float = 0.0
    chunks: tuple[str, ...] | None = None  # explicit stream chunks (default: split into words)


@dataclasses.dataclass(frozen=True)
class SlowStream:
    """Like ``Reply`` but waits ``chunk_delay`` seconds before each streamed chunk.

    A non-streaming request gets the whole text after ``chunk_delay * len(chunks)`` seconds.
    """

    text: str
    chunk_delay: float
    usage: UsageSpec = "auto"
    usage_shape: Literal["chat", "responses"] = "chat"
    finish_reason: str = "stop"
    delay: float = 0.0
    chunks: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Fail:
    """An HTTP error. ``body``: dict → JSON; str/bytes → sent raw; None → OpenAI-style error.
    ``echo_headers``: request headers (case-insensitive names) quoted in the OpenAI-style message."""

    status: int = 500
    body: dict[str, Any] | str | bytes | None = None
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    delay: float = 0.0
    echo_headers: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Garbage:
    """HTTP 200 with a body that is not a chat completion.

    ``kind="non-json"`` sends ``body`` (default ``this is not json``) raw;
    ``kind="no-choices"`` sends a JSON object without ``choices``.
    The content type defaults to ``application/json`` so the client actually tries to parse it
    (with a non-JSON content type openai 3.x silently returns the body as a ``str``).
    """

    kind: Literal["non-json", "no-choices"] = "non-json"
    body: str | bytes | None = None
    content_type: str = "application/json"
    delay: float = 0.0


@dataclasses.dataclass(frozen=True)
class Hang:
    """Never answers until the client disconnects (or the server stops).

    For a streaming request the response headers and the ``partial`` text (as chunks) are sent
    first, so the client is inside the stream when it hangs. A non-streaming request gets no
    bytes at all.
    """

    partial: str = ""
    delay: float = 0.0


@dataclasses.dataclass(frozen=True)
class Drop:
    """Closes the connection abruptly: after the headers and ``partial`` chunks when streaming,
    before any response bytes otherwise."""

    partial: str = ""
    delay: float = 0.0


Response = Reply | SlowStream | Fail | Garbage | Hang | Drop
Responder = Callable[[dict[str, Any]], Response]
ScriptEntry = Response | Responder


def reply(text: str, **kw: Any) -> Reply:
    return Reply(text, **kw)


def delay(seconds: float, then: Response | None = None) -> Response:
    """``then`` (default ``Reply("ok")``) answered after ``seconds``."""
    return dataclasses.replace(then if then is not None else Reply("ok"), delay=seconds)


def fail(status: int = 500, body: dict[str, Any] | str | bytes | None = None, **kw: Any) -> Fail:
    return Fail(status, body, **kw)


def garbage(kind: Literal["non-json", "no-choices"] = "non-json", **kw: Any) -> Garbage:
    return Garbage(kind, **kw)


def slow_stream(text: str, chunk_delay: float, **kw: Any) -> SlowStream:
    return SlowStream(text, chunk_delay, **kw)


def hang(partial: str = "") -> Hang:
    return Hang(partial)


def last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return _content_text(message.get("content"))
    return ""


def echo_responder(body: dict[str, Any]) -> Response:
    """The default: ``ok: <last user message>`` with auto usage."""
    return Reply(f"ok: {last_user_text(body)}")


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class RequestRecord:
    index: int
    method: str
    path: str
    body: Any  # parsed JSON (None for GET or unparsable bodies)
    headers: dict[str, str]
    stream: bool
    response: str = ""  # kind of response chosen: reply, slow_stream, fail, ..., reject-developer
    status: int | None = None
    received_at: float = 0.0  # time.monotonic()
    finished_at: float | None = None
    chunks_sent: int = 0
    completed: bool = False  # full response written
    disconnected: bool = False  # the client went away before the response was complete
    aborted_by_server: bool = False  # Drop, or server stopped while the request was open

    @property
    def open(self) -> bool:
        return self.finished_at is None


# --------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------

_WORDS = re.compile(r"\s*\S+\s*|\s+")
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


class _ClientGone(Exception):
    pass


class ScriptedLLM:
    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model: str = "scripted",
        default: Responder = echo_responder,
        developer_role: Literal["accept", "reject"] = "accept",
        stream_usage: bool = True,
        record: bool = True,
        context_tokens: int | None = None,
        overflow: OverflowStyle = "llama-cpp-python",
    ) -> None:
        """``developer_role="reject"`` answers any request containing a ``developer`` message the
        way llama-cpp-python does (HTTP 500, see ``LLAMA_CPP_DEVELOPER_BODY``) without consuming
        the script. ``stream_usage=False`` ignores ``stream_options.include_usage`` like
        llama-cpp-python (no usage chunk in streams). ``record=False`` keeps no records.
        ``context_tokens``: the model's window; a larger request is refused the way ``overflow``
        says (see ``overflow_response``)."""
        self.host = host
        self._requested_port = port
        self.model = model
        self.default = default
        self.developer_role = developer_role
        self.stream_usage = stream_usage
        self.record = record
        self.context_tokens = context_tokens
        self.overflow = overflow
        self.port: int | None = None
        self.request_count = 0
        self._script: collections.deque[ScriptEntry] = collections.deque()
        self._records: list[RequestRecord] = []
        self._cond = threading.Condition()
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None

    # ---- addresses --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("ScriptedLLM is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What to pass as ``base_url`` to ``openai.AsyncOpenAI``."""
        return f"{self.url}/v1"

    # ---- script -----------------------------------------------------------------------------

    def push(self, *entries: ScriptEntry) -> None:
        """Append responses (or ``body -> Response`` callables) to the script."""
        with self._cond:
            self._script.extend(entries)

    def script(self, *entries: ScriptEntry) -> None:
        """Replace the script."""
        with self._cond:
            self._script.clear()
            self._script.extend(entries)

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._script)

    def reset(self) -> None:
        """Clear the script and the records."""
        with self._cond:
            self._script.clear()
            self._records.clear()
            self._ids = itertools.count(1)

    # ---- records ----------------------------------------------------------------------------

    @property
    def records(self) -> list[RequestRecord]:
        """Snapshots of the chat-completion requests received, in arrival order."""
        with self._cond:
            return [dataclasses.replace(r) for r in self._records]

    @property
    def requests(self) -> list[Any]:
        """Parsed JSON bodies of the chat-completion requests received."""
        with self._cond:
            return [r.body for r in self._records]

    def wait_for(self, predicate: Callable[[list[RequestRecord]], Any], timeout: float = 5.0) -> Any:
        """Block until ``predicate(records)`` is truthy; return its value. Raises TimeoutError."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                value = predicate([dataclasses.replace(r) for r in self._records])
                if value:
                    return value
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"ScriptedLLM: condition not met within {timeout}s")
                self._cond.wait(remaining)

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[RequestRecord]:
        return self.wait_for(lambda rs: rs if len(rs) >= n else None, timeout)

    def wait_for_disconnect(self, timeout: float = 5.0, index: int | None = None) -> RequestRecord:
        """The first (or the ``index``-th) request whose client disconnected mid-response."""

        def pred(rs: list[RequestRecord]) -> RequestRecord | None:
            for r in rs:
                if r.disconnected and (index is None or r.index == index):
                    return r
            return None

        return self.wait_for(pred, timeout)

    def wait_idle(self, timeout: float = 5.0) -> list[RequestRecord]:
        """Until no recorded request is still open."""
        return self.wait_for(lambda rs: rs if all(not r.open for r in rs) else None, timeout)

    async def await_for(self, predicate: Callable[[list[RequestRecord]], Any], timeout: float = 5.0) -> Any:
        """Async variant of ``wait_for`` (polls) for use inside the server's own loop."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate(self.records)
            if value:
                return value
            if time.monotonic() >= deadline:
                raise TimeoutError(f"ScriptedLLM: condition not met within {timeout}s")
            await asyncio.sleep(0.01)

    async def await_requests(self, n: int, timeout: float = 5.0) -> list[RequestRecord]:
        return await self.await_for(lambda rs: rs if len(rs) >= n else None, timeout)

    def _changed(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # ---- lifecycle: in the current event loop ------------------------------------------------

    async def astart(self) -> ScriptedLLM:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        # handler_cancellation: the handler task is cancelled when the client disconnects, which
        # is how a Hang/delay notices an aborted call.
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self._requested_port, reuse_address=True)
        await site.start()
        self._runner = runner
        self._stopping = asyncio.Event()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[union-attr]
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def astop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ScriptedLLM:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        await self.astop()

    # ---- lifecycle: background thread with its own loop -------------------------------------

    def start(self, timeout: float = 10.0) -> ScriptedLLM:
        if self._thread is not None:
            return self
        started = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self.astart())
            except BaseException as exc:  # reported to start()
                errors.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self.astop())
                loop.close()

        self._thread = threading.Thread(target=run, name=f"scripted-llm-{id(self):x}", daemon=True)
        self._thread.start()
        if not started.wait(timeout):
            raise TimeoutError("ScriptedLLM did not start")
        if errors:
            self._thread = None
            raise errors[0]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return

        def begin_stop() -> None:
            if self._stopping is not None:
                self._stopping.set()
            loop.stop()

        loop.call_soon_threadsafe(begin_stop)
        thread.join(timeout)
        self._thread = None
        self._loop = None

    def __enter__(self) -> ScriptedLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- handlers ---------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "scripted"}],
            }
        )

    def _next_entry(self, body: dict[str, Any]) -> Response:
        with self._cond:
            entry = self._script.popleft() if self._script else None
        if entry is None:
            return self.default(body)
        if callable(entry):
            return entry(body)
        return entry

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.request_count += 1
        raw = await request.read()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = None
        stream = bool(isinstance(body, dict) and body.get("stream"))
        rec = RequestRecord(
            index=next(self._ids) - 1,
            method=request.method,
            path=request.path,
            body=body,
            headers=dict(request.headers),
            stream=stream,
            received_at=time.monotonic(),
        )
        if self.record:
            with self._cond:
                self._records.append(rec)
                self._cond.notify_all()
        try:
            return await self._answer(request, body, rec)
        except asyncio.CancelledError:
            # handler_cancellation: the client went away (or the server is shutting down)
            self._finish(rec, disconnected=not self._is_stopping(), aborted=self._is_stopping())
            raise
        except (_ClientGone, ConnectionResetError):
            self._finish(rec, disconnected=True)
            raise asyncio.CancelledError() from None

    def _is_stopping(self) -> bool:
        return self._stopping is not None and self._stopping.is_set()

    def _finish(
        self,
        rec: RequestRecord,
        *,
        completed: bool = False,
        disconnected: bool = False,
        aborted: bool = False,
        status: int | None = None,
    ) -> None:
        with self._cond:
            if rec.finished_at is None:
                rec.finished_at = time.monotonic()
                rec.completed = completed
                rec.disconnected = disconnected
                rec.aborted_by_server = aborted
            if status is not None:
                rec.status = status
            self._cond.notify_all()

    async def _answer(self, request: web.Request, body: Any, rec: RequestRecord) -> web.StreamResponse:
        stream = rec.stream
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            rec.response = "bad-request"
            self._finish(rec, completed=True, status=400)
            return _error_response(400, "Request body must be a JSON object with a messages list")
        if self.developer_role == "reject" and any(
            isinstance(m, dict) and m.get("role") == "developer" for m in body["messages"]
        ):
            rec.response = "reject-developer"
            self._finish(rec, completed=True, status=LLAMA_CPP_DEVELOPER_STATUS)
            return web.json_response(LLAMA_CPP_DEVELOPER_BODY, status=LLAMA_CPP_DEVELOPER_STATUS)

        bad_part = content_part_problem(body["messages"])
        if bad_part is not None:
            rec.response = "bad-request"
            self._finish(rec, completed=True, status=400)
            return _error_response(400, bad_part)

        refused = (
            overflow_response(self.overflow, self.context_tokens, body) if self.context_tokens is not None else None
        )
        if refused is not None:
            rec.response = "context-overflow"
            self._finish(rec, completed=True, status=400)
            return web.json_response(refused, status=400)

        entry = self._next_entry(body)
        rec.response = _kind(entry)
        if entry.delay > 0:
            await self._sleep(entry.delay)

        if isinstance(entry, Fail):
            self._finish(rec, completed=True, status=entry.status)
            return _fail_response(entry, rec.headers)
        if isinstance(entry, Garbage):
            self._finish(rec, completed=True, status=200)
            if entry.kind == "no-choices":
                payload: bytes = (
                    (entry.body.encode() if isinstance(entry.body, str) else entry.body)
                    if entry.body is not None
                    else json.dumps(
                        {"id": "chatcmpl-garbage", "object": "chat.completion", "model": self.model}
                    ).encode()
                )
            else:
                raw = entry.body if entry.body is not None else "this is not json"
                payload = raw.encode() if isinstance(raw, str) else raw
            return web.Response(body=payload, status=200, content_type=_mime(entry.content_type))
        if isinstance(entry, Hang):
            if stream:
                resp = await self._open_stream(request, rec)
                for chunk in _split(entry.partial, None):
                    await self._write_chunk(resp, rec, self._delta(rec, chunk, self._usage_chunks(rec)))
            await self._sleep(None)
            raise AssertionError("unreachable")
        if isinstance(entry, Drop):
            if stream:
                resp = await self._open_stream(request, rec)
                for chunk in _split(entry.partial, None):
                    await self._write_chunk(resp, rec, self._delta(rec, chunk, self._usage_chunks(rec)))
            self._finish(rec, aborted=True, status=200 if stream else None)
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError()

        # Reply / SlowStream
        chunk_delay = entry.chunk_delay if isinstance(entry, SlowStream) else 0.0
        chunks = _split(entry.text, entry.chunks)
        usage = _usage(entry.usage, entry.usage_shape, body, entry.text)
        if not stream:
            if chunk_delay:
                await self._sleep(chunk_delay * max(1, len(chunks)))
            payload_obj: dict[str, Any] = {
                "id": f"chatcmpl-{rec.index}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or self.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": entry.text},
                        "logprobs": None,
                        "finish_reason": entry.finish_reason,
                    }
                ],
            }
            if usage is not None:
                payload_obj["usage"] = usage
            self._finish(rec, completed=True, status=200)
            return web.json_response(payload_obj)

        include_usage = self._usage_chunks(rec)
        resp = await self._open_stream(request, rec)
        rec.status = 200
        for chunk in chunks:
            if chunk_delay:
                await self._sleep(chunk_delay)
            await self._write_chunk(resp, rec, self._delta(rec, chunk, include_usage))
        await self._write_chunk(resp, rec, self._chunk(rec, {}, entry.finish_reason, include_usage))
        if include_usage and usage is not None:
            final = self._chunk(rec, None, None, include_usage)
            final["choices"] = []
            final["usage"] = usage
            await self._write_chunk(resp, rec, final)
        await self._write_raw(resp, b"data: [DONE]\n\n")
        await resp.write_eof()
        self._finish(rec, completed=True, status=200)
        return resp

    # ---- helpers ----------------------------------------------------------------------------

    def _usage_chunks(self, rec: RequestRecord) -> bool:
        """Whether stream chunks carry ``usage`` (null, then a final usage-only chunk)."""
        body = rec.body if isinstance(rec.body, dict) else {}
        return self.stream_usage and bool((body.get("stream_options") or {}).get("include_usage"))

    async def _sleep(self, seconds: float | None) -> None:
        """Sleep (forever when None); the server stopping ends it with CancelledError."""
        assert self._stopping is not None
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            done, _ = await asyncio.wait({stopping}, timeout=seconds)
        finally:
            stopping.cancel()
        if done:
            raise asyncio.CancelledError()

    async def _open_stream(self, request: web.Request, rec: RequestRecord) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=200,
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        )
        await resp.prepare(request)
        rec.status = 200
        # First chunk announces the role, like OpenAI.
        first = self._chunk(rec, {"role": "assistant", "content": ""}, None, self._usage_chunks(rec))
        await self._write_chunk(resp, rec, first, count=False)
        return resp

    def _chunk(
        self,
        rec: RequestRecord,
        delta: dict[str, Any] | None,
        finish_reason: str | None,
        include_usage: bool = False,
    ) -> dict[str, Any]:
        body = rec.body if isinstance(rec.body, dict) else {}
        chunk: dict[str, Any] = {
            "id": f"chatcmpl-{rec.index}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish_reason}],
        }
        if include_usage:
            chunk["usage"] = None
        return chunk

    def _delta(self, rec: RequestRecord, text: str, include_usage: bool = False) -> dict[str, Any]:
        return self._chunk(rec, {"content": text}, None, include_usage)

    async def _write_chunk(
        self, resp: web.StreamResponse, rec: RequestRecord, chunk: dict[str, Any], *, count: bool = True
    ) -> None:
        await self._write_raw(resp, b"data: " + json.dumps(chunk).encode() + b"\n\n")
        if count:
            with self._cond:
                rec.chunks_sent += 1
                self._cond.notify_all()

    async def _write_raw(self, resp: web.StreamResponse, data: bytes) -> None:
        try:
            await resp.write(data)
        except (ConnectionResetError, RuntimeError) as exc:  # closed transport
            raise _ClientGone() from exc


# llama-cpp-python 0.3.36 validates messages with pydantic and answers a `developer` message with
# HTTP 500 (openai.InternalServerError, which the SDK retries unless max_retries=0), body:
LLAMA_CPP_DEVELOPER_STATUS = 500
LLAMA_CPP_DEVELOPER_BODY: dict[str, Any] = {
    "error": {
        "message": (
            "7 validation errors:\n  {'type': 'literal_error', 'loc': ('body', 'messages', 0, "
            "'ChatCompletionRequestSystemMessage', 'role'), 'msg': \"Input should be 'system'\", "
            "'input': 'developer', 'ctx': {'expected': \"'system'\"}}\n  ..."
        ),
        "type": "internal_server_error",
        "param": None,
        "code": None,
    }
}


def _kind(entry: Response) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(entry).__name__).lower()


def _mime(content_type: str) -> str:
    return content_type.split(";")[0].strip()


def _split(text: str, chunks: Iterable[str] | None) -> list[str]:
    if chunks is not None:
        return list(chunks)
    return _WORDS.findall(text)


_DATA_URL = re.compile(r"data:(?P<type>[a-z]+/[a-z0-9.+-]+);base64,[A-Za-z0-9+/]+=*")


def content_part_problem(messages: list[Any]) -> str | None:
    """Why a message's content parts would be refused, like the chat API refuses them: parts are
    `text`, `image_url` (a data URL of an image) and `file` (a filename and a PDF data URL); image
    and file parts only in user messages. None when they are fine (or there are none)."""
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        where = f"messages[{index}].content"
        for position, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                if not isinstance(part.get("text"), str):
                    return f"{where}[{position}]: a text part needs a string 'text'"
                continue
            if kind not in ("image_url", "file"):
                return f"{where}[{position}]: unknown content part type {kind!r}"
            if message.get("role") != "user":
                return f"{where}[{position}]: {kind} parts are only allowed in user messages"
            if kind == "image_url":
                url = (part.get("image_url") or {}).get("url")
                found = _DATA_URL.fullmatch(url) if isinstance(url, str) else None
                if found is None or not found["type"].startswith("image/"):
                    return f"{where}[{position}]: image_url.url must be an image data URL"
            else:
                file = part.get("file") or {}
                found = _DATA_URL.fullmatch(file.get("file_data") or "")
                if not file.get("filename") or found is None or found["type"] != "application/pdf":
                    return f"{where}[{position}]: a file part needs a filename and a PDF data URL in file_data"
    return None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _approx_tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


OverflowStyle = Literal["llama-cpp-python", "openai", "llama.cpp"]


def prompt_tokens(body: dict[str, Any]) -> int:
    """The request's prompt size as this server counts it (as the auto usage does)."""
    return sum(_approx_tokens(_content_text(m.get("content"))) for m in body["messages"] if isinstance(m, dict))


def overflow_response(style: OverflowStyle, window: int, body: dict[str, Any]) -> dict[str, Any] | None:
    """The HTTP 400 body a server of this style answers a request over its window with (None: it fits).

    llama-cpp-python 0.3.x refuses when the prompt alone reaches n_ctx (llama_cpp/llama.py) and
    rewrites the error in OpenAI's words (llama_cpp/server/errors.py); OpenAI counts the completion
    tokens too; llama.cpp's own server answers `exceed_context_size_error` with both numbers.
    """
    prompt = prompt_tokens(body)
    completion = body.get("max_tokens") or body.get("max_completion_tokens") or 0
    if style == "openai":
        if prompt + completion <= window:
            return None
        return {
            "error": {
                "message": f"This model's maximum context length is {window} tokens. However, your messages "
                f"resulted in {prompt + completion} tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }
    if prompt < window:
        return None
    if style == "llama.cpp":
        return {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": prompt,
                "n_ctx": window,
            }
        }
    return {
        "error": {
            "message": f"This model's maximum context length is {window} tokens. However, you requested "
            f"{prompt + completion} tokens ({prompt} in the messages, {completion} in the completion). "
            "Please reduce the length of the messages or completion.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def _usage(spec: UsageSpec, shape: str, body: dict[str, Any], text: str) -> dict[str, Any] | None:
    if spec is None:
        return None
    if isinstance(spec, dict):
        return dict(spec)
    if spec == "auto":
        n_in = sum(_approx_tokens(_content_text(m.get("content"))) for m in body["messages"] if isinstance(m, dict))
        n_out = _approx_tokens(text)
    else:
        n_in, n_out = spec
    if shape == "responses":
        return {"input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out}
    return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}


def _error_response(status: int, message: str) -> web.Response:
    return web.json_response(
        {
            "error": {
                "message": message,
                "type": _ERROR_TYPES.get(status, "server_error"),
                "param": None,
                "code": None,
            }
        },
        status=status,
    )


def _fail_response(entry: Fail, request_headers: dict[str, str]) -> web.Response:
    headers = dict(entry.headers)
    if entry.body is None:
        lowered = {name.lower(): value for name, value in request_headers.items()}
        echoed = "".join(f" ({name}: {lowered.get(name.lower(), '')})" for name in entry.echo_headers)
        resp = _error_response(entry.status, f"scripted failure ({entry.status}){echoed}")
        resp.headers.update(headers)
        return resp
    if isinstance(entry.body, dict):
        payload = json.dumps(entry.body).encode()
    else:
        payload = entry.body.encode() if isinstance(entry.body, str) else entry.body
    return web.Response(body=payload, status=entry.status, content_type=_mime(entry.content_type), headers=headers)


# --------------------------------------------------------------------------------------------
# Standalone
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.scripted_llm", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks an ephemeral port (printed)")
    parser.add_argument("--instant", action="store_true", help="answer instantly, keep no records")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each default answer")
    parser.add_argument("--model", default="scripted")
    parser.add_argument("--developer-role", choices=["accept", "reject"], default="accept")
    args = parser.parse_args(argv)

    seconds = 0.0 if args.instant else args.delay

    def responder(body: dict[str, Any]) -> Response:
        return dataclasses.replace(echo_responder(body), delay=seconds)

    server = ScriptedLLM(
        host=args.host,
        port=args.port,
        model=args.model,
        default=responder,
        developer_role=args.developer_role,
        record=not args.instant,
    )

    async def serve() -> None:
        await server.astart()
        print(f"listening on {server.base_url}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.astop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
