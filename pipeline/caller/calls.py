"""What one job does at the provider: a call record's completion or a compact record's summary,
reduced to a `Result` (docs/behaviour.md §4.3, §4.5). Every provider failure is a result, never a crash.

Context overflow. A call the provider refuses for exceeding the model's context window is not
retried as it is: its history is summarized, leaving out the oldest history messages until the
summary call fits (`processors/llm_outcomes.summary_calls`); the outcome writer then appends the
summary before R's failed settlement, whose retry answers from the compacted context.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Literal

from pipeline.caller.files import FileLoader
from pipeline.caller.provider import Provider, Usage, error_body, is_overflow
from processors import llm_outcomes
from schemas.requests import CallRequest, CompactRequest, Message, Transport

Status = Literal["succeeded", "failed", "expired", "overflow"]


@dataclass(frozen=True, slots=True)
class Summary:
    call: llm_outcomes.SummaryCall
    text: str
    usage: Usage


@dataclass(frozen=True, slots=True)
class Result:
    status: Status  # overflow: a call over the context window, see `summary`
    text: str = ""
    usage: Usage = None
    error: str = ""
    duration_ms: int = 0
    summary: Summary | None = None  # the summary call that was answered (compactions, overflows)
    summary_error: str = ""  # overflow: why no summary call was answered


class SummaryFailed(Exception):
    """No summary call was answered; the text says why (scrubbed)."""


class Calls:
    """Runs jobs' provider work, at most `max_in_flight` at once across all streams."""

    def __init__(
        self, provider: Provider, *, max_in_flight: int, streaming: bool, files: FileLoader | None = None
    ) -> None:
        self.provider = provider
        self.files = files  # renders each item's files as the model takes them (docs/behaviour.md §3.3)
        self.streaming = streaming
        self.slots = asyncio.Semaphore(max_in_flight)

    async def call(self, record: CallRequest, text: list[str]) -> Result:
        """Answer request R, streaming into `text` (kept when the task is cancelled)."""
        async with self.slots:
            if time.time() * 1000 >= record.expiresAt:
                return Result("expired")
            started = time.monotonic()
            # Past expiresAt the journal settles the request as expired (docs/behaviour.md §4.3); a
            # call still running then could only append a stale outcome (a failure would journal an
            # error item saying it retries), so it stops there and appends nothing.
            expiry = _expiry(record.expiresAt)
            if self.files is None:
                messages: list[dict[str, Any]] = llm_outcomes.provider_messages(record.messages)
            else:
                messages = await self.files.messages(record)
            try:
                async with expiry:
                    if self.streaming:
                        usage = await self.provider.stream(record.model, record.transport, messages, text)
                    else:
                        whole, usage = await self.provider.complete(record.model, record.transport, messages)
                        text.append(whole)
            except Exception as error:
                if expiry.expired():
                    return Result("expired", duration_ms=_ms(started))
                described = self.provider.describe(error)
                if not is_overflow(error, described):
                    return Result("failed", error=described, duration_ms=_ms(started))
                return await self._after_overflow(record, (error_body(error), described), started)
            answer = "".join(text)
            if not answer:
                return Result("failed", error="the provider returned an empty response", duration_ms=_ms(started))
            return Result("succeeded", text=answer, usage=usage, duration_ms=_ms(started))

    async def compact(self, record: CompactRequest) -> Result:
        """Summarize request R's exact messages plus the instruction (docs/behaviour.md §4.5)."""
        async with self.slots:
            started = time.monotonic()
            try:
                summary = await self._summarize(record.model, record.transport, record.messages, None)
            except SummaryFailed as failure:
                return Result("failed", error=str(failure), duration_ms=_ms(started))
            return Result(
                "succeeded", text=summary.text, usage=summary.usage, summary=summary, duration_ms=_ms(started)
            )

    async def _after_overflow(self, record: CallRequest, overflow: tuple[Any, str], started: float) -> Result:
        """Request R exceeded the model's context window: summarize its history, still within R's expiry."""
        described = overflow[1]
        expiry = _expiry(record.expiresAt)
        try:
            async with expiry:
                summary = await self._summarize(record.model, record.transport, record.messages, overflow)
        except SummaryFailed as failure:
            return Result("overflow", error=described, summary_error=str(failure), duration_ms=_ms(started))
        except TimeoutError:
            if expiry.expired():
                return Result("expired", duration_ms=_ms(started))
            raise
        return Result("overflow", error=described, summary=summary, duration_ms=_ms(started))

    async def _summarize(
        self, model: str, transport: Transport, messages: list[Message], overflow: tuple[Any, str] | None
    ) -> Summary:
        """Summarize `messages` plus the instruction. After a context overflow (`overflow`: the
        refused call's error body and text), or when a summary call overflows itself, the calls
        leave out more and more of the oldest history until one is answered."""
        if overflow is None:
            calls = [llm_outcomes.SummaryCall(llm_outcomes.compaction_messages(messages, transport))]
        else:
            calls = llm_outcomes.summary_calls(messages, transport, llm_outcomes.overflow_ratio(*overflow))
        trimming = overflow is not None
        last_error = "no summary call was made"
        index = 0
        while index < len(calls):
            call = calls[index]
            index += 1
            try:
                text, usage = await self.provider.complete(model, transport, call.messages)
                return Summary(call, text, usage)
            except Exception as error:
                last_error = self.provider.describe(error)
                if not is_overflow(error, last_error):
                    raise SummaryFailed(last_error) from None
                if not trimming:  # the summary call itself is over the window: trim from now on
                    trimming = True
                    ratio = llm_outcomes.overflow_ratio(error_body(error), last_error)
                    calls = llm_outcomes.summary_calls(messages, transport, ratio)
                    index = 0
        raise SummaryFailed(last_error)


def _expiry(expires_at_ms: int) -> asyncio.Timeout:
    loop = asyncio.get_running_loop()
    return asyncio.timeout_at(loop.time() + (expires_at_ms - time.time() * 1000) / 1000)


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
