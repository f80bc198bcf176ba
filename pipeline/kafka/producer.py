"""The journal worker's producer: librdkafka (confluent-kafka), one per worker process.

librdkafka batches and retries in its own threads, and is idempotent (`acks=all`,
`enable.idempotence`): per partition, records land in the order they were produced, exactly once.
Delivery callbacks run inside `poll()` or `flush()`, in the calling thread (a `KafkaError` is an
argument, not an exception: the callback decides what a failure means).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from topics.admin import quiet_librdkafka

log = logging.getLogger("agentstream.producer")

Headers = Sequence[tuple[str, bytes]]


OnDelivery = Callable[[KafkaError | None, Message], None]


FENCED_CODES = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}


class _FencingIsAHandOver(logging.Filter):
    """librdkafka logs a fenced producer as CRITICAL, and a transaction whose offsets the group
    refused as an error; here both are the expected end of a stale owner's writes (the committer
    logs the fence once), so they are warnings."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.WARNING and _HAND_OVER.search(record.getMessage()):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_HAND_OVER = re.compile(r"fenced|ILLEGAL_GENERATION|UNKNOWN_MEMBER_ID|FENCED_INSTANCE_ID|REBALANCE_IN_PROGRESS")
TRANSACTIONS_LOG = logging.getLogger("agentstream.kafka.transactions")
TRANSACTIONS_LOG.addFilter(_FencingIsAHandOver())


class Fenced(Exception):
    """This worker's transactions are fenced: another process initialised its transactional id
    (or the broker aborted a transaction open past its timeout), or the consumer group moved on
    and refused the offsets of the transaction (`GroupMoved`). Nothing of the transaction is
    visible; the worker owns none of its partitions until it takes them over again."""


class Aborted(Fenced):
    """The transaction failed and was aborted (for instance its records timed out while the worker
    was paused): nothing of it is visible, and the producer can go on with the next one. The
    worker's decided state is ahead of Kafka all the same, so it is handled as a fence."""


class GroupMoved(Aborted):
    """The group coordinator refused the transaction's offsets: the generation or member id it
    named is no longer the group's (a rebalance happened)."""


# What a refused transactional offset commit says when the group moved on (KIP-447).
GROUP_MOVED_CODES = {
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError.FENCED_INSTANCE_ID,
    KafkaError.REBALANCE_IN_PROGRESS,
}


TRANSACTION_TIMEOUT_MS = 10_000


class JournalProducer:
    """The journal worker's one producer, for every partition it owns (docs/architecture.md,
    "Fencing").

    With a `transactional_id`, each commit's records go out in one Kafka transaction that also
    commits the command positions as offsets of the worker's consumer group, naming its generation
    (`commit`): once the group has moved on, the coordinator refuses those offsets and the
    transaction aborts (`GroupMoved`), so a worker that lost its partitions (paused, cut off) writes
    nothing `read_committed` readers see. A later process with the same transactional id fences
    this one at `init_transactions` (`Fenced`). Without a transactional id
    (`AGENTSTREAM_TRANSACTIONS=false`) it is an idempotent producer and `commit` only waits for the
    acknowledgements.

    The blocking librdkafka calls (`init_transactions`, `flush`, `commit_transaction`) run in a
    thread; delivery callbacks may therefore run there too and must only record results.
    """

    def __init__(self, config: dict[str, Any], transactional_id: str | None) -> None:
        self.transactional = transactional_id is not None
        self._open = False  # a transaction is open (begun and not committed)
        self.fatal_error: KafkaError | None = None
        options: dict[str, Any] = {
            "enable.idempotence": True,
            "acks": "all",
            # 5 ms: at 1 ms a turn is ~10 ms faster (bench/turns.py), but at 5 000 appends/s the
            # many small produce requests saturate a 2-core broker (bench/journal.py).
            "linger.ms": 5,
            # No compression: aiokafka readers (Faust's changelog recovery, the caller) would need
            # extra codec libraries, and records here are small JSON.
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "error_cb": self._on_error,
            **config,
        }
        if transactional_id is not None:
            options["transactional.id"] = transactional_id
            # A transaction is open for milliseconds. One left open by a worker that stopped (paused,
            # killed) holds every read_committed reader of its partitions back until the broker
            # aborts it, so not for long (Kafka Streams' exactly-once default is 10 s as well).
            options.setdefault("transaction.timeout.ms", TRANSACTION_TIMEOUT_MS)
        self._producer = Producer({**quiet_librdkafka(options), "logger": TRANSACTIONS_LOG})

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            self.fatal_error = error

    def _fenced(self, error: KafkaError | None) -> bool:
        """Whether `error` ends this producer: fenced by a newer one of its transactional id, or any
        other fatal error (a transaction the broker aborted while the worker was paused leaves the
        producer in a state only a new one gets out of). Nothing of its open transaction can commit
        then: the broker aborts it, at the latest when the next producer of the id starts."""
        if error is not None and error.code() == KafkaError._FATAL and self.fatal_error is None:
            # "Fatal error" names no cause: a poll serves it (to `error_cb`, or raised from the poll).
            try:
                self._producer.poll(0)
            except KafkaException as raised:
                self._on_error(raised.args[0])
        return any(e is not None and (e.fatal() or e.code() in FENCED_CODES) for e in (error, self.fatal_error))

    def _raise(self, error: KafkaException, doing: str) -> None:
        kafka_error = error.args[0] if error.args and isinstance(error.args[0], KafkaError) else None
        if self._fenced(kafka_error):
            raise Fenced(f"{doing}: {(self.fatal_error or kafka_error).str()}") from error
        raise error

    async def start(self, timeout_s: float = 60.0) -> None:
        """Fence every earlier producer of this transactional id (an earlier run of this worker) and
        abort its open transaction (Kafka finishes that abort before this returns); then open the
        first one."""
        if self.transactional:
            await asyncio.to_thread(self._start, timeout_s)

    def _start(self, timeout_s: float) -> None:
        self._producer.init_transactions(timeout_s)
        self._producer.begin_transaction()
        self._open = True

    def begin(self) -> None:
        """Open the checkpoint's transaction, unless the last commit already did (an open
        transaction that has produced nothing holds nothing on the broker)."""
        if self.transactional and not self._open:
            try:
                self._producer.begin_transaction()
            except KafkaException as error:
                self._raise(error, "begin transaction")
            self._open = True

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int,
        headers: Headers | None = None,
        on_delivery: OnDelivery | None = None,
    ) -> None:
        while True:
            try:
                self._producer.produce(
                    topic, value=value, key=key, partition=partition, headers=headers, on_delivery=on_delivery
                )
                return
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as error:
                self._raise(error, "produce")

    def send_rows(self, topic: str, partition: int, rows: Sequence[tuple[bytes, bytes | None]]) -> None:
        """Rows (key, value; None: a tombstone) with no headers and no delivery callback, in one
        `produce_batch` call: about half the CPU of a produce per row. A row the full queue refused
        is produced again after a poll, so rows of one call may land out of their order: only
        rows whose order does not matter to each other go together (`Checkpoint.commit`)."""
        pending: list[dict[str, Any]] = [{"key": key, "value": value} for key, value in rows]
        while pending:
            try:
                self._producer.produce_batch(topic, pending, partition=partition)
            except BufferError:  # documented for a full queue, though refusals come per row
                self._producer.poll(0.05)
                for message in pending:
                    message.pop("_error", None)
                continue  # all again: a row queued twice is the same key and value twice
            except KafkaException as error:
                self._raise(error, "produce")
            refused = [message for message in pending if message.get("_error") is not None]
            for message in refused:
                error = message.pop("_error")
                if error.code() != KafkaError._QUEUE_FULL:
                    self._raise(KafkaException(error), "produce")
            if refused:
                self._producer.poll(0.05)
            pending = refused

    async def barrier(self, timeout_s: float = 60.0) -> None:
        """Without transactions: wait until everything produced so far is acknowledged, so nothing
        produced after it is visible before it. Inside a transaction the commit makes a checkpoint's
        records visible together, so there is nothing to wait for."""
        if not self.transactional:
            await self._flush(timeout_s)

    async def _flush(self, timeout_s: float) -> None:
        left = await asyncio.to_thread(self._producer.flush, timeout_s)
        if left:
            raise TimeoutError(f"{left} records not delivered within {timeout_s:.0f}s")

    async def commit(
        self,
        offsets: Callable[[], Sequence[TopicPartition]] = tuple,
        group: bytes | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        """Make the transaction's records durable and visible, in one hop to a thread: flush,
        commit `offsets()` (called once the records are acknowledged: their delivery callbacks have
        run) as the consumer group's in the transaction (`group`: the member's serialized group
        metadata, `pipeline.kafka.group_generation`), commit, open the next one.

        Raises `GroupMoved` (the group refused the offsets) or `Aborted` (any other failure that
        aborts the transaction): nothing of it is visible and the producer goes on; or `Fenced`
        (another producer of this transactional id, or the broker aborted the transaction and
        bumped the epoch): this producer is done."""
        if not self.transactional:
            await self._flush(timeout_s)
            return
        self._open = False
        try:
            await asyncio.to_thread(self._commit, timeout_s, offsets, group)
        except (KafkaException, SystemError) as raised:
            # A KafkaException pending while librdkafka calls the logger surfaces as a SystemError
            # caused by it (seen when a cut-off worker is fenced): still a fence, not a crash.
            error = raised if isinstance(raised, KafkaException) else raised.__cause__
            if not isinstance(error, KafkaException):
                raise
            kafka_error = error.args[0] if error.args and isinstance(error.args[0], KafkaError) else None
            if self._fenced(kafka_error):
                raise Fenced(f"commit: {(self.fatal_error or kafka_error).str()}") from error  # type: ignore[union-attr]
            # Abortable, or retriable and left so (a send_offsets that timed out while the worker
            # was paused): abort, and the worker takes its partitions over again.
            if kafka_error is not None and (kafka_error.txn_requires_abort() or kafka_error.retriable()):
                try:
                    await asyncio.to_thread(self._producer.abort_transaction, timeout_s)
                except KafkaException as abort_error:
                    if self._fenced(abort_error.args[0] if abort_error.args else None):
                        raise Fenced(f"abort: {(self.fatal_error or kafka_error).str()}") from abort_error
                    raise
                if kafka_error.code() in GROUP_MOVED_CODES:
                    raise GroupMoved(f"the consumer group moved on: {kafka_error.str()}") from error
                raise Aborted(f"transaction aborted: {kafka_error.str()}") from error
            raise

    def _commit(self, timeout_s: float, offsets: Callable[[], Sequence[TopicPartition]], group: bytes | None) -> None:
        """In a thread: the blocking part of `commit`."""
        left = self._producer.flush(timeout_s)
        if left:
            raise TimeoutError(f"{left} records not delivered within {timeout_s:.0f}s")
        positions = list(offsets())
        if positions and group is not None:
            # The fence (KIP-447): refused, with an abortable error, once the group moved on.
            self._producer.send_offsets_to_transaction(positions, group, timeout_s)
        while True:
            try:
                self._producer.commit_transaction(timeout_s)
                break
            except KafkaException as error:
                if error.args[0].retriable() and error.args[0].code() not in FENCED_CODES:
                    continue  # e.g. a coordinator moving: the commit may be retried as is
                raise
        self._producer.begin_transaction()
        self._open = True

    def close(self) -> None:
        """Drop whatever is still queued (a fenced or revoked partition writes nothing more)."""
        try:
            self._producer.purge(in_queue=True, in_flight=False, blocking=False)
            self._producer.poll(0)
        except KafkaException as error:  # a fenced producer is in a fatal state: nothing to drop
            log.debug("closing a producer in error: %s", error)
