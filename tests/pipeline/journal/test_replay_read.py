"""Replay reads a partition with its own loop (`_read_partition`, the one-partition `read_ranges`),
passing a clean batch on as it came: records with errors, of another partition (one the consumer
read before) or at or past the end replay began with must still be left out. No broker: a
consumer that hands out given batches and moves its position over them."""

from __future__ import annotations

from collections.abc import Iterator

from confluent_kafka import KafkaError, Message, TopicPartition

from pipeline.journal.replay import PartitionTask, _read_partition

TOPIC = "journal"


class FakeConsumer:
    """poll/consume hand out `batches` one after another; the position follows the last offset of
    this partition handed out (`end` once every batch is out: a trailing transaction marker)."""

    def __init__(self, batches: list[list[Message]], partition: int, end: int) -> None:
        self.batches, self.partition, self.end = batches, partition, end
        self.current: list[Message] = []
        self.position_at = -1001

    def poll(self, timeout: float) -> Message | None:
        self.current = self.batches.pop(0) if self.batches else []
        mine = [m.offset() for m in self.current if m.partition() == self.partition and m.error() is None]
        if mine:
            self.position_at = mine[-1] + 1
        if not self.batches:
            self.position_at = self.end
        return self.current[0] if self.current else None

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        return self.current[1:]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        assert [tp.partition for tp in partitions] == [self.partition]
        return [TopicPartition(TOPIC, self.partition, self.position_at)]


def record(offset: int, partition: int = 2) -> Message:
    return Message(topic=TOPIC, partition=partition, offset=offset, value=b"%d" % offset)


def offsets(batches: Iterator[list[Message]]) -> list[list[tuple[int, int]]]:
    return [[(m.partition(), m.offset()) for m in batch] for batch in batches]


def test_clean_batches_pass_as_they_came() -> None:
    batches = [[record(0), record(1)], [record(2)]]
    clean = [list(batch) for batch in batches]
    read = list(_read_partition(FakeConsumer(batches, 2, 4), TOPIC, PartitionTask(2, 0, 4)))
    assert [[m.offset() for m in batch] for batch in read] == [[0, 1], [2]]
    assert all(a is b for got, given in zip(read, clean, strict=True) for a, b in zip(got, given, strict=True))


def test_errors_other_partitions_and_records_past_the_end_are_left_out() -> None:
    error = Message(topic=TOPIC, partition=2, offset=-1001, error=KafkaError(KafkaError._TRANSPORT))
    batches = [
        [record(7, partition=1), record(0), record(1)],  # the consumer's previous partition, then ours
        [record(2), error, record(3)],
        [record(4), record(5)],  # 5 was journaled after replay began
    ]
    read = _read_partition(FakeConsumer(batches, 2, 6), TOPIC, PartitionTask(2, 0, 5))
    assert offsets(read) == [[(2, 0), (2, 1)], [(2, 2), (2, 3)], [(2, 4)]]


def test_a_batch_of_another_partition_alone_is_left_out() -> None:
    batches = [[record(0, partition=1), record(1, partition=1)], [record(0), record(1)]]
    read = _read_partition(FakeConsumer(batches, 2, 2), TOPIC, PartitionTask(2, 0, 2))
    assert offsets(read) == [[(2, 0), (2, 1)]]


def test_an_empty_range_reads_nothing() -> None:
    assert list(_read_partition(FakeConsumer([[record(0)]], 2, 1), TOPIC, PartitionTask(2, 3, 3))) == []
