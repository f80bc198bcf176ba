"""`JournalProducer.send_rows`, the journal worker's changelog rows in one `produce_batch` call
(docs/architecture.md, "Commit protocol"), against the real broker: every row lands once, a full
queue delays rows but loses none, and a fenced producer's rows never become visible (behaviour §5.2).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.kafka.producer import Fenced, JournalProducer
from tests.kafka_stack import BOOTSTRAP, consumer_config

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]


@pytest.fixture
def topic() -> Iterator[str]:
    name = f"test-send-rows-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP, "log_level": 3})
    for future in admin.create_topics([NewTopic(name, 2, 1)]).values():
        future.result()
    yield name
    for future in admin.delete_topics([name]).values():
        future.result()


def committed_rows(topic: str, partition: int, expected: int, wait_s: float = 10.0) -> list[tuple[bytes, bytes | None]]:
    """What a read_committed reader of one partition sees: read until `expected` records, or
    `wait_s` (what must stay invisible is waited for that long)."""
    consumer = Consumer(consumer_config(f"test-{uuid.uuid4().hex}", **{"isolation.level": "read_committed"}))
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        found: list[tuple[bytes, bytes | None]] = []
        deadline = time.monotonic() + wait_s
        while len(found) < expected and time.monotonic() < deadline:
            found += [(m.key(), m.value()) for m in consumer.consume(500, timeout=0.2) if m.error() is None]
        return found
    finally:
        consumer.close()


def producer(transactional_id: str, **config: object) -> JournalProducer:
    return JournalProducer({"bootstrap.servers": BOOTSTRAP, "log_level": 3, **config}, transactional_id)


def test_5_2_rows_sent_in_one_call_all_land_once_even_through_a_full_queue(topic: str) -> None:
    # A queue of 7 messages: each call refuses most rows at first and must produce them again.
    rows = [(b"i\x00/agents/a\x00%03d" % n, None if n % 5 == 0 else b"\xff\x02value %d" % n) for n in range(60)]

    async def scenario() -> None:
        writer = producer(f"test-{uuid.uuid4().hex}", **{"queue.buffering.max.messages": 7})
        await writer.start()
        writer.begin()
        writer.send_rows(topic, 1, rows[:30])
        writer.send_rows(topic, 1, rows[30:])
        await writer.commit()

    asyncio.run(scenario())
    landed = committed_rows(topic, 1, len(rows))
    assert sorted(landed) == sorted(rows)  # each once, tombstones included (order within a call is free)
    assert committed_rows(topic, 0, 1, wait_s=2.0) == []  # the partition named, no other


def test_5_2_a_fenced_producers_rows_never_become_visible(topic: str) -> None:
    transactional_id = f"test-{uuid.uuid4().hex}"

    async def scenario() -> None:
        stale = producer(transactional_id)
        await stale.start()
        stale.begin()
        stale.send_rows(topic, 0, [(b"before", b"the next owner")])
        await producer(transactional_id).start()  # the next owner fences the stale one
        with pytest.raises(Fenced):
            stale.send_rows(topic, 0, [(b"after", b"the next owner")])
            await stale.commit()

    asyncio.run(scenario())
    assert committed_rows(topic, 0, 1) == []
