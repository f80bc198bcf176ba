"""The capability host (`agentstream worker capabilities`): `script-runs` in, run events out.

The journal worker publishes every journaled `script-run-requested` to `script-runs` (keyed by
stream path, co-partitioned). Per record the host:

1. past `expiresAt` before it started: reads the stream's journal for the execution and settles
   `failed/expired` (did not execute), or `failed/crashed` if an earlier host had started it;
2. otherwise journals `script-run-started` (idempotency key from the execution id) and waits for the
   journal's answer. `journaled`: this host owns the run and runs it. `duplicate`: an earlier host
   started it and died (or settled it and died before committing): unless the journal already holds
   its settlement, it settles `failed/crashed` with executionMayHaveOccurred, and never runs it again;
3. journals exactly one `script-run-settled` (idempotency key from the execution id).

Concurrency: one script at a time per agent (a lane per stream path, in arrival order), up to
`concurrency` agents at once (the sandbox pool). Commits: per partition, the first record not yet
settled; a restart re-delivers the rest, and step 2 makes a re-delivery harmless. Revoked partitions
and SIGTERM let running scripts finish (up to `shutdown_timeout_s`) and start nothing new.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import gc
import logging
import signal
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from pydantic import ValidationError

from pipeline import exit_codes, metrics, tracing
from pipeline.capabilities.config import HostConfig
from pipeline.capabilities.grants import Grants
from pipeline.capabilities.references import ReferencedEvents
from pipeline.capabilities.sandbox import Sandbox
from pipeline.client import AppendError, AppendTimeout, Client
from pipeline.kafka.journal_reader import JournalReader
from pipeline.kafka.keyed_consumer import Backpressure, OffsetCommits, PartitionListener
from pipeline.settings import Settings
from processors import idempotency_keys, scripts
from processors.traceparent import from_headers
from schemas.capabilities import SCRIPT_RUN_SETTLED, SCRIPT_RUN_STARTED, ScriptRunRecord
from topics.names import topic_names

log = logging.getLogger("agentstream.capabilities")

OUTCOME_WAIT_S = 10.0  # one wait for the journal's answer; repeated (never re-sent) until it comes
# Pausing the partitions only bounds the memory of queued run requests (each about its code). A burst
# of one run per agent over a few hundred agents must not pause them: what arrives while paused waits
# until the queue drains below the low mark. So the high mark is well above such a burst, and
# consumption resumes at half of it rather than once the pool is nearly idle.
QUEUED_RUNS_HIGH = 1024


@dataclass(slots=True)
class ScriptJob:
    tp: TopicPartition
    kafka_offset: int
    record: ScriptRunRecord
    running: bool = False  # holds a sandbox slot (started journaled or being journaled)
    trace: bytes | None = None  # the record's traceparent (docs/behaviour.md §8)


@dataclass(slots=True)
class ScriptLane:
    jobs: deque[ScriptJob] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


class CapabilityHost:
    def __init__(self, settings: Settings, config: HostConfig) -> None:
        self.settings = settings
        self.config = config
        self.topic = topic_names(settings.topic_prefix).script_runs
        high = max(QUEUED_RUNS_HIGH, 4 * config.concurrency + 64)
        self.backpressure = Backpressure(high=high, low=high // 2)
        self._lanes: dict[str, ScriptLane] = {}
        self.commits = OffsetCommits(group=config.group)
        self._owned: set[TopicPartition] = set()  # assigned and not being revoked: runs may start
        self.fatal: BaseException | None = None
        self._stopping = False
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None
        self._executor = ThreadPoolExecutor(max_workers=2 * config.concurrency + 8, thread_name_prefix="capabilities")
        self._consumer: AIOKafkaConsumer | None = None
        self._internal: Client | None = None  # started/settled: the workers' door
        self._client: Client | None = None  # the script's own appends: the ordinary door
        self._reader: JournalReader | None = None
        self._references: ReferencedEvents | None = None  # the default read grant's index
        self._sandbox: Sandbox | None = None

    # ---- lifecycle ------------------------------------------------------------------------------

    def request_stop(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._on_stop)

    def _on_stop(self) -> None:
        if self._stop is not None:
            if self._stop.is_set():
                log.warning("second stop request: abandoning running scripts")
                self._stopping = True
                for lane in self._lanes.values():
                    if lane.task is not None:
                        lane.task.cancel()
            self._stop.set()

    async def serve(self) -> None:
        settings, config = self.settings, self.config
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._slots = asyncio.Semaphore(config.concurrency)
        metrics.SCRIPT_POOL_SIZE.set(config.concurrency)
        self._internal = await self._blocking(lambda: Client(settings, internal=True))
        self._client = await self._blocking(lambda: Client(settings))
        self._reader = JournalReader(settings)
        self._references = ReferencedEvents(self._reader)
        session_timeout_ms = int(settings.session_timeout_s * 1000)
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.bootstrap_servers,
            group_id=config.group,
            client_id=f"{config.group}-host",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=max(500, session_timeout_ms // 3),
            max_poll_interval_ms=600_000,
            **settings.aiokafka_consumer_config(),
        )
        self._consumer.subscribe([self.topic], listener=PartitionListener(self._assigned, self._revoked))
        log.info(
            "capability host: group %s consuming %s; %d scripts at once, %d MiB each",
            config.group,
            self.topic,
            config.concurrency,
            config.max_memory_mb,
        )
        committer: asyncio.Task[None] | None = None
        try:
            async with Sandbox(config) as sandbox:
                self._sandbox = sandbox
                await self._consumer.start()
                # What start-up loaded (aiokafka, confluent-kafka, pydantic's schemas, Monty's pool)
                # lives as long as the process: out of the cyclic collector's view, a full
                # collection no longer rescans it, which paused every run in flight for ~30 ms.
                gc.collect()
                gc.freeze()
                committer = asyncio.create_task(self._commit_loop())
                while not self._stop.is_set():
                    batch = await self._consumer.getmany(timeout_ms=200, max_records=500)
                    for tp, messages in batch.items():
                        for message in messages:
                            self._dispatch(tp, message.offset, message.value, message.headers)
                    self._backpressure()
                await self._shutdown(committer)
        finally:
            await self._close()

    async def _shutdown(self, committer: asyncio.Task[None] | None) -> None:
        self._stopping = True
        running = self._lane_tasks(lambda job: job.running)
        if running:
            log.info("stopping: up to %gs for %d running script(s)", self.config.shutdown_timeout_s, len(running))
            await asyncio.wait(running, timeout=self.config.shutdown_timeout_s)
        for lane in self._lanes.values():
            if lane.task is not None and not lane.task.done():
                lane.task.cancel()
        tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        if committer is not None:
            committer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await committer
        with contextlib.suppress(Exception):
            await self._commit()

    async def _close(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._consumer.stop()
        for client in (self._internal, self._client):
            if client is not None:
                with contextlib.suppress(Exception):
                    await self._blocking(client.close)
        if self._reader is not None:
            await self._blocking(self._reader.close)
        self._executor.shutdown(wait=False, cancel_futures=True)
        log.info("capability host stopped")

    async def _blocking(self, function: Any, *args: Any) -> Any:
        assert self._loop is not None
        # In this task's context: a run's appends carry its traceparent (docs/behaviour.md §8).
        context = contextvars.copy_context()
        return await self._loop.run_in_executor(self._executor, functools.partial(context.run, function, *args))

    # ---- records and lanes ----------------------------------------------------------------------

    def _dispatch(self, tp: TopicPartition, offset: int, value: bytes | None, headers: Any = None) -> None:
        if tp not in self._owned or not self.commits.consumed(tp, offset):  # revoked since it was fetched
            return
        try:
            record = ScriptRunRecord.model_validate_json(value or b"")
        except ValidationError as error:
            log.error("%s[%d]@%d is not a script run request (skipped): %s", tp.topic, tp.partition, offset, error)
            self.commits.finished(tp, offset)
            return
        lane = self._lanes.setdefault(record.streamPath, ScriptLane())
        lane.jobs.append(ScriptJob(tp, offset, record, trace=from_headers(headers)))
        metrics.SCRIPT_QUEUED.inc()
        if lane.task is None or lane.task.done():
            lane.task = asyncio.create_task(self._run_lane(record.streamPath, lane))

    async def _run_lane(self, path: str, lane: ScriptLane) -> None:
        """One agent's runs, one at a time, in arrival order."""
        try:
            while lane.jobs:
                job = lane.jobs[0]
                try:
                    if self._may_start(job):
                        await self._traced(job)
                        self._finished(job)
                except asyncio.CancelledError:
                    raise
                except Exception as error:  # Kafka failed us, or a bug: stop before committing past it
                    log.exception("%s: the host failed on %s", path, job.record.executionId)
                    self._fail(error)
                    return
                finally:
                    job.running = False
                lane.jobs.popleft()
                metrics.SCRIPT_QUEUED.dec()
        finally:
            if not lane.jobs and self._lanes.get(path) is lane:
                del self._lanes[path]

    async def _traced(self, job: ScriptJob) -> None:
        """`_handle` as an `agentstream.script` span, a child of the run request's trace; what the
        run appends (started, settled, granted calls) continues it (docs/behaviour.md §8)."""
        if not tracing.ON:
            parent = tracing.PARENT.set(job.trace)
            try:
                await self._handle(job)
            finally:
                tracing.PARENT.reset(parent)
            return
        record = job.record
        attributes = {
            "agentstream.stream.path": record.streamPath,
            "agentstream.journal.offset": record.offset,
            "agentstream.script.execution_id": record.executionId,
        }
        span = tracing.start("agentstream.script", job.trace, attributes)
        parent = tracing.PARENT.set(tracing.header_of(span))
        try:
            with tracing.use(span):
                await self._handle(job)
        finally:
            tracing.PARENT.reset(parent)
            span.end()

    def _may_start(self, job: ScriptJob) -> bool:
        return job.tp in self._owned and not self._stopping

    def _fail(self, error: BaseException) -> None:
        if self.fatal is None:
            self.fatal = error
        self._stopping = True
        if self._stop is not None:
            self._stop.set()

    def _finished(self, job: ScriptJob) -> None:
        self.commits.finished(job.tp, job.kafka_offset)

    async def _handle(self, job: ScriptJob) -> None:
        record = job.record
        execution = record.executionId
        if _now_ms() >= record.expiresAt:
            await self._recover(record, expired=True)
            return
        assert self._slots is not None and self._sandbox is not None
        # From `started` on, a host that dies leaves a run that may have occurred: it is never run
        # again, only settled as crashed. Journaling it before taking a sandbox slot keeps the
        # journal's round trip out of the pool.
        job.running = True
        status = await self._journal(
            record.streamPath,
            SCRIPT_RUN_STARTED,
            {"executionId": execution},
            idempotency_keys.script_run_started_key(execution),
        )
        if status != "journaled":
            if status == "duplicate":  # an earlier host started it: never run twice
                await self._recover(record, expired=False)
            else:
                log.error("%s: %s was not journaled (%s); not running it", record.streamPath, execution, status)
            return
        async with self._slots:
            metrics.SCRIPT_POOL_BUSY.inc()
            try:
                budget_s = min(record.timeoutMs, record.expiresAt - _now_ms()) / 1000
                grants = Grants(
                    path=record.streamPath,
                    execution=execution,
                    client=self._client,  # type: ignore[arg-type]
                    reader=self._reader,  # type: ignore[arg-type]
                    blocking=self._blocking,
                    references=self._references,  # type: ignore[arg-type]
                    granted=record.grants,
                    requested_at=record.offset,
                )
                ran = await self._sandbox.run(record.code, grants.functions(), max(budget_s, 0.001))
            finally:
                metrics.SCRIPT_POOL_BUSY.dec()
        metrics.SCRIPT_RUN_SECONDS.observe(ran.duration_ms / 1000)
        await self._settle(record, ran.settlement, ran.duration_ms)

    async def _recover(self, record: ScriptRunRecord, *, expired: bool) -> None:
        """Settle a run this host did not start: read what the journal holds for the execution."""
        assert self._reader is not None
        execution = record.executionId
        events = await self._blocking(self._reader.events_from, record.streamPath, record.offset + 1)
        mine = [
            e for e in events if isinstance(e.get("payload"), dict) and e["payload"].get("executionId") == execution
        ]
        if any(e["type"] == SCRIPT_RUN_SETTLED for e in mine):
            log.info("%s: %s is already settled", record.streamPath, execution)
            return
        started = any(e["type"] == SCRIPT_RUN_STARTED for e in mine)
        if started:
            log.warning("%s: %s was started by a host that stopped: settled as crashed", record.streamPath, execution)
            await self._settle(record, scripts.crashed(), None)
        else:
            await self._settle(record, scripts.expired(record.expiresAt), None)

    async def _settle(self, record: ScriptRunRecord, settlement: dict[str, Any], duration_ms: int | None) -> None:
        payload = scripts.settled_payload(record.executionId, settlement, duration_ms)
        key = idempotency_keys.script_run_settled_key(record.executionId)
        status = await self._journal(record.streamPath, SCRIPT_RUN_SETTLED, payload, key)
        label = settlement["status"] if settlement["status"] == "succeeded" else settlement["failureKind"]
        metrics.SCRIPT_RUNS.labels(label).inc()
        if status == "rejected":  # another settlement holds the key: exactly one exists, not this one
            log.info("%s: %s already had a different settlement", record.streamPath, record.executionId)

    async def _journal(self, path: str, event_type: str, payload: dict[str, Any], key: str) -> str:
        """Append through the workers' door and wait for the journal's answer (never re-sent: a
        second send of `started` would look like an earlier host's)."""
        assert self._internal is not None
        command = {"type": event_type, "payload": payload, "idempotencyKey": key}
        receipt = self._internal.streams.get(path).append(command)  # produce only: does not block
        while True:
            try:
                result = await receipt.outcome(OUTCOME_WAIT_S)
                return result.status
            except AppendTimeout:
                log.warning("%s: no answer from the journal for %s yet; still waiting", path, key)
            except AppendError as error:
                raise RuntimeError(f"could not append {key} to {path}: {error}") from error

    # ---- commits and rebalances -----------------------------------------------------------------

    async def _commit_loop(self) -> None:
        rounds = 0
        while True:
            await asyncio.sleep(0.5)
            rounds += 1
            try:
                await self._commit()
                if rounds % 2 == 0 and self._consumer is not None:
                    await self.commits.report_lag(self._consumer)
            except Exception as error:  # the next round retries
                log.warning("commit failed, retrying: %s", error)

    async def _commit(self) -> None:
        assert self._consumer is not None
        await self.commits.commit(self._consumer)

    def _assigned(self, assigned: set[TopicPartition]) -> None:
        self.commits.assigned(assigned)
        self._owned |= assigned
        self.backpressure.reset()
        log.info("assigned %s", sorted(f"{tp.topic}[{tp.partition}]" for tp in assigned) or "no partitions")

    async def _revoked(self, revoked: set[TopicPartition]) -> None:
        if not revoked:
            return
        self._owned -= revoked  # nothing new starts for them
        running = self._lane_tasks(lambda job: job.running and job.tp in revoked)
        if running:
            log.info("revoked: up to %gs for %d running script(s)", self.config.shutdown_timeout_s, len(running))
            await asyncio.wait(running, timeout=self.config.shutdown_timeout_s)
        with contextlib.suppress(Exception):
            await self._commit()  # what they finished; the new owner repeats the rest harmlessly
        self.commits.revoked(revoked)

    def _lane_tasks(self, which: Any) -> set[asyncio.Task[None]]:
        return {
            lane.task
            for lane in self._lanes.values()
            if lane.task is not None and not lane.task.done() and lane.jobs and which(lane.jobs[0])
        }

    def _backpressure(self) -> None:
        assert self._consumer is not None
        self.backpressure.check(self._consumer, sum(len(lane.jobs) for lane in self._lanes.values()))


def _now_ms() -> int:
    return int(time.time() * 1000)


def run(settings: Settings, config: HostConfig | None = None) -> None:
    """Run the host in the foreground until SIGTERM/SIGINT (a second signal abandons running scripts)."""
    from pipeline.logs import setup_logging

    setup_logging(settings)
    config = config or HostConfig.from_env()
    metrics.serve(config.metrics_port, settings.metrics_host)
    host = CapabilityHost(settings, config)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, host.request_stop)
        await host.serve()

    try:
        asyncio.run(main())
    except AppendError as error:  # the topics are missing or Kafka is unreachable at startup
        log.error("capability host cannot start: %s", error)
        logging.shutdown()
        raise SystemExit(exit_codes.KAFKA) from None
    if host.fatal is not None:
        log.critical("capability host stopped on an error (uncommitted runs go to the next host): %s", host.fatal)
        logging.shutdown()
        raise SystemExit(exit_codes.FATAL)
