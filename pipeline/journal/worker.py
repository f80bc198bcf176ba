"""The journal processor as a Faust worker (`agentstream worker journal`).

Faust is the framework: consumer group membership, partition assignment, the changelog-backed
RocksDB rows table and its recovery. The data path around it moves records in batches:

- Faust assigns partitions of `agent-journal-owners` (co-partitioned with the rows table); once
  Faust has restored the rows of an assignment (`on_rebalance_complete`), this worker takes each
  new partition over: it reads the group's committed positions of the partition (which waits out
  a previous owner's open transaction), re-folds the journal tail (`recover`), and reads partition
  p of both command topics (`CommandReader`);
- `PartitionEngine` decides each command (pure core) into the partition's open checkpoint, and the
  worker's one `WorkerCommitter` commits the checkpoints of all its partitions in one Kafka
  transaction: journal, dead-letter, result, request and changelog records, and the command
  positions as offsets of Faust's consumer group, fenced by the group generation Faust's member
  holds (`pipeline.journal.checkpoint`, `pipeline.kafka.group_generation`);
- once committed, the rows go to each partition's RocksDB in one write batch together with Faust's
  changelog offset (`FaustStore`), so a restart resumes exactly there.

Faust reads committed records only here (`pipeline.kafka.faust_committed`): a fenced writer's
aborted rows are never restored. Keys and values are raw bytes everywhere, so prefix scans work
(docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from rocksdict import WriteBatch

from pipeline import exit_codes, metrics
from pipeline.journal import heap
from pipeline.journal.checkpoint import WorkerCommitter
from pipeline.journal.command_reader import CommandReader, GroupPositions
from pipeline.journal.due_timer import DueTimer
from pipeline.journal.engine import PartitionEngine
from pipeline.journal.recovery import Recovery
from pipeline.kafka.faust_committed import RAW, CommittedTableManager, broker_url, faust_credentials
from pipeline.kafka.faust_internals import group_membership, table_offset_key, table_partition_db
from pipeline.kafka.group_generation import GroupMembership, unjoined
from pipeline.kafka.journal_reader import JournalReader
from pipeline.kafka.producer import Aborted, JournalProducer
from pipeline.settings import AIOKAFKA_METADATA_MAX_AGE_MS, Settings
from processors.row_codec import RowFormatError
from topics.names import LLM_REQUESTS_MAX_MESSAGE_BYTES, topic_names

log = logging.getLogger("agentstream.journal")

ROWS_TABLE = "rows"
# How long a take-over waits for the group's committed positions to be stable: a previous owner's
# open transaction ends within the transaction timeout (the broker aborts it then, checking every
# 10 s by default), so this is a broker that does not answer.
STABLE_POSITIONS_TIMEOUT_S = 120.0


class FaustStore:
    """`RowStore` over one partition of the Faust table: its RocksDB and its changelog topic.

    The engine produces the rows to the changelog inside the partition's transaction and writes
    them here only once that transaction is committed, together with Faust's changelog offset, in
    one write batch: the local store never holds a row the committed changelog lacks, so after a
    crash Faust's restore (committed records only) continues exactly where it stopped, on this
    machine or another. (Faust's own table-write path routes each write through the current event
    and a small buffer; it stalled the worker.)
    """

    def __init__(self, table: Any, partition: int) -> None:
        self.table = table
        self.partition = partition
        self.changelog_topic: str = table.changelog_topic.get_topic_name()

    def _db(self) -> Any:
        return table_partition_db(self.table, self.partition)

    def get(self, key: bytes) -> bytes | None:
        value = self._db().get(key)
        return None if value is None else bytes(value)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        for key, value in self._db().items(from_key=prefix):
            if not key.startswith(prefix):
                break
            yield bytes(key), bytes(value)

    def write(self, rows: dict[bytes, bytes | None], changelog_offset: int) -> None:
        batch = WriteBatch(raw_mode=True)
        for key, value in rows.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        # Faust's recovery offset in the same atomic write as the rows it covers.
        batch.put(table_offset_key(self.table), str(changelog_offset).encode())
        self._db().write(batch)


def build_app(settings: Settings) -> faust.App:
    names = topic_names(settings.topic_prefix)
    mb = 1 << 20
    app = faust.App(
        settings.app_id,
        # Faust's aiokafka transport, reading committed records only; its table recovery ends at the
        # last committed changelog record (`pipeline.kafka.faust_committed`).
        broker=broker_url(settings.bootstrap_servers),
        TableManager=CommittedTableManager,
        broker_credentials=faust_credentials(settings),
        store="rocksdb://",
        datadir=str(settings.data_dir),
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        topic_allow_declare=True,  # the changelog topic; our own topics exist already (topics ensure)
        web_enabled=settings.worker_port > 0,
        web_port=settings.worker_port or 6066,
        web_bind=settings.worker_bind,  # loopback unless AGENTSTREAM_WORKER_BIND says otherwise
        # The web server serves status only: Faust's /table views would hand out every row
        # (every agent's context) unauthenticated, and /router the cluster's layout. `/` stays
        # ({"status": "OK"}); stats and graph stay off (they follow `debug`, which is off).
        web_tables_enabled=False,
        web_router_enabled=False,
        producer_acks=-1,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=1.0,
        consumer_metadata_max_age_ms=AIOKAFKA_METADATA_MAX_AGE_MS,  # see its comment
        producer_metadata_max_age_ms=AIOKAFKA_METADATA_MAX_AGE_MS,
        consumer_group_instance_id=settings.worker_instance_id,
        # Faust's own (aiokafka) producer sends nothing; every data record goes through the
        # worker's one transactional librdkafka producer (`JournalProducer`).
        stream_wait_empty=False,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        key_serializer="raw",  # table rows and records are bytes we encode ourselves
        value_serializer="raw",
    )
    # Faust assigns this topic's partitions, and the rows table's with them (co-partitioned): the
    # owner of partition p reads partition p of both command topics (`CommandReader`).
    owners = app.topic(names.journal_owners, partitions=settings.partitions, **RAW)
    table = app.Table(
        ROWS_TABLE,
        partitions=settings.partitions,
        key_type=bytes,
        value_type=bytes,
        options={
            "write_buffer_size": settings.rocksdb_write_buffer_mb * mb,
            "max_write_buffer_number": 2,
            "block_cache_size": settings.rocksdb_block_cache_mb * mb,
            "target_file_size_base": 8 * mb,
        },
    )

    def crash(error: BaseException) -> None:
        if isinstance(error, RowFormatError):  # rows of another version: a restart would stop again
            log.critical("journal worker stopped: %s", error)
            logging.shutdown()
            os._exit(exit_codes.ROW_FORMAT)
        # The in-memory state may now be ahead of the journal; only a restart (which restores
        # rows and re-folds the journal) is safe. Exit like a crash would.
        log.critical("journal worker failed; exiting for a clean recovery", exc_info=error)
        logging.shutdown()
        os._exit(exit_codes.FATAL)

    kafka_config = settings.kafka_client_config()
    app.agentstream_kafka_config = kafka_config  # type: ignore[attr-defined]  # CommittedTableManager reads it
    producer_config = {**kafka_config, "message.max.bytes": LLM_REQUESTS_MAX_MESSAGE_BYTES + (1 << 20)}
    # Faust's consumer group: the worker's transactions commit the command positions as its
    # offsets, fenced by the generation of Faust's member (`pipeline.kafka.group_generation`).
    commands_group = settings.app_id
    reader = CommandReader(kafka_config, names, commands_group, crash, settings.commit_interval_ms)
    membership: list[GroupMembership] = [unjoined(settings.app_id)]  # as of the last rebalance
    committer = WorkerCommitter(
        None,
        names.journal,
        names.results,
        (names.appends, names.internal_appends),
        membership=lambda: membership[0] if settings.transactions else None,
        fatal=crash,
        commit_interval_s=settings.commit_interval_ms / 1000,
    )
    app.agentstream_committer = committer  # type: ignore[attr-defined]

    async def ensure_producer() -> None:
        """Start the worker's producer, or a new one after a fence that ended the last: a producer
        of this transactional id that runs on (an earlier run of this worker) is fenced here."""
        fence = committer.fenced
        if committer.producer is not None and (fence is None or isinstance(fence, Aborted)):
            committer.fenced = None
            return
        if committer.producer is not None:
            committer.producer.close()  # type: ignore[attr-defined]
        transactional_id = settings.journal_transactional_id() if settings.transactions else None
        producer = JournalProducer(producer_config, transactional_id)
        await producer.start()
        committer.producer, committer.fenced = producer, None

    engines = reader.engines
    metrics.count_turns(engines)  # the partitions owned now: a revoked one no longer counts

    def run_due(now_ms: int) -> int | None:
        """Journal the scheduler's due decisions (requests, pauses, resumes); expiries go behind
        the commands already produced (`PartitionEngine.schedule`). Returns the earliest wakeup left."""
        earliest: int | None = None
        for engine in list(engines.values()):
            if not engine.scheduling:
                continue
            engine.schedule(now_ms)
            if engine.wakeups and (earliest is None or engine.wakeups[0][0] < earliest):
                earliest = engine.wakeups[0][0]
        return earliest

    due_timer = DueTimer(run_due)

    def fenced(engine: PartitionEngine, _error: BaseException) -> None:
        """The worker's transaction was fenced: stop reading the partition; it is taken over anew
        once the group has settled (`restart_dropped`)."""
        if reader.engines.get(engine.partition) is engine:
            reader.release(engine.partition)

    def take_over(partition: int, positions: GroupPositions) -> PartitionEngine:
        """A new engine for `partition`, reading commands from where its rows or the group's
        committed offsets say, whichever is further."""
        engine = PartitionEngine(
            partition,
            FaustStore(table, partition),
            names,
            committer,
            max_cached_streams=settings.max_cached_streams,
            partitions=settings.partitions,
            max_event_bytes=settings.max_event_bytes,
            append_id_window=settings.append_id_window,
            fatal=crash,
            on_fenced=fenced,
            default_model=settings.default_model,
            transport=settings.transport,
            render_budget=settings.render_budget_for,
        )
        engine.on_wake = due_timer.at
        engine.checkpoints.positions.raise_to(positions.appends, positions.internal)
        return engine

    def aiokafka_reader() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            bootstrap_servers=settings.bootstrap_servers,
            enable_auto_commit=False,
            **settings.aiokafka_consumer_config(),
        )

    async def recover(engine: PartitionEngine, positions: GroupPositions) -> None:
        """Steps 1 and 2 of `Recovery`: re-fold the journal tail (at least as far as the group's
        committed positions say the last owner got), wake the streams with work."""
        recovery = Recovery(engine)
        consumer = aiokafka_reader()
        await consumer.start()
        try:
            await recovery.read_journal_tail(consumer, names.journal, at_least=positions.journal)
        finally:
            await consumer.stop()
        recovery.wake_streams_with_work()

    async def command_ends(partition: int) -> dict[bool, int]:
        """The end offsets of both command topics' partition p now: what was waiting at recovery."""
        consumer = aiokafka_reader()
        await consumer.start()
        try:
            appends = TopicPartition(names.appends, partition)
            internal = TopicPartition(names.internal_appends, partition)
            ends = await consumer.end_offsets([appends, internal])
            return {False: ends[appends], True: ends[internal]}
        finally:
            await consumer.stop()

    async def after_backlog(engine: PartitionEngine, ends: dict[bool, int]) -> None:
        """Once the commands that waited at recovery are committed: steps 4 and 5 of `Recovery`
        (what open requests and unsettled script runs still need), then start scheduling turns,
        whose decisions must not overtake those commands (a settlement, new input)."""
        while engine.active and not reader.read_through(engine.partition, ends):
            await asyncio.sleep(0.05)
        await engine.checkpoints.flush()
        if not engine.active:
            return  # revoked or fenced: the next owner does it
        recovery = Recovery(engine)
        records = recovery.open_work()
        for topic, key, value in records:
            engine.checkpoints.publish(topic, key, value)
        engine.scheduling = True
        due_timer.at(0)  # decide what became due while the backlog was read
        log.info("partition %d: published again %d records open requests need", engine.partition, len(records))
        events = JournalReader(settings, consumers=1)  # a run's code is in its event, not in the rows
        try:
            published = await recovery.republish_script_runs(events)
        except Exception as error:  # the journal cannot be read: restart and try again
            crash(error)
            return
        finally:
            await asyncio.to_thread(events.close)
        log.info("partition %d: published again %d unsettled script runs", engine.partition, published)

    starting: set[int] = set()
    background: set[asyncio.Task[None]] = set()

    def owned_now() -> set[int]:
        return {tp.partition for tp in app.consumer.assignment() if tp.topic == names.journal_owners}

    async def start_partitions() -> None:
        """Take each newly owned partition over, all at once. Runs once Faust has restored the rows
        of the new assignment."""
        new = [p for p in sorted(owned_now()) if p not in engines and p not in starting]
        if not new:
            return
        starting.update(new)
        try:
            await ensure_producer()
            # Stable offsets: waits while a previous owner's transaction over these partitions is
            # open, so that everything it will ever commit is in Kafka before the journal is read.
            positions = await asyncio.to_thread(reader.committed, new, STABLE_POSITIONS_TIMEOUT_S)
        except Exception as error:
            starting.difference_update(new)
            crash(error)
            return
        await asyncio.gather(*(start_partition(partition, positions[partition]) for partition in new))

    async def start_partition(partition: int, positions: GroupPositions) -> None:
        """Re-fold the journal tail, start reading the partition's commands."""
        try:
            engine = take_over(partition, positions)
            ends = await command_ends(partition)
            await recover(engine, positions)
            if partition in owned_now() and engine.active:  # not revoked meanwhile by another rebalance
                # Everything loaded and recovered so far (Faust, aiokafka, pydantic's schemas, the
                # re-folded streams) out of the cyclic collector's view before commands flow: the
                # engine settles only every `heap.SETTLE_EVERY` commands, and until then each full
                # collection rescanned it all, a 60-110 ms pause of every partition at a few hundred
                # commands/s (bench/capabilities.py --rate 40).
                heap.settle()
                reader.own(engine)
                task = asyncio.get_running_loop().create_task(
                    after_backlog(engine, ends), name=f"after-backlog-{partition}"
                )
                background.add(task)  # a reference until it ends: the loop keeps only weak ones
                task.add_done_callback(background.discard)
            else:
                engine.active = False
                await engine.checkpoints.flush()
                committer.leave(engine.checkpoints)
        except Exception as error:
            crash(error)
        finally:
            starting.discard(partition)

    @app.on_rebalance_complete.connect
    async def rebalanced(app: Any, **_: Any) -> None:
        # The generation and member id the worker's transactions name until the next rebalance.
        membership[0] = group_membership(app)
        log.info("group %s generation %d: taking partitions over", settings.app_id, membership[0].generation)
        reader.start()
        asyncio.get_running_loop().create_task(start_partitions(), name="start-partitions")

    @app.agent(owners, name="journal")
    async def journal(stream: Any) -> None:
        """Membership only: Faust assigns this topic's partitions (and the rows table's with them);
        nothing is written to it."""
        async for _ in stream:
            pass

    @app.timer(interval=5.0)
    async def restart_dropped() -> None:
        """Take over again what a fenced transaction dropped but the group still gives this worker
        (a transaction the broker aborted while the worker was paused, with no rebalance since)."""
        if committer.fenced is None or app.rebalancing or starting:
            return
        if owned_now() - set(engines):
            membership[0] = group_membership(app)
            await start_partitions()

    @app.timer(interval=5.0)
    async def report_lag() -> None:
        for partition in list(engines):
            lag = reader.lag(partition)
            if lag is not None:
                metrics.CONSUMER_LAG.labels(commands_group, names.appends, str(partition)).set(lag)

    @app.on_partitions_revoked.connect
    async def revoked(app: Any, revoked: set[Any], **_: Any) -> None:
        released: list[PartitionEngine] = []
        for tp in revoked:
            if tp.topic != names.journal_owners:
                continue
            engine = reader.release(tp.partition)
            if engine is not None:
                released.append(engine)
        # Commit what was decided before another worker reads the partitions (a fenced engine
        # commits nothing: its partition is already another's).
        for engine in released:
            try:
                await engine.checkpoints.flush()
            finally:
                committer.leave(engine.checkpoints)

    app.agentstream_engines = engines  # type: ignore[attr-defined]
    return app


def run(settings: Settings) -> None:
    """Run the worker in the foreground until SIGTERM/SIGINT."""
    from pipeline.logs import faust_worker, setup_logging

    setup_logging(settings)
    metrics.serve(settings.metrics_port, settings.metrics_host)
    app = build_app(settings)
    names = topic_names(settings.topic_prefix)
    needed = (names.appends, names.internal_appends, names.journal, names.results, names.llm_requests)
    worker = faust_worker(app, settings, (*needed, names.dlq, names.script_runs, names.journal_owners))
    worker.execute_from_commandline()
