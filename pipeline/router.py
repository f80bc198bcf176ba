"""The router (`agentstream worker router`): events of subscribed streams, summarized to subscribers.

A Faust app (raw bytes keys and values, like the journal worker) with two agents on agent-journal:

- `subscriptions`: picks `agent/subscribed` / `agent/unsubscribed` events out of the journal,
  repartitions them by their `source` (`group_by`), and folds them into the `subscriptions` table
  (key: source stream path; value: its `SourceRoutes` as JSON). The table is the routing truth;
  its changelog topic restores it on any worker.
- `fanout`: for every journaled event whose stream has subscribers, produces one `context-added`
  append command per subscriber to agent-appends (`processors.routing` decides what), keyed and
  partitioned by the subscriber's path, idempotency key `route/<source>@<offset>`, no appendId.
  The event is acknowledged only after Kafka has every command, so a crash re-routes it and the
  idempotency key makes the repeat a no-op.

Which sources are agents (docs/behaviour.md §6.7: from an agent only its answers are routed, as
agent-loop input): every stream under `/agents/`, and any other stream whose `agent/created` the
fan-out has passed, remembered in a second table, `agents` (key: stream path), which is keyed and
partitioned like the journal.

The repartition topic, the tables and the journal have the same partition count and key (a stream
path), so source s's journal partition and table partition are the same number and land on the
same worker. A subscription reaches the table after its repartition hop, or much later when the
router restarts over a backlog, so the fan-out may already have passed source events journaled
after it: when a new subscriber enters the table, the router re-reads the source's journal
partition from the subscription's createdAt up to where the fan-out has looked, and routes those
events to that subscriber (idempotency keys make any overlap a no-op). Events journaled after an
`unsubscribed` but passed before it reached the table may still be routed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import faust
import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from faust.exceptions import Skip
from prometheus_client import Counter, Histogram, start_http_server

from pipeline import tracing
from pipeline.kafka.faust_committed import RAW, broker_url, faust_credentials
from pipeline.kafka.partitioner import partition_for
from pipeline.kafka.read import read_ranges_async
from pipeline.settings import AIOKAFKA_METADATA_MAX_AGE_MS, Settings
from processors import traceparent
from processors.reducer import epoch_ms
from processors.routing import SUBSCRIPTION_TYPES, apply_subscription, routed_commands, subscription_source
from schemas.events import AGENT_CREATED
from schemas.routing import SOURCE_ROUTES, Route, SourceRoutes
from topics.names import topic_names

log = logging.getLogger("agentstream.router")

TABLE = "subscriptions"
AGENTS_TABLE = "agents"
AGENT_NAMESPACE = "/agents/"
_CREATED_MARK = AGENT_CREATED.encode()
# Journal records carry the producer's timestamp, a moment before their createdAt: seek a little
# earlier and compare createdAt exactly.
CATCH_UP_MARGIN_MS = 10_000
_SUBSCRIPTION_MARK = b"events.iterate.com/agent/"  # cheap pre-filter before decoding a record

ROUTED = Counter("agentstream_router_routed_total", "Summary items produced to subscribers.")
SUBSCRIPTION_CHANGES = Counter(
    "agentstream_router_subscription_changes_total", "Subscription events folded into the table, by kind.", ["kind"]
)
FANOUT_SECONDS = Histogram(
    "agentstream_router_fanout_seconds",
    "Time to route one source event to all its subscribers (produce and acknowledge).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


def decode_routes(raw: bytes | None) -> SourceRoutes:
    return {} if raw is None else SOURCE_ROUTES.validate_json(raw)


def encode_routes(routes: SourceRoutes) -> bytes:
    return SOURCE_ROUTES.dump_json(routes, exclude_none=True)


def subscription_record(value: bytes | None) -> dict[str, Any] | None:
    """A journal record that is a subscription change (None: anything else)."""
    if not value or _SUBSCRIPTION_MARK not in value:
        return None
    try:
        record = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict) or record.get("type") not in SUBSCRIPTION_TYPES:
        return None
    return record if subscription_source(record) is not None else None


def build_app(settings: Settings) -> faust.App:
    names = topic_names(settings.topic_prefix)
    partitions = settings.partitions
    datadir = settings.data_dir / "router"
    datadir.mkdir(parents=True, exist_ok=True)  # Faust creates only the last level
    app = faust.App(
        settings.router_app_id,
        # Journal records of aborted transactions (a fenced writer's) must never be routed: Faust's
        # consumer reads committed records only (docs/architecture.md, "Fencing").
        broker=broker_url(settings.bootstrap_servers),
        broker_credentials=faust_credentials(settings),
        store="memory://",  # small state, restored from its changelog on start
        datadir=str(datadir),
        topic_partitions=partitions,
        topic_replication_factor=settings.replication_factor,
        topic_allow_declare=True,  # the repartition and changelog topics
        web_enabled=False,
        producer_acks=-1,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=1.0,
        consumer_metadata_max_age_ms=AIOKAFKA_METADATA_MAX_AGE_MS,  # see its comment
        producer_metadata_max_age_ms=AIOKAFKA_METADATA_MAX_AGE_MS,
        producer_linger_ms=2,
        stream_wait_empty=False,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",  # the journal is the truth: a new router reads all of it
        key_serializer="raw",
        value_serializer="raw",
    )
    journal = app.topic(names.journal, partitions=partitions, **RAW)
    # Named after the app (Faust's default name ignores the app id, so two routers would share it).
    repartition = app.topic(
        f"{settings.router_app_id}-{TABLE}-repartition", partitions=partitions, internal=True, **RAW
    )
    table = app.Table(TABLE, partitions=partitions, key_type=bytes, value_type=bytes)
    agents = app.Table(AGENTS_TABLE, partitions=partitions, key_type=bytes, value_type=bytes)

    def from_agent(source: bytes) -> bool:
        return source.startswith(AGENT_NAMESPACE.encode()) or agents.get(source) is not None

    # Journal partition -> the last offset the fan-out has looked up in the table (this worker).
    looked_up: dict[int, int] = {}

    async def send_all(commands: list[dict[str, Any]], headers: list[tuple[str, bytes]] | None = None) -> None:
        deliveries = []
        for command in commands:
            path = command["streamPath"]
            deliveries.append(
                await app.producer.send(
                    names.appends, path.encode(), orjson.dumps(command), partition_for(path, partitions), None, headers
                )
            )
        await asyncio.gather(*deliveries)  # acknowledged before the event that caused them is
        ROUTED.inc(len(commands))

    async def catch_up(source: str, agent: str, route: Route, subscribed_at: str) -> None:
        """Route the source events journaled since the subscription that the fan-out passed before
        the subscription reached the table (its repartition hop, or a restart over a backlog)."""
        partition = partition_for(source, partitions)
        last = looked_up.get(partition)
        if last is None:
            return  # the fan-out has not started this partition: it will consult the table itself
        consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.bootstrap_servers,
            enable_auto_commit=False,
            **settings.aiokafka_consumer_config(),
        )
        await consumer.start()
        try:
            tp = TopicPartition(names.journal, partition)
            consumer.assign([tp])
            since_ms = max(epoch_ms(subscribed_at) - CATCH_UP_MARGIN_MS, 0)
            start = (await consumer.offsets_for_times({tp: since_ms}))[tp]
            if start is None or start.offset > last:
                return
            key, routes = source.encode(), {agent: route}
            agent_source = from_agent(key)
            async for batch in read_ranges_async(consumer, {tp: (start.offset, last + 1)}, max_records=1000):
                for message in batch:
                    if message.key != key:
                        continue
                    record = orjson.loads(message.value)
                    if record.get("createdAt", "") >= subscribed_at:
                        await send_all(routed_commands(record, len(message.value), routes, from_agent=agent_source))
        finally:
            await consumer.stop()

    def only_subscriptions(value: bytes) -> bytes:
        if subscription_record(value) is None:
            raise Skip()  # acknowledged, never repartitioned
        return value

    def source_key(value: bytes) -> bytes:
        record = subscription_record(value)
        assert record is not None  # only subscriptions reach the repartition step
        return str(subscription_source(record)).encode()

    @app.agent(journal, name="subscriptions")
    async def subscriptions(stream: Any) -> None:
        grouped = stream.group_by(source_key, name=TABLE, topic=repartition)
        # `stream.filter(...).group_by(...)` would filter after repartitioning: group_by moves the
        # stream's processors to the grouped stream (faust-streaming issue #553), so every journal
        # record would be copied to the repartition topic. Put the filter in front ourselves.
        stream._processors.insert(0, only_subscriptions)
        async for event in grouped.events():
            record = subscription_record(event.value)
            if record is None:
                continue
            routes = decode_routes(table.get(event.key))
            updated = apply_subscription(routes, record)
            SUBSCRIPTION_CHANGES.labels(record["type"].rsplit("/", 1)[-1]).inc()
            if updated != routes:
                table[event.key] = encode_routes(updated)
            agent = record["streamPath"]
            if agent in updated and agent not in routes:
                await catch_up(event.key.decode(), agent, updated[agent], record["createdAt"])

    def remember_agent(key: bytes, value: bytes) -> None:
        try:
            created = orjson.loads(value).get("type") == AGENT_CREATED
        except (orjson.JSONDecodeError, AttributeError):
            return
        if created and agents.get(key) is None:
            agents[key] = b"1"

    @app.agent(journal, name="fanout")
    async def fanout(stream: Any) -> None:
        async for event in stream.events():
            # Before the lookup: a subscription applied from now on catches up through this offset.
            looked_up[event.message.partition] = event.message.offset
            if _CREATED_MARK in event.value and not event.key.startswith(AGENT_NAMESPACE.encode()):
                remember_agent(event.key, event.value)
            raw_routes = table.get(event.key)  # the record key is the source's stream path
            if raw_routes is None:
                continue
            started = time.perf_counter()
            try:
                record = orjson.loads(event.value)
            except orjson.JSONDecodeError:
                log.error("journal record at %s is not JSON; not routed", event.message.offset)
                continue
            routes = decode_routes(raw_routes)
            commands = routed_commands(record, len(event.value), routes, from_agent=from_agent(event.key))
            headers = None
            if tracing.ON and commands:  # a trace of its own, linked to the source's (docs/behaviour.md §8)
                source = traceparent.from_headers(event.headers)
                attributes = {
                    "agentstream.stream.path": record.get("streamPath", ""),
                    "agentstream.routed": len(commands),
                }
                span = tracing.start("agentstream.route", None, attributes, kind="producer", link=source)
                span.end()
                headers = [(traceparent.TRACEPARENT, tracing.header_of(span))]
            await send_all(commands, headers)
            FANOUT_SECONDS.observe(time.perf_counter() - started)

    @app.on_partitions_revoked.connect
    async def revoked(app: Any, revoked: set[Any], **_: Any) -> None:
        for tp in revoked:
            if tp.topic == names.journal:
                looked_up.pop(tp.partition, None)

    return app


def run(settings: Settings) -> None:
    """Run the router in the foreground until SIGTERM/SIGINT."""
    from pipeline.logs import faust_worker, setup_logging

    setup_logging(settings)
    if settings.router_metrics_port:
        start_http_server(settings.router_metrics_port, addr=settings.metrics_host)
    app = build_app(settings)
    names = topic_names(settings.topic_prefix)
    worker = faust_worker(app, settings, (names.journal, names.appends))
    worker.execute_from_commandline()
