"""The journal worker's commit protocol: the checkpoints of all its partitions made durable at once.

A `PartitionEngine` decides commands into its partition's open `Checkpoint` (journal and
dead-letter records, the records that follow them, the rows they changed, how far each command
topic was read). The worker's `WorkerCommitter` then makes the open checkpoints of every partition
durable in one Kafka `Transaction`, in the numbered steps of its `commit` (docs/architecture.md,
"Commit protocol"), one transaction at a time while the next batches are decided. The pattern is
Kafka Streams' exactly-once v2 (KIP-447): one transactional producer per worker, whose transactions
commit the command positions as offsets of the worker's consumer group naming its generation, so
that once the group has moved on a paused worker's transactions abort and it writes nothing more.
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

from confluent_kafka import TopicPartition

from pipeline import metrics
from pipeline.journal.pacing import CommitPacing
from pipeline.kafka.group_generation import GroupMembership, position_metadata
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
    """What a transaction needs of the worker's producer (`pipeline.kafka.producer.JournalProducer`)."""

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
    async def commit(self, offsets: Callable[[], Sequence[TopicPartition]] = tuple, group: bytes | None = None) -> None:
        """Flush, then commit `offsets()` as the group's inside the transaction (fenced by `group`),
        then commit the transaction. `offsets` is called once the delivery callbacks have run."""


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
    """Everything one partition decided since the worker's last commit, made durable together."""

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

    def raise_to(self, appends: int, internal: int) -> None:
        """What the consumer group's committed offsets say is done, when they are further (a
        previous owner's last transaction committed after this worker restored its rows)."""
        self.done[False] = max(self.done[False], appends)
        self.done[True] = max(self.done[True], internal)


class Transaction:
    """One commit of the worker: the sealed checkpoints of every partition with work, in one Kafka
    transaction (`commit`'s numbered steps; docs/architecture.md, "Commit protocol")."""

    def __init__(self, parts: list[tuple[PartitionCheckpoints, Checkpoint]]) -> None:
        self.parts = parts

    @property
    def commands(self) -> int:
        return sum(checkpoint.commands for _, checkpoint in self.parts)

    async def commit(
        self,
        producer: TransactionalProducer,
        journal_topic: str,
        results_topic: str,
        command_topics: tuple[str, str],
        group: bytes | None,
    ) -> None:
        """Make every checkpoint durable, in this order:

        1. Begin the worker's transaction.
        2. Produce every partition's journal and dead-letter records (partition explicit).
        3. Barrier: without transactions, wait for their acknowledgements, so nothing downstream
           sees a result or a request for an event the journal could still lose. (Inside a
           transaction the commit makes everything visible at once.)
        4. Produce the follow-ups (llm-requests, script-runs, the workers' own commands), then the
           outcomes of every partition on `results_topic`, many to a record, all in one partition
           (the first checkpoint's).
        5. Produce each partition's rows to its changelog partition, group after group of
           `changelog_groups` (a group in one `send_rows` call, its last row alone: it carries the
           delivery callback), the positions last: `c`, how far each command topic is read, and
           `p`, a journal offset whose rows are stored (recovery re-folds the journal past it).
        6. Flush, then commit the command positions of every partition in the transaction as the
           consumer group's offsets (`command_topics`; each names the journal offset its partition
           reached), naming the worker's group membership (`group`): the fence. Once the group has
           moved on, the coordinator refuses them and the transaction aborts (`GroupMoved`).
        7. Commit the transaction. A fenced producer raises `Fenced`: nothing of the transaction
           becomes visible, and the worker must drop its partitions at once. Any other failure
           leaves the local stores untouched and is fatal for the worker.
        8. Write each partition's rows and the changelog offset they reach to its local store in
           one batch: a store never holds a row the committed changelog lacks.

        A failure at any step leaves every checkpoint FAILED; none may be reused.
        """
        for _, checkpoint in self.parts:
            checkpoint._check_open()
            checkpoint.status = Status.COMMITTING
        try:
            send = producer.send
            producer.begin()  # 1
            barrier = False
            for _, checkpoint in self.parts:  # 2
                _send_records(send, checkpoint, journal_topic)
                barrier = barrier or bool(checkpoint.records and (checkpoint.follow_ups or checkpoint.outcomes))
            if barrier:
                await producer.barrier()  # 3
            for _, checkpoint in self.parts:  # 4
                partition = checkpoint.partition
                for topic, key, value, headers in checkpoint.follow_ups:
                    send(topic, key, value, partition, headers or None)
            # Every reader of the results topic reads all its partitions, so the outcomes of the
            # whole transaction go to one partition: each partition a transaction writes costs a
            # produce request and a commit marker.
            outcomes = [outcome for _, checkpoint in self.parts for outcome in checkpoint.outcomes]
            for value in outcome_records(outcomes):
                send(results_topic, None, value, self.parts[0][1].partition, None)
            stored: list[tuple[PartitionCheckpoints, Checkpoint]] = []
            for handle, checkpoint in self.parts:  # 5
                checkpoint._positions(handle.positions.done, max(handle.journal_position, checkpoint.journal_offset))
                if _send_changelog(producer, checkpoint, handle.store.changelog_topic):
                    stored.append((handle, checkpoint))
            await producer.commit(lambda: _group_offsets(self.parts, command_topics), group)  # 6, 7
            for handle, checkpoint in stored:  # 8
                if checkpoint.changelog_offset < 0:
                    raise RuntimeError(f"partition {checkpoint.partition}: changelog committed without its offsets")
                handle.store.write(checkpoint.rows, checkpoint.changelog_offset)
        except BaseException:
            for _, checkpoint in self.parts:
                checkpoint.status = Status.FAILED
            raise
        for _, checkpoint in self.parts:
            checkpoint.status = Status.COMMITTED


def _send_records(send: Any, checkpoint: Checkpoint, journal_topic: str) -> None:
    """Step 2 for one partition. Records of one partition land in the order produced (idempotent
    producer), so only the last journal record carries a delivery callback: its offset is the
    partition's highest (one callback per record was a visible cost)."""

    def on_journal(error: Any, message: Any) -> None:
        if error is None:
            checkpoint.journal_offset = max(checkpoint.journal_offset, message.offset())

    last_journal = _last_index(checkpoint.records, journal_topic)
    partition = checkpoint.partition
    for index, (topic, key, value, headers) in enumerate(checkpoint.records):
        send(topic, key, value, partition, headers, on_journal if index == last_journal else None)


def _send_changelog(producer: TransactionalProducer, checkpoint: Checkpoint, changelog: str) -> bool:
    """Step 5 for one partition; whether it had rows to send."""

    def on_changelog(error: Any, message: Any) -> None:
        if error is None:
            checkpoint.changelog_offset = max(checkpoint.changelog_offset, message.offset())

    groups = [group for group in changelog_groups(checkpoint.rows) if group]
    if not groups:
        return False
    last_key, last_value = groups[-1].pop()
    for group in groups:
        if group:
            producer.send_rows(changelog, checkpoint.partition, group)
    producer.send(changelog, last_key, last_value, checkpoint.partition, None, on_changelog)
    return True


def _group_offsets(
    parts: list[tuple[PartitionCheckpoints, Checkpoint]], command_topics: tuple[str, str]
) -> list[TopicPartition]:
    """Step 6's offsets: for each partition of the transaction, the next command to read from each
    command topic, with the journal offset the partition reached as metadata. Every partition of
    the transaction is named, so that its next owner waits for the transaction to end before it
    reads what it holds (`pipeline.journal.worker`, the stable offsets of a take-over); the offsets
    are never negative, so librdkafka never leaves one out."""
    offsets: list[TopicPartition] = []
    for handle, checkpoint in parts:
        done = handle.positions.done
        metadata = position_metadata(max(handle.journal_position, checkpoint.journal_offset))
        for internal, topic in zip((False, True), command_topics, strict=True):
            position = checkpoint.read.get(internal, done[internal]) + 1
            offsets.append(TopicPartition(topic, checkpoint.partition, position, metadata=metadata))
    return offsets


# A commit that takes longer is stuck, not slow: the broker aborts a transaction open for 10 s
# (`pipeline.kafka.producer.TRANSACTION_TIMEOUT_MS`), and a commit of a large backlog takes a
# second or two. Stuck is fatal: the restart's producer fences this one and finds the coordinators.
COMMIT_TIMEOUT_S = 30.0


class CommitStuck(Exception):
    """A commit did not end within `COMMIT_TIMEOUT_S` (fatal for the worker)."""


class PartitionCheckpoints:
    """One partition's checkpoints: the open one its engine decides into, and the one (if any) of
    the worker's transaction being committed. The `WorkerCommitter` commits them."""

    def __init__(
        self,
        partition: int,
        store: RowStore,
        worker: WorkerCommitter,
        *,
        on_fenced: Callable[[BaseException], None],
        seal: Callable[[Checkpoint], None] | None = None,
    ) -> None:
        self.partition = partition
        self.store = store
        self.worker = worker
        self.on_fenced = on_fenced
        self.seal = seal  # completes the open checkpoint's rows right before it is committed
        self.open = Checkpoint(partition)  # what is being decided
        self.committing: Checkpoint | None = None  # what is being committed
        self.fenced: BaseException | None = None
        self.positions = CommandPositions.decode(store.get(rows.command_positions_key(partition)))
        position = store.get(rows.position_key(partition))
        self.journal_position = -1 if position is None else row_codec.decode_offset(position)

    def staged(self) -> list[dict[bytes, bytes | None]]:
        """Rows decided but not stored yet, newest first."""
        if self.committing is None:
            return [self.open.rows]
        return [self.open.rows, self.committing.rows]

    def work(self) -> None:
        """The open checkpoint holds something: it goes with the worker's next transaction."""
        self.worker.work(self.open.awaited)

    def publish(self, topic: str, key: bytes, value: bytes) -> None:
        """Send a record with the next checkpoint (what recovery publishes again, expiries)."""
        self.open.follow(topic, key, value)
        self.work()

    async def room(self, max_commands: int) -> None:
        """Back-pressure: wait while the open checkpoint holds `max_commands` or more."""
        while self.open.commands >= max_commands and self.fenced is None:
            await self.worker.committed()

    async def commit(self) -> None:
        """Commit the open checkpoint now, with whatever the other partitions have open."""
        await self.worker.commit()

    async def flush(self) -> None:
        """Commit everything staged so far (a revoked partition's last checkpoint, recovery). A
        fenced partition commits nothing more: it returns at once (`fenced` tells)."""
        while (self.open or self.committing is not None) and self.fenced is None:
            try:
                await self.worker.commit()
            except Fenced:
                return

    def _take(self) -> Checkpoint | None:
        """The open checkpoint, sealed, for the worker's transaction; a new one opens."""
        if self.fenced is not None:
            return None
        if self.seal is not None:
            self.seal(self.open)
        checkpoint, self.open = self.open, Checkpoint(self.partition)
        return checkpoint if checkpoint else None

    def _committed(self, checkpoint: Checkpoint) -> None:
        self.positions.done.update(checkpoint.read)
        self.journal_position = max(self.journal_position, checkpoint.journal_offset)

    def _fence(self, error: BaseException) -> None:
        if self.fenced is not None:
            return
        self.fenced = error
        self.open = Checkpoint(self.partition)
        log.warning("partition %d fenced: it is not this worker's now (%s); dropping it", self.partition, error)
        self.on_fenced(error)


class WorkerCommitter:
    """The worker's one transaction at a time over every partition it owns (KIP-447's pattern: a
    transactional producer per worker, fenced by the consumer group's generation).

    Engines decide into their partitions' open checkpoints; a task commits all of them that hold
    something in one transaction whenever none is committing, so the next batches are decided
    while the last one commits. Under load, at most one transaction starts per `commit_interval_s`
    (`pipeline.journal.pacing`, over the worker's command rate); work another process waits on
    commits at once.

    A fenced transaction (`Fenced`, `GroupMoved`) drops every partition of the worker (`on_fenced`
    of each): their decided state is ahead of Kafka, and the partitions are this worker's again only
    once it takes them over anew. Any other failure is `fatal`: only a restart is safe.
    """

    def __init__(
        self,
        producer: TransactionalProducer | None,
        journal_topic: str,
        results_topic: str,
        command_topics: tuple[str, str],
        *,
        membership: Callable[[], GroupMembership | None] = lambda: None,
        fatal: Callable[[BaseException], None] | None = None,
        commit_interval_s: float = 0.0,
        commit_timeout_s: float = COMMIT_TIMEOUT_S,
    ) -> None:
        self.producer = producer
        self.commit_timeout_s = commit_timeout_s
        self.journal_topic = journal_topic
        self.results_topic = results_topic
        self.command_topics = command_topics
        self.membership = membership  # the group membership transactions name (None: not fenced by one)
        self.fatal = fatal
        self.pacing = CommitPacing(commit_interval_s)
        self.partitions: dict[int, PartitionCheckpoints] = {}
        self.committing: Transaction | None = None
        self.fenced: BaseException | None = None  # the last fence; the producer may need renewing
        self.transactions = 0
        self._work = asyncio.Event()  # an open checkpoint has something to commit
        self._awaited = asyncio.Event()  # ... and another process waits on it: end a pacing wait
        self._committed = asyncio.Event()  # set after every commit (back-pressure, flush)
        self._task: asyncio.Task[None] | None = None

    def join(
        self,
        partition: int,
        store: RowStore,
        *,
        on_fenced: Callable[[BaseException], None],
        seal: Callable[[Checkpoint], None] | None = None,
    ) -> PartitionCheckpoints:
        """A partition's checkpoints, committed with the worker's from now on."""
        handle = PartitionCheckpoints(partition, store, self, on_fenced=on_fenced, seal=seal)
        self.partitions[partition] = handle
        return handle

    def leave(self, handle: PartitionCheckpoints) -> None:
        """The partition is not this worker's any more (after its last flush, or fenced)."""
        if self.partitions.get(handle.partition) is handle:
            del self.partitions[handle.partition]

    def work(self, awaited: bool) -> None:
        self._work.set()
        if awaited:
            self._awaited.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._commit_forever(), name="commit")

    async def committed(self) -> None:
        """Wait for the end of the next commit."""
        self._committed.clear()
        await self._committed.wait()

    def _pending(self) -> tuple[bool, bool]:
        """Whether any partition's open checkpoint holds something, and whether any is awaited."""
        opened = awaited = False
        for handle in self.partitions.values():
            if handle.fenced is None and handle.open:
                opened = True
                awaited = awaited or handle.open.awaited
        return opened, awaited

    async def _commit_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._work.wait()
            self._work.clear()
            opened, awaited = self._pending()
            if not opened:
                continue
            self._awaited.clear()
            delay = self.pacing.delay(loop.time(), awaited)
            if delay > 0:  # what arrives meanwhile joins this transaction
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._awaited.wait(), delay)
            try:
                await self.commit()
            except Fenced:
                continue  # the partitions are dropped; the worker takes them over again
            except Exception as error:
                if self.fatal is None:
                    raise
                self.fatal(error)
                return

    async def commit(self) -> None:
        """Commit every partition's open checkpoint now, in one transaction; new ones open at once."""
        while self.committing is not None:  # one transaction at a time
            await self.committed()
        parts: list[tuple[PartitionCheckpoints, Checkpoint]] = []
        for handle in list(self.partitions.values()):
            checkpoint = handle._take()
            if checkpoint is not None:
                parts.append((handle, checkpoint))
        if not parts:
            return
        assert self.producer is not None, "an engine without a producer only catches up"
        transaction = Transaction(parts)
        self.committing = transaction
        for handle, checkpoint in parts:
            handle.committing = checkpoint
        self.pacing.started(asyncio.get_running_loop().time(), transaction.commands)
        membership = self.membership()
        started = time.perf_counter()
        try:
            await asyncio.wait_for(
                transaction.commit(
                    self.producer,
                    self.journal_topic,
                    self.results_topic,
                    self.command_topics,
                    None if membership is None else membership.encode(),
                ),
                self.commit_timeout_s,
            )
        except TimeoutError as error:
            # librdkafka can wait minutes on a coordinator that died (measured: 3 minutes on a
            # TxnOffsetCommit to a killed broker); the broker aborts the transaction after its
            # timeout anyway, and a restart finds the coordinators afresh.
            raise CommitStuck(
                f"a commit of {len(parts)} partitions took over {self.commit_timeout_s:.0f}s "
                "(a transaction or group coordinator unreachable)"
            ) from error
        except Fenced as error:
            self._fence(error)
            raise
        finally:
            self.committing = None
            for handle, _ in parts:
                handle.committing = None
            self._committed.set()
        self.transactions += 1
        metrics.CHECKPOINT_SECONDS.observe(time.perf_counter() - started)
        metrics.CHECKPOINT_COMMANDS.observe(transaction.commands)
        for handle, checkpoint in parts:
            handle._committed(checkpoint)

    def _fence(self, error: BaseException) -> None:
        """Drop every partition: their state is ahead of what Kafka holds."""
        self.fenced = error
        metrics.FENCED.inc()
        log.warning(
            "this worker's transaction was fenced (%s): dropping its %d partitions", error, len(self.partitions)
        )
        for handle in list(self.partitions.values()):
            handle._fence(error)
            self.leave(handle)
