"""The caller's per-stream job queues (`pipeline/caller/queues.py`), without a broker or a provider
(docs/architecture.md, "LLM caller"): one running job per stream, arrival order, stale records."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka.structs import TopicPartition

from pipeline.caller.queues import Job, StreamQueues
from schemas.requests import CallRequest

TP = TopicPartition("llm-requests", 0)
OTHER_TP = TopicPartition("llm-requests", 1)


def job(path: str, order: int, tp: TopicPartition = TP) -> Job:
    record = CallRequest(
        kind="call",
        streamPath=path,
        requestOffset=order,
        model="m",
        transport="openai-compatible",
        expiresAt=0,
        attempt=1,
        maxAttempts=3,
        messages=[],
    )
    return Job(record, tp, offset=order * 10)


class Harness:
    """Queues whose jobs wait on a gate per job; records what started and what settled."""

    def __init__(self, settle: bool | Exception = True) -> None:
        self.started: list[tuple[str, int]] = []
        self.settled: list[tuple[str, int]] = []
        self.gates: dict[tuple[str, int], asyncio.Event] = {}
        self.settle_result = settle
        self.queues = StreamQueues(self._start, self._settle, self._fail)
        self.failures: list[BaseException] = []

    def _start(self, job: Job) -> asyncio.Task[Any]:
        self.started.append((job.path, job.order))
        gate = self.gates.setdefault((job.path, job.order), asyncio.Event())
        return asyncio.create_task(gate.wait())

    def _settle(self, job: Job, task: asyncio.Task[Any]) -> bool:
        self.settled.append((job.path, job.order))
        if isinstance(self.settle_result, Exception):
            raise self.settle_result
        return self.settle_result

    def _fail(self, error: BaseException) -> None:
        self.failures.append(error)

    async def finish(self, path: str, order: int) -> None:
        self.gates[(path, order)].set()
        for _ in range(3):
            await asyncio.sleep(0)


def test_one_job_runs_per_stream_the_rest_wait_in_arrival_order() -> None:
    async def main() -> Harness:
        h = Harness()
        for j in (job("/a", 5), job("/b", 3), job("/a", 6), job("/a", 7)):
            assert h.queues.offer(j) is None
        assert h.started == [("/a", 5), ("/b", 3)]
        assert h.queues.size() == 4
        await h.finish("/a", 5)
        assert h.started[-1] == ("/a", 6)
        await h.finish("/a", 6)
        await h.finish("/a", 7)
        await h.finish("/b", 3)
        return h

    h = asyncio.run(main())
    assert h.settled == [("/a", 5), ("/a", 6), ("/a", 7), ("/b", 3)]
    assert h.queues.size() == 0 and not h.failures


def test_an_offset_not_newer_than_one_handled_running_or_waiting_is_stale() -> None:
    async def main() -> Harness:
        h = Harness()
        assert h.queues.offer(job("/a", 5)) is None
        assert h.queues.offer(job("/a", 8)) is None
        assert h.queues.offer(job("/a", 5)) == 8  # running
        assert h.queues.offer(job("/a", 7)) == 8  # older than one waiting
        await h.finish("/a", 5)
        await h.finish("/a", 8)
        assert h.queues.offer(job("/a", 8)) == 8  # handled
        assert h.queues.offer(job("/a", 9)) is None
        await h.finish("/a", 9)
        return h

    assert asyncio.run(main()).started == [("/a", 5), ("/a", 8), ("/a", 9)]


def test_abandoned_work_is_not_counted_as_handled() -> None:
    """A job whose settlement says it must run again (rebalance, shutdown) may be offered again."""

    async def main() -> Harness:
        h = Harness(settle=False)
        h.queues.offer(job("/a", 5))
        await h.finish("/a", 5)
        assert h.queues.offer(job("/a", 5)) is None
        return h

    assert asyncio.run(main()).started == [("/a", 5), ("/a", 5)]


def test_withdrawn_and_dropped_jobs_never_start() -> None:
    async def main() -> Harness:
        h = Harness()
        h.queues.offer(job("/a", 5))
        h.queues.offer(job("/a", 6))
        h.queues.offer(job("/a", 7, OTHER_TP))
        withdrawn = h.queues.withdraw("/a", 6)
        assert withdrawn is not None and withdrawn.order == 6
        assert h.queues.withdraw("/a", 6) is None and h.queues.withdraw("/a", 5) is None  # gone; running
        assert h.queues.running("/a", 5) is not None and h.queues.running("/a", 6) is None
        h.queues.drop_waiting({OTHER_TP})
        await h.finish("/a", 5)
        assert h.queues.offer(job("/a", 6)) == 6  # a withdrawn job counts as handled
        return h

    h = asyncio.run(main())
    assert h.started == [("/a", 5)] and h.queues.size() == 0


def test_draining_starts_nothing_more() -> None:
    async def main() -> Harness:
        h = Harness()
        h.queues.offer(job("/a", 5))
        h.queues.offer(job("/a", 6))
        h.queues.draining = True
        await h.finish("/a", 5)
        return h

    h = asyncio.run(main())
    assert h.started == [("/a", 5)] and h.queues.size() == 1


def test_a_failing_settlement_is_reported_not_raised() -> None:
    async def main() -> Harness:
        h = Harness(settle=RuntimeError("append failed"))
        h.queues.offer(job("/a", 5))
        await h.finish("/a", 5)
        return h

    h = asyncio.run(main())
    assert [str(e) for e in h.failures] == ["append failed"]
