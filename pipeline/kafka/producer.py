"""A librdkafka producer (confluent-kafka) driven from the asyncio event loop.

librdkafka batches and retries in its own threads, and is idempotent (`acks=all`,
`enable.idempotence`): per partition, records land in the order they were produced, exactly once.
Delivery callbacks run inside `poll()`, in the calling thread; this wrapper polls from the event
loop only, so every callback runs on the loop (a `KafkaError` is an argument, not an exception:
the callback decides what a failure means).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from topics.admin import quiet_librdkafka

log = logging.getLogger("agentstream.producer")

Headers = Sequence[tuple[str, bytes]]


OnDelivery = Callable[[KafkaError | None, Message], None]


class AsyncProducer:
    """librdkafka from the event loop: `send` with a delivery callback (no future per record, the
    hot path), served by polling on the loop."""

    def __init__(self, config: dict[str, Any], *, poll_interval_s: float = 0.001) -> None:
        self._producer = Producer(
            quiet_librdkafka(
                {
                    "enable.idempotence": True,
                    "acks": "all",
                    # 5 ms: at 1 ms a turn is ~10 ms faster (bench/turns.py), but at 5 000 appends/s
                    # the many small produce requests saturate a 2-core broker (append->journaled
                    # p99 53 ms -> 3.5 s in bench/journal.py).
                    "linger.ms": 5,
                    # No compression: aiokafka readers (Faust's changelog recovery, the caller)
                    # would need extra codec libraries, and records here are small JSON.
                    "queue.buffering.max.messages": 1_000_000,
                    "queue.buffering.max.kbytes": 1_048_576,
                    **config,
                }
            )
        )
        self._poll_interval_s = poll_interval_s
        self._poller: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start polling for deliveries from the running loop."""
        if self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(self._poll_forever(), name="producer-poll")

    async def _poll_forever(self) -> None:
        producer = self._producer
        while True:
            producer.poll(0)
            await asyncio.sleep(self._poll_interval_s if len(producer) else 0.01)

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int,
        headers: Headers | None = None,
        on_delivery: OnDelivery | None = None,
    ) -> None:
        """Produce one record; `on_delivery(error, message)` runs on the loop once it is settled.

        A full local queue is drained by polling here (librdkafka's BufferError), so a burst
        larger than the queue slows the caller down instead of failing.
        """
        while True:
            try:
                self._producer.produce(
                    topic, value=value, key=key, partition=partition, headers=headers, on_delivery=on_delivery
                )
                return
            except BufferError:
                self._producer.poll(0.05)

    async def drain(self, timeout_s: float = 60.0) -> None:
        """Wait (on the loop) until every record produced so far is delivered or failed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(self._producer) > 0:
            if loop.time() > deadline:
                raise TimeoutError(f"{len(self._producer)} records not delivered within {timeout_s:.0f}s")
            self._producer.poll(0.005)
            await asyncio.sleep(0)
