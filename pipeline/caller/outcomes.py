"""Appending each job's outcome to its stream (docs/behaviour.md §4.3, §4.4, §4.5).

What to append is decided by the pure `processors/llm_outcomes.py`; this module produces those
commands through `Client(internal=True)` and logs what happened. Appends are only produced here:
the worker flushes the producer before it commits a record (docs/architecture.md, "LLM caller").
The journal's answers (receipts) are read later, for the log only: a repeated call whose text
differs is kept as the first body, which is expected after a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable

from pipeline import metrics
from pipeline.caller.calls import Result
from pipeline.caller.queues import Job
from pipeline.client import AppendError, Client, Receipt
from processors import llm_outcomes
from schemas.requests import CallRequest, CompactRequest

log = logging.getLogger("agentstream.caller")

RECEIPT_TTL_S = 120.0  # how long to wait for the journal's answer to an append (for the log only)


class OutcomeWriter:
    def __init__(self, client: Client, secrets: tuple[str | None, ...], context_tokens: Callable[[str], int]) -> None:
        """`context_tokens(model)`: the window reported with a call's usage (docs/behaviour.md §4.5)."""
        self.client = client
        self.secrets = secrets
        self.context_tokens = context_tokens
        self._receipts: dict[str, tuple[Receipt, str, float]] = {}

    def settle(self, job: Job, task: asyncio.Task[Result]) -> bool:
        """Append the job's outcome; False if nothing was appended because it must run again."""
        record, path, order = job.record, job.path, job.order
        waited = time.monotonic() - job.queued_at
        if job.superseded:
            log.info("%s %s @%d: settled in the journal meanwhile, stopped; nothing appended", record.kind, path, order)
            return True
        if job.abandoned:
            log.info(
                "%s %s @%d model=%s: abandoned after %.1fs (will be repeated)",
                record.kind,
                path,
                order,
                record.model,
                waited,
            )
            return False
        if task.cancelled():
            if not job.interrupted or not isinstance(record, CallRequest):
                log.info("%s %s @%d: cancelled, nothing appended (will be repeated)", record.kind, path, order)
                return False
            partial = "".join(job.text)
            self.append(path, llm_outcomes.cancelled(order, partial))
            log.info(
                "call %s @%d model=%s %dms cancelled (interrupted; %d partial chars)",
                path,
                order,
                record.model,
                int(waited * 1000),
                len(partial),
            )
            return True
        result = self._result(job, task)
        if result.duration_ms:
            metrics.PROVIDER_SECONDS.labels(result.status).observe(result.duration_ms / 1000)
        if isinstance(record, CallRequest):
            self._call(path, record, result)
        else:
            self._compaction(path, record, result)
        return True

    def cancelled_before_start(self, job: Job) -> None:
        """A cancel for a call still waiting: settled as cancelled without any provider call."""
        self.append(job.path, llm_outcomes.cancelled(job.order, ""))
        log.info("call %s @%d: cancelled before it started (no provider call)", job.path, job.order)

    def append(self, path: str, appends: list[llm_outcomes.Append]) -> None:
        """Produce the commands in order (delivery is awaited by the worker's flush before a commit)."""
        stream = self.client.streams.get(path)
        deadline = time.monotonic() + RECEIPT_TTL_S
        for append in appends:
            receipt = stream.append(append.event())
            self._receipts[receipt.append_id] = (receipt, append.idempotencyKey, deadline)

    def check_receipts(self) -> None:
        """Log what the journal made of our appends (a repeated call's differing text is expected)."""
        now = time.monotonic()
        for append_id, (receipt, key, deadline) in list(self._receipts.items()):
            try:
                answer = receipt.result(timeout=0)
            except AppendError:
                if now > deadline:
                    del self._receipts[append_id]
                continue
            del self._receipts[append_id]
            if answer.status == "rejected":
                log.info("journal kept an earlier %s for %s: %s", key, receipt.stream_path, answer.reason)
            elif answer.status == "duplicate":
                log.debug("journal already had %s for %s", key, receipt.stream_path)

    def _result(self, job: Job, task: asyncio.Task[Result]) -> Result:
        error = task.exception()
        if error is None:
            return task.result()
        # The traceback is scrubbed too: an exception's text may quote a request.
        trace = "".join(traceback.format_exception(error))
        log.error(
            "%s %s @%d crashed:\n%s", job.record.kind, job.path, job.order, llm_outcomes.scrub(trace, self.secrets)
        )
        text = f"internal error in the caller ({type(error).__name__}: {error})"
        return Result("failed", error=llm_outcomes.scrub(text, self.secrets))

    def _call(self, path: str, record: CallRequest, result: Result) -> None:
        r, model, took = record.requestOffset, record.model, result.duration_ms
        if result.status == "expired":
            stopped = f"stopped after {took}ms" if took else "not called"
            log.info(
                "call %s @%d model=%s: expired (%s); nothing appended, the journal settles it", path, r, model, stopped
            )
        elif result.status == "succeeded":
            window = self.context_tokens(model)
            self.append(path, llm_outcomes.succeeded(r, model, result.text, result.usage, took, window))
            log.info(
                "call %s @%d model=%s %dms succeeded (%d chars, usage %s)",
                path,
                r,
                model,
                took,
                len(result.text),
                result.usage or "not reported",
            )
        elif result.status == "overflow":
            self._overflowed(path, record, result)
        else:
            self.append(path, llm_outcomes.failed(r, record.attempt, record.maxAttempts, result.error))
            log.info(
                "call %s @%d model=%s %dms failed (attempt %d of %d): %s",
                path,
                r,
                model,
                took,
                record.attempt,
                record.maxAttempts,
                result.error,
            )

    def _overflowed(self, path: str, record: CallRequest, result: Result) -> None:
        """Call R exceeded the context window: the summary item and R's failed settlement (whose
        retry answers from the compacted context), or only the failed settlement."""
        r, attempt, most = record.requestOffset, record.attempt, record.maxAttempts
        summary = result.summary
        if summary is None:
            self.append(path, llm_outcomes.overflow_not_compacted(r, attempt, most, result.error, result.summary_error))
            log.warning(
                "call %s @%d model=%s %dms over the context window, and no summary call fitted: %s",
                path,
                r,
                record.model,
                result.duration_ms,
                result.summary_error,
            )
            return
        appends = llm_outcomes.overflow_compacted(
            r, attempt, most, result.error, summary.text, summary.usage, summary.call
        )
        self.append(path, appends)
        log.info(
            "call %s @%d model=%s %dms over the context window: compacted (%d oldest messages left out of the "
            "summary), settled failed (attempt %d of %d): %s",
            path,
            r,
            record.model,
            result.duration_ms,
            summary.call.dropped,
            attempt,
            most,
            result.error,
        )

    def _compaction(self, path: str, record: CompactRequest, result: Result) -> None:
        through = record.requestOffset
        if result.status == "succeeded":
            call = result.summary.call if result.summary is not None else None
            appends = llm_outcomes.compacted(
                through, record.reportOffset, record.tokens, record.threshold, result.text, result.usage, call
            )
            self.append(path, appends)
            log.info(
                "compact %s @%d (through @%d) model=%s %dms succeeded (%d chars)",
                path,
                record.reportOffset,
                through,
                record.model,
                result.duration_ms,
                len(result.text),
            )
        else:
            log.warning(
                "compact %s @%d (through @%d) model=%s %dms failed, nothing appended: %s",
                path,
                record.reportOffset,
                through,
                record.model,
                result.duration_ms,
                result.error,
            )
