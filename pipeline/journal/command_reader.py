"""Reads the owned partitions of both command topics in batches and hands them to their engines.

Faust decides which worker owns partition p (the `agent-journal-owners` topic and the rows table
are co-partitioned); this reader then consumes partition p of `agent-appends` and
`agent-internal-appends` with a librdkafka consumer (manual assignment, no group membership of its
own), from the positions the partition's rows record (`CommandPositions`). Records move in
fetched batches: one decision pass per batch per partition, no per-record framework dispatch.

The reader's `group_id` is the Faust app's consumer group, which it never joins: every
transaction of the worker commits the command positions as that group's offsets (the fence,
`pipeline.journal.checkpoint.Transaction`), so `kafka-consumer-groups` shows the lag, and a new
owner reads them back with `committed` before it takes a partition over.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from pipeline.journal.decisions import CommandRecord
from pipeline.journal.engine import PartitionEngine
from pipeline.kafka.group_generation import journal_offset_of
from topics.admin import quiet_librdkafka
from topics.names import TopicNames

log = logging.getLogger("agentstream.journal")

BATCH_RECORDS = 5000
IDLE_FETCH_WAIT_MS = 100
PACED_FETCH_MIN_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class GroupPositions:
    """A partition's positions as its consumer group's committed offsets say: the last command done
    on each command topic (-1: none) and the journal offset the committing transaction reached."""

    appends: int
    internal: int
    journal: int


def fetch_settings(internal: bool, commit_interval_ms: int) -> dict[str, int]:
    """How the reader of one command topic fetches (`CommandReader`): the internal topic, and any
    topic without commit pacing, at once; client commands of a paced worker in fetches held for a
    third of the commit interval or a MiB."""
    if internal or commit_interval_ms <= 0:
        return {"fetch.wait.max.ms": IDLE_FETCH_WAIT_MS, "fetch.min.bytes": 1}
    return {"fetch.wait.max.ms": max(commit_interval_ms // 3, 1), "fetch.min.bytes": PACED_FETCH_MIN_BYTES}


class CommandReader:
    def __init__(
        self,
        config: dict[str, Any],
        names: TopicNames,
        group_id: str,
        fatal: Callable[[BaseException], None],
        commit_interval_ms: int = 0,
    ) -> None:
        self.names = names
        self.fatal = fatal
        self.engines: dict[int, PartitionEngine] = {}
        base = {
            **config,
            "group.id": group_id,
            # The workers' own commands come out of transactions: never an aborted one.
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "fetch.max.bytes": 64 << 20,
            "max.partition.fetch.bytes": 8 << 20,
            "queued.max.messages.kbytes": 256 << 10,
        }
        # A consumer per command topic, because they want different fetches. Every fetch costs the
        # broker work for each partition it names, and a fetch that finds records returns at once,
        # so a reader of a steady trickle asks again after every record. Client commands go into
        # paced commits (`pipeline.journal.pacing`) anyway: their fetch is held until a MiB has
        # arrived or a third of the commit interval has passed, a tenth of the fetches at 500
        # commands/s for a few ms of latency (docs/benchmarks.md, round eight). The internal topic
        # carries what other processes of the platform wait on: its fetch returns at once. When a
        # fetch finds nothing, `fetch.wait.max.ms` also sets how often an idle reader asks: at 5 ms
        # the broker spent about 5 % of a core answering one idle worker (round seven).
        self.consumers = {
            internal: Consumer(quiet_librdkafka({**base, **fetch_settings(internal, commit_interval_ms)}))
            for internal in (False, True)
        }
        self.topics = {False: names.appends, True: names.internal_appends}
        self._task: asyncio.Task[None] | None = None
        self._handing: set[int] = set()  # partitions whose fetched records are being handed over

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="command-reader")

    def own(self, engine: PartitionEngine) -> None:
        """Start reading partition p of both command topics after what its rows record as done."""
        p = engine.partition
        self.engines[p] = engine
        positions = engine.checkpoints.positions
        for internal, consumer in self.consumers.items():
            consumer.incremental_assign([TopicPartition(self.topics[internal], p, _resume(positions.done[internal]))])
        log.info(
            "partition %d: reading commands from offsets %d (appends) and %d (internal)",
            p,
            positions.done[False] + 1,
            positions.done[True] + 1,
        )

    def release(self, partition: int) -> PartitionEngine | None:
        """Stop reading partition p; records already fetched for it are dropped (the next owner
        reads them again)."""
        engine = self.engines.pop(partition, None)
        if engine is None:
            return None
        engine.active = False
        for internal, consumer in self.consumers.items():
            consumer.incremental_unassign([TopicPartition(self.topics[internal], partition)])
        return engine

    def read_through(self, partition: int, ends: dict[bool, int]) -> bool:
        """Whether partition p's commands before `ends` (per command topic) are all handed to its
        engine. Compares the consumer's positions: the last offsets may be transaction markers."""
        if partition in self._handing or partition not in self.engines:
            return False
        done = self.engines[partition].checkpoints.positions.done  # committed: read past them
        for internal, consumer in self.consumers.items():
            [position] = consumer.position([TopicPartition(self.topics[internal], partition)])
            if max(position.offset, done[internal] + 1) < ends[internal]:
                return False
        return True

    async def _run(self) -> None:
        consumers = list(self.consumers.values())
        internal_topic = self.names.internal_appends
        while True:
            try:
                if not self.engines:
                    await asyncio.sleep(0.05)
                    continue
                messages = [
                    m for consumer in consumers for m in consumer.consume(num_messages=BATCH_RECORDS, timeout=0)
                ]
                if not messages:
                    await asyncio.sleep(0.002)
                    continue
                batches: dict[int, list[CommandRecord]] = defaultdict(list)
                for message in messages:
                    error = message.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            log.warning("command topic: %s", error.str())
                        continue
                    partition = message.partition()
                    if partition not in self.engines:
                        continue  # released since it was fetched
                    headers = message.headers()
                    batches[partition].append(
                        CommandRecord(
                            partition=partition,
                            offset=message.offset(),
                            key=message.key(),
                            value=message.value() or b"",
                            headers=dict(headers) if headers else {},
                            internal=message.topic() == internal_topic,
                        )
                    )
                self._handing.update(batches)
                try:
                    for partition, commands in batches.items():
                        engine = self.engines.get(partition)
                        if engine is not None:
                            await engine.handle_batch(commands)
                finally:
                    self._handing.clear()
                await asyncio.sleep(0)  # let deliveries, drains and timers run between batches
            except asyncio.CancelledError:
                raise
            except Exception as error:  # Kafka or storage I/O: only a restart is safe
                self.fatal(error)
                return

    def committed(self, partitions: list[int], timeout_s: float) -> dict[int, GroupPositions]:
        """The group's committed command positions of `partitions` (blocking: run it in a thread).

        Read committed only, librdkafka asks the coordinator for stable offsets (KIP-447): while a
        transaction that commits offsets of these partitions is open (a previous owner's, paused or
        cut off), the answer waits until it commits or aborts. So what a new owner reads next (the
        journal, the changelog) holds every transaction the previous owner will ever commit."""
        tps = [
            TopicPartition(topic, p) for p in partitions for topic in (self.names.appends, self.names.internal_appends)
        ]
        found = {(tp.topic, tp.partition): tp for tp in self.consumers[True].committed(tps, timeout=timeout_s)}
        positions: dict[int, GroupPositions] = {}
        for p in partitions:
            appends = found[(self.names.appends, p)]
            internal = found[(self.names.internal_appends, p)]
            for tp in (appends, internal):
                if tp.error is not None:
                    raise KafkaException(tp.error)
            positions[p] = GroupPositions(
                appends=max(appends.offset, 0) - 1,
                internal=max(internal.offset, 0) - 1,
                journal=max(journal_offset_of(appends.metadata), journal_offset_of(internal.metadata)),
            )
        return positions

    def lag(self, partition: int) -> int | None:
        engine = self.engines.get(partition)
        if engine is None:
            return None
        try:
            _, high = self.consumers[False].get_watermark_offsets(
                TopicPartition(self.names.appends, partition), cached=True
            )
        except Exception:
            return None
        if high < 0:
            return None
        return max(high - engine.checkpoints.positions.done[False] - 1, 0)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for consumer in self.consumers.values():
            consumer.close()


def _resume(done: int) -> int:
    return OFFSET_BEGINNING if done < 0 else done + 1
