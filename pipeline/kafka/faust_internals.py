"""Every place the project reaches past Faust's and aiokafka's public API, in one module.

Faust has no public way to read one partition of a table's RocksDB, to learn the group generation
of its consumer, or to make its worker consumer read committed records only; these functions do
it, each checked against the pinned versions (faust-streaming 0.15.3, aiokafka 0.14.0, mode-streaming
0.7.1; pyproject.toml). `tests/pipeline/kafka/test_faust_internals.py` fails when an upgrade moves
any of them. `pipeline.kafka.faust_committed` also overrides these private methods of Faust's
classes (listed here so an upgrade checks them too; the same test names them):

- `faust.transport.drivers.aiokafka.AIOKafkaConsumerThread._create_worker_consumer`
- `faust.transport.drivers.aiokafka.Consumer._new_consumer_thread`
- `faust.tables.recovery.Recovery._build_highwaters`
- `faust.tables.TableManager._recovery` (the attribute its `recovery` property caches)
"""

from __future__ import annotations

from typing import Any

from pipeline.kafka.group_generation import GroupMembership, unjoined

# The private names below, by owner; the test checks each still exists in the installed version.
CHECKED = {
    "faust.transport.drivers.aiokafka.AIOKafkaConsumerThread": ("_consumer", "_create_worker_consumer"),
    "faust.transport.drivers.aiokafka.Consumer": ("_new_consumer_thread", "_thread"),
    "faust.tables.recovery.Recovery": ("_build_highwaters",),
    "faust.tables.TableManager": ("_recovery",),
    "faust.stores.rocksdb.Store": ("_db_for_partition", "offset_key"),
    "aiokafka.consumer.group_coordinator.GroupCoordinator": ("generation", "member_id", "_group_instance_id"),
    "aiokafka.consumer.consumer.AIOKafkaConsumer": ("_coordinator", "_isolation_level"),
}


def group_membership(app: Any) -> GroupMembership:
    """The generation and member id of the Faust app's group member (its aiokafka consumer)
    now; a member between generations (not started, rejoining) holds none.

    faust 0.15.3: `app.consumer._thread._consumer` is the aiokafka consumer, built in the consumer's
    own thread; aiokafka 0.14.0: its `_coordinator` keeps `generation`, `member_id` and
    `_group_instance_id` (plain attributes, read whole under the GIL).
    """
    consumer = getattr(app.consumer._thread, "_consumer", None)
    if consumer is None:
        return unjoined(app.conf.id)
    return aiokafka_membership(consumer, app.conf.id)


def aiokafka_membership(consumer: Any, group_id: str) -> GroupMembership:
    """The membership of an aiokafka group consumer now (aiokafka 0.14.0: its `_coordinator`)."""
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is None:
        return unjoined(group_id)
    return GroupMembership(
        group_id=coordinator.group_id,
        generation=coordinator.generation,
        member_id=coordinator.member_id or "",
        instance_id=coordinator._group_instance_id,
    )


def table_partition_db(table: Any, partition: int) -> Any:
    """The rocksdict `Rdict` of one partition of a Faust RocksDB table (faust 0.15.3: the store's
    `_db_for_partition`; Faust has no public per-partition read or prefix scan)."""
    return table.data._db_for_partition(partition)


def table_offset_key(table: Any) -> bytes:
    """The row key under which Faust's RocksDB store keeps its changelog offset (faust 0.15.3)."""
    key: bytes = table.data.offset_key
    return key


def read_committed_only(consumer: Any) -> None:
    """Make an aiokafka consumer that has not started read committed records only (aiokafka
    0.14.0 hands `_isolation_level` to its fetcher in `start()`; there is no public setter)."""
    consumer._isolation_level = "read_committed"
