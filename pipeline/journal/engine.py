"""The journal processor's per-partition engine: the I/O shell around `processors.journal`.

One writer per partition. For every command of partition p it decides (pure core), produces the
journal record at once, and keeps the rows the event changed in a per-partition queue. Rows are
written to the table, and the command acknowledged, only after the journal record is
acknowledged by Kafka, in order. Therefore:

- stored rows never run ahead of the journal (a crash cannot leave a projection that the journal
  does not back), and the committed `agent-appends` offset never passes an unjournaled command;
- after a crash the rows lag the journal by at most the queue; `catch_up` re-folds the journal
  tail past the recorded position (the `p` row) before the partition takes new commands;
- a re-delivered command is recognised by its source offset (recorded per stream and command
  topic, also in each journal record's headers) or its append id, and journaled once; its outcome
  is published again, so a client waiting on it never times out;
- a command is acknowledged only once the records that follow its journal record (its result, a
  request body) are delivered too, and catch-up publishes the results of the events it re-folds;
- nothing a command holds can stop the partition: any failure while deciding it sends it to the
  dead-letter topic as `internal_error` and the stream's state is reloaded from its rows. Only a
  failure to produce or store (Kafka or RocksDB I/O) stops the worker.

Two command topics feed one writer: `agent-appends` (anyone) and `agent-internal-appends` (the
workers only; co-partitioned). Events that only the workers may write are refused on the first.

The Faust wiring lives in `pipeline.journal.worker`; this module needs only a `RowTable` (the
partition's rows: read a key, scan a prefix, write a row), a producer and a journal reader.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from confluent_kafka import KafkaError
from pydantic import ValidationError

from pipeline import metrics
from pipeline.journal import heap
from pipeline.kafka.partitioner import partition_for
from pipeline.kafka.producer import OnDelivery
from processors import dedupe, row_codec, rows
from processors.journal import Duplicate, Journaled, Rejected, apply_event, journal_command, payload_hash
from processors.render import DEFAULT_BUDGET, RenderBudget, as_of_request, render_messages
from processors.scheduler import decide, stale_expiry
from processors.scripts import script_follow_ups
from processors.state import AgentState, ScriptRun, SourceOffsets
from schemas.capabilities import SCRIPT_RUN_REQUESTED, ScriptRunRecord
from schemas.events import (
    CONTEXT_ADDED,
    LLM_REQUEST_REQUESTED,
    LLM_REQUEST_SETTLED,
    TOKEN_USAGE_REPORTED,
    AppendCommand,
    EnvelopeError,
    InvalidPayloadEvent,
    decode_event,
    describe_validation_error,
    worker_only_reason,
)
from schemas.limits import DEFAULT_MAX_EVENT_BYTES
from schemas.outcomes import AppendOutcome, AppendStatus
from schemas.requests import CallRequest, CancelRequest, CompactRequest, SettledNotice, Transport

log = logging.getLogger("agentstream.journal")

# Kafka record headers carried by journal records (and DLQ records).
H_APPEND_ID = "append-id"
H_SOURCE_OFFSET = "source-offset"
# On journal records: "internal" for agent-internal-appends, "scheduler" for the scheduler's
# decisions journaled at once (no command topic, no source offset), absent for agent-appends.
H_SOURCE_TOPIC = "source-topic"
INTERNAL = b"internal"
SCHEDULER = b"scheduler"
H_REASON = "reason"

# A scheduler decision not journaled within this time is decided again (its idempotency key makes
# a duplicate harmless).
RESEND_AFTER_MS = 5_000


class RowTable(Protocol):
    """The rows of one partition."""

    def get(self, key: bytes) -> bytes | None: ...
    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...
    def put(self, key: bytes, value: bytes | None) -> None: ...
    async def flush(self) -> None:
        """Hand the puts so far to durable storage (`FaustRows`: one changelog burst). Commits no offset."""


def changelog_order(burst: dict[bytes, bytes | None]) -> list[tuple[bytes, bytes | None]]:
    """The order in which one burst of rows goes to the changelog, so that any prefix of it is a
    state recovery can complete.

    A worker killed mid-burst leaves a prefix of it in the changelog, and the table's restore
    applies that prefix. A stream's metadata row is its commit point (its cursor and seq range), so
    it follows every other row of the burst: restored without them, it would claim events whose
    item and dedupe rows are missing, and catch-up, which skips events a stream already holds,
    would never write them. Rows restored without their metadata row lie past the stream's recorded
    seq range or cursor and are rewritten identically when catch-up re-folds their events. The
    partition's positions (`p`, `c`) come last: they claim everything before them.
    """
    rows_first: list[tuple[bytes, bytes | None]] = []
    metas: list[tuple[bytes, bytes | None]] = []
    positions: list[tuple[bytes, bytes | None]] = []
    meta_prefix = rows.META + rows.SEP
    position_prefixes = (rows.POSITION + rows.SEP, rows.COMMAND_POSITIONS + rows.SEP)
    for row in burst.items():
        key = row[0]
        if key.startswith(meta_prefix):
            metas.append(row)
        elif key.startswith(position_prefixes):
            positions.append(row)
        else:
            rows_first.append(row)
    return rows_first + metas + positions


# Produce one record to this engine's partition number (every topic is co-partitioned):
# (topic, key, value, headers, on_delivery(error, message)); the callback runs on the event loop.
Send = Callable[[str, bytes | None, bytes, list[tuple[str, bytes]], OnDelivery | None], None]


@dataclass(slots=True)
class CommandRecord:
    """One Kafka record of a command topic as the engine reads it (its value parses as an `AppendCommand`)."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]
    internal: bool = False  # read from agent-internal-appends (only the workers produce there)
    # A scheduler decision journaled at once: read from no topic, so no source offset to record.
    scheduled: bool = False


@dataclass(slots=True)
class StreamEntry:
    state: AgentState
    sources: SourceOffsets  # how far this stream's commands are journaled, per command topic
    # The last opened request's messages: a compaction resends them byte for byte.
    last_request: tuple[int, list[dict[str, Any]]] | None = None
    # Scheduler commands sent but not yet journaled (idempotency key -> sent at, ms).
    sent: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class HandledCommand:
    """What handling one command produces: the command in flight, plus what to write to Kafka."""

    in_flight: InFlightCommand
    journal: tuple[bytes, list[tuple[str, bytes]]] | None = None  # journal record and its headers
    reject_reason: str | None = None  # set: the command goes to the dead-letter topic


@dataclass(slots=True, eq=False)
class InFlightCommand:
    """A handled command whose journal (or dead-letter) record may not be acknowledged yet: its rows
    and follow-ups wait here until it is stored. (A stream's pending trigger is `PendingTrigger`.)"""

    command: CommandRecord
    rows: list[rows.Row]
    # Records published once the journal record is acknowledged (results, LLM requests): nothing
    # downstream ever sees an event the journal might still lose.
    after: list[tuple[str, bytes, bytes]] = field(default_factory=list)  # (topic, key, value)
    awaiting: int = 0  # journal / dead-letter records produced and not yet settled
    journal_offset: int | None = None  # the journal record's offset, once acknowledged
    error: BaseException | None = None  # a failed delivery: fatal when the queue reaches it
    on_settled: Callable[[], None] | None = None

    def done(self) -> bool:
        return self.awaiting == 0

    async def wait(self) -> None:
        while self.awaiting:
            await asyncio.sleep(0.001)  # the producer's poll task settles deliveries meanwhile

    def journal_delivered(self, error: KafkaError | None, message: Any) -> None:
        if error is None:
            self.journal_offset = message.offset()
        self._settled(error, "journal")

    def dlq_delivered(self, error: KafkaError | None, message: Any) -> None:
        self._settled(error, "dead-letter")

    def _settled(self, error: KafkaError | None, what: str) -> None:
        self.awaiting -= 1
        if error is not None and self.error is None:
            self.error = RuntimeError(f"{what} record not delivered: {error.str()}")
        if self.on_settled is not None:
            self.on_settled()


class CommandPositions:
    """How far each command topic of one partition is done: the upstream position stored with
    what was derived from it (a row in the same write batch), where reading resumes after a restart.

    A command is done once its journal (or dead-letter) record, its rows and the records that
    follow it (its result, a request body) are all in Kafka. Commands finish out of order (their
    follow-up deliveries do), so the position is the end of the prefix of done commands.
    """

    def __init__(self, appends: int = -1, internal: int = -1) -> None:
        self.done = {False: appends, True: internal}
        self._open: dict[bool, deque[int]] = {False: deque(), True: deque()}
        self._finished: dict[bool, set[int]] = {False: set(), True: set()}
        self.changed = False

    def arrived(self, internal: bool, offset: int) -> None:
        self._open[internal].append(offset)

    def finished(self, internal: bool, offset: int) -> None:
        open_offsets, finished = self._open[internal], self._finished[internal]
        finished.add(offset)
        while open_offsets and open_offsets[0] in finished:
            self.done[internal] = open_offsets.popleft()
            finished.discard(self.done[internal])
            self.changed = True

    def encode(self) -> bytes:
        return row_codec.encode_command_positions(self.done[False], self.done[True])

    @classmethod
    def decode(cls, value: bytes | None) -> CommandPositions:
        if value is None:
            return cls()
        return cls(*row_codec.decode_command_positions(value))


class PartitionEngine:
    """Everything one partition's writer holds: cached states, unstored rows, the queue.

    Its commit protocol, in order (docs/architecture.md, "Commit protocol"):

    1. `handle_batch`: decide each command of a fetched batch (pure core), stage its rows in the
       overlay (later reads see them), produce its journal or dead-letter record. A failure while
       deciding dead-letters that one command (`internal_error`).
    2. Deliveries settle in order per partition. `drain` takes the prefix of the queue whose
       records are acknowledged: a failed one is fatal (the state is ahead of the journal).
    3. Their rows go into the table (one changelog record per changed key: the last write of a
       batch wins), with the journal position `p` and the command positions `c`.
    4. `RowTable.flush` produces the changelog burst; once every record of it is acknowledged,
       the rows, Faust's changelog offset and both positions are written to RocksDB in one batch
       (any failed record is fatal: the store must stay a prefix of the changelog).
    5. The follow-up records of each drained command (its result, a request body, a cancel, a
       compaction, script commands) are produced; once all are delivered the command is done and
       its offset may enter the next `c` row. A crash before that reads the command again after
       the restart, and its outcome is published again.
    """

    def __init__(
        self,
        partition: int,
        table: RowTable,
        topics: Any,
        send: Send,
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
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.partition = partition
        self.table = table
        self.topics = topics
        self.send = send
        self.clock_ms = clock_ms
        self.partitions = partitions
        self.default_model = default_model
        self.transport = transport
        self.render_budget = render_budget  # per model: items are cut to fit its context window
        self.wakeups: list[tuple[int, str]] = []  # heap of (due ms, stream path)
        self.on_wake: Callable[[int], None] | None = None  # told of every wakeup pushed (the worker's timer)
        self.max_cached_streams = max_cached_streams
        self.max_pending = max_pending
        self.max_event_bytes = max_event_bytes
        self.append_id_window = append_id_window
        self.streams: OrderedDict[str, StreamEntry] = OrderedDict()
        self.overlay: dict[bytes, bytes | None] = {}  # rows decided but not yet stored
        self.overlay_owner: dict[bytes, InFlightCommand] = {}
        self.queue: deque[InFlightCommand] = deque()
        # Set by the worker once recovery's command backlog is read: scheduler decisions are
        # journaled at once and must not overtake it.
        self.scheduling = False
        self.fatal = fatal
        self._drain_lock = asyncio.Lock()
        self._drain_task: asyncio.Task[None] | None = None
        self.handled = 0
        self.last_offset = -1  # agent-appends offset of the last command handled (consumer lag)
        self._check_row_format()
        self.positions = CommandPositions.decode(table.get(rows.command_positions_key(partition)))
        self.active = True  # False once the partition is revoked: nothing more may be produced
        # This partition's streams with a request open / paused: the gauges sum them over the
        # partitions a worker owns now (`metrics.count_turns`), so a revoked partition drops out.
        self.open_requests = 0
        self.paused_agents = 0

    # --- rows ----------------------------------------------------------------------------------

    def _check_row_format(self) -> None:
        """Stop (`RowFormatError`) on rows another version wrote; mark a store this version's."""
        key = rows.format_key(self.partition)
        stored = self.table.get(key)
        row_codec.check_format(stored, self.partition)
        if stored is None:
            self.table.put(key, row_codec.encode_format())  # stored with the partition's next rows

    def read(self, key: bytes) -> bytes | None:
        if key in self.overlay:
            return self.overlay[key]
        return self.table.get(key)

    def entry(self, path: str) -> StreamEntry:
        entry = self.streams.get(path)
        if entry is not None:
            self.streams.move_to_end(path)
            return entry
        meta = self.read(rows.meta_key(path))
        if meta is None:
            entry = StreamEntry(AgentState(stream_path=path), SourceOffsets())
        else:
            state, sources = row_codec.load_state(meta, self._scan(rows.items_prefix(path)))
            entry = StreamEntry(state, sources)
        self.streams[path] = entry
        self._evict()
        return entry

    def _scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Stored rows under `prefix` with the rows decided but not yet stored laid over them."""
        staged = {key: value for key, value in self.overlay.items() if key.startswith(prefix)}
        if not staged:
            yield from self.table.scan(prefix)
            return
        merged: dict[bytes, bytes | None] = dict(self.table.scan(prefix))
        merged.update(staged)
        for key in sorted(merged):
            value = merged[key]
            if value is not None:
                yield key, value

    def _evict(self) -> None:
        # A stream with rows still queued stays cached: its state is ahead of the store.
        while len(self.streams) > self.max_cached_streams:
            for path in self.streams:
                if rows.meta_key(path) not in self.overlay:
                    del self.streams[path]
                    break
            else:
                return

    def _stage(self, in_flight: InFlightCommand) -> None:
        for key, value in in_flight.rows:
            self.overlay[key] = value
            self.overlay_owner[key] = in_flight
        self.queue.append(in_flight)
        if in_flight.awaiting == 0:
            self._delivered(None)

    def _on_settled(self) -> None:
        self._delivered(None)

    def _delivered(self, _: object) -> None:
        """A delivery completed: store what is ready now, without waiting for the next command.
        Deliveries resolve in bursts (one producer poll); one drain task serves a burst."""
        if self._drain_task is None or self._drain_task.done():
            self._drain_task = asyncio.get_running_loop().create_task(self._drain_soon())

    async def _drain_soon(self) -> None:
        try:
            await self.drain(wait=False)
        except Exception as error:  # a failed delivery: the state is ahead of the journal
            if self.fatal is None:
                raise
            self.fatal(error)

    async def drain(self, wait: bool) -> int:
        """Store the rows of every queued command whose deliveries are acknowledged, in order."""
        async with self._drain_lock:  # one drain at a time: rows, acks and the position stay in order
            return await self._drain(wait)

    async def _drain(self, wait: bool) -> int:
        stored = 0
        position = None
        queue = self.queue
        while queue:
            in_flight = queue[0]
            if not in_flight.done():
                if not wait:
                    break
                await in_flight.wait()
            queue.popleft()
            self._store(in_flight)
            if in_flight.journal_offset is not None:
                position = in_flight.journal_offset
            self._send_follow_ups(in_flight.command, in_flight.after)
            stored += 1
        if position is not None:
            # Once per batch, after every row it covers: recovery re-folds the journal past it.
            self.table.put(rows.position_key(self.partition), row_codec.encode_offset(position))
        positions_changed = self.positions.changed
        if positions_changed:
            self.positions.changed = False
            self.table.put(rows.command_positions_key(self.partition), self.positions.encode())
        if stored or position is not None or positions_changed:
            await self.table.flush()
        return stored

    def _store(self, in_flight: InFlightCommand) -> None:
        if in_flight.error is not None:
            raise in_flight.error  # the journal (or the dead-letter topic) lacks it: only a restart is safe
        put = self.table.put
        for key, value in in_flight.rows:
            put(key, value)
            if self.overlay_owner.get(key) is in_flight:
                del self.overlay_owner[key]
                del self.overlay[key]

    def _send_follow_ups(self, command: CommandRecord, records: list[tuple[str, bytes, bytes]]) -> None:
        """Publish what follows a journaled command. The command is done once these are in Kafka
        too: a crash before that reads the command again, and its outcome is published again."""

        def finished(internal: bool, offset: int) -> None:
            if not command.scheduled:  # read from no topic: no position to advance
                self.positions.finished(internal, offset)

        if not records:
            finished(command.internal, command.offset)
            return
        remaining = len(records)

        def delivered(error: KafkaError | None, _message: Any) -> None:
            nonlocal remaining
            if error is not None:
                failure = RuntimeError(f"record after the journal not delivered: {error.str()}")
                if self.fatal is None:
                    raise failure
                self.fatal(failure)  # an outcome the journal promised is lost: restart and republish
                return
            remaining -= 1
            if remaining == 0:
                finished(command.internal, command.offset)
                self._delivered(None)  # record the new position soon, even if no command follows

        for topic, key, value in records:
            self.send(topic, key, value, [], delivered)

    # --- commands ------------------------------------------------------------------------------

    async def handle_batch(self, commands: Iterable[CommandRecord]) -> None:
        """Decide and produce a batch of this partition's commands, in order."""
        if len(self.queue) >= self.max_pending:
            await self.drain(wait=True)  # back-pressure: the journal is slower than the input
        if not self.active:
            return  # revoked while waiting: the new owner reads these commands again
        arrived = self.positions.arrived
        for command in commands:
            self.handled += 1
            if self.handled % heap.SETTLE_EVERY == 0:
                heap.settle()
            arrived(command.internal, command.offset)
            if not command.internal:
                self.last_offset = command.offset
            try:
                decision = self._decide(command)
            except Exception as error:  # nothing a command holds may stop the partition
                decision = self._internal_error(command, error)
            self._carry_out(command, decision)

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
            append = AppendCommand.model_validate_json(command.value)
        except ValidationError as error:
            return self._rejection(command, None, "not an append command: " + describe_validation_error(error))
        misrouted = self._misrouted(command, append.streamPath)
        if misrouted is not None:
            return self._rejection(command, append, misrouted)
        entry = self.entry(append.streamPath)
        if not command.scheduled and entry.sources.covers(command.internal, command.offset):
            # Re-delivered after a crash: this exact record is already journaled.
            metrics.DUPLICATES.inc()
            in_flight = InFlightCommand(command, [])
            self._republish(in_flight, append)
            return HandledCommand(in_flight)
        if not command.internal:
            forbidden = worker_only_reason(append.type, append.payload)
            if forbidden is not None:
                return self._rejection(command, append, forbidden)
        else:
            stale = stale_expiry(entry.state, append, self.read)
            if stale is not None:  # the caller's settlement was journaled first: nothing to expire
                log.info("%s: expiry command not journaled: %s", append.streamPath, stale)
                return HandledCommand(InFlightCommand(command, []))
        state = entry.state
        was_open, was_paused = state.open, state.paused
        sources = entry.sources if command.scheduled else entry.sources.advanced(command.internal, command.offset)
        started = time.perf_counter()
        outcome = journal_command(
            state,
            append,
            now_ms=self.clock_ms(),
            sources=sources,
            read=self.read,
            append_id_window=self.append_id_window,
        )
        metrics.FOLD_SECONDS.observe(time.perf_counter() - started)
        if isinstance(outcome, Journaled):
            entry.sources = sources
            _observe(outcome.event, state, was_open)
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
            in_flight = InFlightCommand(command, outcome.rows)
            self._result(in_flight, append, "journaled", outcome.event.offset)
            self._after_fold(entry, outcome.event, in_flight)
            self._script_follow_ups(entry, outcome.event, in_flight)
            return HandledCommand(in_flight, journal=(outcome.record, headers))
        if isinstance(outcome, Duplicate):
            metrics.DUPLICATES.inc()
            in_flight = InFlightCommand(command, [])
            self._result(in_flight, append, "duplicate", outcome.offset, outcome.reason)
            return HandledCommand(in_flight)
        assert isinstance(outcome, Rejected)
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
            self.streams.pop(path, None)
        return self._rejection(
            command, _parsed_or_none(command.value), f"internal_error: {type(error).__name__}: {error}"
        )

    def _rejection(self, command: CommandRecord, append: AppendCommand | None, reason: str) -> HandledCommand:
        in_flight = InFlightCommand(command, [])
        if append is not None:
            self._result(in_flight, append, "rejected", None, reason)
        return HandledCommand(in_flight, reject_reason=reason)

    def _republish(self, in_flight: InFlightCommand, append: AppendCommand) -> None:
        """A redelivered, already journaled command: its command position was not recorded as
        done, so its result may never have reached Kafka (the worker died first). Publish it
        again for a client still waiting. (What an open request needs, its call record, a cancel
        or a compaction, is published again by `republish_open_work` after recovery.)"""
        if append.appendId is None:
            return
        found = self.read(rows.append_id_key(append.streamPath, append.appendId))
        if found is not None:
            self._result(in_flight, append, "journaled", row_codec.decode_offset(found))

    def _request_messages(self, entry: StreamEntry, request_offset: int, model: str) -> list[dict[str, Any]] | None:
        """The messages request R was sent with: from memory, else rendered again exactly as R saw
        them (`as_of_request`). None when a compaction since R makes that impossible."""
        if entry.last_request is not None and entry.last_request[0] == request_offset:
            return entry.last_request[1]
        state = entry.state
        created_at = _request_created_at(state, request_offset)
        view = as_of_request(state, request_offset)
        if view is None or created_at is None:
            return None
        messages = render_messages(view, self.transport, created_at, self.render_budget(model))
        entry.last_request = (request_offset, messages)
        return messages

    def _call_record(self, state: AgentState, messages: list[dict[str, Any]]) -> bytes:
        request = state.open
        assert request is not None
        record = CallRequest.model_validate(
            {
                "kind": "call",
                "streamPath": state.stream_path,
                "requestOffset": request.offset,
                "model": request.model,
                "transport": self.transport,
                "expiresAt": request.expiresAt,
                "attempt": state.consecutive_llm_failures + 1,
                "maxAttempts": state.config.llmRequestRetryPolicy.maxAttempts,
                "messages": messages,
            }
        )
        return _record_bytes(record)

    def _carry_out(self, command: CommandRecord, decision: HandledCommand) -> None:
        """The I/O of one decision. A failure here is Kafka's, and stops the worker."""
        in_flight = decision.in_flight
        in_flight.on_settled = self._on_settled
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
            in_flight.awaiting += 1
            self.send(self.topics.dlq, command.key, command.value, headers, in_flight.dlq_delivered)
        if decision.journal is not None:
            record, headers = decision.journal
            in_flight.awaiting += 1
            self.send(self.topics.journal, command.key, record, headers, in_flight.journal_delivered)
        self._stage(in_flight)

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
        in_flight: InFlightCommand,
        append: AppendCommand,
        status: AppendStatus,
        offset: int | None,
        reason: str | None = None,
    ) -> None:
        if append.appendId is not None:
            outcome = AppendOutcome.encode_trusted(append.appendId, append.streamPath, status, offset, reason)
            in_flight.after.append((self.topics.results, append.streamPath.encode(), outcome))

    # --- scheduling ------------------------------------------------------------------------

    def _after_fold(self, entry: StreamEntry, event: Any, in_flight: InFlightCommand) -> None:
        """What a journaled event sets in motion: a request body, a cancel, a compaction, a wakeup."""
        state = entry.state
        path = event.streamPath
        entry.sent.pop(event.idempotencyKey or "", None)
        open_request = state.open
        if event.type == LLM_REQUEST_REQUESTED and open_request is not None and open_request.offset == event.offset:
            # The record must fit llm-requests whatever the projection holds: render within budget.
            with metrics.RENDER_SECONDS.time():
                messages = render_messages(
                    state, self.transport, event.createdAt, self.render_budget(open_request.model)
                )
            entry.last_request = (event.offset, messages)
            in_flight.after.append((self.topics.llm_requests, path.encode(), self._call_record(state, messages)))
        elif open_request is not None and open_request.interruptedBy == event.offset:
            in_flight.after.append((self.topics.llm_requests, path.encode(), _cancel_record(path, open_request.offset)))
        elif event.type == LLM_REQUEST_SETTLED and not isinstance(event, InvalidPayloadEvent):
            notice = SettledNotice(kind="settled", streamPath=path, requestOffset=event.payload.requestOffset)
            in_flight.after.append((self.topics.llm_requests, path.encode(), _record_bytes(notice)))
        elif event.type == TOKEN_USAGE_REPORTED:
            compact = self._compaction(entry, event.offset)
            if compact is not None:
                in_flight.after.append((self.topics.llm_requests, path.encode(), compact))
        self.wake(path, 0)

    def _script_follow_ups(self, entry: StreamEntry, event: Any, in_flight: InFlightCommand) -> None:
        """Agents run code: the run request, feedback or script result the event calls for (commands
        to the internal topic), and each journaled run request for the capability host (script-runs).
        All are published once the journal acknowledges the event."""
        in_flight.after.extend(self._script_commands(entry.state, event))
        if event.type == SCRIPT_RUN_REQUESTED and not isinstance(event, InvalidPayloadEvent):
            payload = event.payload
            record = script_run_record(
                event.streamPath,
                event.offset,
                event.createdAt,
                payload.code,
                payload.executionId,
                payload.expiresAt,
                entry.state.config.scriptTimeoutMs,
            )
            in_flight.after.append((self.topics.script_runs, event.streamPath.encode(), record))

    def _script_commands(self, state: AgentState, event: Any) -> list[tuple[str, bytes, bytes]]:
        """The commands agent-run code calls for after `event` (`state`: folded through it)."""
        path = event.streamPath
        key = path.encode()
        return [
            (self.topics.internal_appends, key, orjson.dumps(append.command(path)))
            for append in script_follow_ups(state, event)
        ]

    def open_script_runs(self) -> list[tuple[str, ScriptRun, int]]:
        """Every execution requested and not settled in this partition, with its agent's script
        timeout: (stream path, run, timeoutMs). The worker publishes their `script-runs` records
        again after recovery (their code is read back from the journal)."""
        runs: list[tuple[str, ScriptRun, int]] = []
        for _, value in self.table.scan(rows.META + rows.SEP):
            meta = row_codec.decode_meta_row(value)
            if meta.scripts:
                state = self.entry(meta.path).state
                runs.extend((meta.path, run, state.config.scriptTimeoutMs) for run in state.scripts.values())
        return runs

    def _compaction(self, entry: StreamEntry, report_offset: int) -> bytes | None:
        """§4.5: summarize request R when its usage crossed the threshold (newest report only)."""
        report = entry.state.over_threshold
        if report is None or report.offset != report_offset or len(entry.state.history) == 0:
            return None
        messages = self._request_messages(entry, report.llmRequestOffset, report.model)
        if messages is None:
            log.warning(
                "%s: usage of @%d crossed the compaction threshold but the request cannot be rendered again "
                "(compacted since); compaction waits for the next report",
                entry.state.stream_path,
                report.llmRequestOffset,
            )
            return None
        record = CompactRequest.model_validate(
            {
                "kind": "compact",
                "streamPath": entry.state.stream_path,
                "requestOffset": report.llmRequestOffset,
                "reportOffset": report.offset,
                "model": report.model,
                "transport": self.transport,
                "tokens": report.tokens,
                "threshold": report.threshold,
                "messages": messages,
            }
        )
        return _record_bytes(record)

    def wake(self, path: str, at_ms: int) -> None:
        heapq.heappush(self.wakeups, (at_ms, path))
        if self.on_wake is not None:
            self.on_wake(at_ms)

    def schedule(self, now_ms: int) -> list[tuple[str, dict[str, Any]]]:
        """Run the scheduler (`processors.scheduler.decide`) for every stream whose wakeup is due.

        A decision's appends are journaled here and now, like a command read from a topic: a turn
        costs no round trip through Kafka before its request is published. A decision that must
        not overtake commands already produced (an expiry: the caller may have produced R's
        settlement just before) is returned instead, as commands for `agent-internal-appends`,
        where they queue behind those. The worker calls this only once a recovered partition has
        read the commands that waited at recovery, so no decision overtakes those either.
        """
        due: list[str] = []
        seen: set[str] = set()
        while self.wakeups and self.wakeups[0][0] <= now_ms:
            _, path = heapq.heappop(self.wakeups)
            if path not in seen:  # journaling below wakes streams again: decided on the next run
                seen.add(path)
                due.append(path)
        commands: list[tuple[str, dict[str, Any]]] = []
        for path in due:
            if not self.active:
                break
            entry = self.entry(path)
            decision = decide(entry.state, now_ms, self.default_model)
            if not decision.appends:
                if decision.wake_at_ms is not None:
                    self.wake(path, decision.wake_at_ms)
                continue
            self.wake(path, now_ms + RESEND_AFTER_MS)  # should a decision not be journaled
            for append in decision.appends:
                if not decision.after_commands:
                    self._journal_scheduled(path, append.command(path))
                    continue
                sent_at = entry.sent.get(append.idempotencyKey)
                if sent_at is not None and now_ms - sent_at < RESEND_AFTER_MS:
                    continue
                entry.sent[append.idempotencyKey] = now_ms
                commands.append((path, append.command(path)))
        return commands

    def _journal_scheduled(self, path: str, body: dict[str, Any]) -> None:
        """Journal one scheduler append now, through the same decision as every command."""
        value = orjson.dumps(body)
        command = CommandRecord(self.partition, -1, path.encode(), value, {}, internal=True, scheduled=True)
        try:
            decision = self._decide(command)
        except Exception as error:  # as for commands: dead-letter it, keep the partition going
            decision = self._internal_error(command, error)
        self._carry_out(command, decision)

    def wake_streams_with_work(self) -> None:
        """After recovery (a restart or a rebalance): wake every stream with a pending trigger or an
        open request, and count the gauges from the rows."""
        self.open_requests = self.paused_agents = 0
        for _, value in self.table.scan(rows.META + rows.SEP):
            meta = row_codec.decode_meta_row(value)
            self.open_requests += meta.open is not None
            self.paused_agents += meta.paused
            if meta.pending is not None or meta.open is not None:
                self.wake(meta.path, 0)

    def republish_open_work(self) -> list[tuple[str, bytes, bytes]]:
        """What open requests still need published, once the partition has read the commands that
        were waiting when it was recovered (the worker calls it then).

        The worker may have died after journaling a request, an interrupt or a usage report but
        before its follow-up reached `llm-requests`. So every open request's call record goes out
        again (rendered exactly as first sent), with a cancel if it was interrupted, and every
        compaction not yet applied. Waiting for the commands first matters: a settlement the caller
        appended while no worker ran is among them, and a call record republished before it is
        journaled would have the caller answer R twice. Repeats that remain are harmless: the caller
        skips what it has handled, and its outcomes carry idempotency keys derived from R."""
        records: list[tuple[str, bytes, bytes]] = []
        for _, value in self.table.scan(rows.META + rows.SEP):
            meta = row_codec.decode_meta_row(value)
            if meta.open is not None or meta.over_threshold is not None:
                records.extend(self._open_work(self.entry(meta.path)))  # the current state decides
        return records

    def _open_work(self, entry: StreamEntry) -> list[tuple[str, bytes, bytes]]:
        state = entry.state
        path = state.stream_path
        assert path is not None
        key = path.encode()
        records: list[tuple[str, bytes, bytes]] = []
        request = state.open
        if request is not None:
            messages = self._request_messages(entry, request.offset, request.model)
            if messages is None:
                log.warning(
                    "%s: the call record of @%d cannot be rendered again (history compacted since, or state "
                    "from an older version); the request expires at %d",
                    path,
                    request.offset,
                    request.expiresAt,
                )
            else:
                records.append((self.topics.llm_requests, key, self._call_record(state, messages)))
            if request.interruptedBy is not None:
                records.append((self.topics.llm_requests, key, _cancel_record(path, request.offset)))
        if state.over_threshold is not None:
            compact = self._compaction(entry, state.over_threshold.offset)
            if compact is not None:
                records.append((self.topics.llm_requests, key, compact))
        return records

    # --- recovery ------------------------------------------------------------------------------

    def recorded_position(self) -> int:
        value = self.table.get(rows.position_key(self.partition))
        return -1 if value is None else row_codec.decode_offset(value)

    def catch_up(
        self,
        records: Iterable[tuple[int, bytes, dict[str, bytes]]],
        outcomes: list[tuple[str, bytes, bytes]] | None = None,
    ) -> int:
        """Re-fold journal records (kafka offset, value, headers) past the recorded position.

        Events a stream's rows already hold are skipped; the rest are folded and stored exactly as
        the live path would have stored them. With `outcomes`, what the previous owner may have
        died before publishing is added to it: the result record of every re-folded event that a
        client may wait for, and the commands agent-run code calls for (a run request, the
        too-many-blocks feedback, a script result). Replay passes none.
        """
        refolded = 0
        position = None
        for kafka_offset, value, headers in records:
            position = kafka_offset
            try:
                event = decode_event(value)
            except EnvelopeError as error:
                log.error("journal partition %d offset %d is not an event: %s", self.partition, kafka_offset, error)
                continue
            entry = self.entry(event.streamPath)
            if event.offset <= entry.state.cursor:
                continue
            internal = headers.get(H_SOURCE_TOPIC) == INTERNAL
            sources = entry.sources.advanced(internal, int(headers.get(H_SOURCE_OFFSET, b"-1")))
            append_id = headers[H_APPEND_ID].decode() if H_APPEND_ID in headers else None
            digest = None
            if event.idempotencyKey is not None:
                digest = payload_hash(event.type, orjson.loads(value)["payload"])
            if isinstance(event, InvalidPayloadEvent):
                log.error(
                    "journal @%d of %s has an invalid payload (skipped): %s",
                    event.offset,
                    event.streamPath,
                    event.reason,
                )
            changed = apply_event(
                entry.state, event, sources, append_id, digest, window=self.append_id_window, read=self.read
            )
            entry.sources = sources
            for key, row_value in changed:
                self.table.put(key, row_value)
            if outcomes is not None:
                if append_id is not None:
                    outcome = AppendOutcome.encode_trusted(append_id, event.streamPath, "journaled", event.offset)
                    outcomes.append((self.topics.results, event.streamPath.encode(), outcome))
                # Folded in journal order, the state is exactly the one the live path decided with,
                # so these are the commands it produced (or never got to): repeats are duplicates.
                outcomes.extend(self._script_commands(entry.state, event))
            refolded += 1
        if position is not None:
            self.table.put(rows.position_key(self.partition), row_codec.encode_offset(position))
        return refolded


def script_run_record(
    path: str, offset: int, created_at: str, code: str, execution_id: str, expires_at: int, timeout_ms: int
) -> bytes:
    """The `script-runs` record of the run requested at `path@offset`: the event's fields and the
    agent's script timeout."""
    record = ScriptRunRecord(
        streamPath=path,
        offset=offset,
        createdAt=created_at,
        code=code,
        executionId=execution_id,
        expiresAt=expires_at,
        timeoutMs=timeout_ms,
    )
    return record.model_dump_json().encode()


def _cancel_record(path: str, request_offset: int) -> bytes:
    record = CancelRequest(
        kind="cancel", streamPath=path, requestOffset=request_offset, reason="interrupted-by-user-input"
    )
    return _record_bytes(record)


def _record_bytes(record: CallRequest | CancelRequest | CompactRequest | SettledNotice) -> bytes:
    """An `llm-requests` record, built and checked through its `schemas.requests` model."""
    return record.model_dump_json(exclude_none=True).encode()


def _request_created_at(state: AgentState, request_offset: int) -> str | None:
    """createdAt of request R (its trailing timestamp message), while the state still knows it:
    R is open, or R is the newest request event (every request event seals the projection)."""
    if state.open is not None and state.open.offset == request_offset:
        return state.open.createdAt
    if state.published_through == request_offset:
        return state.last_request_created_at
    return None


def _parsed_or_none(value: bytes) -> AppendCommand | None:
    """The command, if it parses: its append id gets the rejection as an outcome (nobody waits
    on a command without one)."""
    try:
        return AppendCommand.model_validate_json(value)
    except Exception:
        return None


def _observe(event: Any, state: AgentState, was_open: Any) -> None:
    """Counters of one journaled event (the state is already folded)."""
    metrics.journaled(event.type).inc()
    if state.open is not None and state.open is not was_open:
        metrics.REQUESTS_OPENED.inc()
    if was_open is not None and state.open is None and event.type == LLM_REQUEST_SETTLED:
        metrics.REQUESTS_SETTLED.labels(event.payload.result.status).inc()
    if event.type == TOKEN_USAGE_REPORTED:
        report = event.payload
        metrics.TOKENS.labels("input").inc(report.inputTokens)
        metrics.TOKENS.labels("output").inc(report.outputTokens)
        metrics.TOKENS.labels("cached").inc(report.cachedInputTokens or 0)
    elif (
        event.type == CONTEXT_ADDED
        and event.payload.compaction is not None
        and state.compacted_through >= (event.payload.compaction.replacesHistoryThrough)
    ):
        metrics.COMPACTIONS.inc()
