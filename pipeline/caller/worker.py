"""The LLM caller's lifecycle (`agentstream worker caller`): consume `llm-requests`, hand records to
the per-stream queues, commit, rebalance, stop (docs/architecture.md, "LLM caller").

Everything runs on one asyncio loop.

Cancel (docs/behaviour.md §4.4). A `cancel` record for the call running in its stream's queue
cancels that task, which closes the HTTP connection (a streaming provider stops generating); the
task's end then appends the partial output (if any) and the cancelled settlement. A cancel for a
call still waiting settles it as cancelled without any HTTP call. A cancel for a call that already
finished (or is unknown here) does nothing: its settlement already went out. A `settled` notice
(R is settled in the journal) drops a waiting call for R and stops a running one, appending nothing.

Rebalance and shutdown. Revoked partitions get a short grace for their running calls, then those
calls are abandoned (cancelled, nothing appended; the new owner repeats them) and finished work is
committed. SIGTERM/SIGINT stops consuming and starts no waiting job, waits up to the shutdown
timeout for running calls (a second signal stops waiting), abandons what is left, flushes and
commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Coroutine
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from pydantic import TypeAdapter, ValidationError

from pipeline import exit_codes, metrics, tracing
from pipeline.blobs import blob_store
from pipeline.caller.calls import Calls, Result
from pipeline.caller.commits import CallerFatal, flush_before_commit
from pipeline.caller.files import FileLoader
from pipeline.caller.outcomes import OutcomeWriter
from pipeline.caller.provider import Provider
from pipeline.caller.queues import Job, StreamQueues
from pipeline.client import AppendError, Client
from pipeline.kafka.keyed_consumer import Backpressure, OffsetCommits, PartitionListener
from pipeline.kafka.read import read_ranges_async
from pipeline.settings import Settings
from processors.traceparent import from_headers
from schemas.requests import CallRequest, CancelRequest, CompactRequest, LlmRequestRecord, SettledNotice
from topics.names import topic_names

log = logging.getLogger("agentstream.caller")

_records: TypeAdapter[Any] = TypeAdapter(LlmRequestRecord)


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
        self.backpressure = Backpressure(high=max(2 * settings.llm_max_in_flight, 16), low=settings.llm_max_in_flight)
        self.fatal: BaseException | None = None
        self.ready = threading.Event()  # set once partitions are assigned (tests, readiness)
        self.commits = OffsetCommits()
        self.calls = StreamQueues(self._start_call, self._settle, self._fail)
        self.compactions = StreamQueues(self._start_compaction, self._settle, self._fail)
        self._background: set[asyncio.Task[None]] = set()  # read-aheads (strong references)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._force: asyncio.Event | None = None
        self._stop_requests = 0
        self._client: Client | None = None
        self._provider: Provider | None = None
        self._work: Calls | None = None
        self._outcomes: OutcomeWriter | None = None
        self._consumer: AIOKafkaConsumer | None = None

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
        self._client = await asyncio.to_thread(lambda: Client(settings, internal=True))
        self.commits = OffsetCommits(flush_before_commit(self._client), group=settings.caller_group)
        self._outcomes = OutcomeWriter(self._client, (settings.openai_api_key,), settings.context_tokens)
        self._provider = Provider(settings)
        files = FileLoader(blob_store(settings), settings)
        self._work = Calls(
            self._provider, max_in_flight=settings.llm_max_in_flight, streaming=settings.streaming, files=files
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
            **settings.aiokafka_consumer_config(),
        )
        self._consumer.subscribe([self.topic], listener=PartitionListener(self._assigned, self._revoked))
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
                            self._dispatch(tp, message.offset, message.value, message.headers)
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
        self.calls.draining = self.compactions.draining = True
        running = self._running_tasks()
        if running and self.fatal is None:
            log.info("stopping: waiting up to %gs for %d running call(s)", self.shutdown_timeout_s, len(running))
            deadline = time.monotonic() + self.shutdown_timeout_s
            while running and time.monotonic() < deadline and not self._force.is_set():
                await asyncio.wait(running, timeout=min(0.1, max(0.0, deadline - time.monotonic())))
                running = self._running_tasks()
        await self._abandon(self._jobs(), "shutting down")
        if committer is not None:
            committer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await committer
        if self.fatal is None and self._consumer is not None and self._client is not None:
            try:
                await self.commits.commit(self._consumer)
            except Exception as error:  # shutting down: say it and go on
                log.warning("final commit failed: %s", error)
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._consumer.stop()
        if self._provider is not None:
            with contextlib.suppress(Exception):
                await self._provider.close()
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

    def _dispatch(self, tp: TopicPartition, offset: int, value: bytes | None, headers: Any = None) -> None:
        if not self.commits.consumed(tp, offset):  # revoked since it was fetched
            return
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
            self.commits.finished(tp, offset)
            return
        if isinstance(record, CancelRequest):
            self.commits.finished(tp, offset)  # its call record (earlier, same partition) holds the commit point
            self._cancel(record)
            return
        if isinstance(record, SettledNotice):
            self.commits.finished(tp, offset)
            self._settled_in_journal(record)
            return
        queues = self.calls if isinstance(record, CallRequest) else self.compactions
        job = Job(record, tp, offset, trace=from_headers(headers))
        newest = queues.offer(job)
        if newest is not None:
            log.info("%s %s @%d: skipped, @%d was already handled here", record.kind, job.path, job.order, newest)
            self.commits.finished(tp, offset)

    def _start_call(self, job: Job) -> asyncio.Task[Result]:
        assert self._work is not None and isinstance(job.record, CallRequest)
        call = self._work.call(job.record, job.text)
        return asyncio.create_task(self._traced(job, call), name=f"call {job.path} @{job.order}")

    def _start_compaction(self, job: Job) -> asyncio.Task[Result]:
        assert self._work is not None and isinstance(job.record, CompactRequest)
        call = self._work.compact(job.record)
        return asyncio.create_task(self._traced(job, call), name=f"compact {job.path} @{job.order}")

    @staticmethod
    async def _traced(job: Job, call: Coroutine[Any, Any, Result]) -> Result:
        """The provider call as a `chat <model>` span with the GenAI attributes (docs/behaviour.md
        §8), a child of the record's trace; the outcomes appended for it continue that span."""
        if not tracing.ON:
            return await call
        model = job.record.model
        attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model}
        span = tracing.start(f"chat {model}", job.trace, attributes, kind="client")
        job.trace = tracing.header_of(span)
        try:
            with tracing.use(span):
                result = await call
        except BaseException as error:
            span.set_attribute("error.type", type(error).__name__)
            span.end()
            raise
        usage = result.usage or {}
        if "inputTokens" in usage:
            span.set_attribute("gen_ai.usage.input_tokens", usage["inputTokens"])
            span.set_attribute("gen_ai.usage.output_tokens", usage["outputTokens"])
        if result.status != "succeeded":
            span.set_attribute("error.type", result.status)
        span.end()
        return result

    def _settle(self, job: Job, task: asyncio.Task[Result]) -> bool:
        """A job's task ended: append its outcome and finish its record (unless it must run again)."""
        assert self._outcomes is not None
        parent = tracing.PARENT.set(job.trace)  # its appends carry the call's trace (docs/behaviour.md §8)
        try:
            if not self._outcomes.settle(job, task):
                return False
        finally:
            tracing.PARENT.reset(parent)
        self.commits.finished(job.tp, job.offset)
        return True

    def _settled_in_journal(self, record: SettledNotice) -> None:
        """R is settled in the journal (a record read again after a restart, an expiry): a call for
        R still waiting is dropped, a running one is stopped; neither appends anything."""
        path, request = record.streamPath, record.requestOffset
        running = self.calls.running(path, request)
        if running is not None:
            running.superseded = True
            assert running.task is not None
            running.task.cancel()  # its settlement appends nothing and finishes the record
            return
        waiting = self.calls.withdraw(path, request)
        if waiting is not None:
            self.commits.finished(waiting.tp, waiting.offset)
            log.info("call %s @%d: already settled in the journal, not called", path, request)
        else:
            self.calls.handled.bump(path, request)  # a call record for R read later is stale

    def _cancel(self, record: CancelRequest) -> None:
        path, request = record.streamPath, record.requestOffset
        running = self.calls.running(path, request)
        if running is not None:
            running.interrupted = True
            assert running.task is not None
            running.task.cancel()  # closes the HTTP connection; its settlement appends partial + cancelled
            return
        waiting = self.calls.withdraw(path, request)
        if waiting is not None:
            assert self._outcomes is not None
            self._outcomes.cancelled_before_start(waiting)
            self.commits.finished(waiting.tp, waiting.offset)
            return
        log.info("cancel %s @%d: no such call running or waiting here (already settled); nothing to do", path, request)

    # ---- commits, rebalances, back-pressure --------------------------------------------------

    async def _commit_loop(self) -> None:
        assert self._consumer is not None and self._client is not None and self._outcomes is not None
        last_receipts = 0.0
        while True:
            await asyncio.sleep(self.commit_interval_s)
            try:
                await self.commits.commit(self._consumer)
            except CallerFatal as error:
                self._fail(error)
                return
            except AppendError as error:
                log.warning("appends not yet delivered, commit postponed: %s", error)
            except Exception as error:  # the next round retries
                log.warning("commit failed, retrying: %s", error)
            if time.monotonic() - last_receipts >= 1.0:
                last_receipts = time.monotonic()
                self._outcomes.check_receipts()
                await self.commits.report_lag(self._consumer)

    async def _read_ahead_then_resume(self, assigned: set[TopicPartition]) -> None:
        try:
            await self._read_settled_ahead(assigned)
        finally:
            if self._consumer is not None:
                still = assigned & self._consumer.assignment()
                if still:
                    self._consumer.resume(*still)

    async def _read_settled_ahead(self, assigned: set[TopicPartition]) -> None:
        """Before reading newly assigned partitions from their committed offsets: note every R the
        records after that point say is settled, so their calls are skipped instead of answered
        again (a previous owner answered them but died before committing). The notices come
        after the calls in the partition, possibly far behind a backlog; read ahead, they take
        effect first. Best effort: on failure the notices still act when reached."""
        if not assigned or self._consumer is None:
            return
        started = time.monotonic()
        # The group's committed offsets are read through this reader (manual assignment with the
        # group id stores and reads offsets without joining); asking the member consumer from
        # inside its rebalance callback stalled its fetching.
        reader = AIOKafkaConsumer(
            bootstrap_servers=self.settings.bootstrap_servers,
            group_id=self.settings.caller_group,
            enable_auto_commit=False,
            **self.settings.aiokafka_consumer_config(),
        )
        settled = 0
        try:
            await reader.start()
            ends = await reader.end_offsets(list(assigned))
            starts = {tp: await reader.committed(tp) for tp in assigned}
            ranges = {tp: (starts[tp] or 0, ends[tp]) for tp in assigned}
            async for batch in read_ranges_async(reader, ranges, stop_when_idle=True):
                for message in batch:
                    if b'"settled"' in (message.value or b""):  # cheap filter before validating
                        record = _records.validate_json(message.value)
                        if isinstance(record, SettledNotice):
                            self.calls.handled.bump(record.streamPath, record.requestOffset)
                            settled += 1
        except Exception as error:  # the notices still act when the consumer reaches them
            log.warning("reading settled notices ahead failed: %s", error)
        finally:
            await reader.stop()
        log.info("read ahead: %d requests already settled (%.2fs)", settled, time.monotonic() - started)

    def _assigned(self, assigned: set[TopicPartition]) -> None:
        if assigned and self._consumer is not None:
            # Held until the settled notices ahead are read (outside the rebalance callback: a
            # network call inside it stalled this consumer's fetching).
            self._consumer.pause(*assigned)
            task = asyncio.get_running_loop().create_task(self._read_ahead_then_resume(assigned))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        self.commits.assigned(assigned)
        self.backpressure.reset()
        log.info("assigned %s", sorted(f"{tp.topic}[{tp.partition}]" for tp in assigned) or "no partitions")
        self.ready.set()

    async def _revoked(self, revoked: set[TopicPartition]) -> None:
        if not revoked:
            return
        jobs = [job for job in self._jobs() if job.tp in revoked]
        self.calls.drop_waiting(revoked)
        self.compactions.drop_waiting(revoked)
        running = [job.task for job in jobs if job.task is not None and not job.task.done()]
        if running:
            log.info("partitions revoked: %gs grace for %d running call(s)", self.rebalance_grace_s, len(running))
            await asyncio.wait(running, timeout=self.rebalance_grace_s)
        await self._abandon(jobs, "partition revoked")
        if self.fatal is None and self._consumer is not None and self._client is not None:
            try:
                await self.commits.commit(self._consumer)
            except Exception as error:  # the new owner repeats uncommitted work
                log.warning("commit on revoke failed: %s", error)
        self.commits.revoked(revoked)

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
        """Stop fetching while too many records wait; resume when the queues drain."""
        assert self._consumer is not None
        self.backpressure.check(self._consumer, self.calls.size() + self.compactions.size())

    def _jobs(self) -> list[Job]:
        return [*self.calls.jobs(), *self.compactions.jobs()]

    def _running_tasks(self) -> set[asyncio.Task[Any]]:
        return self.calls.running_tasks() | self.compactions.running_tasks()


def run(settings: Settings, **options: Any) -> None:
    """Run the caller in the foreground until SIGTERM/SIGINT (a second signal stops waiting for
    running calls). Exits with status 70 if appends could not be delivered."""
    from pipeline.logs import setup_logging

    setup_logging(settings)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    metrics.serve(settings.caller_metrics_port, settings.metrics_host)
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
        raise SystemExit(exit_codes.KAFKA) from None
    except CallerFatal:
        logging.shutdown()
        raise SystemExit(exit_codes.FATAL) from None
