"""The LLM caller worker (`agentstream worker caller`): `llm-requests` in, append commands out.

Consumes the records the journal processor writes to `llm-requests` (keyed by stream path, one
JSON `LlmRequestRecord` each), calls the provider through the openai SDK, and appends the outcome
to the stream through `pipeline.client.Client` (docs/behaviour.md §4.3, §4.4, §4.5). What to append for
each outcome is decided by the pure `processors.llm_outcomes`.

Concurrency. Everything runs on one asyncio loop. Many streams are in flight at once (at most
`llm_max_in_flight` provider calls, a semaphore); per stream there is one *call lane* and one
*compaction lane*, each running at most one job, the rest waiting in arrival order. A call record
whose request offset is not newer than one already started (or queued) for its stream is skipped:
the processor opens a new request offset for every attempt, so an old or repeated offset is stale.

Commits (at-least-once). A record is *finished* once its appends are produced (or it needed none).
Per partition the committed offset is the first unfinished record's offset; before each commit the
producer is flushed, so a committed record's appends are in Kafka. A restart re-delivers every
unfinished record and repeats its call; the idempotency keys (derived from the request offset)
make the journal answer the second set of appends as duplicates, or keep the first body when a
repeated call produced different text (logged at info, never an error).

Context overflow. A call the provider refuses for exceeding the model's context window is not
retried as it is: its history is summarized (§4.5), leaving out the oldest history messages until
the summary call fits, and the summary item (replacing history through R, key
`agent/compact-context@overflow-<R>`) is appended before R's failed settlement, whose retry then
answers from the compacted context. If no summary call fits, only the failed settlement goes out.

Secrets. Provider error text is scrubbed of the configured API key and of anything shaped like a
credential before it is appended or logged (`processors.llm_outcomes.scrub`).

Cancel. A `cancel` record for the call running in its stream's lane cancels that task, which
closes the HTTP connection (so a streaming provider stops generating); the task's completion then
appends the partial output (if any) and the cancelled settlement. A cancel for a call still waiting
in the lane (or for a provider slot) settles it as cancelled without any HTTP call. A cancel for a
call that already finished (or is unknown here) does nothing: its settlement already went out.

Rebalance and shutdown. Revoked partitions get a short grace for their running calls, then those
calls are abandoned (cancelled, nothing appended; the new owner repeats them) and finished work is
committed. SIGTERM/SIGINT stops consuming and starts no queued job, waits up to the shutdown
timeout for running calls (a second signal stops waiting), abandons what is left, flushes and
commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import signal
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import openai
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition
from openai import AsyncOpenAI
from pydantic import TypeAdapter, ValidationError

from pipeline import metrics
from pipeline.client import AppendError, Client, Receipt
from pipeline.offset_progress import PartitionProgress
from pipeline.settings import Settings
from processors import llm_outcomes as outcomes
from schemas.requests import CallRequest, CancelRequest, CompactRequest, LlmRequestRecord, Message, Transport
from topics.names import topic_names

log = logging.getLogger("agentstream.caller")

_records: TypeAdapter[Any] = TypeAdapter(LlmRequestRecord)

EXIT_FATAL = 70
EXIT_KAFKA = 3  # as the CLI's
RECEIPT_TTL_S = 120.0  # how long to wait for the journal's answer to an append (for the log only)
STALE_MEMORY = 100_000  # streams whose newest handled offsets are remembered


class CallerFatal(RuntimeError):
    """The worker cannot go on safely (appends could not be delivered): exit without committing."""


class InvalidResponse(Exception):
    """The provider answered, but not with a usable chat completion."""


# --- bookkeeping ---------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class Job:
    """One call or compaction record being worked on."""

    record: CallRequest | CompactRequest
    tp: TopicPartition
    offset: int
    partial: list[str] = field(default_factory=list)
    task: asyncio.Task[Result] | None = None
    interrupted: bool = False  # a cancel record asked for it: settle as cancelled
    abandoned: bool = False  # rebalance or shutdown: append nothing, leave the record unfinished
    queued_at: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class Lane:
    running: Job | None = None
    queue: deque[Job] = field(default_factory=deque)

    def jobs(self) -> list[Job]:
        return ([self.running] if self.running is not None else []) + list(self.queue)


@dataclass(frozen=True, slots=True)
class Result:
    status: str  # succeeded | failed | expired | overflow (a call over the context window, see `summary`)
    text: str = ""
    usage: dict[str, int] | None = None
    error: str = ""
    duration_ms: int = 0
    summary: Summary | None = None  # the summary call that fitted (compactions, overflows)
    summary_error: str = ""  # overflow: why no summary call fitted


@dataclass(frozen=True, slots=True)
class Summary:
    call: outcomes.SummaryCall
    text: str
    usage: dict[str, int] | None


class SummaryFailed(Exception):
    """No summary call was answered; the text says why (scrubbed)."""


class _Bounded(OrderedDict[str, int]):
    """Newest handled offset per stream, forgetting the least recently used streams."""

    def bump(self, key: str, value: int) -> None:
        self[key] = max(value, self.get(key, 0))
        self.move_to_end(key)
        if len(self) > STALE_MEMORY:
            self.popitem(last=False)


# --- provider responses and errors ----------------------------------------------------------------


def _as_mapping(value: Any) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        return value
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        with contextlib.suppress(Exception):
            dumped = dump()
            return dumped if isinstance(dumped, Mapping) else None
    return None


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


def describe_error(error: BaseException, timeout_s: float, secrets: tuple[str | None, ...] = ()) -> str:
    """One line a person can act on; never a traceback, never a credential (`secrets`: the
    configured API key; credential-shaped text goes too)."""
    if isinstance(error, openai.APIStatusError):
        text = f"HTTP {error.status_code} from the provider: {_provider_message(error)}"
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
    return outcomes.one_line(outcomes.scrub(text, secrets))


def _overflow(error: BaseException, text: str) -> bool:
    """Whether the provider refused the request for exceeding the model's context window."""
    return isinstance(error, openai.APIStatusError) and outcomes.is_context_overflow(
        error.status_code, error.body, text
    )


def _completion_text(response: Any) -> str:
    """The text of a non-streaming chat completion, or InvalidResponse."""
    if isinstance(response, (str, bytes)):
        raise InvalidResponse("the provider's response is not a chat completion (not JSON)")
    choices = getattr(response, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise InvalidResponse("the provider's response has no choices")
    message = getattr(choices[0], "message", None)
    content = getattr(message, "content", None)
    if not isinstance(content, str) or not content.strip():
        raise InvalidResponse("the provider returned an empty response")
    return content


# --- the worker ------------------------------------------------------------------------------------


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, caller: LlmCaller) -> None:
        self.caller = caller

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.caller._revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.caller._assigned(set(assigned))


class LlmCaller:
    def __init__(
        self,
        settings: Settings,
        *,
        shutdown_timeout_s: float = 25.0,
        rebalance_grace_s: float = 5.0,
        commit_interval_s: float = 0.2,
        session_timeout_ms: int | None = None,
    ) -> None:
        self.settings = settings
        self.topic = topic_names(settings.topic_prefix).llm_requests
        self.shutdown_timeout_s = shutdown_timeout_s
        self.rebalance_grace_s = rebalance_grace_s
        self.commit_interval_s = commit_interval_s
        if session_timeout_ms is None:  # the workers' shared setting, where this version of Settings has it
            session_timeout_ms = int(float(getattr(settings, "session_timeout_s", 10.0)) * 1000)
        self.session_timeout_ms = session_timeout_ms
        self.max_queued = max(2 * settings.llm_max_in_flight, 16)
        self.fatal: BaseException | None = None
        self.ready = threading.Event()  # set once partitions are assigned (tests, readiness)
        self._calls: dict[str, Lane] = {}
        self._compactions: dict[str, Lane] = {}
        self._latest_call = _Bounded()
        self._latest_compaction = _Bounded()
        self._progress: dict[TopicPartition, PartitionProgress] = {}
        self._receipts: dict[str, tuple[Receipt, str, float]] = {}
        self._draining = False
        self._paused = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._force: asyncio.Event | None = None
        self._stop_requests = 0
        self._client: Client | None = None
        self._openai: AsyncOpenAI | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._slots: asyncio.Semaphore | None = None
        self._commit_lock: asyncio.Lock | None = None

    # ---- lifecycle --------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop gracefully; a second request stops waiting for running calls. Thread-safe."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # loop already closed
            loop.call_soon_threadsafe(self._on_stop_request)

    def _on_stop_request(self) -> None:
        self._stop_requests += 1
        assert self._stop is not None and self._force is not None
        if self._stop_requests > 1:
            log.warning("second stop request: abandoning running calls")
            self._force.set()
        self._stop.set()

    async def serve(self) -> None:
        """Consume until `request_stop`, then shut down cleanly. Raises CallerFatal if appends failed."""
        settings = self.settings
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._force = asyncio.Event()
        self._slots = asyncio.Semaphore(settings.llm_max_in_flight)
        self._commit_lock = asyncio.Lock()
        self._client = await asyncio.to_thread(lambda: Client(settings, internal=True))
        self._openai = AsyncOpenAI(
            base_url=settings.llm_base_url,
            api_key=settings.openai_api_key or "agentstream-local",
            max_retries=0,  # retries are the journal's business (docs/behaviour.md §4.3)
            timeout=settings.llm_timeout_s,
        )
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.bootstrap_servers,
            group_id=settings.caller_group,
            client_id=f"{settings.caller_group}-caller",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=max(500, self.session_timeout_ms // 3),
            max_poll_interval_ms=max(300_000, int(settings.llm_timeout_s * 1000) * 3),
            **settings.aiokafka_config(),
        )
        self._consumer.subscribe([self.topic], listener=_Rebalance(self))
        log.info(
            "LLM caller: group %s consuming %s; provider %s (max %d in flight, timeout %gs)",
            settings.caller_group,
            self.topic,
            settings.llm_base_url or "api.openai.com",
            settings.llm_max_in_flight,
            settings.llm_timeout_s,
        )
        committer: asyncio.Task[None] | None = None
        try:
            await self._consumer.start()
            committer = asyncio.create_task(self._commit_loop())
            while not self._stop.is_set():
                batch = await self._consumer.getmany(timeout_ms=200, max_records=500)
                try:
                    for tp, messages in batch.items():
                        for message in messages:
                            self._dispatch(tp, message.offset, message.value)
                except Exception as error:  # an append failed: stop before committing anything more
                    self._fail(error)
                    break
                self._backpressure()
        finally:
            await self._shutdown(committer)
        if self.fatal is not None:
            raise CallerFatal(str(self.fatal)) from self.fatal

    async def _shutdown(self, committer: asyncio.Task[None] | None) -> None:
        assert self._force is not None
        self._draining = True
        running = self._running_tasks()
        if running and self.fatal is None:
            log.info("stopping: waiting up to %gs for %d running call(s)", self.shutdown_timeout_s, len(running))
            deadline = time.monotonic() + self.shutdown_timeout_s
            while running and time.monotonic() < deadline and not self._force.is_set():
                await asyncio.wait(running, timeout=min(0.1, max(0.0, deadline - time.monotonic())))
                running = self._running_tasks()
        await self._abandon([job for lane in self._lanes() for job in lane.jobs()], "shutting down")
        if committer is not None:
            committer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await committer
        if self.fatal is None and self._consumer is not None and self._client is not None:
            try:
                await self._commit()
            except Exception as error:  # shutting down: say it and go on
                log.warning("final commit failed: %s", error)
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._consumer.stop()
        if self._openai is not None:
            with contextlib.suppress(Exception):
                await self._openai.close()
        if self._client is not None:
            await asyncio.to_thread(self._client.close)
        log.info("LLM caller stopped")

    def _fail(self, error: BaseException) -> None:
        if self.fatal is None:
            log.critical("LLM caller cannot continue safely (nothing more is committed): %s", error)
            self.fatal = error
        if self._stop is not None:
            self._stop.set()
        if self._force is not None:
            self._force.set()

    # ---- records ----------------------------------------------------------------------------

    def _dispatch(self, tp: TopicPartition, offset: int, value: bytes | None) -> None:
        progress = self._progress.get(tp)
        if progress is None:  # revoked since it was fetched
            return
        progress.consumed(offset)
        try:
            record = _records.validate_json(value or b"")
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(record)'}: {e['msg']}"
                for e in error.errors(include_url=False)[:3]
            )
            log.warning(
                "skipping unparsable llm-requests record %s[%d]@%d: %s", tp.topic, tp.partition, offset, problems
            )
            progress.finished(offset)
            return
        if isinstance(record, CancelRequest):
            progress.finished(offset)  # its call record (earlier, same partition) holds the commit point
            self._cancel(record)
        elif isinstance(record, CallRequest):
            self._enqueue(self._calls, self._latest_call, record.streamPath, record.requestOffset, record, tp, offset)
        else:
            self._enqueue(
                self._compactions, self._latest_compaction, record.streamPath, record.reportOffset, record, tp, offset
            )

    def _enqueue(
        self,
        lanes: dict[str, Lane],
        latest: _Bounded,
        path: str,
        order: int,
        record: CallRequest | CompactRequest,
        tp: TopicPartition,
        offset: int,
    ) -> None:
        lane = lanes.get(path)
        # Settled here, or running, or waiting. Not abandoned work: that must run again when its
        # partition comes back.
        newest = max([latest.get(path, 0), *(_order(job.record) for job in (lane.jobs() if lane else []))])
        if order <= newest:
            log.info("%s %s @%d: skipped, @%d was already handled here", record.kind, path, order, newest)
            self._finished(tp, offset)
            return
        if lane is None:
            lane = lanes[path] = Lane()
        lane.queue.append(Job(record, tp, offset))
        self._pump(lanes, latest, path)

    def _pump(self, lanes: dict[str, Lane], latest: _Bounded, path: str) -> None:
        """Start the lane's next job if it is idle; forget idle lanes."""
        lane = lanes.get(path)
        if lane is None:
            return
        if lane.running is None and lane.queue and not self._draining:
            job = lane.queue.popleft()
            lane.running = job
            if isinstance(job.record, CallRequest):
                job.task = asyncio.create_task(self._call(job), name=f"call {path} @{job.record.requestOffset}")
            else:
                job.task = asyncio.create_task(self._compact(job), name=f"compact {path} @{job.record.reportOffset}")
            job.task.add_done_callback(functools.partial(self._done, lanes, latest, path, job))
        if lane.running is None and not lane.queue:
            del lanes[path]

    def _cancel(self, record: CancelRequest) -> None:
        path, request = record.streamPath, record.requestOffset
        lane = self._calls.get(path)
        if lane is not None:
            job = lane.running
            if job is not None and _order(job.record) == request and job.task is not None and not job.task.done():
                job.interrupted = True
                job.task.cancel()  # closes the HTTP connection; `_done` appends partial + settlement
                return
            for queued in lane.queue:
                if _order(queued.record) == request:
                    lane.queue.remove(queued)
                    self._latest_call.bump(path, request)
                    self._append(path, outcomes.cancelled(request, ""))
                    self._finished(queued.tp, queued.offset)
                    log.info("call %s @%d: cancelled before it started (no provider call)", path, request)
                    self._pump(self._calls, self._latest_call, path)
                    return
        log.info("cancel %s @%d: no such call running or waiting here (already settled); nothing to do", path, request)

    # ---- provider calls ---------------------------------------------------------------------

    async def _call(self, job: Job) -> Result:
        record = job.record
        assert isinstance(record, CallRequest) and self._slots is not None and self._openai is not None
        async with self._slots:
            if time.time() * 1000 >= record.expiresAt:
                return Result("expired")
            started = time.monotonic()
            # Past expiresAt the journal settles the request as expired (docs/behaviour.md §4.3); a call still
            # running then could only append a stale outcome (a failure would journal an error item
            # saying it retries), so it stops there and appends nothing.
            loop = asyncio.get_running_loop()
            expiry = asyncio.timeout_at(loop.time() + (record.expiresAt - time.time() * 1000) / 1000)
            try:
                async with expiry:
                    usage = await self._stream(record, job)
            except Exception as error:  # every provider failure is an outcome, never a crash
                if expiry.expired():
                    return Result("expired", duration_ms=_ms(started))
                described = self._describe(error)
                if not _overflow(error, described):
                    return Result("failed", error=described, duration_ms=_ms(started))
                return await self._after_overflow(record, error, described, started)
            text = "".join(job.partial)
            if not text:
                return Result("failed", error="the provider returned an empty response", duration_ms=_ms(started))
            return Result("succeeded", text=text, usage=usage, duration_ms=_ms(started))

    async def _stream(self, record: CallRequest, job: Job) -> dict[str, int] | None:
        """Stream the completion into `job.partial` (kept if the task is cancelled); return usage."""
        assert self._openai is not None
        if not self.settings.streaming:
            return await self._complete(record, job)
        usage: dict[str, int] | None = None
        chunks = 0
        async with asyncio.timeout(self.settings.llm_timeout_s):
            stream: Any = await self._openai.chat.completions.create(
                model=record.model,
                messages=outcomes.provider_messages(record.messages),  # type: ignore[arg-type]
                **self._limit(record.transport),
                stream=True,
                stream_options={"include_usage": True},
            )
            if not hasattr(stream, "__aiter__"):
                raise InvalidResponse("the provider did not answer with a stream")
            try:
                async for chunk in stream:
                    chunks += 1
                    usage = outcomes.normalize_usage(_as_mapping(getattr(chunk, "usage", None))) or usage
                    choices = getattr(chunk, "choices", None)
                    if not isinstance(choices, list):
                        continue
                    for choice in choices:
                        if getattr(choice, "index", 0) not in (0, None):
                            continue
                        content = getattr(getattr(choice, "delta", None), "content", None)
                        if isinstance(content, str) and content:
                            job.partial.append(content)
            finally:
                with contextlib.suppress(Exception):
                    await stream.close()
        if chunks == 0:
            raise InvalidResponse("the provider's response is not a chat completion stream (no chunks)")
        return usage

    async def _complete(self, record: CallRequest, job: Job) -> dict[str, int] | None:
        """Non-streaming call (settings.streaming off): the whole text at once, with usage."""
        assert self._openai is not None
        async with asyncio.timeout(self.settings.llm_timeout_s):
            response = await self._openai.chat.completions.create(
                model=record.model,
                messages=outcomes.provider_messages(record.messages),  # type: ignore[arg-type]
                **self._limit(record.transport),
            )
        job.partial.append(_completion_text(response))
        return outcomes.normalize_usage(_as_mapping(getattr(response, "usage", None)))

    async def _after_overflow(self, record: CallRequest, error: Exception, described: str, started: float) -> Result:
        """Request R exceeded the model's context window: summarize its history (leaving out the
        oldest until a summary call fits), still within R's expiry."""
        loop = asyncio.get_running_loop()
        expiry = asyncio.timeout_at(loop.time() + (record.expiresAt - time.time() * 1000) / 1000)
        body = error.body if isinstance(error, openai.APIStatusError) else None
        try:
            async with expiry:
                summary = await self._summarize(record.model, record.transport, record.messages, (body, described))
        except SummaryFailed as failure:
            return Result("overflow", error=described, summary_error=str(failure), duration_ms=_ms(started))
        except TimeoutError:
            if expiry.expired():
                return Result("expired", duration_ms=_ms(started))
            raise
        return Result("overflow", error=described, summary=summary, duration_ms=_ms(started))

    async def _compact(self, job: Job) -> Result:
        record = job.record
        assert isinstance(record, CompactRequest) and self._slots is not None and self._openai is not None
        async with self._slots:
            started = time.monotonic()
            try:
                summary = await self._summarize(record.model, record.transport, record.messages, None)
            except SummaryFailed as failure:
                return Result("failed", error=str(failure), duration_ms=_ms(started))
            return Result(
                "succeeded", text=summary.text, usage=summary.usage, summary=summary, duration_ms=_ms(started)
            )

    async def _summarize(
        self, model: str, transport: Transport, messages: list[Message], overflow: tuple[Any, str] | None
    ) -> Summary:
        """Summarize `messages` plus the instruction (§4.5). After a context overflow (`overflow`:
        the refused call's error body and text), or when a summary call overflows itself, the calls
        leave out more and more of the oldest history until one is answered."""
        assert self._openai is not None
        if overflow is None:
            calls = [outcomes.SummaryCall(outcomes.compaction_messages(messages, transport))]
        else:
            calls = outcomes.summary_calls(messages, transport, outcomes.overflow_ratio(*overflow))
        trimming = overflow is not None
        last_error = "no summary call was made"
        index = 0
        while index < len(calls):
            call = calls[index]
            index += 1
            try:
                async with asyncio.timeout(self.settings.llm_timeout_s):
                    response = await self._openai.chat.completions.create(
                        model=model,
                        messages=call.messages,  # type: ignore[arg-type]
                        **self._limit(transport),
                    )
                text = _completion_text(response)
                return Summary(call, text, outcomes.normalize_usage(_as_mapping(getattr(response, "usage", None))))
            except Exception as error:
                last_error = self._describe(error)
                if not _overflow(error, last_error):
                    raise SummaryFailed(last_error) from None
                if not trimming:  # the summary call itself is over the window: trim from now on
                    trimming = True
                    body = error.body if isinstance(error, openai.APIStatusError) else None
                    calls = outcomes.summary_calls(messages, transport, outcomes.overflow_ratio(body, last_error))
                    index = 0
        raise SummaryFailed(last_error)

    def _describe(self, error: BaseException) -> str:
        return describe_error(error, self.settings.llm_timeout_s, (self.settings.openai_api_key,))

    def _limit(self, transport: str) -> dict[str, int]:
        """The output token limit. OpenAI's newer models reject `max_tokens` (its replacement is
        `max_completion_tokens`); OpenAI-compatible servers such as llama-cpp know only `max_tokens`."""
        if transport == "openai":
            return {"max_completion_tokens": self.settings.llm_max_tokens}
        return {"max_tokens": self.settings.llm_max_tokens}

    def _done(self, lanes: dict[str, Lane], latest: _Bounded, path: str, job: Job, task: asyncio.Task[Result]) -> None:
        """A job's task ended: append its outcome, finish its record, start the lane's next job."""
        try:
            lane = lanes.get(path)
            if lane is not None and lane.running is job:
                lane.running = None
            if self._settle(path, job, task):
                latest.bump(path, _order(job.record))
            self._pump(lanes, latest, path)
        except Exception as error:  # an append failed: stop before committing anything more
            self._fail(error)

    def _settle(self, path: str, job: Job, task: asyncio.Task[Result]) -> bool:
        """Append the job's outcome and finish its record; False if it must run again (abandoned)."""
        record = job.record
        kind = record.kind
        order = _order(record)
        waited = time.monotonic() - job.queued_at
        if job.abandoned:
            log.info(
                "%s %s @%d model=%s: abandoned after %.1fs (will be repeated)", kind, path, order, record.model, waited
            )
            return False
        if task.cancelled():
            if not job.interrupted or not isinstance(record, CallRequest):
                log.info("%s %s @%d: cancelled, nothing appended (will be repeated)", kind, path, order)
                return False
            partial = "".join(job.partial)
            self._append(path, outcomes.cancelled(order, partial))
            log.info(
                "call %s @%d model=%s %dms cancelled (interrupted; %d partial chars)",
                path,
                order,
                record.model,
                int(waited * 1000),
                len(partial),
            )
            self._finished(job.tp, job.offset)
            return True
        error = task.exception()
        secrets = (self.settings.openai_api_key,)
        result = (
            Result(
                "failed",
                error=outcomes.scrub(f"internal error in the caller ({type(error).__name__}: {error})", secrets),
            )
            if error is not None
            else task.result()
        )
        if error is not None:  # the traceback is scrubbed too: an exception's text may quote a request
            trace = "".join(traceback.format_exception(error))
            log.error("%s %s @%d crashed:\n%s", kind, path, order, outcomes.scrub(trace, secrets))
        if result.duration_ms:
            metrics.PROVIDER_SECONDS.labels(result.status).observe(result.duration_ms / 1000)
        if isinstance(record, CallRequest):
            if result.status == "expired":
                log.info(
                    "call %s @%d model=%s: expired (%s); nothing appended, the journal settles it",
                    path,
                    order,
                    record.model,
                    f"stopped after {result.duration_ms}ms" if result.duration_ms else "not called",
                )
            elif result.status == "succeeded":
                self._append(
                    path,
                    outcomes.succeeded(
                        order,
                        record.model,
                        result.text,
                        result.usage,
                        result.duration_ms,
                        self.settings.context_tokens(record.model),
                    ),
                )
                log.info(
                    "call %s @%d model=%s %dms succeeded (%d chars, usage %s)",
                    path,
                    order,
                    record.model,
                    result.duration_ms,
                    len(result.text),
                    result.usage or "not reported",
                )
            elif result.status == "overflow":
                self._overflowed(path, record, result)
            else:
                self._append(path, outcomes.failed(order, record.attempt, record.maxAttempts, result.error))
                log.info(
                    "call %s @%d model=%s %dms failed (attempt %d of %d): %s",
                    path,
                    order,
                    record.model,
                    result.duration_ms,
                    record.attempt,
                    record.maxAttempts,
                    result.error,
                )
        elif result.status == "succeeded":
            call = result.summary.call if result.summary is not None else None
            self._append(
                path,
                outcomes.compacted(
                    record.requestOffset, order, record.tokens, record.threshold, result.text, result.usage, call
                ),
            )
            log.info(
                "compact %s @%d (through @%d) model=%s %dms succeeded (%d chars)",
                path,
                order,
                record.requestOffset,
                record.model,
                result.duration_ms,
                len(result.text),
            )
        else:
            log.warning(
                "compact %s @%d (through @%d) model=%s %dms failed, nothing appended: %s",
                path,
                order,
                record.requestOffset,
                record.model,
                result.duration_ms,
                result.error,
            )
        self._finished(job.tp, job.offset)
        return True

    def _overflowed(self, path: str, record: CallRequest, result: Result) -> None:
        """Call R exceeded the context window: the summary item and R's failed settlement (whose
        retry answers from the compacted context), or only the failed settlement."""
        r = record.requestOffset
        summary = result.summary
        if summary is None:
            appends = outcomes.overflow_not_compacted(
                r, record.attempt, record.maxAttempts, result.error, result.summary_error
            )
            self._append(path, appends)
            log.warning(
                "call %s @%d model=%s %dms over the context window, and no summary call fitted: %s",
                path,
                r,
                record.model,
                result.duration_ms,
                result.summary_error,
            )
            return
        self._append(
            path,
            outcomes.overflow_compacted(
                r, record.attempt, record.maxAttempts, result.error, summary.text, summary.usage, summary.call
            ),
        )
        log.info(
            "call %s @%d model=%s %dms over the context window: compacted (%d oldest messages left out of the "
            "summary), settled failed (attempt %d of %d): %s",
            path,
            r,
            record.model,
            result.duration_ms,
            summary.call.dropped,
            record.attempt,
            record.maxAttempts,
            result.error,
        )

    # ---- appends, commits, rebalances --------------------------------------------------------

    def _append(self, path: str, appends: list[outcomes.Append]) -> None:
        """Produce the commands in order; their delivery is awaited before the record is committed."""
        assert self._client is not None
        stream = self._client.streams.get(path)
        deadline = time.monotonic() + RECEIPT_TTL_S
        for append in appends:
            receipt = stream.append(append.event())
            self._receipts[receipt.append_id] = (receipt, append.idempotencyKey, deadline)

    def _finished(self, tp: TopicPartition, offset: int) -> None:
        progress = self._progress.get(tp)
        if progress is not None:
            progress.finished(offset)

    async def _commit_loop(self) -> None:
        last_receipts = 0.0
        while True:
            await asyncio.sleep(self.commit_interval_s)
            try:
                await self._commit()
            except CallerFatal as error:
                self._fail(error)
                return
            except AppendError as error:
                log.warning("appends not yet delivered, commit postponed: %s", error)
            except Exception as error:  # the next round retries
                log.warning("commit failed, retrying: %s", error)
            if time.monotonic() - last_receipts >= 1.0:
                last_receipts = time.monotonic()
                self._check_receipts()

    async def _commit(self) -> None:
        """Flush the producer, then commit each partition's first unfinished offset."""
        assert self._commit_lock is not None and self._consumer is not None and self._client is not None
        async with self._commit_lock:
            offsets: dict[TopicPartition, int] = {}
            for tp, progress in self._progress.items():
                point = progress.committable()
                if point is not None and point != progress.committed:
                    offsets[tp] = point
            if not offsets:
                return
            # Every append of the records counted above was produced before this flush started.
            try:
                await asyncio.to_thread(self._client.flush, 30.0)
            except AppendError as failure:
                raise CallerFatal(f"appends could not be delivered to Kafka: {failure}") from None
            try:
                await self._consumer.commit(offsets)
            except KafkaError as error:
                log.info("commit skipped (%s); it is retried", error)
                return
            for tp, point in offsets.items():
                progress = self._progress.get(tp)
                if progress is not None:
                    progress.committed = point

    def _check_receipts(self) -> None:
        """Log what the journal made of our appends (a repeated call's differing text is expected)."""
        now = time.monotonic()
        for append_id, (receipt, key, deadline) in list(self._receipts.items()):
            try:
                result = receipt.result(timeout=0)
            except AppendError:
                if now > deadline:
                    del self._receipts[append_id]
                continue
            del self._receipts[append_id]
            if result.status == "rejected":
                log.info("journal kept an earlier %s for %s: %s", key, receipt.stream_path, result.reason)
            elif result.status == "duplicate":
                log.debug("journal already had %s for %s", key, receipt.stream_path)

    def _assigned(self, assigned: set[TopicPartition]) -> None:
        for tp in assigned:
            self._progress.setdefault(tp, PartitionProgress())
        self._paused = False
        log.info("assigned %s", sorted(f"{tp.topic}[{tp.partition}]" for tp in assigned) or "no partitions")
        self.ready.set()

    async def _revoked(self, revoked: set[TopicPartition]) -> None:
        if not revoked:
            return
        jobs = [job for lane in self._lanes() for job in lane.jobs() if job.tp in revoked]
        for lanes in (self._calls, self._compactions):
            for lane in lanes.values():
                for job in [j for j in lane.queue if j.tp in revoked]:
                    lane.queue.remove(job)
        running = [job.task for job in jobs if job.task is not None and not job.task.done()]
        if running:
            log.info("partitions revoked: %gs grace for %d running call(s)", self.rebalance_grace_s, len(running))
            await asyncio.wait(running, timeout=self.rebalance_grace_s)
        await self._abandon(jobs, "partition revoked")
        if self.fatal is None:
            try:
                await self._commit()
            except Exception as error:  # the new owner repeats uncommitted work
                log.warning("commit on revoke failed: %s", error)
        for tp in revoked:
            self._progress.pop(tp, None)

    async def _abandon(self, jobs: list[Job], why: str) -> None:
        tasks = []
        for job in jobs:
            if job.task is not None and not job.task.done():
                job.abandoned = True
                job.task.cancel()
                tasks.append(job.task)
        if tasks:
            log.info("%s: abandoning %d running call(s)", why, len(tasks))
            await asyncio.wait(tasks, timeout=10)
        await asyncio.sleep(0)  # let the done callbacks run

    def _backpressure(self) -> None:
        """Stop fetching while too many records wait; resume when the lanes drain."""
        assert self._consumer is not None
        waiting = sum(len(lane.queue) + (lane.running is not None) for lane in self._lanes())
        if not self._paused and waiting >= self.max_queued:
            self._consumer.pause(*self._consumer.assignment())
            self._paused = True
        elif self._paused and waiting < self.settings.llm_max_in_flight:
            self._consumer.resume(*self._consumer.assignment())
            self._paused = False

    def _lanes(self) -> list[Lane]:
        return [*self._calls.values(), *self._compactions.values()]

    def _running_tasks(self) -> set[asyncio.Task[Result]]:
        return {
            lane.running.task
            for lane in self._lanes()
            if lane.running is not None and lane.running.task is not None and not lane.running.task.done()
        }


def _order(record: CallRequest | CompactRequest) -> int:
    """The offset that orders a lane: the request offset for calls, the report offset for compactions."""
    return record.requestOffset if isinstance(record, CallRequest) else record.reportOffset


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def run(settings: Settings, **options: Any) -> None:
    """Run the caller in the foreground until SIGTERM/SIGINT (a second signal stops waiting for
    running calls). Exits with status 70 if appends could not be delivered."""
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    metrics.serve(settings.caller_metrics_port)
    caller = LlmCaller(settings, **options)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, caller.request_stop)
        await caller.serve()

    try:
        asyncio.run(main())
    except AppendError as error:  # the topics are missing or Kafka is unreachable at startup
        log.error("LLM caller cannot start: %s", error)
        logging.shutdown()
        raise SystemExit(EXIT_KAFKA) from None
    except CallerFatal:
        logging.shutdown()
        raise SystemExit(EXIT_FATAL) from None
