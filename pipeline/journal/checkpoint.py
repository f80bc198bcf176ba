"""The journal worker's commit protocol: one checkpoint of one partition made durable at once.

A `PartitionEngine` decides commands into its open `Checkpoint` (journal and dead-letter
records, the records that follow them, the rows they changed, how far each command topic was
read). `Checkpoint.commit` then makes all of it durable in one Kafka transaction, in the numbered
steps of its docstring (docs/architecture.md, "Commit protocol"); the partition's `Committer`
commits one checkpoint at a time while the next is decided. The pattern is the one of
Kafka Streams' exactly-once tasks: a transactional producer per partition, so the partition's next
owner fences the last one and a paused worker writes nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pipeline import metrics
from pipeline.journal.pacing import CommitPacing
from pipeline.kafka.producer import Fenced, Headers, OnDelivery
from processors import row_codec, rows
from processors.traceparent import TRACEPARENT
from schemas.outcomes import outcome_records

log = logging.getLogger("agentstream.journal")


class RowStore(Protocol):
    """The local rows of one partition (Faust's RocksDB in the worker, a dict in tests)."""

    changelog_topic: str

    def get(self, key: bytes) -> bytes | None: ...
    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...
    def write(self, rows: dict[bytes, bytes | None], changelog_offset: int) -> None:
        """Apply committed rows and the changelog offset they reach, in one atomic write."""


class TransactionalProducer(Protocol):
    """What a checkpoint needs of its partition's producer (`pipeline.kafka.producer.PartitionProducer`)."""

    def begin(self) -> None: ...
    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int,
        headers: Headers | None = None,
        on_delivery: OnDelivery | None = None,
    ) -> None: ...
    def send_rows(self, topic: str, partition: int, rows: Sequence[tuple[bytes, bytes | None]]) -> None:
        """Rows without headers or callback, in one call; their order among themselves may change."""

    async def barrier(self) -> None: ...
    async def commit(self) -> None: ...


Rows = list[tuple[bytes, bytes | None]]


def changelog_groups(burst: dict[bytes, bytes | None]) -> tuple[Rows, Rows, Rows]:
    """One checkpoint's rows in the three groups the changelog holds in turn: item, dedupe and
    other rows; then each stream's metadata row (its commit point: cursor and seq range); then the
    partition's positions (`p`, `c`), which claim everything before them. Within a group, order
    does not matter.

    Inside a transaction a restore sees all of a checkpoint or none of it. Without transactions
    (`AGENTSTREAM_TRANSACTIONS=false`) a worker killed mid-checkpoint leaves part of it on the
    changelog, groups in this order; every such part is one that catch-up completes: rows restored
    without their metadata row lie past the stream's cursor and seq range, where loading ignores
    them and re-folding rewrites them identically, and a stream's metadata row claims only rows
    of the group before it.
    """
    rows_first: Rows = []
    metas: Rows = []
    positions: Rows = []
    for row in burst.items():
        kind = row[0][0]  # every row key starts with its kind's byte (processors/rows.py)
        if kind == _META_KIND:
            metas.append(row)
        elif kind in _POSITION_KINDS:
            positions.append(row)
        else:
            rows_first.append(row)
    return rows_first, metas, positions


_META_KIND = rows.META[0]
_POSITION_KINDS = frozenset((rows.POSITION[0], rows.COMMAND_POSITIONS[0]))


class Status(enum.Enum):
    OPEN = "open"
    COMMITTING = "committing"
    COMMITTED = "committed"
    FAILED = "failed"


Outgoing = tuple[str, bytes | None, bytes, list[tuple[str, bytes]]]  # topic, key, value, headers


@dataclass(eq=False)
class Checkpoint:
    """Everything one partition decided since its last commit, made durable together."""

    partition: int
    # Journal and dead-letter records, in decision order.
    records: list[Outgoing] = field(default_factory=list)
    # What follows them: llm-requests, script-runs, the workers' own commands, traced outcomes.
    follow_ups: list[Outgoing] = field(default_factory=list)
    # Outcomes for clients (`AppendOutcome` JSON) with no trace to carry: sent as a few results
    # records holding many each (`outcome_records`), not one record per command.
    outcomes: list[bytes] = field(default_factory=list)
    rows: dict[bytes, bytes | None] = field(default_factory=dict)  # the last write of a key wins
    # The last offset read from each command topic (False: agent-appends, True: internal).
    read: dict[bool, int] = field(default_factory=dict)
    commands: int = 0
    # A follow-up another process of the platform waits on (an LLM request, a script run, a
    # command to the workers' topic): the checkpoint is not held back (`pipeline.journal.pacing`).
    awaits_follow_up: bool = False
    status: Status = Status.OPEN
    journal_offset: int = -1  # the highest journal offset acknowledged for it
    changelog_offset: int = -1

    def __bool__(self) -> bool:
        return bool(self.records or self.follow_ups or self.outcomes or self.rows or self.read)

    @property
    def awaited(self) -> bool:
        """Whether another process of the platform waits on it: it holds a command of
        agent-internal-appends or a follow-up such a process reads (`pipeline.journal.pacing`)."""
        return self.awaits_follow_up or True in self.read

    def put(self, key: bytes, value: bytes | None) -> None:
        self._check_open()
        self.rows[key] = value

    def produce(self, topic: str, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        self._check_open()
        self.records.append((topic, key, value, headers))

    def follow(
        self, topic: str, key: bytes | None, value: bytes, traceparent: bytes | None = None, *, awaited: bool = True
    ) -> None:
        """`awaited`: a process of the platform waits on the record (all but a client's outcome)."""
        self._check_open()
        headers = [] if traceparent is None else [(TRACEPARENT, traceparent)]  # docs/behaviour.md §8
        self.follow_ups.append((topic, key, value, headers))
        self.awaits_follow_up = self.awaits_follow_up or awaited

    def _check_open(self) -> None:
        if self.status is not Status.OPEN:
            raise RuntimeError(f"checkpoint of partition {self.partition} is {self.status.value}, not open")

    async def commit(
        self,
        producer: TransactionalProducer,
        store: RowStore,
        journal_topic: str,
        done: dict[bool, int],
        journal_position: int,
        *,
        results_topic: str,
    ) -> None:
        """Make the checkpoint durable, in this order:

        1. Begin the partition's transaction.
        2. Produce the journal and dead-letter records (partition explicit).
        3. Barrier: without transactions, wait for their acknowledgements, so nothing downstream
           sees a result or a request for an event the journal could still lose. (Inside a
           transaction the commit makes everything visible at once.)
        4. Produce the follow-ups (llm-requests, script-runs, the workers' own commands), then the
           outcomes on `results_topic`, many to a record.
        5. Produce the rows to the changelog, one record per changed key, group after group of
           `changelog_groups` (a group in one `send_rows` call, its last row alone: it carries
           the delivery callback), the positions last: `c`, how far each command topic is read
           (`done` for a topic this checkpoint read nothing of), and `p`, a journal offset whose
           rows are stored, at or after `journal_position` (recovery re-folds the journal past it).
        6. Commit the transaction (flush, then commit). A fenced producer raises `Fenced`: nothing
           of this checkpoint becomes visible, and the partition must be dropped at once. Any
           other failure leaves the local store untouched and is fatal for the worker.
        7. Write the rows and the changelog offset they reach to the local store in one batch:
           the store never holds a row the committed changelog lacks.

        A failure at any step leaves the checkpoint FAILED; the caller must not reuse it.
        """
        self._check_open()
        self.status = Status.COMMITTING
        try:
            partition = self.partition
            send = producer.send

            # Records of one partition land in the order produced (idempotent producer), so the
            # offset of the last journal record and of the last changelog record are the highest:
            # only those two carry a delivery callback (one per record was a visible cost).
            def on_journal(error: Any, message: Any) -> None:
                if error is None:
                    self.journal_offset = max(self.journal_offset, message.offset())

            def on_changelog(error: Any, message: Any) -> None:
                if error is None:
                    self.changelog_offset = max(self.changelog_offset, message.offset())

            producer.begin()  # 1
            last_journal = _last_index(self.records, journal_topic)
            for index, (topic, key, value, headers) in enumerate(self.records):  # 2
                send(topic, key, value, partition, headers, on_journal if index == last_journal else None)
            if self.records and (self.follow_ups or self.outcomes):
                await producer.barrier()  # 3
            for topic, key, value, headers in self.follow_ups:  # 4
                send(topic, key, value, partition, headers or None)
            for value in outcome_records(self.outcomes):
                send(results_topic, None, value, partition, None)
            self._positions(done, max(journal_position, self.journal_offset))
            changelog = store.changelog_topic
            groups = [group for group in changelog_groups(self.rows) if group]
            if groups:  # 5
                last_key, last_value = groups[-1].pop()
                for group in groups:
                    if group:
                        producer.send_rows(changelog, partition, group)
                send(changelog, last_key, last_value, partition, None, on_changelog)
            await producer.commit()  # 6
            if groups:  # 7
                if self.changelog_offset < 0:
                    raise RuntimeError(f"partition {partition}: changelog committed without its offsets")
                store.write(self.rows, self.changelog_offset)
        except BaseException:
            self.status = Status.FAILED
            raise
        self.status = Status.COMMITTED

    def _positions(self, done: dict[bool, int], journal_offset: int) -> None:
        if self.read:
            self.rows[rows.command_positions_key(self.partition)] = row_codec.encode_command_positions(
                self.read.get(False, done[False]), self.read.get(True, done[True])
            )
        if journal_offset >= 0:
            self.rows[rows.position_key(self.partition)] = row_codec.encode_offset(journal_offset)


def _last_index(records: list[Outgoing], topic: str) -> int:
    for index in range(len(records) - 1, -1, -1):
        if records[index][0] == topic:
            return index
    return -1


class CommandPositions:
    """How far each command topic of one partition is done (committed with what it produced): the
    upstream position stored with what was derived from it, where reading resumes after a restart."""

    def __init__(self, appends: int = -1, internal: int = -1) -> None:
        self.done = {False: appends, True: internal}

    @classmethod
    def decode(cls, value: bytes | None) -> CommandPositions:
        if value is None:
            return cls()
        return cls(*row_codec.decode_command_positions(value))


class Committer:
    """One partition's checkpoints: the open one that decisions go into, and at most one being
    committed. A task commits the open checkpoint whenever it holds something, one transaction at a
    time, so the next batch is decided while the last one commits; under load, at most one commit
    starts per `commit_interval_s` (`pipeline.journal.pacing`).

    A fenced commit drops the partition for good (`on_fenced`); any other failure is `fatal`: the
    decided state is then ahead of what Kafka holds, and only a restart is safe.
    """

    def __init__(
        self,
        partition: int,
        store: RowStore,
        producer: TransactionalProducer | None,
        journal_topic: str,
        results_topic: str,
        *,
        on_fenced: Callable[[BaseException], None],
        fatal: Callable[[BaseException], None] | None,
        seal: Callable[[Checkpoint], None] | None = None,
        commit_interval_s: float = 0.0,
    ) -> None:
        self.partition = partition
        self.pacing = CommitPacing(commit_interval_s)
        self.seal = seal  # completes the open checkpoint's rows right before it is committed
        self.store = store
        self.producer = producer
        self.journal_topic = journal_topic
        self.results_topic = results_topic
        self.on_fenced = on_fenced
        self.fatal = fatal
        self.open = Checkpoint(partition)  # what is being decided
        self.committing: Checkpoint | None = None  # what is being committed
        self.fenced: BaseException | None = None
        self.positions = CommandPositions.decode(store.get(rows.command_positions_key(partition)))
        position = store.get(rows.position_key(partition))
        self.journal_position = -1 if position is None else row_codec.decode_offset(position)
        self._work = asyncio.Event()  # the open checkpoint has something to commit
        self._awaited = asyncio.Event()  # ... and another process waits on it: end a pacing wait
        self._committed = asyncio.Event()  # set after every commit (back-pressure, flush)
        self._task: asyncio.Task[None] | None = None

    def staged(self) -> list[dict[bytes, bytes | None]]:
        """Rows decided but not stored yet, newest first."""
        if self.committing is None:
            return [self.open.rows]
        return [self.open.rows, self.committing.rows]

    def work(self) -> None:
        """The open checkpoint holds something: commit it as soon as none is committing."""
        self._work.set()
        if self.open.awaited:
            self._awaited.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._commit_forever(), name=f"commit-{self.partition}")

    def publish(self, topic: str, key: bytes, value: bytes) -> None:
        """Send a record with the next checkpoint (what recovery publishes again, expiries)."""
        self.open.follow(topic, key, value)
        self.work()

    async def room(self, max_commands: int) -> None:
        """Back-pressure: wait while the open checkpoint holds `max_commands` or more."""
        while self.open.commands >= max_commands and self.fenced is None:
            self._committed.clear()
            await self._committed.wait()

    async def _commit_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._work.wait()
            self._work.clear()
            if not self.open:
                continue
            self._awaited.clear()
            delay = self.pacing.delay(loop.time(), self.open.awaited)
            if delay > 0:  # what arrives meanwhile joins this checkpoint
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._awaited.wait(), delay)
            try:
                await self.commit()
            except Exception as error:
                if self.fenced is not None:
                    return
                if self.fatal is None:
                    raise
                self.fatal(error)
                return

    async def commit(self) -> None:
        """Commit the open checkpoint now (`Checkpoint.commit`); a new one opens at once."""
        while self.committing is not None:  # one transaction at a time
            self._committed.clear()
            await self._committed.wait()
        if self.seal is not None and self.fenced is None:
            self.seal(self.open)
        checkpoint, self.open = self.open, Checkpoint(self.partition)
        if not checkpoint or self.fenced is not None:
            return
        assert self.producer is not None, "an engine without a producer only catches up"
        self.committing = checkpoint
        self.pacing.started(asyncio.get_running_loop().time(), checkpoint.commands)
        started = time.perf_counter()
        try:
            await checkpoint.commit(
                self.producer,
                self.store,
                self.journal_topic,
                self.positions.done,
                self.journal_position,
                results_topic=self.results_topic,
            )
        except Fenced as error:
            self._fence(error)
            raise
        finally:
            self.committing = None
            self._committed.set()
        metrics.CHECKPOINT_SECONDS.observe(time.perf_counter() - started)
        metrics.CHECKPOINT_COMMANDS.observe(checkpoint.commands)
        self.positions.done.update(checkpoint.read)
        self.journal_position = max(self.journal_position, checkpoint.journal_offset)

    def _fence(self, error: BaseException) -> None:
        self.fenced = error
        self.open = Checkpoint(self.partition)
        metrics.FENCED.inc()
        log.warning("partition %d fenced: another worker owns it now (%s); dropping it", self.partition, error)
        self.on_fenced(error)

    async def flush(self) -> None:
        """Commit everything staged so far (a revoked partition's last checkpoint, recovery). A
        fenced partition commits nothing more: it returns at once (`fenced` tells)."""
        while (self.open or self.committing is not None) and self.fenced is None:
            try:
                await self.commit()
            except Fenced:
                return
