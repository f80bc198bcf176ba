"""Reading journaled events back: one event by (stream, offset), or a stream's events from an offset.

The journal is keyed by stream path, and a partition interleaves many streams; a stream's records
appear in the partition in the order of their stream offsets. So an event is found by bisecting the
partition's Kafka offsets (each probe reads forward to the stream's next record) and then scanning
the remaining window, instead of reading the partition from its start. Journaled events never
change, so found events are cached. Blocking (confluent-kafka): call it from a worker thread.
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition

from pipeline.kafka.partitioner import partition_for
from pipeline.kafka.read import read_ranges, watermarks
from pipeline.settings import Settings
from topics.admin import quiet_librdkafka
from topics.names import topic_names

SCAN_WINDOW = 2_000  # below this many records a linear scan beats another probe
CACHED_EVENTS = 10_000
POLL_S = 1.0


class JournalReader:
    def __init__(self, settings: Settings, *, consumers: int = 8) -> None:
        self.settings = settings
        self.topic = topic_names(settings.topic_prefix).journal
        self._idle: queue.LifoQueue[Consumer] = queue.LifoQueue()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(consumers)
        self._cache: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()
        self._closed = False

    # --- consumers (reused: creating one costs a connection and metadata) -----------------------

    def _consumer(self) -> Consumer:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            return Consumer(
                quiet_librdkafka(
                    {
                        **self.settings.kafka_consumer_config(),
                        "group.id": "agentstream-capabilities-reader",
                        "enable.auto.commit": False,
                        "enable.partition.eof": False,
                        # Every read starts at a new position; librdkafka's default 500 ms fetch wait
                        # would often be paid once per probe.
                        "fetch.wait.max.ms": 10,
                    }
                )
            )

    def _records(self, consumer: Consumer, tp: TopicPartition, start: int, end: int) -> Iterator[Any]:
        """Records of `tp` from Kafka offset `start` up to (excluding) `end`. A poll that returns
        nothing ends it (a truncated partition): stop rather than hang."""
        ranges = {tp.partition: (start, end)}
        for batch in read_ranges(consumer, tp.topic, ranges, max_messages=500, poll_s=POLL_S, stop_when_idle=True):
            yield from batch

    # --- queries --------------------------------------------------------------------------------

    def event(self, path: str, offset: int) -> dict[str, Any] | None:
        """The journaled event `path@offset` (its JSON envelope), or None if the stream has none."""
        cached = self._cache.get((path, offset))
        if cached is not None:
            return cached
        for event in self._scan(path, offset, stop_at=offset):
            if event["offset"] == offset:
                self._remember(path, event)
                return event
        return None

    def events_from(self, path: str, offset: int) -> list[dict[str, Any]]:
        """The stream's events with offset >= `offset`, up to the journal's current end."""
        return list(self._scan(path, offset, stop_at=None))

    def _remember(self, path: str, event: dict[str, Any]) -> None:
        with self._lock:
            self._cache[(path, event["offset"])] = event
            while len(self._cache) > CACHED_EVENTS:
                self._cache.popitem(last=False)

    def _scan(self, path: str, offset: int, stop_at: int | None) -> Iterator[dict[str, Any]]:
        key = path.encode()
        tp = TopicPartition(self.topic, partition_for(path, self.settings.partitions))
        with self._slots:
            consumer = self._consumer()
            try:
                low, high = watermarks(consumer, tp)
                start = self._bisect(consumer, tp, key, offset, low, high)
                for message in self._records(consumer, tp, start, high):
                    if message.key() != key:
                        continue
                    event = orjson.loads(message.value())
                    if event.get("offset", 0) < offset:
                        continue
                    yield event
                    if stop_at is not None and event["offset"] >= stop_at:
                        return
            finally:
                self._idle.put(consumer)

    def _bisect(self, consumer: Consumer, tp: TopicPartition, key: bytes, offset: int, low: int, high: int) -> int:
        """A Kafka offset at or before the stream's first record with stream offset >= `offset`."""
        lo, hi = low, high
        while hi - lo > SCAN_WINDOW:
            mid = (lo + hi) // 2
            found = self._next_record_of(consumer, tp, key, mid, hi)
            if found is None:
                hi = mid  # no record of the stream in [mid, hi)
                continue
            kafka_offset, stream_offset = found
            if stream_offset < offset:
                lo = kafka_offset + 1
            elif stream_offset == offset:
                return kafka_offset
            else:
                hi = mid  # the stream has no record in [mid, kafka_offset): what we want is before mid
        return lo

    def _next_record_of(
        self, consumer: Consumer, tp: TopicPartition, key: bytes, start: int, end: int
    ) -> tuple[int, int] | None:
        for message in self._records(consumer, tp, start, end):
            if message.key() == key:
                return message.offset(), int(orjson.loads(message.value()).get("offset", 0))
        return None

    def close(self) -> None:
        while True:
            try:
                consumer = self._idle.get_nowait()
            except queue.Empty:
                return
            consumer.close()
