"""The journal processor as a Faust worker (`agentstream worker journal`).

Faust is the framework: consumer group membership, partition assignment, the changelog-backed
RocksDB rows table and its recovery. The data path around it moves records in batches:

- Faust assigns partitions of `agent-journal-owners` (co-partitioned with the rows table); once
  Faust has restored the rows of an assignment (`on_rebalance_complete`), this worker re-folds
  each new partition's journal tail (`recover`) and starts reading partition p of both command
  topics (`CommandReader`);
- `PartitionEngine` decides each command (pure core) and produces journal, dead-letter, result,
  request and changelog records through librdkafka (`AsyncProducer`: idempotent, acks=all);
- rows go to the table's changelog (partition explicit) and then, once acknowledged, to the
  partition's RocksDB in one write batch with Faust's changelog offset (`FaustRows`); the command
  positions the partition has finished are rows too, so a restart resumes exactly there.

Keys and values are raw bytes everywhere, so prefix scans work (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import faust
import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from rocksdict import WriteBatch

from pipeline import exit_codes, metrics
from pipeline.capabilities.journal import JournalReader
from pipeline.journal.command_reader import CommandReader
from pipeline.journal.due_timer import DueTimer
from pipeline.journal.engine import PartitionEngine, changelog_order, script_run_record
from pipeline.kafka.producer import AsyncProducer
from pipeline.settings import Settings
from processors.row_codec import RowFormatError
from schemas.capabilities import SCRIPT_RUN_REQUESTED
from topics.names import LLM_REQUESTS_MAX_MESSAGE_BYTES, topic_names

log = logging.getLogger("agentstream.journal")

RAW = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw", "value_serializer": "raw"}
ROWS_TABLE = "rows"


class FaustRows:
    """`RowTable` over one partition of the Faust table.

    Rows go to the table's changelog first, one record per changed key per `flush()` (the last
    write of a batch wins), produced with the partition explicit; only once every record of that
    burst is acknowledged are they written to the local RocksDB in one write batch together with
    Faust's changelog offset. So the local store never holds a row the changelog lacks: after a
    crash Faust replays the changelog past that offset and the local store is again exactly a
    prefix of the changelog, on this machine or a new one. That prefix may end inside a burst; the
    burst's order (`changelog_order`) makes any such prefix one that catch-up completes. A burst
    with any failed record is fatal: applying later bursts would make a store the changelog cannot
    rebuild. Until a burst is stored, reads are served from the rows in flight. (Faust's own
    table-write path routes each write through the current event and a small buffer; it stalled
    the worker.)
    """

    def __init__(self, producer: AsyncProducer, table: Any, partition: int, fatal: Any) -> None:
        self.producer = producer
        self.table = table
        self.partition = partition
        self.fatal = fatal
        self.changelog: dict[bytes, bytes | None] = {}
        self.in_flight: dict[bytes, tuple[int, bytes | None]] = {}  # key -> (burst, value)
        self.bursts = 0

    def _db(self) -> Any:
        # Faust has no public per-partition read or prefix scan; this is the one place we reach in.
        return self.table.data._db_for_partition(self.partition)

    def get(self, key: bytes) -> bytes | None:
        if key in self.changelog:
            return self.changelog[key]
        if key in self.in_flight:
            return self.in_flight[key][1]
        value = self._db().get(key)
        return None if value is None else bytes(value)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        rows: dict[bytes, bytes | None] = {}
        for key, value in self._db().items(from_key=prefix):
            if not key.startswith(prefix):
                break
            rows[bytes(key)] = bytes(value)
        for key, (_, value) in self.in_flight.items():
            if key.startswith(prefix):
                rows[key] = value
        for key, value in self.changelog.items():
            if key.startswith(prefix):
                rows[key] = value
        for key in sorted(rows):
            value = rows[key]
            if value is not None:
                yield key, value

    def put(self, key: bytes, value: bytes | None) -> None:
        self.changelog[key] = value

    async def flush(self) -> None:
        """Send the rows put since the last flush as one changelog burst (stored once acknowledged)."""
        if not self.changelog:
            return
        records, self.changelog = self.changelog, {}
        burst = self.bursts
        self.bursts += 1
        topic = self.table.changelog_topic.get_topic_name()
        remaining = len(records)
        last_offset = -1
        failed = False

        def delivered(error: Any, message: Any) -> None:
            nonlocal remaining, last_offset, failed
            remaining -= 1
            if error is not None and not failed:
                failed = True
                self.fatal(RuntimeError(f"changelog record not delivered: {error}"))
                return
            last_offset = max(last_offset, message.offset())
            if remaining == 0 and not failed:
                try:
                    self._apply(burst, records, last_offset)
                except Exception as error:  # the local store failed: only a restart is safe
                    self.fatal(error)

        for key, value in changelog_order(records):  # any prefix of a burst is recoverable
            self.in_flight[key] = (burst, value)
            self.producer.send(topic, key, value, self.partition, None, delivered)

    def _apply(self, burst: int, records: dict[bytes, bytes | None], changelog_offset: int) -> None:
        batch = WriteBatch(raw_mode=True)
        for key, value in records.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
            if self.in_flight.get(key, (None,))[0] == burst:
                del self.in_flight[key]
        # Faust's recovery offset in the same atomic write as the rows it covers.
        batch.put(self.table.data.offset_key, str(changelog_offset).encode())
        self._db().write(batch)


def build_app(settings: Settings) -> faust.App:
    names = topic_names(settings.topic_prefix)
    mb = 1 << 20
    app = faust.App(
        settings.app_id,
        broker=f"kafka://{settings.bootstrap_servers}",
        broker_credentials=_credentials(settings),
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
        consumer_group_instance_id=settings.worker_instance_id,
        # Faust's own (aiokafka) producer sends only assignment ticks; every data record goes
        # through librdkafka (`AsyncProducer`).
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
    producer = AsyncProducer({**kafka_config, "message.max.bytes": LLM_REQUESTS_MAX_MESSAGE_BYTES + (1 << 20)})
    reader = CommandReader(kafka_config, names, f"{settings.app_id}-commands", crash)
    engines = reader.engines
    metrics.count_turns(engines)  # the partitions owned now: a revoked one no longer counts

    def run_due(now_ms: int) -> int | None:
        """Journal the scheduler's due decisions (requests, pauses, resumes); expiries go behind
        the commands already produced (`PartitionEngine.schedule`). Returns the earliest wakeup left."""
        earliest: int | None = None
        for partition, engine in list(engines.items()):
            if not engine.scheduling:
                continue
            for path, command in engine.schedule(now_ms):
                producer.send(names.internal_appends, path.encode(), orjson.dumps(command), partition)
            if engine.wakeups and (earliest is None or engine.wakeups[0][0] < earliest):
                earliest = engine.wakeups[0][0]
        return earliest

    due_timer = DueTimer(run_due)

    def new_engine(partition: int) -> PartitionEngine:
        def send(
            topic: str, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]], on_delivery: Any
        ) -> None:
            producer.send(topic, key, value, partition, headers, on_delivery)

        engine = PartitionEngine(
            partition,
            FaustRows(producer, table, partition, crash),
            names,
            send,
            max_cached_streams=settings.max_cached_streams,
            partitions=settings.partitions,
            max_event_bytes=settings.max_event_bytes,
            append_id_window=settings.append_id_window,
            fatal=crash,
            default_model=settings.default_model,
            transport=settings.transport,
            render_budget=settings.render_budget_for,
        )
        engine.on_wake = due_timer.at
        return engine

    def must_deliver(error: Any, _message: Any) -> None:
        if error is not None:  # a republished outcome lost again: restart and republish
            crash(RuntimeError(f"record republished at recovery not delivered: {error.str()}"))

    async def recover(engine: PartitionEngine) -> None:
        """Re-fold the journal tail past the rows' recorded position (crash or rebalance), and
        publish the results of what it re-folds (its writer may have died before doing so)."""
        started = time.monotonic()
        position = engine.recorded_position()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.bootstrap_servers, enable_auto_commit=False, **settings.aiokafka_config()
        )
        await consumer.start()
        refolded = 0
        try:
            tp = TopicPartition(names.journal, engine.partition)
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp]
            if position + 1 < end:
                consumer.seek(tp, position + 1)
                while True:
                    batch = await consumer.getmany(tp, timeout_ms=1000, max_records=5000)
                    records = [(r.offset, r.value, dict(r.headers or ())) for r in batch.get(tp, [])]
                    outcomes: list[tuple[str, bytes, bytes]] = []
                    refolded += engine.catch_up(records, outcomes)
                    await engine.table.flush()
                    for topic, key, value in outcomes:
                        producer.send(topic, key, value, engine.partition, on_delivery=must_deliver)
                    if records and records[-1][0] + 1 >= end:
                        break
        finally:
            await consumer.stop()
        await engine.table.flush()  # the format row a new store got on open, even with nothing to re-fold
        await producer.drain()
        log.info(
            "partition %d: re-folded %d journal events past position %d in %.2fs",
            engine.partition,
            refolded,
            position,
            time.monotonic() - started,
        )
        engine.wake_streams_with_work()

    async def command_ends(partition: int) -> dict[bool, int]:
        """The end offsets of both command topics' partition p now: what was waiting at recovery."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.bootstrap_servers, enable_auto_commit=False, **settings.aiokafka_config()
        )
        await consumer.start()
        try:
            appends = TopicPartition(names.appends, partition)
            internal = TopicPartition(names.internal_appends, partition)
            ends = await consumer.end_offsets([appends, internal])
            return {False: ends[appends], True: ends[internal]}
        finally:
            await consumer.stop()

    async def after_backlog(engine: PartitionEngine, ends: dict[bool, int]) -> None:
        """Once the commands that waited at recovery are done: publish again what open requests
        still need (`PartitionEngine.republish_open_work`), then start scheduling turns, whose
        decisions must not overtake those commands (a settlement, new input)."""
        done = engine.positions.done
        while engine.active and not (done[False] >= ends[False] - 1 and done[True] >= ends[True] - 1):
            await asyncio.sleep(0.05)
        if not engine.active:
            return  # revoked: the next owner does it
        records = engine.republish_open_work()
        for topic, key, value in records:
            producer.send(topic, key, value, engine.partition, on_delivery=must_deliver)
        engine.scheduling = True
        due_timer.at(0)  # decide what became due while the backlog was read
        log.info("partition %d: published again %d records open requests need", engine.partition, len(records))
        try:
            await republish_script_runs(engine)
        except Exception as error:  # the journal cannot be read: restart and try again
            crash(error)

    async def republish_script_runs(engine: PartitionEngine) -> None:
        """Publish the `script-runs` record of every unsettled run again: the previous owner may have
        died between journaling a run request and publishing its record, and the capability host
        learns of a run from that record only. A host that has the run already finds its start
        journaled and never runs it twice (docs/architecture.md, "Recovering")."""
        runs = engine.open_script_runs()
        if not runs:
            return
        events = JournalReader(settings, consumers=1)  # the run's code is in its event, not in the rows
        published = 0
        try:
            for path, run, timeout_ms in runs:
                event = await asyncio.to_thread(events.event, path, run.offset)
                if not engine.active:
                    return  # revoked: the next owner does it
                try:
                    if event is None or event.get("type") != SCRIPT_RUN_REQUESTED:
                        raise ValueError(f"the journal has no {SCRIPT_RUN_REQUESTED} at {path}@{run.offset}")
                    payload = event["payload"]
                    code, created_at = payload["code"], event["createdAt"]
                    value = script_run_record(
                        path, run.offset, created_at, code, run.executionId, run.expiresAt, timeout_ms
                    )
                except (ValueError, KeyError, TypeError) as error:
                    log.error("%s: run %s cannot be published again: %s", path, run.executionId, error)
                    continue
                producer.send(names.script_runs, path.encode(), value, engine.partition, on_delivery=must_deliver)
                published += 1
        finally:
            await asyncio.to_thread(events.close)
        log.info("partition %d: published again %d unsettled script runs", engine.partition, published)

    starting: set[int] = set()
    background: set[asyncio.Task[None]] = set()

    def owned_now() -> set[int]:
        return {tp.partition for tp in app.consumer.assignment() if tp.topic == names.journal_owners}

    async def start_partitions() -> None:
        """Recover each newly owned partition (re-fold the journal tail) and start reading its
        commands. Runs once Faust has restored the rows of the new assignment."""
        for partition in sorted(owned_now()):
            if partition in engines or partition in starting:
                continue
            starting.add(partition)
            try:
                engine = new_engine(partition)
                ends = await command_ends(partition)
                await recover(engine)
                if partition in owned_now():  # not revoked meanwhile by another rebalance
                    reader.own(engine)
                    task = asyncio.get_running_loop().create_task(
                        after_backlog(engine, ends), name=f"after-backlog-{partition}"
                    )
                    background.add(task)  # a reference until it ends: the loop keeps only weak ones
                    task.add_done_callback(background.discard)
            except Exception as error:
                crash(error)
            finally:
                starting.discard(partition)

    @app.on_rebalance_complete.connect
    async def rebalanced(app: Any, **_: Any) -> None:
        producer.start()
        reader.start()
        asyncio.get_running_loop().create_task(start_partitions(), name="start-partitions")

    @app.agent(owners, name="journal")
    async def journal(stream: Any) -> None:
        """Membership only: Faust assigns this topic's partitions (and the rows table's with them);
        nothing is written to it."""
        async for _ in stream:
            pass

    @app.timer(interval=5.0)
    async def report_lag() -> None:
        for partition in list(engines):
            lag = reader.lag(partition)
            if lag is not None:
                metrics.CONSUMER_LAG.labels(names.appends, str(partition)).set(lag)

    @app.on_partitions_revoked.connect
    async def revoked(app: Any, revoked: set[Any], **_: Any) -> None:
        released: list[PartitionEngine] = []
        for tp in revoked:
            if tp.topic != names.journal_owners:
                continue
            engine = reader.release(tp.partition)
            if engine is not None:
                released.append(engine)
        # Let in-flight records land, and rows and positions be stored, before another worker
        # reads the partitions: drain, deliver the follow-ups, store what they finished.
        for engine in released:
            await engine.drain(wait=True)
        await producer.drain()
        for engine in released:
            await engine.drain(wait=True)
        await producer.drain()

    app.agentstream_engines = engines  # type: ignore[attr-defined]
    return app


def _credentials(settings: Settings) -> Any:
    if settings.sasl_mechanism and settings.sasl_username:
        ssl_context = None
        if settings.security_protocol.endswith("SSL"):
            import ssl

            ssl_context = ssl.create_default_context(cafile=settings.ssl_cafile)
        return faust.SASLCredentials(
            username=settings.sasl_username,
            password=settings.sasl_password or "",
            mechanism=settings.sasl_mechanism,
            ssl_context=ssl_context,
        )
    if settings.security_protocol == "SSL":
        import ssl

        return faust.SSLCredentials(ssl.create_default_context(cafile=settings.ssl_cafile))
    return None


def run(settings: Settings) -> None:
    """Run the worker in the foreground until SIGTERM/SIGINT."""
    from faust.worker import Worker

    logging.basicConfig(level=settings.log_level)
    metrics.serve(settings.metrics_port)
    app = build_app(settings)
    worker = Worker(app, loglevel=settings.log_level, quiet=True, redirect_stdouts=False)
    # Faust's terminal spinner sets the root logger to DEBUG so it can spin on every record: every
    # debug call of aiokafka and Faust then builds a LogRecord (measured: ~14% of the worker's CPU).
    worker.spinner = None
    worker.execute_from_commandline()
