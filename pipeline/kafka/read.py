"""Reading Kafka partitions with librdkafka: committed records only, and to an end by position.

With transactions (docs/architecture.md, "Fencing") the last offsets of a partition are commit
markers, which no consumer receives, and the records of aborted transactions are skipped. A reader
is at the end of a partition when its *position* reaches the end offset, never "when a record at
end - 1 arrived": that record may not exist.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition


def consume_ready(consumer: Consumer, max_messages: int, timeout: float) -> list[Any]:
    """Up to `max_messages` records, returning as soon as any are there.

    librdkafka's consume(n, timeout) waits the whole timeout whenever fewer than n records are
    ready; poll() returns at the first record and consume(timeout=0) then takes what is buffered.
    """
    first = consumer.poll(timeout)
    if first is None:
        return []
    return [first, *consumer.consume(max_messages - 1, timeout=0)]


def watermarks(consumer: Consumer, tp: TopicPartition, timeout: float = 15.0) -> tuple[int, int]:
    """(low, high) offsets of a partition, retrying while a new topic's leadership settles."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return consumer.get_watermark_offsets(tp, timeout=max(deadline - time.monotonic(), 1.0))
        except KafkaException as error:
            settling = error.args[0].retriable() or error.args[0].code() in _SETTLING
            if not settling or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


_SETTLING = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.LEADER_NOT_AVAILABLE}


def read_ranges(
    consumer: Consumer,
    topic: str,
    ranges: Mapping[int, tuple[int, int]],
    *,
    max_messages: int = 1000,
    poll_s: float = 0.5,
    timeout: float | None = None,
    stop_when_idle: bool = False,
) -> Iterator[list[Any]]:
    """Batches of the records of `topic`, partition p read from offset `ranges[p][0]` until the
    consumer's position reaches `ranges[p][1]` (records at or past that end are left out).

    The end is reached by position, never by a record at end - 1: with transactions a partition's
    last offsets are commit markers, which no consumer receives, and aborted records are skipped
    (docs/architecture.md, "Fencing"). Take the ends from `watermarks` of a read_committed
    consumer (`Settings.kafka_consumer_config()`): its high offset is the last stable one.
    Assigns the consumer to these partitions; records with errors are skipped. Stops early,
    quietly, once `timeout` seconds have passed or, with `stop_when_idle`, at the first poll that
    returns nothing (a partition truncated below its end is then not waited for).
    """
    ends = {p: end for p, (start, end) in ranges.items() if start < end}
    if not ends:
        return
    consumer.assign([TopicPartition(topic, p, ranges[p][0]) for p in ends])
    behind = dict(ends)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        messages = consume_ready(consumer, max_messages, poll_s)
        batch = [m for m in messages if m.error() is None and m.offset() < ends.get(m.partition(), -1)]
        if batch:
            yield batch
        # Asked after every poll, records or none: a trailing marker moves only the position.
        for tp in consumer.position([TopicPartition(topic, p) for p in behind]):
            if tp.offset >= behind[tp.partition]:  # an unknown position (before any fetch) is negative
                del behind[tp.partition]
        if not behind:
            return
        if (stop_when_idle and not messages) or (deadline is not None and time.monotonic() > deadline):
            return


async def read_ranges_async(
    consumer: Any,
    ranges: Mapping[Any, tuple[int, int]],
    *,
    max_records: int = 5000,
    stop_when_idle: bool = False,
) -> AsyncIterator[list[Any]]:
    """`read_ranges` for an aiokafka consumer: batches of the records of each topic partition from
    `ranges[tp][0]` until the consumer's position reaches `ranges[tp][1]` (records at or past that
    end are left out). With `stop_when_idle`, it stops at the first fetch that returns nothing."""
    ends = {tp: end for tp, (start, end) in ranges.items() if start < end}
    if not ends:
        return
    consumer.assign(list(ends))
    for tp in ends:
        consumer.seek(tp, ranges[tp][0])
    behind = set(ends)
    while behind:
        batches = await consumer.getmany(*behind, timeout_ms=1000, max_records=max_records)
        batch = [record for tp, records in batches.items() for record in records if record.offset < ends[tp]]
        if batch:
            yield batch
        for tp in list(behind):  # asked after every fetch: a trailing marker moves only the position
            if await consumer.position(tp) >= ends[tp]:
                behind.discard(tp)
                consumer.pause(tp)
        if stop_when_idle and not batches:
            return
