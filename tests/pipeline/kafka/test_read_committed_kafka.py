"""Readers of transactional topics (behaviour §5.2: readers see committed records only), against the real broker.

The journal worker writes in Kafka transactions (docs/architecture.md, "Fencing"). A partition then
holds commit and abort markers, which no consumer receives, and records of aborted transactions,
which read_committed consumers skip. Here a transactional producer writes a stream's journal as

    offsets 0-2: events 1-3 (committed)   3: commit marker
    offsets 4-5: events 4-5 "aborted"     6: abort marker
    offsets 7-8: events 4-5 (committed)   9: commit marker

(and one `settled` notice committed, one aborted, on llm-requests), and every reader must return
events 1-5 as committed, without waiting for a record at the partition's last offset.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, Producer, TopicPartition

from pipeline.caller.worker import LlmCaller
from pipeline.gateway.console.mirror import JournalMirror
from pipeline.journal.replay import PartitionTask, replay, replay_partition
from pipeline.journal.replay_store import open_output
from pipeline.kafka.journal_reader import JournalReader
from pipeline.kafka.partitioner import partition_for
from pipeline.kafka.read import read_ranges, read_ranges_async, watermarks
from tests.kafka_stack import BOOTSTRAP, RecordCounter, Stack, consumer_config, wait_until
from tests.support.journal_builder import Journal

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]

PARTITIONS = 2
PATH = "/agents/read-committed"
COMMITTED = ["c1", "c2", "c3", "c4", "c5"]
PROMPT_S = 5.0  # well below the 10 s a reader waiting for a record at the last offset would give up after


def journal_values(contents: list[str]) -> list[bytes]:
    journal = Journal(PATH)
    for content in contents:
        journal.user(content)
    return [orjson.dumps(event) for event in journal.events]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(tmp_path_factory.mktemp("read-committed") / "data", partitions=PARTITIONS)
    topics = stack.client.topics
    partition = partition_for(PATH, PARTITIONS)
    producer = Producer(
        {"bootstrap.servers": BOOTSTRAP, "transactional.id": f"test-{uuid.uuid4().hex}", "log_level": 3}
    )
    committed = journal_values(COMMITTED)
    aborted = journal_values(["x1", "x2", "x3", "aborted-4", "aborted-5"])[3:]
    settled = [{"kind": "settled", "streamPath": PATH, "requestOffset": n} for n in (3, 7)]

    def transaction(records: list[tuple[str, bytes]], commit: bool) -> None:
        producer.begin_transaction()
        for topic, value in records:
            producer.produce(topic, key=PATH.encode(), value=value, partition=partition)
        producer.flush(30)  # on the broker before the abort: an aborted transaction's records stay in the log
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)

    try:
        producer.init_transactions(60)
        transaction([(topics.journal, value) for value in committed[:3]], commit=True)
        aborted_notice = (topics.llm_requests, orjson.dumps(settled[1]))
        transaction([*((topics.journal, value) for value in aborted), aborted_notice], commit=False)
        transaction(
            [*((topics.journal, value) for value in committed[3:]), (topics.llm_requests, orjson.dumps(settled[0]))],
            commit=True,
        )
        yield stack
    finally:
        stack.close()


def contents(events: list[Any]) -> list[str]:
    return [event.payload.content for event in events]


def test_the_partition_ends_in_a_marker_after_aborted_records(stack: Stack) -> None:
    """The layout the other tests rely on: what a reader waiting for offset end - 1 never receives."""
    consumer = Consumer(consumer_config("test-read-committed", **{"isolation.level": "read_uncommitted"}))
    try:
        tp = TopicPartition(stack.client.topics.journal, partition_for(PATH, PARTITIONS))
        assert watermarks(consumer, tp) == (0, 10)
        ranges = {tp.partition: (0, 10)}
        offsets = [message.offset() for batch in read_ranges(consumer, tp.topic, ranges) for message in batch]
        assert offsets == [0, 1, 2, 4, 5, 7, 8]  # read_uncommitted: the aborted records too, never a marker
    finally:
        consumer.close()


def test_5_2_read_ranges_returns_committed_records_and_stops_at_the_end_by_position(stack: Stack) -> None:
    topic = stack.client.topics.journal
    consumer = Consumer(consumer_config("test-read-committed"))
    try:
        ranges = {p: watermarks(consumer, TopicPartition(topic, p)) for p in range(PARTITIONS)}
        started = time.monotonic()
        records = [message for batch in read_ranges(consumer, topic, ranges) for message in batch]
        assert time.monotonic() - started < PROMPT_S
        assert [message.offset() for message in records] == [0, 1, 2, 7, 8]
        assert [orjson.loads(message.value())["payload"]["content"] for message in records] == COMMITTED

        # An end inside the partition: records at or past it are left out.
        partition = partition_for(PATH, PARTITIONS)
        inside = [m.offset() for b in read_ranges(consumer, topic, {partition: (1, 8)}) for m in b]
        assert inside == [1, 2, 7]
        # A range that starts on the last marker holds no record, and still ends.
        assert list(read_ranges(consumer, topic, {partition: (9, 10)})) == []
    finally:
        consumer.close()


def test_5_2_client_reads_a_streams_committed_events_promptly(stack: Stack) -> None:
    client = stack.client
    started = time.monotonic()
    assert contents(client.streams.get(PATH).events()) == COMMITTED
    assert contents(list(client.iter_journal(PATH, follow=False))) == COMMITTED
    assert time.monotonic() - started < PROMPT_S


def test_5_2_test_and_bench_readers_read_and_count_committed_records(stack: Stack) -> None:
    started = time.monotonic()
    records = stack.read_topic(stack.client.topics.journal)
    assert time.monotonic() - started < PROMPT_S
    assert [orjson.loads(m.value())["payload"]["content"] for m in records] == COMMITTED

    counter = RecordCounter(stack.client.topics.journal, PARTITIONS)
    try:
        wait_until(lambda: counter.total() >= len(COMMITTED), PROMPT_S, "the counter to read the journal")
        time.sleep(0.2)
        assert counter.total() == len(COMMITTED)  # not 10, the sum of the high watermarks
    finally:
        counter.close()


def test_5_2_capability_journal_reader_finds_committed_events_without_waiting(stack: Stack) -> None:
    reader = JournalReader(stack.settings, consumers=1)
    try:
        started = time.monotonic()
        fifth = reader.event(PATH, 5)
        assert reader.event(PATH, 6) is None
        since = reader.events_from(PATH, 2)
        # Each read used to end only after a 1 s poll that returned nothing.
        assert time.monotonic() - started < 1.5
        assert fifth is not None and fifth["payload"]["content"] == "c5"
        assert [event["payload"]["content"] for event in since] == COMMITTED[1:]
    finally:
        reader.close()


def test_5_2_replay_folds_committed_events_and_counts_records_read(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = stack.client.topics.journal
    partition = partition_for(PATH, PARTITIONS)
    consumer = Consumer(consumer_config("test-read-committed"))
    db = open_output(tmp_path / "rows.db")
    try:
        task = PartitionTask(partition, *watermarks(consumer, TopicPartition(topic, partition)))
        consumed: list[int] = []
        started = time.monotonic()
        folded, streams = replay_partition(consumer, topic, task, db, None, consumed.append)
        assert time.monotonic() - started < PROMPT_S
        assert (folded, streams, sum(consumed)) == (5, [PATH], 5)
    finally:
        db.close()
        consumer.close()

    stats = replay(stack.settings, tmp_path / "replay", progress=True)
    assert stats.events == 5
    assert "5/5" in capsys.readouterr().err  # the progress total is what was read, not the offsets


def test_5_2_console_mirror_catches_up_though_the_last_offset_is_a_marker(stack: Stack) -> None:
    mirror = JournalMirror(stack.settings, stack.client.topics.journal)
    loop = asyncio.new_event_loop()  # never run: the mirror only queues its notifications on it
    try:
        mirror.ensure_started(loop)
        wait_until(lambda: mirror.caught_up, PROMPT_S, "the mirror to catch up")
        assert mirror.read(PATH, lambda entry: entry.state.cursor) == 5
        events = asyncio.run(mirror.events(PATH, [1, 2, 3, 4, 5]))
        assert contents(events) == COMMITTED
    finally:
        mirror.close()
        loop.close()


def test_5_2_caller_reads_settled_notices_ahead_to_the_end_by_position(stack: Stack) -> None:
    caller = LlmCaller(stack.settings)
    caller._consumer = object()  # type: ignore[assignment]  # only its presence is checked
    tp = AioTopicPartition(stack.client.topics.llm_requests, partition_for(PATH, PARTITIONS))

    async def read_ahead() -> float:
        started = time.monotonic()
        await caller._read_settled_ahead({tp})
        return time.monotonic() - started

    elapsed = asyncio.run(read_ahead())
    assert caller.calls.handled.get(PATH) == 3  # the aborted notice (request 7) is not seen
    assert elapsed < 1.0  # it used to wait for one more empty 1 s fetch after the last record


def test_5_2_aiokafka_consumers_read_committed_and_reach_the_end_by_position(stack: Stack) -> None:
    """`read_ranges_async`: what the journal worker's recovery, the router's catch-up and the caller's
    read-ahead rely on."""
    tp = AioTopicPartition(stack.client.topics.journal, partition_for(PATH, PARTITIONS))

    async def read(start: int, end: int | None) -> tuple[list[int], int, int, float]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=BOOTSTRAP, enable_auto_commit=False, **stack.settings.aiokafka_consumer_config()
        )
        await consumer.start()
        try:
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp] if end is None else end
            started = time.monotonic()
            offsets = [r.offset async for batch in read_ranges_async(consumer, {tp: (start, end)}) for r in batch]
            return offsets, await consumer.position(tp), end, time.monotonic() - started
        finally:
            await consumer.stop()

    offsets, position, end, elapsed = asyncio.run(read(0, None))
    assert offsets == [0, 1, 2, 7, 8]
    assert position == end == 10 and elapsed < PROMPT_S
    inside, _, _, _ = asyncio.run(read(1, 8))  # an end inside the partition: records past it left out
    assert inside == [1, 2, 7]
    assert asyncio.run(read(9, 10))[0] == []  # only the last marker: no record, and it still ends
