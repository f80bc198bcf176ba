"""The journal processor as a Faust worker (`agentstream worker journal`).

Faust supplies the consumer group, partition assignment, offset commits and the changelog-backed
RocksDB table; `pipeline.journal_processor.PartitionEngine` makes every decision. Notes on Faust
(see DESIGN.md, "Known traps"):
- keys and values are raw bytes everywhere (`raw` serializers), so prefix scans work;
- rows go to the table's changelog (partition explicit) and then to the partition's RocksDB,
  not through Faust's table-write path (see `FaustRows`); so rows can be stored as soon as the
  journal record is acknowledged, from any coroutine;
- acknowledgements are manual (`noack`): a command is acknowledged once its journal record is
  acknowledged and its rows are stored.
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
from faust.types import TP
from rocksdict import WriteBatch

from pipeline import metrics
from pipeline.journal_processor import H_TICK, Command, PartitionEngine
from pipeline.settings import Settings
from topics.names import LLM_REQUESTS_MAX_MESSAGE_BYTES, topic_names

log = logging.getLogger("agentstream.journal")

RAW = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw", "value_serializer": "raw"}
ROWS_TABLE = "rows"


class FaustRows:
    """`RowTable` over one partition of the Faust table.

    Rows go to the table's changelog first, in one burst per `commit()`, through the producer with
    the partition explicit; only once the burst is acknowledged are they written to the local
    RocksDB (one write batch) and Faust's changelog offset advanced. So the local store never holds
    a row the changelog lacks: after a crash Faust replays the changelog past that offset and the
    local store is again exactly a prefix of the changelog, on this machine or a new one. Until
    then reads are served from the rows in flight. (Faust's own table-write path routes a write
    by the current event and queues changelog records in a small buffer drained one await at a
    time, which stalled the agent at a few hundred events/s.)
    """

    def __init__(self, app: Any, table: Any, partition: int, fatal: Any) -> None:
        self.app = app
        self.table = table
        self.partition = partition
        self.fatal = fatal
        self.changelog: list[tuple[bytes, bytes | None]] = []
        self.in_flight: dict[bytes, tuple[int, bytes | None]] = {}  # key -> (burst, value)
        self.bursts = 0

    def _db(self) -> Any:
        # Faust has no public per-partition read or prefix scan; this is the one place we reach in.
        return self.table.data._db_for_partition(self.partition)

    def get(self, key: bytes) -> bytes | None:
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
        for key in sorted(rows):
            value = rows[key]
            if value is not None:
                yield key, value

    def put(self, key: bytes, value: bytes | None) -> None:
        self.changelog.append((key, value))
        self.in_flight[key] = (self.bursts, value)

    async def commit(self) -> None:
        if not self.changelog:
            return
        records, self.changelog = self.changelog, []
        burst = self.bursts
        self.bursts += 1
        topic = self.table.changelog_topic.get_topic_name()
        send = self.app.producer.send
        last = None
        for key, value in records:
            last = await send(topic, key, value, self.partition, None, None)
        assert last is not None
        last.add_done_callback(lambda future: self._apply(burst, records, future))

    def _apply(self, burst: int, records: list[tuple[bytes, bytes | None]], future: Any) -> None:
        if future.cancelled() or future.exception() is not None:
            # A burst missing from the changelog: applying later bursts would make the local store
            # something the changelog cannot rebuild. Only a restart (changelog replay) is safe.
            self.fatal(future.exception() if not future.cancelled() else RuntimeError("changelog send cancelled"))
            return
        batch = WriteBatch(raw_mode=True)
        for key, value in records:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
            if self.in_flight.get(key, (None,))[0] == burst:
                del self.in_flight[key]
        # Faust's recovery offset in the same atomic write as the rows it covers.
        batch.put(self.table.data.offset_key, str(future.result().offset).encode())
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
        producer_linger_ms=5,  # batches the journal, changelog and result records of a burst
        # aiokafka refuses records over 1 MB by default; a request body may be up to the topic's limit.
        producer_max_request_size=LLM_REQUESTS_MAX_MESSAGE_BYTES,
        stream_wait_empty=False,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        key_serializer="raw",  # table rows and records are bytes we encode ourselves
        value_serializer="raw",
    )
    appends = app.topic(names.appends, partitions=settings.partitions, **RAW)
    # One agent reads both command topics (co-partitioned): partition p of each feeds engine p.
    commands = app.topic(names.appends, names.internal_appends, partitions=settings.partitions, **RAW)
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
    engines: dict[int, PartitionEngine] = {}

    def crash(error: BaseException) -> None:
        # The in-memory state may now be ahead of the journal; only a restart (which restores
        # rows and re-folds the journal) is safe. Exit like a crash would.
        log.critical("journal worker failed; exiting for a clean recovery", exc_info=error)
        logging.shutdown()
        os._exit(70)

    def engine_for(partition: int) -> PartitionEngine:
        engine = engines.get(partition)
        if engine is None:

            async def send(topic: str, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]) -> Any:
                return await app.producer.send(topic, key, value, partition, None, headers)

            engine = engines[partition] = PartitionEngine(
                partition,
                FaustRows(app, table, partition, crash),
                names,
                send,
                max_cached_streams=settings.max_cached_streams,
                partitions=settings.partitions,
                max_event_bytes=settings.max_event_bytes,
                fatal=crash,
                default_model=settings.default_model,
                transport=settings.transport,
            )
        return engine

    async def recover(engine: PartitionEngine) -> None:
        """Re-fold the journal tail past the rows' recorded position (crash or rebalance)."""
        started = time.monotonic()
        position = engine.recorded_position()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.bootstrap_servers, enable_auto_commit=False, **settings.aiokafka_config()
        )
        await consumer.start()
        try:
            tp = TopicPartition(names.journal, engine.partition)
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp]
            if position + 1 >= end:
                engine.caught_up = True
                engine.wake_streams_with_work()
                return
            consumer.seek(tp, position + 1)
            refolded = 0
            while True:
                batch = await consumer.getmany(tp, timeout_ms=1000, max_records=5000)
                records = [(r.offset, r.value, dict(r.headers or ())) for r in batch.get(tp, [])]
                outcomes: list[tuple[str, bytes, bytes]] = []
                refolded += engine.catch_up(records, outcomes)
                await engine.table.commit()
                # The worker that journaled these may have died before publishing their results.
                for topic, key, value in outcomes:
                    await app.producer.send(topic, key, value, engine.partition, None, None)
                if records and records[-1][0] + 1 >= end:
                    break
            log.info(
                "partition %d: re-folded %d journal events past position %d in %.2fs",
                engine.partition,
                refolded,
                position,
                time.monotonic() - started,
            )
            engine.caught_up = True
            engine.wake_streams_with_work()
        finally:
            await consumer.stop()

    @app.agent(commands, name="journal")
    async def journal(stream: Any) -> None:
        async for event in stream.noack().events():
            message = event.message
            engine = engine_for(message.partition)
            try:
                if not engine.caught_up:
                    await recover(engine)
                headers = message.headers or ()
                await engine.handle(
                    Command(
                        partition=message.partition,
                        offset=message.offset,
                        key=message.key,
                        value=message.value or b"",
                        headers=dict(headers.items() if isinstance(headers, dict) else headers),
                        ack=event.ack,
                        internal=message.topic == names.internal_appends,
                    )
                )
            except Exception as error:
                crash(error)

    @app.timer(interval=0.01)
    async def schedule() -> None:
        """Append the scheduler's due commands (requests, pauses, resumes, expiries)."""
        now_ms = int(time.time() * 1000)
        for partition, engine in list(engines.items()):
            if not engine.caught_up:
                continue
            for path, command in engine.due_commands(now_ms):
                await app.producer.send(
                    names.internal_appends, path.encode(), orjson.dumps(command), partition, None, None
                )

    @app.timer(interval=5.0)
    async def report_lag() -> None:
        for partition, engine in list(engines.items()):
            highwater = app.consumer.highwater(TP(names.appends, partition))
            if highwater is not None and engine.last_offset >= 0:
                lag = max(highwater - engine.last_offset - 1, 0)
                metrics.CONSUMER_LAG.labels(names.appends, str(partition)).set(lag)

    @app.on_partitions_assigned.connect
    async def assigned(app: Any, assigned: set[Any], **_: Any) -> None:
        # Every owned partition catches up now, not at its next command.
        for tp in assigned:
            if tp.topic == names.appends:
                await appends.send(key=b"", value=b"", partition=tp.partition, headers=[(H_TICK, b"1")])

    @app.on_partitions_revoked.connect
    async def revoked(app: Any, revoked: set[Any], **_: Any) -> None:
        for tp in revoked:
            if tp.topic != names.appends:
                continue
            engine = engines.pop(tp.partition, None)
            if engine is not None:
                # Let in-flight journal records land before another worker reads the tail.
                await asyncio.gather(*(p.wait() for p in engine.queue), return_exceptions=True)

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
