"""Faust apps that read committed records only (docs/architecture.md, "Fencing").

The journal worker writes every record inside Kafka transactions, so a fenced writer's records
end up in aborted transactions. Every reader must skip them, Faust's included: the journal
worker's table restore reads the rows changelog, and the router reads `agent-journal`.

faust-streaming 0.15.3 reads `read_uncommitted` unless the whole app runs with
`processing_guarantee="exactly_once"`, which would also make Faust's own producer transactional
(with known bugs, docs/architecture.md "Fencing"). So these apps keep Faust's default guarantee and use:

- `CommittedTransport` (URL scheme `kafka-committed://`): Faust's aiokafka transport whose worker
  consumer reads `read_committed`;
- `CommittedTableManager`: its table recovery ends at the last *committed data record* of a
  changelog partition. Faust would wait for offset `end - 1`, but with transactions that offset
  is the commit marker, which no consumer ever receives, so the restore would never finish.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import Any

import faust
from confluent_kafka import Consumer, TopicPartition
from faust.tables import TableManager
from faust.tables.recovery import Recovery
from faust.transport import drivers
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from pipeline.kafka.read import read_ranges
from pipeline.settings import Settings
from topics.admin import quiet_librdkafka

SCHEME = "kafka-committed"
# Topic options of a Faust app that moves raw bytes (keys are stream paths, values JSON it decodes).
RAW = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw", "value_serializer": "raw"}


class _CommittedConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka hands this to its fetcher in start(), which has not run yet: no public setter.
        consumer._isolation_level = "read_committed"
        return consumer


class _CommittedConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _CommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)


class CommittedTransport(faust_aiokafka.Transport):
    """Faust's aiokafka transport, reading committed records only."""

    Consumer = _CommittedConsumer


drivers.TRANSPORTS.aliases[SCHEME] = f"{__name__}:CommittedTransport"


def broker_url(bootstrap_servers: str) -> str:
    """The Faust `broker` setting for a committed-only app."""
    return f"{SCHEME}://{bootstrap_servers}"


def last_committed_offset(config: dict[str, Any], tp: TopicPartition, end: int) -> int:
    """Offset of the last committed data record below `end` in `tp`, -1 if there is none.

    Reads backwards in widening windows: usually the last transaction of the partition holds it.
    """
    consumer = Consumer(
        quiet_librdkafka(
            {
                **config,
                "isolation.level": "read_committed",
                "group.id": f"agentstream-highwater-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
            }
        )
    )
    try:
        window = 256
        while True:
            start = max(end - window, 0)
            last = -1
            for batch in read_ranges(consumer, tp.topic, {tp.partition: (start, end)}, timeout=60):
                last = max(last, *(message.offset() for message in batch))
            if last >= 0 or start == 0:
                return last
            window *= 16
    finally:
        consumer.close()


class _CommittedRecovery(Recovery):
    async def _build_highwaters(self, consumer: Any, tps: set[TP], destination: Any, title: str) -> None:
        await super()._build_highwaters(consumer, tps, destination, title)
        config: dict[str, Any] = self.app.agentstream_kafka_config  # type: ignore[attr-defined]

        def committed(highwaters: Mapping[TP, int]) -> dict[TP, int]:
            return {
                tp: last_committed_offset(config, TopicPartition(tp.topic, tp.partition), highwater + 1)
                for tp, highwater in highwaters.items()
                if highwater is not None and highwater >= 0
            }

        # A Counter: `update` would add to the highwaters, not replace them.
        for tp, offset in (await asyncio.to_thread(committed, dict(destination))).items():
            destination[tp] = offset


class CommittedTableManager(TableManager):
    """Faust's table manager whose recovery ends at the last committed changelog record.

    The app must carry its librdkafka connection settings as `app.agentstream_kafka_config`.
    """

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = _CommittedRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery


def faust_credentials(settings: Settings) -> Any:
    """SASL or TLS credentials of a Faust app from the shared settings (None: plaintext)."""
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
