"""The console's view of the journal: every stream folded as the journal worker folds it.

A `JournalMirror` follows the whole `agent-journal` topic from its start (one background consumer
thread, no consumer group commits) and folds each stream's events with the reducer itself
(`processors.reducer.fold`), so the console shows exactly the state the worker decides from. It
keeps, per stream, the folded state and the Kafka offset of each journal offset (8 bytes an event):
a page of an old journal is read back from Kafka by offset, never by scanning the partition. The
most recent records stay in a cache bounded in bytes, so live pages read nothing from Kafka.

The mirror starts on the first console request: a gateway used only as an API pays nothing.
Changes are handed to the event loop with `call_soon_threadsafe`; subscribers (server-sent event
streams) are woken per stream path. docs/operations.md, "Web console", states the memory cost.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaException, TopicPartition

from pipeline.kafka.read import consume_ready, watermarks
from pipeline.settings import Settings
from processors.reducer import fold
from processors.state import AgentState
from schemas.capabilities import AGENT_OUTPUT_PREFIX, SCRIPT_RUN_REQUESTED, SCRIPT_RUN_SETTLED, SCRIPT_RUN_STARTED
from schemas.events import (
    AGENT_PAUSED,
    AGENT_RESUMED,
    CONTEXT_ADDED,
    LLM_REQUEST_REQUESTED,
    LLM_REQUEST_SETTLED,
    EnvelopeError,
    InvalidPayloadEvent,
    decode_event,
)

log = logging.getLogger("agentstream.gateway.console")

CACHE_BYTES = 64 * 1024 * 1024
FETCH_TIMEOUT_S = 10.0
# Reading a page back: a wanted record this close after the last one read is reached by reading
# on rather than by re-assigning the partition.
READ_ON_RECORDS = 200

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RequestInfo:
    created_at: str
    model: str


@dataclass(slots=True)
class TurnOffsets:
    """The journal offsets of one request's turn, for its timeline (a few ints per request)."""

    trigger: int | None
    settled: int | None = None
    answer: int | None = None
    script_requested: int | None = None
    script_started: int | None = None
    script_settled: int | None = None


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """A journal event with its Kafka record's headers and timestamp (epoch ms)."""

    event: Any
    headers: dict[str, bytes]
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class RawRecord:
    value: bytes
    headers: dict[str, bytes]
    timestamp_ms: int

    def __len__(self) -> int:  # what it costs the record cache
        return len(self.value)


@dataclass(slots=True)
class MirroredStream:
    path: str
    partition: int
    state: AgentState = field(default_factory=AgentState)
    positions: array[int] = field(default_factory=lambda: array("q"))  # journal offset i+1 -> Kafka offset
    requests: dict[int, RequestInfo] = field(default_factory=dict)
    turns: dict[int, TurnOffsets] = field(default_factory=dict)  # by request offset
    answers: dict[int, int] = field(default_factory=dict)  # assistant item offset -> its request
    pause_reason: str | None = None


class RecordCache:
    """Raw journal records by (path, offset), least recently used out first, bounded in bytes."""

    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._size = 0
        self._records: OrderedDict[tuple[str, int], Any] = OrderedDict()

    def put(self, key: tuple[str, int], value: Any) -> None:
        """`value`: anything with a length in bytes (a `RawRecord`)."""
        if len(value) > self._budget // 16:
            return  # one huge record must not flush everything else
        old = self._records.pop(key, None)
        if old is not None:
            self._size -= len(old)
        self._records[key] = value
        self._size += len(value)
        while self._size > self._budget:
            _, dropped = self._records.popitem(last=False)
            self._size -= len(dropped)

    def get(self, key: tuple[str, int]) -> Any:
        value = self._records.get(key)
        if value is not None:
            self._records.move_to_end(key)
        return value


class Subscriber:
    """A live page: woken when a stream it watches changes."""

    def __init__(self, wants: Callable[[str], bool]) -> None:
        self.wants = wants
        self.wake = asyncio.Event()


class JournalMirror:
    def __init__(self, settings: Settings, topic: str, cache_bytes: int = CACHE_BYTES) -> None:
        self._settings = settings
        self._topic = topic
        self.lock = threading.Lock()  # guards entries, states and the cache (follower vs. pages)
        self._entries: dict[str, MirroredStream] = {}
        self._cache = RecordCache(cache_bytes)
        self._subscribers: set[Subscriber] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._started = False
        self._start_lock = threading.Lock()
        self._ends: dict[int, int] | None = None  # end offsets at start: "caught up" once reached
        self.caught_up = False
        self.problem: str | None = None
        self._thread = threading.Thread(target=self._follow, name="console-mirror", daemon=True)
        self._reader_lock = threading.Lock()
        self._reader: Consumer | None = None

    # --- life ------------------------------------------------------------------------------------

    def ensure_started(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._start_lock:
            if not self._started:
                self._loop = loop
                self._started = True
                self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None

    # --- reading ---------------------------------------------------------------------------------

    def paths(self) -> list[str]:
        with self.lock:
            return list(self._entries)

    def read(self, path: str, view: Callable[[MirroredStream], T]) -> T | None:
        """`view(entry)` under the lock (the follower folds meanwhile otherwise); None: no such stream."""
        with self.lock:
            entry = self._entries.get(path)
            return None if entry is None else view(entry)

    def read_all(self, view: Callable[[MirroredStream], T], wanted: Callable[[str], bool]) -> list[T]:
        with self.lock:
            return [view(entry) for path, entry in self._entries.items() if wanted(path)]

    async def events(self, path: str, offsets: list[int]) -> list[Any]:
        """Decoded journal events of `path` at `offsets` (in that order; unknown offsets left out)."""
        return [record.event for record in await self.records(path, offsets)]

    async def records(self, path: str, offsets: list[int]) -> list[JournalRecord]:
        """`events`, each with its Kafka record's headers and timestamp."""
        raw: dict[int, RawRecord] = {}
        missing: dict[int, int] = {}  # Kafka offset -> journal offset
        partition = 0
        with self.lock:
            entry = self._entries.get(path)
            if entry is None:
                return []
            partition = entry.partition
            for offset in offsets:
                if not 1 <= offset <= len(entry.positions):
                    continue
                cached = self._cache.get((path, offset))
                if cached is not None:
                    raw[offset] = cached
                else:
                    missing[entry.positions[offset - 1]] = offset
        if missing:
            fetched = await asyncio.to_thread(self._fetch, self._topic, partition, sorted(missing))
            for position, value in fetched.items():
                raw[missing[position]] = value
        records = []
        for offset in offsets:
            found = raw.get(offset)
            if found is not None:
                try:
                    records.append(JournalRecord(decode_event(found.value), found.headers, found.timestamp_ms))
                except EnvelopeError:
                    continue
        return records

    async def command_records(self, topic: str, partition: int, positions: list[int]) -> dict[int, RawRecord]:
        """Records of a command topic at these Kafka offsets (a turn's timeline reads when its
        commands were appended); offsets gone by retention, or a topic this gateway may not read,
        are left out."""
        try:
            return await asyncio.to_thread(self._fetch, topic, partition, sorted(set(positions)))
        except KafkaException as error:
            log.info("console: cannot read %s[%d]: %s", topic, partition, error)
            return {}

    def _fetch(self, topic: str, partition: int, positions: list[int]) -> dict[int, RawRecord]:
        """Records of one partition of `topic` at these Kafka offsets (ascending)."""
        wanted = set(positions)
        found: dict[int, RawRecord] = {}
        with self._reader_lock:
            if self._reader is None:
                self._reader = self._consumer()
            reader = self._reader
            deadline = time.monotonic() + FETCH_TIMEOUT_S
            index = 0
            last_read = -1
            while index < len(positions) and time.monotonic() < deadline:
                target = positions[index]
                if last_read < 0 or not last_read < target <= last_read + READ_ON_RECORDS:
                    reader.assign([TopicPartition(topic, partition, target)])
                messages = consume_ready(reader, 500, 1.0)
                if not messages:
                    index += 1  # gone (retention): leave it out rather than wait for it
                    last_read = -1
                    continue
                for message in messages:
                    if message.error() is not None or message.partition() != partition:
                        continue
                    last_read = message.offset()
                    if last_read in wanted:
                        found[last_read] = _raw(message)
                while index < len(positions) and (positions[index] in found or positions[index] <= last_read):
                    index += 1
            reader.unassign()
        return found

    # --- live pages ------------------------------------------------------------------------------

    def subscribe(self, wants: Callable[[str], bool]) -> Subscriber:
        subscriber = Subscriber(wants)
        self._subscribers.add(subscriber)
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.discard(subscriber)

    def _notify(self, changed: set[str], everyone: bool = False) -> None:
        for subscriber in list(self._subscribers):
            if everyone or any(subscriber.wants(path) for path in changed):
                subscriber.wake.set()

    # --- following the journal -------------------------------------------------------------------

    def _consumer(self) -> Consumer:
        return Consumer(
            {
                **self._settings.kafka_consumer_config(),
                "group.id": f"agentstream-console-{uuid.uuid4().hex}",  # never joins or commits
                "enable.auto.commit": False,
                "log_level": 3,
                "logger": log,
            }
        )

    def _follow(self) -> None:
        consumer = self._consumer()
        try:
            while not self._stop.is_set() and not self._assign(consumer):
                self._stop.wait(2.0)
            while not self._stop.is_set():
                messages = consume_ready(consumer, 1000, 0.2)
                was_caught_up = self.caught_up
                changed = self._apply(messages) if messages else set()
                if not was_caught_up:
                    self._check_caught_up(consumer)
                everyone = self.caught_up and not was_caught_up  # every page drops its "catching up" notice
                if (changed or everyone) and self._loop is not None:
                    self._loop.call_soon_threadsafe(self._notify, changed, everyone)
        except Exception:  # the console must never take the gateway down: say so and stop following
            log.exception("the web console stopped following %s", self._topic)
            self.problem = f"the console stopped following {self._topic}; see the gateway log"
        finally:
            consumer.close()

    def _assign(self, consumer: Consumer) -> bool:
        try:
            metadata = consumer.list_topics(self._topic, timeout=5).topics[self._topic]
            if metadata.error is not None:
                self.problem = f"{self._topic}: {metadata.error.str()}"
                return False
            partitions = []
            ends = {}
            for p in metadata.partitions:
                low, high = watermarks(consumer, TopicPartition(self._topic, p), timeout=5)
                partitions.append(TopicPartition(self._topic, p, low))
                if high > low:
                    ends[p] = high
        except KafkaException as error:
            self.problem = f"cannot read {self._topic}: {error.args[0].str()}"
            return False
        consumer.assign(partitions)
        self._ends = ends
        self.caught_up = not ends
        self.problem = None
        return True

    def _check_caught_up(self, consumer: Consumer) -> None:
        """Caught up once every partition's position reached its end at start. By position, also
        after a poll that returned nothing: a partition's last offset is usually a transaction's
        commit marker, which no consumer receives (docs/architecture.md, "Fencing")."""
        ends = self._ends or {}
        positions = consumer.position([TopicPartition(self._topic, p) for p in ends])
        self.caught_up = all(tp.offset >= ends[tp.partition] for tp in positions)

    def _apply(self, messages: list[Any]) -> set[str]:
        changed: set[str] = set()
        with self.lock:
            for message in messages:
                if message.error() is not None:
                    continue
                partition, position, value = message.partition(), message.offset(), message.value()
                try:
                    event = decode_event(value)
                except EnvelopeError:
                    continue
                path = event.streamPath
                entry = self._entries.get(path)
                if entry is None:
                    entry = self._entries[path] = MirroredStream(path, partition)
                if self._add(entry, event, position, _raw(message)):
                    changed.add(path)
        return changed

    def _add(self, entry: MirroredStream, event: Any, position: int, value: RawRecord) -> bool:
        offset = event.offset
        if offset <= entry.state.cursor:
            return False  # a record the journal worker produced twice (at-least-once): folded already
        positions = entry.positions
        while len(positions) < offset - 1:
            positions.append(-1)  # a gap the journal never leaves; keep offsets aligned anyway
        positions.append(position)
        self._cache.put((entry.path, offset), value)
        try:
            fold(entry.state, event)
        except Exception:  # the reducer skips invalid payloads itself; anything else is logged, never fatal
            log.exception("console: could not fold %s@%d", entry.path, offset)
            entry.state.cursor = offset
            return True
        if isinstance(event, InvalidPayloadEvent):
            return True
        if event.type == LLM_REQUEST_REQUESTED:
            entry.requests[offset] = RequestInfo(event.createdAt, event.payload.model)
            opened = entry.state.open
            entry.turns[offset] = TurnOffsets(opened.triggerOffset if opened and opened.offset == offset else None)
        elif event.type in _TURN_EVENTS:
            _index_turn(entry, event)
        elif event.type == AGENT_PAUSED and entry.state.paused:
            entry.pause_reason = event.payload.reason
        elif event.type == AGENT_RESUMED:
            entry.pause_reason = None
        return True


_TURN_EVENTS = frozenset(
    {LLM_REQUEST_SETTLED, CONTEXT_ADDED, SCRIPT_RUN_REQUESTED, SCRIPT_RUN_STARTED, SCRIPT_RUN_SETTLED}
)


def _index_turn(entry: MirroredStream, event: Any) -> None:
    """Remember which events belong to which request's turn (its settlement, its answer, the run
    of the code the answer holds: docs/behaviour.md §4.3, §6.3)."""
    payload = event.payload
    if event.type == LLM_REQUEST_SETTLED:
        turn = entry.turns.get(payload.requestOffset)
        if turn is not None:
            turn.settled = event.offset
    elif event.type == CONTEXT_ADDED:
        request = payload.llmRequestOffset if payload.role == "assistant" else None
        turn = None if request is None else entry.turns.get(request)
        if turn is not None and turn.answer is None:
            turn.answer = event.offset
            entry.answers[event.offset] = request
    else:
        execution = payload.executionId
        answer = execution[len(AGENT_OUTPUT_PREFIX) :] if execution.startswith(AGENT_OUTPUT_PREFIX) else ""
        turn = entry.turns.get(entry.answers.get(int(answer), 0)) if answer.isdigit() else None
        if turn is None:
            return
        if event.type == SCRIPT_RUN_REQUESTED:
            turn.script_requested = event.offset
        elif event.type == SCRIPT_RUN_STARTED:
            turn.script_started = event.offset
        else:
            turn.script_settled = event.offset


def _raw(message: Any) -> RawRecord:
    _, timestamp = message.timestamp()
    return RawRecord(message.value(), dict(message.headers() or ()), timestamp)
