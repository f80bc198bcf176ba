"""What the LLM caller and the capability host share: a consumer group on a topic keyed by stream
path, work finishing out of order, at-least-once commits (docs/architecture.md, "LLM caller").

- `OffsetCommits`: which consumed records of the assigned partitions are finished; a commit moves
  each partition's committed offset to its first unfinished record
  (`pipeline/kafka/offset_progress.py`). An optional `before_commit` runs first, under the same
  lock: the caller flushes its producer there, so a committed record's appends are in Kafka.
  `report_lag` sets each partition's `agentstream_consumer_lag` for the group.
- `PartitionListener`: the rebalance listener both workers register, calling their own
  `assigned` and `revoked` (which may wait for running work before it is given up).
- `Backpressure`: pause fetching while too much work waits, resume when it drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from pipeline import metrics
from pipeline.kafka.offset_progress import PartitionProgress, commit_points

log = logging.getLogger("agentstream.kafka")


class OffsetCommits:
    def __init__(self, before_commit: Callable[[], Awaitable[None]] | None = None, group: str = "") -> None:
        self._progress: dict[TopicPartition, PartitionProgress] = {}
        self._lock = asyncio.Lock()
        self._before_commit = before_commit
        self.group = group  # the consumer group, for the lag gauge

    def assigned(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            self._progress.setdefault(tp, PartitionProgress())

    def revoked(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            if self._progress.pop(tp, None) is not None:
                with contextlib.suppress(KeyError):  # its lag is the new owner's to report
                    metrics.CONSUMER_LAG.remove(self.group, tp.topic, str(tp.partition))

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

    async def commit(self, consumer: AIOKafkaConsumer) -> None:
        """Commit each partition's first unfinished offset (after `before_commit`). A commit the
        group refuses (a rebalance in progress) is skipped: the next one covers it."""
        async with self._lock:
            offsets = commit_points(self._progress)
            if not offsets:
                return
            if self._before_commit is not None:
                await self._before_commit()
            try:
                await consumer.commit(offsets)
            except KafkaError as error:
                log.info("commit skipped (%s); it is retried", error)
                return
            for tp, point in offsets.items():
                progress = self._progress.get(tp)
                if progress is not None:
                    progress.committed = point

    async def report_lag(self, consumer: AIOKafkaConsumer) -> None:
        """Set each assigned partition's lag: its records from the first unfinished one (none: the
        consumer's position) to its end as last fetched (the last stable offset, reading committed
        records). A partition not fetched from yet has no end known and is left out."""
        for tp, progress in list(self._progress.items()):
            end = consumer.last_stable_offset(tp)
            if end is None:
                end = consumer.highwater(tp)
            if end is None:
                continue
            progress.committable()  # drops the finished records before the first unfinished one
            if progress.pending:
                first = next(iter(progress.pending))
            else:
                try:  # immediate once the partition has a position; never wait here for one
                    first = await asyncio.wait_for(consumer.position(tp), 0.5)
                except (KafkaError, TimeoutError):  # revoked meanwhile, or no position yet
                    continue
            metrics.CONSUMER_LAG.labels(self.group, tp.topic, str(tp.partition)).set(max(0, end - first))


class PartitionListener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(
        self,
        assigned: Callable[[set[TopicPartition]], None],
        revoked: Callable[[set[TopicPartition]], Awaitable[None]],
    ) -> None:
        self._assigned = assigned
        self._revoked = revoked

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self._assigned(set(assigned))


class Backpressure:
    """Pause the consumer's partitions once `high` jobs wait; resume below `low`."""

    def __init__(self, high: int, low: int) -> None:
        self.high = high
        self.low = low
        self.paused = False

    def check(self, consumer: AIOKafkaConsumer, waiting: int) -> None:
        if not self.paused and waiting >= self.high:
            consumer.pause(*consumer.assignment())
            self.paused = True
        elif self.paused and waiting < self.low:
            consumer.resume(*consumer.assignment())
            self.paused = False

    def reset(self) -> None:
        """A new assignment starts unpaused."""
        self.paused = False
