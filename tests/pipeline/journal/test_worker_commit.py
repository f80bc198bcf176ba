"""One transaction per worker (docs/architecture.md, "Commit protocol" and "Fencing"; behaviour
§5.2): the engines of all the partitions a worker owns decide into their own checkpoints, and the
worker's `WorkerCommitter` commits all of them in one transaction, with the command positions of
every partition in it committed as the consumer group's offsets, naming the worker's membership.
Broker-free: the in-memory transactional producer of `tests/support/journal_fakes.py`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pipeline.journal.decisions import CommandRecord
from pipeline.journal.engine import PartitionEngine
from pipeline.kafka.group_generation import GroupMembership, journal_offset_of
from pipeline.kafka.producer import Aborted, Fenced, GroupMoved
from processors import rows
from tests.support.engine_harness import NAMES, committer, user
from tests.support.journal_fakes import DictStore, FakeTransactions

MEMBER = GroupMembership("agentstream-journal", 7, "member-1", "pod-0")


class Worker:
    """Engines of `partitions` on one committer, each over its own store."""

    def __init__(self, partitions: tuple[int, ...] = (0, 1, 2), commit_interval_ms: int = 0) -> None:
        self.kafka = FakeTransactions()
        self.fatal: list[BaseException] = []
        self.dropped: list[int] = []
        self.committer = committer(self.kafka, self.fatal.append, commit_interval_ms)
        self.committer.membership = lambda: MEMBER
        self.stores = {p: DictStore() for p in partitions}
        self.engines = {
            p: PartitionEngine(
                p,
                self.stores[p],
                NAMES,
                self.committer,
                max_cached_streams=100,
                on_fenced=lambda engine, _error: self.dropped.append(engine.partition),
            )
            for p in partitions
        }
        self.next = {(p, internal): 0 for p in partitions for internal in (False, True)}

    def command(self, partition: int, text: str, internal: bool = False, **extra: Any) -> CommandRecord:
        import orjson

        offset = self.next[(partition, internal)]
        self.next[(partition, internal)] += 1
        path = f"/agents/p{partition}"
        value = orjson.dumps({"streamPath": path, **user(text, **extra)})
        return CommandRecord(partition, offset, path.encode(), value, {}, internal=internal)

    async def handle(self, partition: int, *commands: CommandRecord) -> None:
        await self.engines[partition].handle_batch(commands)

    async def settle(self) -> None:
        for engine in self.engines.values():
            await engine.checkpoints.flush()


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_5_2_the_checkpoints_of_every_partition_go_in_one_transaction() -> None:
    async def scenario() -> None:
        w = Worker()
        await w.settle()  # each new store's format row
        before = w.kafka.transactions
        for p in (0, 1, 2):
            await w.handle(p, w.command(p, f"hello {p}"))
        await w.settle()
        assert w.kafka.transactions == before + 1
        journal = w.kafka.on(NAMES.journal)
        assert sorted(record.key for record in journal) == [b"/agents/p0", b"/agents/p1", b"/agents/p2"]
        for p, store in w.stores.items():
            assert rows.meta_key(f"/agents/p{p}") in store.stored  # each partition's rows in its own store
            assert store.writes == 2

    run(scenario())


def test_5_2_each_partitions_positions_are_committed_as_the_groups_offsets_naming_the_membership() -> None:
    async def scenario() -> None:
        w = Worker(partitions=(0, 1))
        await w.handle(0, w.command(0, "a"), w.command(0, "b"), w.command(0, "c", internal=True))
        await w.handle(1, w.command(1, "d"))
        await w.settle()
        assert w.kafka.group == MEMBER.encode()
        offsets = w.kafka.group_offsets
        assert offsets[(NAMES.appends, 0)][0] == 2 and offsets[(NAMES.internal_appends, 0)][0] == 1
        assert offsets[(NAMES.appends, 1)][0] == 1
        assert offsets[(NAMES.internal_appends, 1)][0] == 0  # nothing read yet: from the start, never -1
        journal = {record.key: record.offset for record in w.kafka.on(NAMES.journal)}
        assert journal_offset_of(offsets[(NAMES.appends, 1)][1]) == journal[b"/agents/p1"]
        assert journal_offset_of(offsets[(NAMES.appends, 0)][1]) == max(
            r.offset for r in w.kafka.on(NAMES.journal) if r.key == b"/agents/p0"
        )

        await w.handle(1, w.command(1, "e"))
        await w.settle()
        # A partition keeps the positions of a topic its checkpoint did not read.
        assert w.kafka.group_offsets[(NAMES.appends, 1)][0] == 2
        assert w.kafka.group_offsets[(NAMES.internal_appends, 1)][0] == 0

    run(scenario())


@pytest.mark.parametrize(
    "error",
    [
        Fenced("fenced by a newer instance"),
        GroupMoved("the consumer group moved on"),
        Aborted("transaction aborted: 1 message(s) timed out"),
    ],
)
@pytest.mark.parametrize("step", ["begin", "send", "commit"])
def test_5_2_a_fenced_transaction_drops_every_partition_and_nothing_of_it_is_visible(
    error: Exception, step: str
) -> None:
    async def scenario() -> None:
        w = Worker()
        for p in (0, 1, 2):
            await w.handle(p, w.command(p, "before"))
        await w.settle()
        committed = list(w.kafka.committed)
        stored = {p: dict(store.stored) for p, store in w.stores.items()}
        w.kafka.fail_next[step] = error
        await w.handle(0, w.command(0, "lost"))
        await w.handle(2, w.command(2, "lost too"))
        await w.settle()
        assert sorted(w.dropped) == [0, 1, 2] and not w.fatal  # a partition without work is not the worker's either
        assert all(not engine.active for engine in w.engines.values())
        assert w.kafka.committed == committed
        assert {p: store.stored for p, store in w.stores.items()} == stored
        assert w.committer.partitions == {} and w.committer.fenced is error

    run(scenario())


def test_the_outcomes_of_every_partition_go_to_one_results_partition() -> None:
    """Readers of the results topic read all its partitions; each partition a transaction writes
    costs a produce request and a commit marker."""

    async def scenario() -> None:
        w = Worker()
        await w.settle()
        for p in (2, 0, 1):
            await w.handle(p, w.command(p, f"hi {p}", appendId=f"a{p}"))
        await w.settle()
        results = w.kafka.on(NAMES.results)
        assert {record.partition for record in results} == {0}  # the first partition of the transaction
        assert sorted(o["appendId"] for o in w.kafka.outcomes(NAMES.results)) == ["a0", "a1", "a2"]
        journal = w.kafka.on(NAMES.journal)
        assert {record.key: record.partition for record in journal} == {
            b"/agents/p0": 0,
            b"/agents/p1": 1,
            b"/agents/p2": 2,
        }

    run(scenario())


def test_any_other_failure_is_fatal_for_the_worker() -> None:
    async def scenario() -> None:
        w = Worker(partitions=(0, 1))
        w.kafka.fail_next["commit"] = RuntimeError("broker unreachable")
        await w.handle(0, w.command(0, "x"))
        await w.handle(1, w.command(1, "y"))
        for _ in range(10):
            await asyncio.sleep(0)
        assert w.fatal and "broker unreachable" in str(w.fatal[0])
        assert all(store.writes == 0 for store in w.stores.values()) and not w.dropped

    run(scenario())


def test_a_partition_that_left_is_in_no_later_transaction() -> None:
    async def scenario() -> None:
        w = Worker(partitions=(0, 1))
        await w.settle()
        w.committer.leave(w.engines[1].checkpoints)
        w.kafka.group_offsets.clear()
        await w.handle(0, w.command(0, "x"))
        await w.settle()
        assert (NAMES.appends, 1) not in w.kafka.group_offsets
        assert [record.key for record in w.kafka.on(NAMES.journal)] == [b"/agents/p0"]

    run(scenario())


def test_pacing_is_the_workers_many_quiet_partitions_share_a_transaction() -> None:
    """A command every 5 ms spread over 8 partitions: each partition alone is quiet (one command
    per 40 ms), the worker is busy; paced, the worker's transactions hold several partitions each."""

    async def transactions(interval_ms: int) -> int:
        w = Worker(partitions=tuple(range(8)), commit_interval_ms=interval_ms)
        await w.settle()
        before = w.kafka.transactions
        for n in range(40):
            p = n % 8
            await w.handle(p, w.command(p, f"m{n}"))
            await asyncio.sleep(0.005)
        await w.settle()
        assert len(w.kafka.on(NAMES.journal)) == 40
        return w.kafka.transactions - before

    unpaced, paced = run(transactions(0)), run(transactions(100))
    assert unpaced >= 30
    assert paced <= 8  # the first two at once, then about one per 100 ms


def test_client_commands_of_a_paced_worker_are_fetched_in_held_fetches_and_internal_ones_at_once() -> None:
    from pipeline.journal.command_reader import IDLE_FETCH_WAIT_MS, PACED_FETCH_MIN_BYTES, fetch_settings

    assert fetch_settings(False, 30) == {"fetch.wait.max.ms": 10, "fetch.min.bytes": PACED_FETCH_MIN_BYTES}
    assert fetch_settings(False, 2) == {"fetch.wait.max.ms": 1, "fetch.min.bytes": PACED_FETCH_MIN_BYTES}
    at_once = {"fetch.wait.max.ms": IDLE_FETCH_WAIT_MS, "fetch.min.bytes": 1}
    assert fetch_settings(True, 30) == at_once  # what other processes wait on
    assert fetch_settings(False, 0) == at_once  # pacing off: nothing is held back


def test_a_commit_that_hangs_is_fatal_not_a_stall() -> None:
    """A coordinator that died can keep librdkafka waiting for minutes; the worker exits for a
    clean recovery instead of holding every partition still."""
    from pipeline.journal.checkpoint import CommitStuck

    async def scenario() -> None:
        w = Worker(partitions=(0,))
        w.committer.commit_timeout_s = 0.05
        forever = asyncio.Event()

        async def hang(*_args: Any) -> None:
            await forever.wait()

        w.kafka.commit = hang  # type: ignore[method-assign]
        await w.handle(0, w.command(0, "x"))
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert len(w.fatal) == 1 and isinstance(w.fatal[0], CommitStuck)
        assert "took over 0s" in str(w.fatal[0]) and w.stores[0].writes == 0

    run(scenario())
