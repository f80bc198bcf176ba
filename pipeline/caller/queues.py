"""Per-stream job queues of the LLM caller (docs/architecture.md, "LLM caller").

Per stream there is one queue of call jobs and one of compaction jobs, each running at most one
job while the rest wait in arrival order; across streams the provider slots bound the calls in
flight. A record whose order offset (the request offset of a call, the report offset of a
compaction) is not newer than one already handled, running or waiting for its stream is stale:
the journal worker opens a new request offset for every attempt, so an old or repeated one is a
re-delivery.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiokafka.structs import TopicPartition

from schemas.requests import CallRequest, CompactRequest

STALE_MEMORY = 100_000  # streams whose newest handled offset is remembered


@dataclass(eq=False, slots=True)
class Job:
    """One call or compaction record being worked on."""

    record: CallRequest | CompactRequest
    tp: TopicPartition
    offset: int
    text: list[str] = field(default_factory=list)  # what the provider streamed so far
    task: asyncio.Task[Any] | None = None
    interrupted: bool = False  # a cancel record asked for it: settle as cancelled
    abandoned: bool = False  # rebalance or shutdown: append nothing, leave the record unfinished
    superseded: bool = False  # the journal settled it already: append nothing, the record is done
    queued_at: float = field(default_factory=time.monotonic)
    trace: bytes | None = None  # the record's traceparent, then its chat span's (docs/behaviour.md §8)

    @property
    def path(self) -> str:
        return self.record.streamPath

    @property
    def order(self) -> int:
        """The offset that orders a stream's jobs: request offset (calls), report offset (compactions)."""
        record = self.record
        return record.requestOffset if isinstance(record, CallRequest) else record.reportOffset

    def running(self) -> bool:
        return self.task is not None and not self.task.done()


@dataclass(slots=True)
class StreamQueue:
    """One stream's jobs of one kind: the running one and those waiting behind it."""

    running: Job | None = None
    waiting: deque[Job] = field(default_factory=deque)

    def jobs(self) -> list[Job]:
        return ([self.running] if self.running is not None else []) + list(self.waiting)


class HandledOffsets(OrderedDict[str, int]):
    """Newest handled order offset per stream, forgetting the least recently used streams."""

    def bump(self, path: str, order: int) -> None:
        self[path] = max(order, self.get(path, 0))
        self.move_to_end(path)
        if len(self) > STALE_MEMORY:
            self.popitem(last=False)


Start = Callable[[Job], "asyncio.Task[Any]"]
Settle = Callable[[Job, "asyncio.Task[Any]"], bool]


class StreamQueues:
    """The queues of one job kind for every stream. `start` runs a job; `settle` is called when its
    task ends and says whether the job's record is done (False: abandoned, it must run again);
    `fail` gets what `settle` raised (an append that could not be produced)."""

    def __init__(self, start: Start, settle: Settle, fail: Callable[[BaseException], None]) -> None:
        self._start = start
        self._settle = settle
        self._fail = fail
        self._queues: dict[str, StreamQueue] = {}
        self.handled = HandledOffsets()
        self.draining = False  # shutting down: start nothing more

    def offer(self, job: Job) -> int | None:
        """Queue the job and start it if its stream is idle; if it is stale, return the newer
        offset that makes it so (the job is not queued)."""
        queue = self._queues.get(job.path)
        # Settled here, or running, or waiting. Not abandoned work: that must run again when its
        # partition comes back.
        newest = max([self.handled.get(job.path, 0), *(j.order for j in (queue.jobs() if queue else []))])
        if job.order <= newest:
            return newest
        if queue is None:
            queue = self._queues[job.path] = StreamQueue()
        queue.waiting.append(job)
        self._pump(job.path)
        return None

    def running(self, path: str, order: int) -> Job | None:
        """The job for `order` if it is running in `path`'s queue."""
        queue = self._queues.get(path)
        job = queue.running if queue is not None else None
        return job if job is not None and job.order == order and job.running() else None

    def withdraw(self, path: str, order: int) -> Job | None:
        """Take the job for `order` out of `path`'s waiting jobs (it counts as handled); None if not waiting."""
        queue = self._queues.get(path)
        job = next((j for j in queue.waiting if j.order == order), None) if queue is not None else None
        if queue is None or job is None:
            return None
        queue.waiting.remove(job)
        self.handled.bump(path, order)
        self._pump(path)
        return job

    def drop_waiting(self, partitions: set[TopicPartition]) -> None:
        """Forget the waiting jobs of revoked partitions (their records stay uncommitted)."""
        for queue in self._queues.values():
            for job in [j for j in queue.waiting if j.tp in partitions]:
                queue.waiting.remove(job)

    def jobs(self) -> Iterator[Job]:
        for queue in self._queues.values():
            yield from queue.jobs()

    def running_tasks(self) -> set[asyncio.Task[Any]]:
        return {job.task for job in self.jobs() if job.task is not None and not job.task.done()}

    def size(self) -> int:
        """Jobs running or waiting."""
        return sum(len(q.waiting) + (q.running is not None) for q in self._queues.values())

    def _pump(self, path: str) -> None:
        """Start the stream's next job if it is idle; forget an idle, empty queue."""
        queue = self._queues.get(path)
        if queue is None:
            return
        if queue.running is None and queue.waiting and not self.draining:
            job = queue.running = queue.waiting.popleft()
            job.task = self._start(job)
            job.task.add_done_callback(functools.partial(self._ended, job))
        if queue.running is None and not queue.waiting:
            del self._queues[path]

    def _ended(self, job: Job, task: asyncio.Task[Any]) -> None:
        queue = self._queues.get(job.path)
        if queue is not None and queue.running is job:
            queue.running = None
        try:
            if self._settle(job, task):
                self.handled.bump(job.path, job.order)
            self._pump(job.path)
        except Exception as error:
            self._fail(error)
