"""When the capability host pauses its consumer, broker-free: a run request fetched while it is paused
waits until the queue drains, so a burst of one run per agent must not pause it."""

from __future__ import annotations

import asyncio

from aiokafka.structs import TopicPartition

from pipeline.capabilities import host as host_module
from pipeline.capabilities.config import HostConfig
from pipeline.capabilities.host import CapabilityHost
from pipeline.settings import Settings
from schemas.capabilities import ScriptRunRecord


class RecordingConsumer:
    def __init__(self, partitions: set[TopicPartition]) -> None:
        self.partitions = partitions
        self.calls: list[str] = []

    def assignment(self) -> set[TopicPartition]:
        return self.partitions

    def pause(self, *_: TopicPartition) -> None:
        self.calls.append("pause")

    def resume(self, *_: TopicPartition) -> None:
        self.calls.append("resume")


def run_request(index: int) -> bytes:
    return (
        ScriptRunRecord.model_validate(
            {
                "streamPath": f"/agents/a{index}",
                "offset": 3,
                "createdAt": "2026-01-01T00:00:00.000Z",
                "executionId": "agent-output:3",
                "code": "1",
                "expiresAt": 2**40,
                "timeoutMs": 30_000,
            }
        )
        .model_dump_json()
        .encode()
    )


async def dispatch_burst(agents: int) -> list[str]:
    """One run request per agent, all fetched at once, as a round of answers arrives; what the
    consumer is told before any of them runs."""
    tp = TopicPartition("script-runs", 0)
    host = CapabilityHost(Settings(), HostConfig(concurrency=16))
    host._stopping = True  # the lanes then finish their jobs without running them
    host._assigned({tp})
    consumer = RecordingConsumer({tp})
    host._consumer = consumer  # type: ignore[assignment]
    for offset in range(agents):
        host._dispatch(tp, offset, run_request(offset))
        host._backpressure()
    calls = list(consumer.calls)
    lanes = [lane.task for lane in host._lanes.values() if lane.task is not None]
    await asyncio.gather(*lanes)
    host._executor.shutdown(wait=False)
    return calls


def test_a_burst_of_one_run_per_agent_does_not_pause_the_consumer() -> None:
    # Records that arrive while paused wait until the queue drains: the whole burst, not one fetch.
    assert asyncio.run(dispatch_burst(400)) == []


def test_a_backlog_far_beyond_a_burst_still_pauses_it() -> None:
    assert asyncio.run(dispatch_burst(host_module.QUEUED_RUNS_HIGH)) == ["pause"]


def test_consumption_resumes_at_half_the_high_mark() -> None:
    host = CapabilityHost(Settings(), HostConfig(concurrency=16))
    tp = TopicPartition("script-runs", 0)
    consumer = RecordingConsumer({tp})
    high = host.backpressure.high
    host.backpressure.check(consumer, high)  # type: ignore[arg-type]
    host.backpressure.check(consumer, high // 2)  # type: ignore[arg-type]
    host.backpressure.check(consumer, high // 2 - 1)  # type: ignore[arg-type]
    assert consumer.calls == ["pause", "resume"]
    host._executor.shutdown(wait=False)
