"""In-memory stand-ins for the journal engine's I/O: a row store and a transactional producer.

`FakeTransactions` keeps each transaction's records apart until its commit, so a test sees exactly
what `read_committed` readers would; any step (begin, send, barrier, commit) can be made to fail
or be fenced once. `DictStore` is the `RowStore` contract over a dict.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from schemas.outcomes import decode_outcomes


class DictStore:
    """`RowStore` over a dict; `writes` counts the atomic writes (one per committed checkpoint)."""

    changelog_topic = "rows-changelog"

    def __init__(self) -> None:
        self.stored: dict[bytes, bytes] = {}
        self.changelog_offset = -1
        self.writes = 0

    def get(self, key: bytes) -> bytes | None:
        return self.stored.get(key)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        for key in sorted(self.stored):
            if key.startswith(prefix):
                yield key, self.stored[key]

    def write(self, rows: dict[bytes, bytes | None], changelog_offset: int) -> None:
        for key, value in rows.items():
            if value is None:
                self.stored.pop(key, None)
            else:
                self.stored[key] = value
        self.changelog_offset = changelog_offset
        self.writes += 1


class FakeMessage:
    def __init__(self, topic: str, offset: int) -> None:
        self._topic, self._offset = topic, offset

    def topic(self) -> str:
        return self._topic

    def offset(self) -> int:
        return self._offset


@dataclass
class Record:
    topic: str
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]
    offset: int
    partition: int = 0


class FakeTransactions:
    """A transactional producer in memory. `fail_next[step] = error` raises `error` at the next
    `step` ("begin", "send", "barrier", "commit") and aborts the open transaction."""

    def __init__(self) -> None:
        self.committed: list[Record] = []
        self.open: list[tuple[Record, Any]] = []
        self.offsets: dict[str, int] = {}
        # The consumer group offsets committed with each transaction: (topic, partition) -> (next
        # offset, metadata), and the group metadata the last commit named.
        self.group_offsets: dict[tuple[str, int], tuple[int, str]] = {}
        self.group: bytes | None = None
        self.fail_next: dict[str, BaseException] = {}
        self.steps: list[str] = []
        self.transactions = 0

    def _step(self, step: str) -> None:
        self.steps.append(step)
        error = self.fail_next.pop(step, None)
        if error is not None:
            self.open.clear()  # aborted: nothing of it is ever visible
            raise error

    def begin(self) -> None:
        self._step("begin")

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int,
        headers: Any = None,
        on_delivery: Any = None,
    ) -> None:
        self._step("send")
        offset = self.offsets.get(topic, 0)
        self.offsets[topic] = offset + 1
        self.open.append((Record(topic, key, value or b"", dict(headers or ()), offset, partition), on_delivery))

    def send_rows(self, topic: str, partition: int, rows: Any) -> None:
        for key, value in rows:
            self.send(topic, key, value, partition)

    async def barrier(self) -> None:
        self._step("barrier")

    async def commit(self, offsets: Any = tuple, group: bytes | None = None) -> None:
        self._step("commit")
        for record, on_delivery in self.open:  # acknowledged: the flush runs the callbacks
            if on_delivery is not None:
                on_delivery(None, FakeMessage(record.topic, record.offset))
        self.group = group
        for tp in offsets():
            self.group_offsets[(tp.topic, tp.partition)] = (tp.offset, tp.metadata)
        self.committed.extend(record for record, _ in self.open)
        self.open.clear()
        self.transactions += 1

    def on(self, topic: str) -> list[Record]:
        """The committed records of `topic`, in order."""
        return [record for record in self.committed if record.topic == topic]

    def outcomes(self, topic: str) -> list[dict[str, Any]]:
        """The append outcomes on the results `topic`, in order, whatever records hold them."""
        return [outcome.model_dump(exclude_none=True) for r in self.on(topic) for outcome in decode_outcomes(r.value)]
