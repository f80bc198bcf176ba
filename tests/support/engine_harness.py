"""One partition's journal writer (`PartitionEngine`) over the in-memory row store and transactional
producer of `tests/support/journal_fakes.py`: commands in, committed records out, no broker.

    h = EngineHarness()
    await h.handle(h.command({"type": CONTEXT_ADDED, "payload": {...}}))
    await h.settle()
    h.kafka.on(NAMES.journal), h.kafka.on(NAMES.dlq)
"""

from __future__ import annotations

from typing import Any

import orjson

from pipeline.journal.decisions import CommandRecord
from pipeline.journal.engine import PartitionEngine
from tests.support.journal_fakes import DictStore, FakeTransactions
from topics.names import topic_names

NAMES = topic_names("t-")
PATH = "/agents/a"


class EngineHarness:
    def __init__(self, **engine_options: Any) -> None:
        self.kafka = FakeTransactions()
        self.table = DictStore()
        self.fatal: list[BaseException] = []
        self.engine = PartitionEngine(
            0, self.table, NAMES, self.kafka, max_cached_streams=100, fatal=self.fatal.append, **engine_options
        )
        self.offsets = {False: 0, True: 0}

    def command(self, body: dict[str, Any], *, internal: bool = False, path: str = PATH) -> CommandRecord:
        """A command record of `path` (the record key and the command's streamPath)."""
        return self.raw(orjson.dumps({"streamPath": path, **body}), internal=internal, path=path)

    def raw(self, value: bytes, *, internal: bool = False, path: str = PATH) -> CommandRecord:
        offset = self.offsets[internal]
        self.offsets[internal] += 1
        return CommandRecord(partition=0, offset=offset, key=path.encode(), value=value, headers={}, internal=internal)

    async def handle(self, *commands: CommandRecord) -> None:
        await self.engine.handle_batch(commands)

    async def settle(self) -> None:
        """Commit everything decided so far."""
        await self.engine.checkpoints.flush()
