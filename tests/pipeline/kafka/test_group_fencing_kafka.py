"""The journal worker's fence (docs/architecture.md, "Fencing"; behaviour §5.2), on the real broker:
a transaction commits the command positions as offsets of the worker's consumer group, naming the
generation and member id an aiokafka member (as Faust's is) holds, written in librdkafka's form
(`pipeline.kafka.group_generation`). Once the group has moved on, the coordinator refuses them and
the transaction aborts; a new owner reading the group's offsets waits while a transaction that
commits them is open.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.kafka.faust_internals import aiokafka_membership
from pipeline.kafka.group_generation import GroupMembership, journal_offset_of, position_metadata
from pipeline.kafka.producer import GroupMoved, JournalProducer
from tests.kafka_stack import BOOTSTRAP, consumer_config

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]


@pytest.fixture
def topics() -> Iterator[tuple[str, str]]:
    tag = uuid.uuid4().hex[:12]
    names = (f"test-fence-in-{tag}", f"test-fence-out-{tag}")
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP, "log_level": 3})
    for future in admin.create_topics([NewTopic(name, 2, 1) for name in names]).values():
        future.result()
    yield names
    for future in admin.delete_topics(list(names)).values():
        future.result()


def visible(topic: str, wait_s: float) -> list[bytes]:
    """The values a read_committed reader sees in `topic` within `wait_s`."""
    consumer = Consumer(consumer_config(f"test-{uuid.uuid4().hex}", **{"isolation.level": "read_committed"}))
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
        found: list[bytes] = []
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            found += [m.value() for m in consumer.consume(100, timeout=0.2) if m.error() is None]
        return found
    finally:
        consumer.close()


def group_reader(group: str) -> Consumer:
    """A reader of `group`'s committed offsets that never joins it (as the worker's command reader)."""
    return Consumer(consumer_config(group, **{"isolation.level": "read_committed", "enable.auto.commit": False}))


async def member(group: str, topic: str) -> tuple[AIOKafkaConsumer, asyncio.Task[None]]:
    """An aiokafka member of `group` that keeps polling (so it follows rebalances) once it is in."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=BOOTSTRAP, group_id=group, session_timeout_ms=6000, enable_auto_commit=False
    )
    await consumer.start()

    async def poll() -> None:
        while True:
            await consumer.getmany(timeout_ms=100)

    task = asyncio.get_running_loop().create_task(poll())
    while not aiokafka_membership(consumer, group).joined or not consumer.assignment():
        await asyncio.sleep(0.05)
    return consumer, task


def test_5_2_a_transaction_naming_a_generation_the_group_left_aborts_and_one_naming_the_current_commits(
    topics: tuple[str, str],
) -> None:
    source, out = topics
    group = f"test-fence-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        first, first_poll = await member(group, source)
        joined = aiokafka_membership(first, group)
        producer = JournalProducer({"bootstrap.servers": BOOTSTRAP, "log_level": 3}, f"test-{uuid.uuid4().hex}")
        await producer.start()
        try:
            producer.begin()
            producer.send(out, b"k", b"before", 0)
            await producer.commit(
                lambda: [TopicPartition(source, 0, 5, metadata=position_metadata(0))], joined.encode()
            )

            second, second_poll = await member(group, source)  # the group moves to a new generation
            while aiokafka_membership(first, group).generation == joined.generation:
                await asyncio.sleep(0.05)
            producer.begin()
            producer.send(out, b"k", b"zombie", 0)
            with pytest.raises(GroupMoved, match="moved on"):
                await producer.commit(lambda: [TopicPartition(source, 0, 9)], joined.encode())

            current = aiokafka_membership(first, group)
            assert current.generation > joined.generation
            producer.begin()
            producer.send(out, b"k", b"after", 0)
            await producer.commit(
                lambda: [TopicPartition(source, 0, 7, metadata=position_metadata(3))], current.encode()
            )
            for task, consumer in ((second_poll, second), (first_poll, first)):
                task.cancel()
                await consumer.stop()
        finally:
            producer.close()

    asyncio.run(scenario())
    assert visible(out, 3.0) == [b"before", b"after"]  # nothing of the refused transaction
    reader = group_reader(group)
    try:
        [position] = reader.committed([TopicPartition(source, 0)], timeout=10)
        assert position.offset == 7 and journal_offset_of(position.metadata) == 3
    finally:
        reader.close()


def test_5_2_a_new_owner_reading_the_group_offsets_waits_while_a_transaction_committing_them_is_open(
    topics: tuple[str, str],
) -> None:
    source, out = topics
    group = f"test-stable-{uuid.uuid4().hex[:8]}"
    answered: list[int] = []

    async def scenario() -> None:
        first, first_poll = await member(group, source)
        producer = JournalProducer({"bootstrap.servers": BOOTSTRAP, "log_level": 3}, f"test-{uuid.uuid4().hex}")
        await producer.start()
        raw = producer._producer  # the steps of `commit`, one at a time, to hold the transaction open
        try:
            producer.begin()
            producer.send(out, b"k", b"v", 1)
            raw.flush(10)
            membership: GroupMembership = aiokafka_membership(first, group)
            raw.send_offsets_to_transaction([TopicPartition(source, 1, 42)], membership.encode(), 10)

            def read() -> None:
                reader = group_reader(group)
                try:
                    [position] = reader.committed([TopicPartition(source, 1)], timeout=30)
                    answered.append(position.offset)
                finally:
                    reader.close()

            thread = threading.Thread(target=read)
            thread.start()
            await asyncio.sleep(2.0)
            assert answered == []  # the offsets are not stable while the transaction is open
            await asyncio.to_thread(raw.commit_transaction, 10)
            await asyncio.to_thread(thread.join, 20)
            first_poll.cancel()
            await first.stop()
        finally:
            producer.close()

    asyncio.run(scenario())
    assert answered == [42]  # and then the reader sees what it committed
