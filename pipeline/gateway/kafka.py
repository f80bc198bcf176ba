"""The gateway's Kafka side: an asyncio face on confluent-kafka.

`CommandProducer.send` resolves once Kafka has acknowledged the command (acks=all, idempotent),
so a 202 never hides a lost record; `ResultsFollower.expect` resolves with the journal's outcome
of an append id. librdkafka runs its callbacks on our poller thread; they hand results to the
event loop with `call_soon_threadsafe`.

Health: a probe thread asks the broker for the command topics' metadata every few seconds;
while it fails (or librdkafka reports every broker down) writes answer 503 at once instead of
queueing records that would only time out.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from pydantic import ValidationError

from pipeline.kafka.read import consume_ready, watermarks
from pipeline.settings import Settings
from processors.traceparent import TRACEPARENT
from schemas.outcomes import AppendOutcome, decode_outcomes
from topics.names import TopicNames

log = logging.getLogger("agentstream.gateway")
KAFKA_LOG = logging.getLogger("agentstream.gateway.kafka")

PROBE_INTERVAL_S = 2.0
PROBE_TIMEOUT_S = 3.0


class KafkaUnavailable(Exception):
    """Kafka cannot take the command now (unreachable, topics missing, delivery failed): 503."""


class Saturated(Exception):
    """The producer's queue is full: 429, retry shortly."""


def producer_config(settings: Settings) -> dict[str, Any]:
    """The client's producer settings (pipeline/client/), with the gateway's bounds."""
    return {
        **settings.kafka_client_config(),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 2,
        "partitioner": "murmur2_random",  # Java/aiokafka-compatible: same partition everywhere
        "message.timeout.ms": int(settings.gateway_delivery_timeout_s * 1000),
        "queue.buffering.max.messages": settings.gateway_max_queued,
        "allow.auto.create.topics": False,  # topics come from `agentstream topics ensure`, with their configs
        "log_level": 3,
        "logger": KAFKA_LOG,  # librdkafka's own messages go through logging, not raw stderr
    }


class CommandProducer:
    def __init__(self, settings: Settings, topics: TopicNames) -> None:
        self._bootstrap = settings.bootstrap_servers
        self._required = (topics.appends, topics.internal_appends, topics.results)
        self._producer = Producer({**producer_config(settings), "error_cb": self._on_error})
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._delivered: list[tuple[asyncio.Future[None], KafkaError | None]] = []
        self._reachable = False
        self.problem = "not connected to Kafka yet"
        self._threads = [
            threading.Thread(target=self._poll, name="gateway-producer", daemon=True),
            threading.Thread(target=self._probe_forever, name="gateway-probe", daemon=True),
        ]

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        for thread in self._threads:
            thread.start()

    @property
    def reachable(self) -> bool:
        return self._reachable

    async def send(self, topic: str, key: bytes, value: bytes) -> None:
        """Produce one record and wait for Kafka's acknowledgement."""
        future = self.submit(topic, key, value)
        await future

    def submit(self, topic: str, key: bytes, value: bytes, traceparent: bytes | None = None) -> asyncio.Future[None]:
        """Produce one record; the future resolves on acknowledgement (KafkaUnavailable on failure).

        Raises at once: KafkaUnavailable while the broker is unreachable, Saturated when the
        producer's queue is full.
        """
        loop = self._loop
        assert loop is not None, "CommandProducer.start() first"
        future: asyncio.Future[None] = loop.create_future()

        def delivered(error: KafkaError | None, _message: Any) -> None:
            self._delivered.append((future, error))  # on the poll thread; handed over after poll()

        self._produce(topic, key, value, traceparent, delivered)
        return future

    def acknowledgements(self) -> Acknowledgements:
        """A tally for many records produced with `submit_batch` or `submit_into`."""
        assert self._loop is not None, "CommandProducer.start() first"
        return Acknowledgements(self._loop)

    def submit_batch(self, acks: Acknowledgements, topic: str, records: list[dict[str, Any]]) -> int:
        """Produce `records` (`{"key": bytes, "value": bytes}`, no headers) to `topic` in one call,
        each counted by `acks`; returns how many librdkafka took. One it refused at once carries
        why under `_error` (a KafkaError; `_QUEUE_FULL` while its queue is full).

        Raises KafkaUnavailable at once while the broker is unreachable."""
        if not self._reachable:
            raise KafkaUnavailable(f"Kafka is unavailable: {self.problem}")
        try:
            taken: int = self._producer.produce_batch(topic, records, on_delivery=acks.report)
        except KafkaException as error:
            raise KafkaUnavailable(f"could not produce to {topic}: {error}") from None
        acks.expected += taken
        return taken

    def submit_into(
        self, acks: Acknowledgements, topic: str, key: bytes, value: bytes, traceparent: bytes | None = None
    ) -> None:
        """Produce one record counted by `acks` (raises at once like `submit`)."""
        self._produce(topic, key, value, traceparent, acks.report)
        acks.expected += 1

    def _produce(
        self, topic: str, key: bytes, value: bytes, traceparent: bytes | None, delivered: Callable[..., None]
    ) -> None:
        if not self._reachable:
            raise KafkaUnavailable(f"Kafka is unavailable: {self.problem}")
        try:
            if traceparent is None:
                self._producer.produce(topic, key=key, value=value, on_delivery=delivered)
            else:  # docs/behaviour.md §8
                headers = [(TRACEPARENT, traceparent)]
                self._producer.produce(topic, key=key, value=value, headers=headers, on_delivery=delivered)
        except BufferError:
            raise Saturated("the gateway's producer queue is full") from None
        except KafkaException as error:
            if error.args and error.args[0].code() == KafkaError._QUEUE_FULL:
                raise Saturated("the gateway's producer queue is full") from None
            raise KafkaUnavailable(f"could not produce to {topic}: {error}") from None

    def queued(self) -> int:
        return len(self._producer)

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=5)
        remaining = self._producer.flush(timeout)
        self._hand_over()
        if remaining > 0:
            log.error("%d commands were not acknowledged by Kafka before shutdown", len(self._producer))
            self._producer.purge()
        self._producer.close()

    # --- threads -------------------------------------------------------------------------------

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)
            self._hand_over()

    def _hand_over(self) -> None:
        """Settle every acknowledgement of one poll() with a single wake-up of the event loop."""
        if self._delivered and self._loop is not None:
            batch, self._delivered = self._delivered, []
            self._loop.call_soon_threadsafe(_settle_all, batch)

    def _probe_forever(self) -> None:
        while not self._stop.is_set():
            self.probe()
            self._stop.wait(PROBE_INTERVAL_S)

    def probe(self) -> bool:
        """Ask the broker for the command topics; True if all exist (updates `reachable`)."""
        try:
            metadata = self._producer.list_topics(timeout=PROBE_TIMEOUT_S)
        except KafkaException as error:
            return self._set_health(f"broker unreachable at {self._bootstrap}: {error.args[0].str()}")
        missing = [t for t in self._required if t not in metadata.topics or metadata.topics[t].error is not None]
        if missing:
            return self._set_health(f"topics {missing} do not exist: run `agentstream topics ensure`")
        return self._set_health(None)

    def _set_health(self, problem: str | None) -> bool:
        if problem is None and not self._reachable:
            log.info("Kafka is reachable")
        elif problem is not None and (self._reachable or problem != self.problem):
            log.warning("Kafka is unavailable: %s", problem)
        self._reachable = problem is None
        self.problem = problem or ""
        return self._reachable

    def _on_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self._set_health(f"every broker is down ({error.str()})")


def not_acknowledged(error: KafkaError) -> KafkaUnavailable:
    return KafkaUnavailable(f"Kafka did not acknowledge the command: {error.str()}")


class Acknowledgements:
    """Kafka's answers for many records produced together, counted on the poll thread by one
    callback for all of them (`report`; a callback per record, and an event loop step per answer,
    cost more than the rest of a batch line): `done` resolves on the event loop once every record
    produced into it (`expected`) is answered and no more will be (`seal`). `failed` holds each
    record Kafka did not acknowledge, by its value: every command's value holds its own append id,
    so the value names its line (`failures`)."""

    __slots__ = ("_loop", "_sealed", "_settled", "done", "expected", "failed")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.done: asyncio.Future[None] = loop.create_future()
        self.expected = 0
        self.failed: list[tuple[bytes, KafkaError]] = []
        self._settled = 0
        self._sealed = False

    def report(self, error: KafkaError | None, message: Any) -> None:
        """librdkafka's delivery report of one record (on the poll thread, holding the GIL: only
        this thread counts `_settled`, and whichever of it and `seal` sees the last answer after
        the seal resolves `done`)."""
        if error is not None:
            self.failed.append((message.value(), error))
        self._settled += 1
        if self._sealed and self._settled == self.expected:
            self._loop.call_soon_threadsafe(self._resolve)

    def seal(self) -> None:
        """No more records: `done` resolves when the last one produced is answered."""
        self._sealed = True
        if self._settled >= self.expected:
            self._resolve()

    def failures(self) -> dict[bytes, KafkaUnavailable]:
        """Once `done`: each record Kafka did not acknowledge, by its value."""
        return {value: not_acknowledged(error) for value, error in self.failed}

    def _resolve(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


def _settle_all(batch: list[tuple[asyncio.Future[None], KafkaError | None]]) -> None:
    for future, error in batch:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(not_acknowledged(error))


class ResultsFollower:
    """Follows agent-append-results from start-up; hands each awaited outcome to its waiter.

    The same job as the client's `_Results`, but waiters are asyncio futures rather than a
    condition variable, so thousands of waiting requests cost no threads.
    """

    def __init__(self, settings: Settings, topic: str) -> None:
        self._settings = settings
        self._topic = topic
        self._waiters: dict[str, asyncio.Future[AppendOutcome]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self.assigned = False
        self._thread = threading.Thread(target=self._run, name="gateway-results", daemon=True)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread.start()

    def expect(self, append_id: str) -> asyncio.Future[AppendOutcome]:
        """Register before producing: the outcome cannot arrive before its waiter."""
        assert self._loop is not None
        future: asyncio.Future[AppendOutcome] = self._loop.create_future()
        self._waiters[append_id] = future
        return future

    def forget(self, append_id: str) -> None:
        self._waiters.pop(append_id, None)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        consumer = Consumer(
            {
                **self._settings.kafka_consumer_config(),
                "group.id": f"agentstream-gateway-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "log_level": 3,
                "logger": KAFKA_LOG,
            }
        )
        try:
            while not self._stop.is_set() and not self._assign(consumer):
                self._stop.wait(PROBE_INTERVAL_S)
            while not self._stop.is_set():
                found: list[tuple[asyncio.Future[AppendOutcome], AppendOutcome]] = []
                for message in consume_ready(consumer, 500, 0.1):
                    if message.error() is not None:
                        continue
                    try:
                        outcomes = decode_outcomes(message.value() or b"")
                    except ValidationError:
                        continue  # not outcomes: nobody can be waiting for them
                    for outcome in outcomes:
                        future = self._waiters.pop(outcome.appendId, None)
                        if future is not None:
                            found.append((future, outcome))
                if found and self._loop is not None:
                    self._loop.call_soon_threadsafe(_resolve_all, found)
        finally:
            consumer.close()

    def _assign(self, consumer: Consumer) -> bool:
        """Start at the topic's end: outcomes of appends sent from now on (False: retry later)."""
        try:
            metadata = consumer.list_topics(self._topic, timeout=PROBE_TIMEOUT_S).topics[self._topic]
            if metadata.error is not None:
                return False
            partitions = [TopicPartition(self._topic, p) for p in metadata.partitions]
            for tp in partitions:
                _, tp.offset = watermarks(consumer, tp, timeout=PROBE_TIMEOUT_S)
        except KafkaException:
            return False
        consumer.assign(partitions)
        self.assigned = True
        return True


def _resolve_all(found: list[tuple[asyncio.Future[AppendOutcome], AppendOutcome]]) -> None:
    for future, outcome in found:
        if not future.done():
            future.set_result(outcome)
