"""One partition's streams as the engine decides with them: each loaded once from its rows and
kept in memory (least recently used out), reading through the rows decided but not yet stored.

The rows of a stream are its only persistent form (docs/architecture.md, "Stored rows"); this
repository is the one place that turns them into `AgentState` and back to reads.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pipeline.journal.checkpoint import RowStore
from processors import row_codec, rows
from processors.state import AgentState, SourceOffsets


@dataclass(slots=True)
class StreamEntry:
    state: AgentState
    sources: SourceOffsets  # how far this stream's commands are journaled, per command topic
    # The last opened request's messages: a compaction resends them byte for byte.
    last_request: tuple[int, list[dict[str, Any]]] | None = None
    # Scheduler commands sent but not yet journaled (idempotency key -> sent at, ms).
    sent: dict[str, int] = field(default_factory=dict)
    # Events folded in the open checkpoint, each with the sources after it: the stream's item and
    # metadata rows are written when the checkpoint is sealed (`PartitionEngine.seal`).
    unsealed: list[tuple[Any, SourceOffsets]] = field(default_factory=list)


class StreamRepository:
    """The streams of one partition, over its stored rows and `staged()` (the rows decided but not
    stored yet, newest first)."""

    def __init__(self, store: RowStore, staged: Callable[[], list[dict[bytes, bytes | None]]], max_cached: int) -> None:
        self.store = store
        self.staged = staged
        self.max_cached = max_cached
        self._cached: OrderedDict[str, StreamEntry] = OrderedDict()

    def read(self, key: bytes) -> bytes | None:
        for staged in self.staged():
            if key in staged:
                return staged[key]
        return self.store.get(key)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Stored rows under `prefix` with the rows decided but not yet stored laid over them."""
        staged: dict[bytes, bytes | None] = {}
        for layer in reversed(self.staged()):  # oldest first: newer writes win
            staged.update((key, value) for key, value in layer.items() if key.startswith(prefix))
        if not staged:
            yield from self.store.scan(prefix)
            return
        merged: dict[bytes, bytes | None] = dict(self.store.scan(prefix))
        merged.update(staged)
        for key in sorted(merged):
            value = merged[key]
            if value is not None:
                yield key, value

    def get(self, path: str) -> StreamEntry:
        """The stream's state (a new stream's when it has no rows)."""
        entry = self._cached.get(path)
        if entry is not None:
            self._cached.move_to_end(path)
            return entry
        meta = self.read(rows.meta_key(path))
        if meta is None:
            entry = StreamEntry(AgentState(stream_path=path), SourceOffsets())
        else:
            state, sources = row_codec.load_state(meta, self.scan(rows.items_prefix(path)))
            entry = StreamEntry(state, sources)
        self._cached[path] = entry
        self._evict()
        return entry

    def put(self, path: str, entry: StreamEntry) -> None:
        self._cached[path] = entry

    def forget(self, path: str) -> None:
        """Drop a stream's cached state: it reloads from its rows (stored and staged)."""
        self._cached.pop(path, None)

    def clear(self) -> None:
        self._cached.clear()

    def __len__(self) -> int:
        return len(self._cached)

    def _evict(self) -> None:
        # A stream with rows not yet stored, or not yet written, stays cached: its state is ahead.
        while len(self._cached) > self.max_cached:
            for path, entry in self._cached.items():
                key = rows.meta_key(path)
                if not entry.unsealed and not any(key in staged for staged in self.staged()):
                    del self._cached[path]
                    break
            else:
                return
