"""The journal processor's per-partition engine: the I/O shell around `processors.journal`.

One writer per partition. For every command of partition p it decides (pure core) what to journal
and what follows, and stages all of it in the partition's open `Checkpoint`: the journal or
dead-letter record, the records that follow it (its result, a request body, script commands), the
rows the event changed and how far each command topic is read. The worker's `WorkerCommitter`
makes the checkpoints of all its partitions durable in one Kafka transaction at a time, while the
next batch is decided into the next checkpoint; stream states come from the `StreamRepository`, and what a new
owner re-folds and publishes again is `pipeline.journal.recovery`. Therefore:

- stored rows never run ahead of the journal, nor the journal ahead of the command positions:
  a checkpoint is visible to `read_committed` readers whole or not at all;
- a worker that lost its partitions is fenced by Kafka (the group coordinator refuses its
  transaction's offsets once the group moved on) and nothing it prepared becomes visible; it drops
  the partition (`on_fenced`);
- reads while deciding see every staged row first (`StreamRepository`), so the next batch is decided
  while the last one commits;
- a re-delivered command is recognised by its source offset (recorded per stream and command
  topic, also in each journal record's headers) or its append id, and journaled once; its outcome
  is published again, so a client waiting on it never times out;
- nothing a command holds can stop the partition: any failure while deciding it sends it to the
  dead-letter topic as `internal_error` and the stream's state is reloaded from its rows. Only a
  failure to produce or store (Kafka or RocksDB I/O) stops the worker.

Two command topics feed one writer: `agent-appends` (anyone) and `agent-internal-appends` (the
workers only; co-partitioned). Events that only the workers may write are refused on the first.

The Faust wiring lives in `pipeline.journal.worker`; this module needs only a `RowStore` (the
partition's stored rows) and the worker's `WorkerCommitter`.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from pydantic import ValidationError

from pipeline import metrics, tracing
from pipeline.journal import heap
from pipeline.journal.checkpoint import Checkpoint, RowStore, WorkerCommitter
from pipeline.journal.decisions import CommandRecord, HandledCommand
from pipeline.journal.follow_ups import FollowUps
from pipeline.journal.streams import StreamEntry, StreamRepository
from pipeline.kafka.partitioner import partition_for
from processors import dedupe, row_codec, rows
from processors.journal import Duplicate, Journaled, Rejected, journal_command, stream_rows
from processors.reducer import fold
from processors.render import DEFAULT_BUDGET, RenderBudget
from processors.scheduler import decide, stale_expiry
from processors.traceparent import TRACEPARENT, carried
from schemas.events import (
    AppendCommand,
    describe_validation_error,
    validate_append_command,
    worker_only_reason,
)
from schemas.limits import DEFAULT_MAX_EVENT_BYTES
from schemas.outcomes import AppendOutcome, AppendStatus
from schemas.requests import Transport
from topics.headers import H_APPEND_ID, H_REASON, H_SOURCE_OFFSET, H_SOURCE_TOPIC, INTERNAL, SCHEDULER

log = logging.getLogger("agentstream.journal")

# The fold-time histogram times one command in this many: an unbiased sample of the same
# distribution, without a histogram update (three locked increments) per command.
FOLD_SAMPLE_EVERY = 16

# A scheduler decision not journaled within this time is decided again (its idempotency key makes
# a duplicate harmless).
RESEND_AFTER_MS = 5_000


class PartitionEngine:
    """Everything one partition's writer holds: cached states, the open and the committing
    checkpoint, and the committer task that turns one into the other
    (docs/architecture.md, "Commit protocol")."""

    def __init__(
        self,
        partition: int,
        store: RowStore,
        topics: Any,
        committer: WorkerCommitter,
        *,
        max_cached_streams: int,
        partitions: int = 0,  # the topic's partition count, to refuse misrouted commands (0: no check)
        default_model: str = "smollm2",
        transport: Transport = "openai-compatible",
        render_budget: Callable[[str], RenderBudget] = lambda _model: DEFAULT_BUDGET,
        max_pending: int = 20_000,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        append_id_window: int = dedupe.DEFAULT_APPEND_ID_WINDOW,
        fatal: Callable[[BaseException], None] | None = None,
        on_fenced: Callable[[PartitionEngine, BaseException], None] | None = None,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.partition = partition
        self.store = store
        self.topics = topics
        self.committer = committer
        self.clock_ms = clock_ms
        self.partitions = partitions
        self.default_model = default_model
        self.transport = transport
        self.follow_ups = FollowUps(topics, transport, render_budget)
        self.wakeups: list[tuple[int, str]] = []  # heap of (due ms, stream path)
        self._woken_now: set[str] = set()  # streams with a wakeup at 0 in the heap
        self.on_wake: Callable[[int], None] | None = None  # told of every wakeup pushed (the worker's timer)
        self.max_pending = max_pending  # commands staged at most while a checkpoint commits
        self.max_event_bytes = max_event_bytes
        self.append_id_window = append_id_window
        self.checkpoints = committer.join(partition, store, on_fenced=self._fenced, seal=self.seal)
        # Streams folded in the open checkpoint: their item and metadata rows are written once, when
        # it is sealed, however many of their events it holds.
        self.unsealed: dict[str, StreamEntry] = {}
        self.streams = StreamRepository(store, self.checkpoints.staged, max_cached_streams)
        # Set by the worker once recovery's command backlog is read: scheduler decisions are
        # journaled at once and must not overtake it.
        self.scheduling = False
        # The traceparent of each stream's pending trigger, so that the turn it starts stays in its
        # trace (docs/behaviour.md §8). Memory only: a restart loses it, and the turn a new trace.
        self.trigger_traces: dict[str, bytes] = {}
        self.fatal = fatal
        self.on_fenced = on_fenced
        self.handled = 0
        self.journaled_types: dict[str, int] = {}  # counted per batch into agentstream_events_journaled_total
        self.last_offset = -1  # agent-appends offset of the last command handled (consumer lag)
        self._check_row_format()
        self.active = True  # False once the partition is revoked or fenced: nothing more is decided
        # This partition's streams with a request open / paused: the gauges sum them over the
        # partitions a worker owns now (`metrics.count_turns`), so a revoked partition drops out.
        self.open_requests = 0
        self.paused_agents = 0

    # --- rows ----------------------------------------------------------------------------------

    def _check_row_format(self) -> None:
        """Stop (`RowFormatError`) on rows a newer version wrote; mark a new or older store this version's
        (older rows are upcast on read)."""
        key = rows.format_key(self.partition)
        stored = self.store.get(key)
        row_codec.check_format(stored, self.partition)
        if stored != row_codec.encode_format():
            self.checkpoints.open.put(key, row_codec.encode_format())  # stored with the first checkpoint

    def _fenced(self, error: BaseException) -> None:
        """Another worker owns the partition now: decide nothing more, forget every state."""
        self.active = False
        self.unsealed.clear()
        self.streams.clear()
        if self.on_fenced is not None:
            self.on_fenced(self, error)

    # --- commands ------------------------------------------------------------------------------

    async def handle_batch(self, commands: Iterable[CommandRecord]) -> None:
        """Decide a batch of this partition's commands, in order, into the open checkpoint."""
        await self.checkpoints.room(self.max_pending)  # back-pressure: the journal is slower than the input
        if not self.active:
            return  # revoked or fenced while waiting: the owner reads these commands again
        read = self.checkpoints.open.read
        for command in commands:
            self.handled += 1
            if self.handled % heap.SETTLE_EVERY == 0:
                heap.settle()
            if not command.internal:
                self.last_offset = command.offset
            try:
                decision = self._decide(command)
            except row_codec.RowFormatError:
                raise  # a row a newer version wrote: the store, not the command, is at fault
            except Exception as error:  # nothing a command holds may stop the partition
                decision = self._internal_error(command, error)
            if tracing.ON or TRACEPARENT in command.headers:
                self._trace(decision, command.headers.get(TRACEPARENT))
            self._carry_out(decision)
            read[command.internal] = command.offset
        self._count_journaled()
        self.checkpoints.work()

    async def handle(self, command: CommandRecord) -> None:
        await self.handle_batch((command,))

    def _decide(self, command: CommandRecord) -> HandledCommand:
        """Everything about one command that is not I/O: validate, dedupe, journal, fold."""
        size = len(command.value)
        if size > self.max_event_bytes:
            reason = (
                f"too_large: the command is {size} bytes, over maxEventBytes ({self.max_event_bytes}); "
                "keep bulky data in a referenced event or a file"
            )
            return self._rejection(command, _parsed_or_none(command.value), reason)
        try:
            append = validate_append_command(command.value)
        except ValidationError as error:
            return self._rejection(command, None, "not an append command: " + describe_validation_error(error))
        misrouted = self._misrouted(command, append.streamPath)
        if misrouted is not None:
            return self._rejection(command, append, misrouted)
        entry = self.streams.get(append.streamPath)
        if not command.scheduled and entry.sources.covers(command.internal, command.offset):
            # Re-delivered after a crash: this exact record is already journaled.
            metrics.DUPLICATES.inc()
            handled = HandledCommand(command, [])
            self._republish(handled, append)
            return handled
        if not command.internal:
            forbidden = worker_only_reason(append.type, append.payload)
            if forbidden is not None:
                return self._rejection(command, append, forbidden)
        else:
            stale = stale_expiry(entry.state, append, self.streams.read)
            if stale is not None:  # the caller's settlement was journaled first: nothing to expire
                log.info("%s: expiry command not journaled: %s", append.streamPath, stale)
                return HandledCommand(command, [])
        state = entry.state
        was_open, was_paused = state.open, state.paused
        sources = entry.sources if command.scheduled else entry.sources.advanced(command.internal, command.offset)
        timed = self.handled % FOLD_SAMPLE_EVERY == 1  # the first command of all, then one in 16
        started = time.perf_counter() if timed else 0.0
        outcome = journal_command(
            state,
            append,
            now_ms=self.clock_ms(),
            sources=sources,
            read=self.streams.read,
            append_id_window=self.append_id_window,
            sealed_later=True,
        )
        if timed:
            metrics.FOLD_SECONDS.observe(time.perf_counter() - started)
        if isinstance(outcome, Journaled):
            entry.sources = sources
            self.journaled_types[outcome.event.type] = self.journaled_types.get(outcome.event.type, 0) + 1
            metrics.observe_journaled(outcome.event, state, was_open)
            self.open_requests += (state.open is not None) - (was_open is not None)
            self.paused_agents += state.paused - was_paused
            if command.scheduled:
                headers = [(H_SOURCE_TOPIC, SCHEDULER)]
            else:
                headers = [(H_SOURCE_OFFSET, str(command.offset).encode())]
                if command.internal:
                    headers.append((H_SOURCE_TOPIC, INTERNAL))
            if append.appendId is not None:
                headers.append((H_APPEND_ID, append.appendId.encode()))
            handled = HandledCommand(command, outcome.rows)
            self._result(handled, append, "journaled", outcome.event.offset)
            entry.sent.pop(outcome.event.idempotencyKey or "", None)  # a scheduler decision arrived
            handled.after.extend(self.follow_ups.after(entry, outcome.event))
            self.wake(append.streamPath, 0)
            entry.unsealed.append((outcome.event, sources))  # last: the command went through whole
            self.unsealed[append.streamPath] = entry
            handled.journal = (outcome.record, headers)
            handled.event = outcome.event
            return handled
        if isinstance(outcome, Duplicate):
            metrics.DUPLICATES.inc()
            handled = HandledCommand(command, [])
            self._result(handled, append, "duplicate", outcome.offset, outcome.reason)
            return handled
        assert isinstance(outcome, Rejected)
        if outcome.key_conflict and command.internal:
            # A platform writer repeating work whose first outcome is journaled (a caller that
            # restarted before its settlement was visible): answered, kept out of the DLQ.
            metrics.REPEATS_REJECTED.inc()
            log.info(
                "partition %d offset %d: repeated work not journaled: %s",
                command.partition,
                command.offset,
                outcome.reason[:300],
            )
            handled = HandledCommand(command, [])
            self._result(handled, append, "rejected", None, outcome.reason)
            return handled
        return self._rejection(command, append, outcome.reason)

    def _internal_error(self, command: CommandRecord, error: Exception) -> HandledCommand:
        """A bug or an input nobody foresaw: dead-letter the command, keep the partition going.

        The failure may have struck halfway through a fold, so the stream's cached state is
        dropped; it reloads from its rows (stored and staged), which never hold a half-applied event.
        """
        log.exception(
            "partition %d offset %d: internal error while handling a command", command.partition, command.offset
        )
        path = command.key.decode(errors="replace") if command.key else None
        if path is not None:
            self._reload(path)
        return self._rejection(
            command, _parsed_or_none(command.value), f"internal_error: {type(error).__name__}: {error}"
        )

    def _reload(self, path: str) -> None:
        """The stream's state as it was before the failed command. Its rows hold it as of the first
        event of the open checkpoint (item and metadata rows wait for the seal), so it is loaded from
        them and the checkpoint's events are folded again."""
        self.streams.forget(path)
        unsealed = self.unsealed.pop(path, None)
        if unsealed is None or not unsealed.unsealed:
            return
        entry = self.streams.get(path)
        entry.state.changes = {}
        for event, sources in unsealed.unsealed:
            fold(entry.state, event)
            entry.sources = sources
        entry.unsealed = unsealed.unsealed
        entry.sent = unsealed.sent
        self.unsealed[path] = entry

    def seal(self, checkpoint: Checkpoint) -> None:
        """Write the item and metadata rows of every stream folded in `checkpoint`, as they are now."""
        for entry in self.unsealed.values():
            for key, value in stream_rows(entry.state, entry.sources):
                checkpoint.rows[key] = value
            entry.unsealed = []
        self.unsealed.clear()

    def _rejection(self, command: CommandRecord, append: AppendCommand | None, reason: str) -> HandledCommand:
        handled = HandledCommand(command, [])
        if append is not None:
            self._result(handled, append, "rejected", None, reason)
        handled.reject_reason = reason
        return handled

    def _republish(self, handled: HandledCommand, append: AppendCommand) -> None:
        """A redelivered, already journaled command: its command position was not recorded as
        done, so its result may never have reached Kafka (the worker died first). Publish it
        again for a client still waiting. (What an open request needs, its call record, a cancel
        or a compaction, is published again by `republish_open_work` after recovery.)"""
        if append.appendId is None:
            return
        found = self.streams.read(rows.append_id_key(append.streamPath, append.appendId))
        if found is not None:
            self._result(handled, append, "journaled", row_codec.decode_offset(found))

    def _carry_out(self, decision: HandledCommand) -> None:
        """Stage one decision in the open checkpoint: its record, its rows, what follows it."""
        command = decision.command
        checkpoint = self.checkpoints.open
        if decision.reject_reason is not None:
            reason = decision.reject_reason
            metrics.DLQ_RECORDS.labels(metrics.dlq_reason_label(reason)).inc()
            log.warning("partition %d offset %d rejected: %s", command.partition, command.offset, reason[:500])
            if command.scheduled:
                source = SCHEDULER
            else:
                source = (self.topics.internal_appends if command.internal else self.topics.appends).encode()
            headers = [
                (H_REASON, reason.encode()),
                ("source-topic", source),
                ("source-partition", str(command.partition).encode()),
                (H_SOURCE_OFFSET, str(command.offset).encode()),
            ]
            checkpoint.produce(self.topics.dlq, command.key, command.value, headers)
        trace = decision.trace
        if decision.journal is not None:
            record, headers = decision.journal
            if trace is not None:
                headers.append((TRACEPARENT, trace))
            checkpoint.produce(self.topics.journal, command.key, record, headers)
        for key, value in decision.rows:
            checkpoint.rows[key] = value
        if decision.outcome is not None:
            if trace is None:  # sent with the checkpoint's other outcomes, a few records for all
                checkpoint.outcomes.append(decision.outcome[1])
            else:  # a record of its own, to carry the command's traceparent (docs/behaviour.md §8)
                checkpoint.follow(self.topics.results, *decision.outcome, trace, awaited=False)
        checkpoint.commands += 1
        for topic, key, value in decision.after:
            if topic == self.topics.internal_appends:
                # A command to this very worker (what agent-run code calls for: a run request, the
                # too-many-blocks feedback, a script result): journaled now, right behind the event
                # and in its checkpoint, as the scheduler's decisions are. Sent, it cost every script
                # run a trip through Kafka (a transaction, then this worker's fetch) for nothing: it
                # is decided from the event just folded, and its idempotency key makes a repeat harmless.
                self._journal_now(key.decode(), value, {} if trace is None else {TRACEPARENT: trace})
            else:
                checkpoint.follow(topic, key, value, trace)

    def _misrouted(self, command: CommandRecord, path: str) -> str | None:
        """One writer per stream holds only if every command of a stream lands on its partition."""
        if command.key != path.encode():
            return f"record key {command.key!r} is not the streamPath {path!r}: key appends by stream path"
        if self.partitions and partition_for(path, self.partitions) != self.partition:
            return (
                f"{path} belongs to partition {partition_for(path, self.partitions)}, not {self.partition}: "
                "produce with the murmur2 partitioner (librdkafka: partitioner=murmur2_random)"
            )
        return None

    def _result(
        self,
        handled: HandledCommand,
        append: AppendCommand,
        status: AppendStatus,
        offset: int | None,
        reason: str | None = None,
    ) -> None:
        if append.appendId is not None:
            outcome = AppendOutcome.encode_trusted(append.appendId, append.streamPath, status, offset, reason)
            handled.outcome = (append.streamPath.encode(), outcome)

    # --- scheduling ------------------------------------------------------------------------

    def wake(self, path: str, at_ms: int) -> None:
        if at_ms == 0:  # every journaled event wakes its stream: one such wakeup per stream is enough
            if path in self._woken_now:
                return
            self._woken_now.add(path)
        heapq.heappush(self.wakeups, (at_ms, path))
        if self.on_wake is not None:
            self.on_wake(at_ms)

    def schedule(self, now_ms: int) -> list[tuple[str, dict[str, Any]]]:
        """Run the scheduler (`processors.scheduler.decide`) for every stream whose wakeup is due.

        A decision's appends are journaled here and now, like a command read from a topic: a turn
        costs no round trip through Kafka before its request is published. A decision that must
        not overtake commands already produced (an expiry: the caller may have produced R's
        settlement just before) is sent instead as a command to `agent-internal-appends` with the
        next checkpoint, where it queues behind those; the commands sent are returned. The worker
        calls this only once a recovered partition has read the commands that waited at recovery,
        so no decision overtakes those either.
        """
        due: list[str] = []
        seen: set[str] = set()
        while self.wakeups and self.wakeups[0][0] <= now_ms:
            at_ms, path = heapq.heappop(self.wakeups)
            if at_ms == 0:
                self._woken_now.discard(path)
            if path not in seen:  # journaling below wakes streams again: decided on the next run
                seen.add(path)
                due.append(path)
        commands: list[tuple[str, dict[str, Any]]] = []
        for path in due:
            if not self.active:
                break
            entry = self.streams.get(path)
            decision = decide(entry.state, now_ms, self.default_model)
            if not decision.appends:
                if decision.wake_at_ms is not None:
                    self.wake(path, decision.wake_at_ms)
                continue
            self.wake(path, now_ms + RESEND_AFTER_MS)  # should a decision not be journaled
            for append in decision.appends:
                if not decision.after_commands:
                    self._journal_scheduled(path, append.command(path), entry)
                    continue
                sent_at = entry.sent.get(append.idempotencyKey)
                if sent_at is not None and now_ms - sent_at < RESEND_AFTER_MS:
                    continue
                entry.sent[append.idempotencyKey] = now_ms
                body = append.command(path)
                self.checkpoints.publish(self.topics.internal_appends, path.encode(), orjson.dumps(body))
                commands.append((path, body))
        return commands

    def _journal_scheduled(self, path: str, body: dict[str, Any], entry: StreamEntry) -> None:
        """Journal one scheduler append now, through the same decision as every command."""
        trigger = self.trigger_traces.pop(path, None)
        headers = {} if trigger is None else {TRACEPARENT: trigger}
        if tracing.ON:  # the turn decided, in the trigger's trace (docs/behaviour.md §8)
            headers = {TRACEPARENT: tracing.schedule_header(trigger, path, body["type"], entry.state.pending)}
        self._journal_now(path, orjson.dumps(body), headers)
        self._count_journaled()
        self.checkpoints.work()

    def _journal_now(self, path: str, value: bytes, headers: dict[str, bytes]) -> None:
        """Decide an append the worker itself calls for (a scheduler decision, a script follow-up)
        like a command read from a topic, and stage it in the open checkpoint. Its journal record
        says `source-topic: scheduler` and it advances no command position."""
        command = CommandRecord(self.partition, -1, path.encode(), value, headers, internal=True, scheduled=True)
        try:
            decision = self._decide(command)
        except Exception as error:  # as for commands: dead-letter it, keep the partition going
            decision = self._internal_error(command, error)
        if tracing.ON or headers:
            self._trace(decision, headers.get(TRACEPARENT))
        self._carry_out(decision)

    def _trace(self, decision: HandledCommand, parent: bytes | None) -> None:
        """What the records of `decision` carry (docs/behaviour.md §8): while tracing, the
        traceparent of its `agentstream.journal` span, a child of the command's; while not, the
        command's own traceparent, passed on."""
        event = decision.event
        if tracing.ON:
            outcome = "journaled" if event is not None else "rejected" if decision.reject_reason else "duplicate"
            decision.trace = tracing.journal_header(parent, event, outcome)
        else:  # parsed and written anew: a producer's header is never copied as it came (§8)
            decision.trace = carried(parent)
        if event is not None and decision.trace is not None:
            pending = self.streams.get(event.streamPath).state.pending
            if pending is not None and pending.offset == event.offset:  # the trigger of the next turn
                self.trigger_traces[event.streamPath] = decision.trace

    def _count_journaled(self) -> None:
        for event_type, count in self.journaled_types.items():
            metrics.journaled(event_type).inc(count)
        self.journaled_types.clear()


def _parsed_or_none(value: bytes) -> AppendCommand | None:
    """The command, if it parses: its append id gets the rejection as an outcome (nobody waits
    on a command without one)."""
    try:
        return AppendCommand.model_validate_json(value)
    except Exception:
        return None
