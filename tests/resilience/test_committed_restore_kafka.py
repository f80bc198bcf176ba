"""Faust restores the rows from committed changelog records only (behaviour §5.2; docs/architecture.md,
"Fencing").

A stale writer (a worker that lost its partitions but still holds its producer) writes rows to the
changelog inside a transaction that never commits: the worker's next run, whose `init_transactions`
names the same transactional id, aborts it.
A worker that then restores the partition from scratch (a new data directory: the whole changelog)
must finish its restore even though the changelog ends in transaction markers, must not restore
any aborted row, and its rows must equal a replay of the journal.
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
from processors import rows
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


def test_5_2_rows_of_an_aborted_transaction_are_never_restored(stack: Stack, tmp_path: Path) -> None:
    stack.start_worker()
    agents = [stack.client.agents.create() for _ in range(4)]
    for agent in agents:
        for n in range(5):
            agent.append(user(f"{agent.path} {n}")).wait(timeout=120)
    stack.stop_worker()

    # The stale writer: the journal worker's transactional id (the same static member, an earlier
    # run), rows that no event made, in a transaction left open (the worker's next run aborts it).
    changelog = f"{stack.settings.app_id}-{ROWS_TABLE}-changelog"
    forged = {p: rows.meta_key(f"/agents/forged-{p}") for p in range(PARTITIONS)}
    zombie = Producer(
        {"bootstrap.servers": BOOTSTRAP, "transactional.id": stack.settings.journal_transactional_id(), "log_level": 3}
    )
    zombie.init_transactions(30)
    zombie.begin_transaction()
    for partition in range(PARTITIONS):
        zombie.produce(changelog, key=forged[partition], value=b'{"forged": true}', partition=partition)
    zombie.flush(30)

    # A worker on a new machine: it restores every partition from the changelog alone.
    fresh = tmp_path / "second"
    stack.settings = stack.settings.model_copy(update={"data_dir": fresh})
    stack.log_path = fresh / "worker.log"
    stack.start_worker()
    agents[0].append(user("after the restore")).wait(timeout=120)
    wait_until(lambda: stack.worker_log().count("reading commands from") >= PARTITIONS, 60, "both partitions owned")
    stack.stop_worker()

    live = live_store_paths(stack.settings)
    for partition, path in live.items():
        assert forged[partition] not in stored_rows(path), f"partition {partition} restored an aborted row"
    events = stack.client.streams.get(agents[0].path).events()
    assert [e.offset for e in events] == list(range(1, len(events) + 1))
    contents = [e.payload.content for e in events if e.type == CONTEXT_ADDED and e.payload.role == "user"]
    assert contents == [f"{agents[0].path} {n}" for n in range(5)] + ["after the restore"]
    out = tmp_path / "replayed"
    replay(stack.settings, out, progress=False)
    assert verify(out, live) == []
