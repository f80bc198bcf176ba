"""A journal worker restores rows of row format 1 from the changelog and carries on (docs/operations.md,
"Row format"): no rebuild, the partition is marked with this format, older rows are read through the
upcasts until an event rewrites them, and the store still equals a replay of the journal.

The format-1 changelog is made from a worker's own rows: format 2 only put a marker in front of
each value, so without it a value is exactly what format 1 wrote.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from pipeline.journal.replay import replay
from pipeline.journal.replay_store import live_store_paths
from pipeline.journal.replay_verify import verify
from pipeline.journal.worker import ROWS_TABLE
from processors import row_codec, rows
from schemas.events import CONTEXT_ADDED
from tests.kafka_stack import BOOTSTRAP, Stack, wait_until
from tests.support.engine_harness import user
from tests.support.row_store import stored_rows

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

PARTITIONS = 2


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(tmp_path / "first", partitions=PARTITIONS, log_level="INFO")
    try:
        yield stack
    finally:
        stack.close()


def as_format_1(key: bytes, value: bytes) -> bytes:
    if key.startswith(rows.FORMAT + rows.SEP):
        return b"1"
    assert row_codec.row_version(value) == 2, (key, value)
    return value[2:]


def test_a_worker_restores_format_1_rows_from_the_changelog_and_carries_on(stack: Stack, tmp_path: Path) -> None:
    stack.start_worker()
    agents = [stack.client.agents.create() for _ in range(4)]
    for agent in agents:
        for n in range(3):
            agent.append(user(f"{agent.path} {n}")).wait(timeout=120)
    stack.stop_worker()

    # The changelog as a format-1 worker left it: every row's latest record in format 1.
    changelog = f"{stack.settings.app_id}-{ROWS_TABLE}-changelog"
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "log_level": 3})
    before: dict[int, dict[bytes, bytes]] = {}
    for partition, path in live_store_paths(stack.settings).items():
        before[partition] = {key: as_format_1(key, value) for key, value in stored_rows(path).items()}
        assert before[partition].get(rows.format_key(partition)) == b"1"
        for key, value in before[partition].items():
            producer.produce(changelog, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0

    # A worker on a new machine restores them from the changelog alone, and carries on.
    fresh = tmp_path / "second"
    stack.settings = stack.settings.model_copy(update={"data_dir": fresh})
    stack.log_path = fresh / "worker.log"
    stack.start_worker()
    for agent in agents[:2]:
        agent.append(user(f"{agent.path} after the upgrade")).wait(timeout=120)
    wait_until(lambda: stack.worker_log().count("reading commands from") >= PARTITIONS, 60, "both partitions owned")
    stack.stop_worker()
    assert "row format" not in stack.worker_log()  # it did not stop

    live = live_store_paths(stack.settings)
    versions: set[int] = set()
    for partition, path in live.items():
        after = stored_rows(path)
        assert after[rows.format_key(partition)] == b"2"  # marked with the first checkpoint
        versions |= {row_codec.row_version(v) for k, v in after.items() if not k.startswith(rows.FORMAT)}
    assert versions == {1, 2}  # untouched rows stay format 1, rewritten ones are format 2
    for agent in agents:
        events = stack.client.streams.get(agent.path).events()
        assert [e.offset for e in events] == list(range(1, len(events) + 1))
        contents = [e.payload.content for e in events if e.type == CONTEXT_ADDED and e.payload.role == "user"]
        expected = [f"{agent.path} {n}" for n in range(3)]
        assert contents == expected + ([f"{agent.path} after the upgrade"] if agent in agents[:2] else [])
    out = tmp_path / "replayed"
    replay(stack.settings, out, progress=False)
    assert verify(out, live) == []  # decoded: format-1 rows equal their format-2 rebuild
