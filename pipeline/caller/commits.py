"""The caller's part of its at-least-once commits (docs/architecture.md, "LLM caller").

A record is *finished* once its appends are produced (or it needed none); `OffsetCommits`
(`pipeline/kafka/keyed_consumer.py`) commits each partition's first unfinished record. Before each
commit the producer is flushed, so a committed record's appends are in Kafka. A restart
re-delivers every unfinished record and repeats its call; the idempotency keys derived from the
request offset make the journal answer the second set of appends as duplicates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from pipeline.client import AppendError, Client

FLUSH_TIMEOUT_S = 30.0


class CallerFatal(RuntimeError):
    """The worker cannot go on safely (appends could not be delivered): exit without committing."""


def flush_before_commit(client: Client) -> Callable[[], Awaitable[None]]:
    """The hook that delivers every append produced so far before offsets are committed."""

    async def flush() -> None:
        try:
            await asyncio.to_thread(client.flush, FLUSH_TIMEOUT_S)
        except AppendError as failure:
            raise CallerFatal(f"appends could not be delivered to Kafka: {failure}") from None

    return flush
