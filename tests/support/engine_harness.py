"""One partition's journal writer (`PartitionEngine`) over the in-memory row store and transactional
producer of `tests/support/journal_fakes.py`: commands in, committed records out, no broker.

    h = EngineHarness()
    await h.handle(h.command({"type": CONTEXT_ADDED, "payload": {...}}))
    await h.settle()
    h.kafka.on(NAMES.journal), h.kafka.on(NAMES.dlq)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from pipeline.journal.checkpoint import WorkerCommitter
from pipeline.journal.decisions import CommandRecord
from pipeline.journal.engine import PartitionEngine
from schemas.events import CONTEXT_ADDED
from tests.support.journal_fakes import DictStore, FakeTransactions
from topics.names import TopicNames, topic_names

NAMES = topic_names("t-")
PATH = "/agents/a"
SYSTEM = {"type": CONTEXT_ADDED, "payload": {"role": "system", "content": "be brief", "key": "agent/system-prompt"}}


def user(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": CONTEXT_ADDED, "payload": {"role": "user", "content": text}, **extra}


def committer(
    kafka: FakeTransactions | None = None,
    fatal: Callable[[BaseException], None] | None = None,
    commit_interval_ms: int = 0,
    names: TopicNames = NAMES,
) -> WorkerCommitter:
    """A worker's committer over the in-memory producer (a fresh one unless `kafka` is given)."""
    return WorkerCommitter(
        kafka if kafka is not None else FakeTransactions(),
        names.journal,
        names.results,
        (names.appends, names.internal_appends),
        fatal=fatal,
        commit_interval_s=commit_interval_ms / 1000,
    )


class EngineHarness:
    """`engine_class` on partition 0; a fenced partition is recorded in `dropped`, any other
    failure in `fatal`."""

    def __init__(self, engine_class: type[PartitionEngine] = PartitionEngine, **engine_options: Any) -> None:
        self.kafka = FakeTransactions()
        self.table = DictStore()
        self.fatal: list[BaseException] = []
        self.dropped: list[int] = []
        engine_options.setdefault("on_fenced", lambda engine, _error: self.dropped.append(engine.partition))
        commit_interval_ms = engine_options.pop("commit_interval_ms", 0)
        self.committer = committer(self.kafka, self.fatal.append, commit_interval_ms)
        self.engine = engine_class(
            0, self.table, NAMES, self.committer, max_cached_streams=100, fatal=self.fatal.append, **engine_options
        )
        self.offsets = {False: 0, True: 0}

    def command(
        self, body: dict[str, Any], *, internal: bool = False, path: str = PATH, offset: int | None = None
    ) -> CommandRecord:
        """A command record of `path` (the record key and the command's streamPath), at the next
        offset of its topic unless `offset` says."""
        return self.raw(orjson.dumps({"streamPath": path, **body}), internal=internal, path=path, offset=offset)

    def raw(
        self, value: bytes, *, internal: bool = False, path: str = PATH, offset: int | None = None
    ) -> CommandRecord:
        if offset is None:
            offset = self.offsets[internal]
            self.offsets[internal] += 1
        return CommandRecord(partition=0, offset=offset, key=path.encode(), value=value, headers={}, internal=internal)

    async def handle(self, *commands: CommandRecord) -> None:
        await self.engine.handle_batch(commands)

    async def settle(self) -> None:
        """Commit everything decided so far."""
        await self.engine.checkpoints.flush()
