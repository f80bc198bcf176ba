"""The client API over confluent-kafka (docs/behaviour.md §5).

    client = Client()                      # settings from AGENTSTREAM_* environment variables
    agent = client.agents.create()         # appends agent/created and the base policy
    receipt = agent.append({"type": CONTEXT_ADDED, "payload": {...}})
    offset = receipt.wait()                # journaled offset (or AppendRejected)
    events = client.streams.get(agent.path).events()

Every append carries a fresh append id, so a retried send is journaled once. Appends are produced
to `agent-appends` keyed by stream path with the Java-compatible murmur2 partitioner; outcomes
come back on `agent-append-results`, which one background consumer per client follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from pydantic import ValidationError

from pipeline import base_policy, tracing
from pipeline.client.prepare import Unfit, new_append_id, prepare_append
from pipeline.kafka.partitioner import partition_for
from pipeline.kafka.read import consume_ready, read_ranges, watermarks
from pipeline.settings import Settings
from processors.idempotency_keys import AGENT_CREATED_KEY
from processors.traceparent import TRACEPARENT
from schemas.events import (
    AGENT_CREATED,
    CONTEXT_ADDED,
    AppendCommand,
    decode_event,
    parse_consumed_input,
)
from schemas.outcomes import AppendOutcome, decode_outcomes
from topics.admin import quiet_librdkafka
from topics.names import topic_names

log = logging.getLogger("agentstream.client")


class AppendError(Exception):
    """An append did not reach the journal."""


class AppendRejected(AppendError):
    """The journal processor rejected the append; the reason says why (also in agent-dlq)."""


class AppendTimeout(AppendError):
    pass


@dataclass(frozen=True, slots=True)
class AppendResult:
    append_id: str
    status: str  # journaled | duplicate | rejected
    offset: int | None
    reason: str | None


MAX_UNCLAIMED_RESULTS = 100_000


class Receipt:
    """The handle of one sent append: wait for its outcome."""

    def __init__(self, client: Client, append_id: str, stream_path: str) -> None:
        self._client = client
        self.append_id = append_id
        self.stream_path = stream_path

    def result(self, timeout: float = 30.0) -> AppendResult:
        return self._client._results.outcomes.wait(self.append_id, timeout)

    async def outcome(self, timeout: float = 30.0) -> AppendResult:
        """`result`, awaited on the running event loop: resolved the moment the outcome is read, with
        no thread blocked and no polling."""
        return await self._client._results.outcomes.wait_async(self.append_id, timeout)

    def wait(self, timeout: float = 30.0) -> int:
        """The offset the append was journaled at (or, for a duplicate, the existing event's)."""
        result = self.result(timeout)
        if result.status == "rejected":
            raise AppendRejected(f"append to {self.stream_path} rejected: {result.reason}")
        assert result.offset is not None
        return result.offset


class Outcomes:
    """The outcomes a client waits for, shared by the thread that reads them and the callers that
    wait (blocking in `wait`, or awaiting on an event loop in `wait_async`). Outcomes of appends
    nobody expects are ignored; the unclaimed ones are bounded, so a client that never waits cannot
    grow without limit (the oldest go first)."""

    def __init__(self, max_unclaimed: int = MAX_UNCLAIMED_RESULTS) -> None:
        self._max_unclaimed = max_unclaimed
        self._expected: OrderedDict[str, None] = OrderedDict()
        self._results: dict[str, AppendResult] = {}
        self._futures: dict[str, asyncio.Future[None]] = {}  # awaiting coroutines, by append id
        self._cond = threading.Condition()

    def expect(self, append_id: str) -> None:
        with self._cond:
            self._expected[append_id] = None
            while len(self._expected) > self._max_unclaimed:
                oldest, _ = self._expected.popitem(last=False)
                self._results.pop(oldest, None)

    def record(self, outcomes: Iterable[AppendOutcome]) -> None:
        """Outcomes read from the topic: keep the expected ones and wake whoever waits on them."""
        with self._cond:
            for outcome in outcomes:
                if outcome.appendId not in self._expected:
                    continue
                self._results[outcome.appendId] = AppendResult(
                    outcome.appendId, outcome.status, outcome.offset, outcome.reason
                )
                future = self._futures.get(outcome.appendId)
                if future is not None:
                    # A loop closed under a waiter just gone must not stop the thread reading outcomes.
                    with contextlib.suppress(RuntimeError):
                        future.get_loop().call_soon_threadsafe(_wake, future)
            self._cond.notify_all()

    def wait(self, append_id: str, timeout: float) -> AppendResult:
        deadline = time.monotonic() + timeout
        with self._cond:
            while append_id not in self._results:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _timed_out(append_id, timeout)
                self._cond.wait(remaining)
            self._expected.pop(append_id, None)
            return self._results.pop(append_id)

    async def wait_async(self, append_id: str, timeout: float) -> AppendResult:
        """`wait` without blocking the event loop or polling: `record` wakes this coroutine."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._cond:
            waiting = append_id not in self._results
            if waiting:
                self._futures[append_id] = future
        try:
            if waiting:
                await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise _timed_out(append_id, timeout) from None
        finally:
            with self._cond:
                self._futures.pop(append_id, None)
        return self.wait(append_id, 0)


def _timed_out(append_id: str, timeout: float) -> AppendTimeout:
    # Only the wait ran out: the append may be journaled yet (a busy, restarting or stopped journal
    # worker looks the same from here), so claim no cause.
    return AppendTimeout(
        f"append {append_id} was sent but no outcome arrived within {timeout:g}s; it may still "
        "be journaled: check with `agentstream agent tail <stream path> --no-follow`"
    )


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():  # a waiter that timed out has cancelled it
        future.set_result(None)


class _Results:
    """Follows agent-append-results from the moment the client starts, into its `Outcomes`."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self._consumer = Consumer(
            quiet_librdkafka(
                {
                    **settings.kafka_consumer_config(),
                    "group.id": f"agentstream-client-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                }
            )
        )
        metadata = self._consumer.list_topics(topic, timeout=10).topics[topic]
        if metadata.error is not None:
            raise AppendError(f"topic {topic} is not available: {metadata.error}; run `agentstream topics ensure`")
        partitions = [TopicPartition(topic, p) for p in metadata.partitions]
        for tp in partitions:
            _, tp.offset = watermarks(self._consumer, tp)
        self._consumer.assign(partitions)
        self.outcomes = Outcomes()
        self._warned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentstream-results", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            messages = consume_ready(self._consumer, 500, 0.1)
            read: list[AppendOutcome] = []
            for message in messages:
                if message.error() is not None:
                    continue
                try:
                    read.extend(decode_outcomes(message.value() or b""))
                except ValidationError:
                    # Anyone who can write the topic can write garbage; it must not stop every
                    # waiting client, so it is skipped (and said once).
                    if not self._warned:
                        self._warned = True
                        log.warning(
                            "%s partition %d offset %d is not an append outcome; skipping such records",
                            message.topic(),
                            message.partition(),
                            message.offset(),
                        )
            if read:
                self.outcomes.record(read)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._consumer.close()


class Stream:
    """Any stream: the raw append door and the journal reader."""

    def __init__(self, client: Client, path: str) -> None:
        AppendCommand.model_validate({"streamPath": path, "type": "x", "payload": {}})  # path check
        self._client = client
        self.path = path

    def append(self, raw: Mapping[str, Any]) -> Receipt:
        """Append any event type: `{type, payload, idempotencyKey?}`. Consumed types are still validated."""
        return self._client._send(self.path, dict(raw))

    def events(self, timeout: float = 10.0) -> list[Any]:
        """Every journaled event of this stream, in offset order (reads its journal partition)."""
        return self._client._read_journal(self.path, timeout)


class Agent:
    def __init__(self, client: Client, path: str) -> None:
        self.path = path
        self.stream = Stream(client, path)

    def append(self, event: Mapping[str, Any]) -> Receipt:
        """Append one of the agent's consumed inputs, validated by `parse_consumed_input`."""
        parse_consumed_input(dict(event))  # raises ValueError naming each bad field
        return self.stream.append(event)

    def __repr__(self) -> str:
        return f"Agent({self.path!r})"


def new_agent_path() -> str:
    """Where `agents.create()` puts a new agent: `/agents/<16 hex digits>`."""
    return f"/agents/{uuid.uuid4().hex[:16]}"


def birth_commands() -> list[dict[str, Any]]:
    """The two events that make an agent, in order: `agent/created`, then the shipped base policy as
    its system prompt. Their idempotency keys are fixed, so creating an existing agent again is a
    duplicate, not a second birth."""
    return [
        {"type": AGENT_CREATED, "payload": {"by": "agentstream-client"}, "idempotencyKey": AGENT_CREATED_KEY},
        {
            "type": CONTEXT_ADDED,
            "payload": {"role": "system", "content": base_policy.TEXT, "key": base_policy.SYSTEM_PROMPT_KEY},
            "idempotencyKey": base_policy.IDEMPOTENCY_KEY,
        },
    ]


class Agents:
    def __init__(self, client: Client) -> None:
        self._client = client

    def create(self) -> Agent:
        """A new agent: `agent/created`, then the shipped base policy as its system prompt."""
        agent = Agent(self._client, new_agent_path())
        for command in birth_commands():
            agent.append(command)
        return agent

    def get(self, path: str) -> Agent:
        return Agent(self._client, path)


class Streams:
    def __init__(self, client: Client) -> None:
        self._client = client

    def get(self, path: str) -> Stream:
        return Stream(self._client, path)


class Client:
    """The door to the journal.

    `internal=True` is for the workers only: their commands (model answers, request bookkeeping,
    compaction summaries) go to `agent-internal-appends`, the one topic the journal accepts those
    event types from. Every other client appends to `agent-appends`.
    """

    def __init__(self, settings: Settings | None = None, *, internal: bool = False) -> None:
        self.settings = settings or Settings.from_env()
        self.topics = topic_names(self.settings.topic_prefix)
        self.internal = internal
        self._command_topic = self.topics.internal_appends if internal else self.topics.appends
        self._closed = False
        self._producer = Producer(
            quiet_librdkafka(
                {
                    **self.settings.kafka_client_config(),
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 2,
                    "partitioner": "murmur2_random",  # Java/aiokafka-compatible: same partition everywhere
                }
            )
        )
        self._results = _Results(self.settings, self.topics.results)
        self._delivery_error: KafkaError | None = None
        self.agents = Agents(self)
        self.streams = Streams(self)

    def _send(self, path: str, raw: dict[str, Any]) -> Receipt:
        append_id = new_append_id()
        ready = prepare_append(
            {**raw, "streamPath": path}, append_id, max_event_bytes=self.settings.max_event_bytes, workers=self.internal
        )
        if isinstance(ready, Unfit):
            if ready.kind == "invalid":
                raise ValueError(ready.detail)
            raise AppendRejected(f"append to {path} refused: {ready.detail}")
        value = ready.value
        self._results.outcomes.expect(append_id)
        # Traces (docs/behaviour.md §8): a worker's appends continue the job they belong to.
        parent = tracing.PARENT.get() if self.internal else tracing.append_header(path, str(raw.get("type")), "client")
        if parent is None:
            self._producer.produce(self._command_topic, key=path.encode(), value=value, on_delivery=self._on_delivery)
        else:
            self._producer.produce(
                self._command_topic,
                key=path.encode(),
                value=value,
                headers=[(TRACEPARENT, parent)],
                on_delivery=self._on_delivery,
            )
        self._producer.poll(0)
        if self._delivery_error is not None:
            raise AppendError(f"could not write to {self._command_topic}: {self._delivery_error}")
        return Receipt(self, append_id, path)

    def _on_delivery(self, error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            self._delivery_error = error

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every append is delivered to Kafka; raises AppendError if any was not."""
        if self._producer.flush(timeout) > 0:
            raise AppendError(f"appends not delivered to Kafka within {timeout:.0f}s")
        if self._delivery_error is not None:
            raise AppendError(f"could not write to {self._command_topic}: {self._delivery_error}")

    def _read_journal(self, path: str, timeout: float) -> list[Any]:
        return list(self.iter_journal(path, follow=False, timeout=timeout))

    def iter_journal(self, path: str, *, follow: bool, timeout: float = 10.0) -> Iterator[Any]:
        """A stream's journaled events in offset order, read from its journal partition.

        Without `follow` it stops at the partition's end as of the call; with it, it waits for more.
        The partition holds other streams too: this is a scan, fine for inspection and tests.
        """
        partition = partition_for(path, self.settings.partitions)
        consumer = Consumer(
            quiet_librdkafka(
                {
                    **self.settings.kafka_consumer_config(),
                    "group.id": "agentstream-reader",
                    "enable.auto.commit": False,
                }
            )
        )
        try:
            topic = self.topics.journal
            low, high = watermarks(consumer, TopicPartition(topic, partition), timeout)
            key = path.encode()
            if not follow:
                for batch in read_ranges(consumer, topic, {partition: (low, high)}, timeout=timeout):
                    yield from (decode_event(message.value()) for message in batch if message.key() == key)
                return
            consumer.assign([TopicPartition(topic, partition, low)])
            while True:
                for message in consume_ready(consumer, 1000, 0.5):
                    if message.error() is None and message.key() == key:
                        yield decode_event(message.value())
        finally:
            consumer.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._producer.flush(10)
        # Closed now, not at garbage collection: a producer outliving `agentstream down` (which stops
        # the broker) would log connection failures at exit.
        self._producer.close()
        self._results.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
