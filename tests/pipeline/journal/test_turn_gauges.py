"""The turn gauges (agentstream_open_requests, agentstream_paused_agents) count the partitions a
worker owns now: not again on every recovery, and no longer once a partition is revoked."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from pipeline import metrics
from pipeline.journal.engine import PartitionEngine
from pipeline.journal.recovery import Recovery
from schemas.events import AGENT_PAUSED, CONTEXT_ADDED, LLM_REQUEST_REQUESTED
from tests.support.engine_harness import EngineHarness


def gauges() -> tuple[float | None, float | None]:
    return (
        REGISTRY.get_sample_value("agentstream_open_requests"),
        REGISTRY.get_sample_value("agentstream_paused_agents"),
    )


async def a_partition_with_an_open_request_and_a_pause() -> PartitionEngine:
    h = EngineHarness()
    await h.handle(
        h.command({"type": CONTEXT_ADDED, "payload": {"role": "user", "content": "hi"}}),
        h.command(
            {"type": LLM_REQUEST_REQUESTED, "payload": {"model": "m", "expiresAt": 2**40}, "idempotencyKey": "r"},
            internal=True,
        ),
        h.command({"type": AGENT_PAUSED, "payload": {"reason": "test"}}),
    )
    await h.settle()
    return h.engine


def test_turn_gauges_count_owned_partitions_once_and_drop_a_revoked_one() -> None:
    asyncio.run(turn_gauges())


async def turn_gauges() -> None:
    engine = await a_partition_with_an_open_request_and_a_pause()
    assert (engine.open_requests, engine.paused_agents) == (1, 1)
    owned = {0: engine}
    metrics.count_turns(owned)
    assert gauges() == (1, 1)
    Recovery(engine).wake_streams_with_work()  # a recovery counts from the rows: again, not on top
    Recovery(engine).wake_streams_with_work()
    assert gauges() == (1, 1)
    other = await a_partition_with_an_open_request_and_a_pause()
    owned[1] = other
    assert gauges() == (2, 2)
    del owned[0]  # revoked (`CommandReader.release`)
    assert gauges() == (1, 1)
    owned.clear()
    assert gauges() == (0, 0)
