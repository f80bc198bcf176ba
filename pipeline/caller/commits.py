"""At-least-once commits of `llm-requests` offsets (docs/architecture.md, "LLM caller").

A record is *finished* once its appends are produced (or it needed none). Per partition the
committed offset is the first unfinished record's (`pipeline/kafka/offset_progress.py`); before each
commit the producer is flushed, so a committed record's appends are in Kafka. A restart
re-delivers every unfinished record and repeats its call; the idempotency keys derived from the
request offset make the journal answer the second set of appends as duplicates.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from pipeline.client import AppendError, Client
from pipeline.kafka.offset_progress import PartitionProgress, commit_points

log = logging.getLogger("agentstream.caller")

FLUSH_TIMEOUT_S = 30.0


class CallerFatal(RuntimeError):
    """The worker cannot go on safely (appends could not be delivered): exit without committing."""


class Commits:
    """Which consumed records of the assigned partitions are finished, and committing them."""

    def __init__(self) -> None:
        self._progress: dict[TopicPartition, PartitionProgress] = {}
        self._lock = asyncio.Lock()

    def assigned(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            self._progress.setdefault(tp, PartitionProgress())

    def revoked(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            self._progress.pop(tp, None)

    def consumed(self, tp: TopicPartition, offset: int) -> bool:
        """Track a fetched record; False if its partition was revoked since the fetch."""
        progress = self._progress.get(tp)
        if progress is None:
            return False
        progress.consumed(offset)
        return True

    def finished(self, tp: TopicPartition, offset: int) -> None:
        progress = self._progress.get(tp)
        if progress is not None:
            progress.finished(offset)

    async def commit(self, consumer: AIOKafkaConsumer, client: Client) -> None:
        """Flush the producer, then commit each partition's first unfinished offset."""
        async with self._lock:
            offsets = commit_points(self._progress)
            if not offsets:
                return
            # Every append of the records counted above was produced before this flush started.
            try:
                await asyncio.to_thread(client.flush, FLUSH_TIMEOUT_S)
            except AppendError as failure:
                raise CallerFatal(f"appends could not be delivered to Kafka: {failure}") from None
            try:
                await consumer.commit(offsets)
            except KafkaError as error:
                log.info("commit skipped (%s); it is retried", error)
                return
            for tp, point in offsets.items():
                progress = self._progress.get(tp)
                if progress is not None:
                    progress.committed = point
