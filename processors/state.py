"""Agent state: the context projection (two lanes) and the turn bookkeeping.

Performance shape (per-event cost must not grow with the projection):
- a lane is a list of mutable `Cell`s plus a key index (key -> the cell holding the last
  occurrence), so slot lookup, in-place replacement and append are O(1);
- every cell has a stable `seq` (its row id in a store). Appends take increasing seqs, a compaction
  summary takes a seq below every other, so ordering rows by seq is lane order;
- `changes` (when enabled) records which rows changed since the last drain, so a store writes only
  what an event touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from schemas.config import AgentConfig
from schemas.context import ContextItem

TriggerSource = Literal["external", "agent-loop"]
LaneName = Literal["system", "history"]


class Cell:
    """One projected item: the payload now supplying a lane position."""

    __slots__ = ("created_offset", "item", "offset", "rendered", "seq", "updates_offset")

    def __init__(
        self, seq: int, offset: int, item: ContextItem, updates_offset: int | None, created_offset: int
    ) -> None:
        self.seq = seq
        self.offset = offset
        self.item = item
        self.updates_offset = updates_offset
        # Offset at which this position was first appended. Positions are appended in offset
        # order, so this is monotone along a lane (except leading compaction summaries).
        self.created_offset = created_offset
        self.rendered: tuple[str, str] | None = None  # (neutral role, content) cache

    def replace(self, offset: int, item: ContextItem) -> None:
        """In-place slot replacement: same position, inherits updates_offset."""
        self.offset = offset
        self.item = item
        self.rendered = None


class Lane:
    __slots__ = ("by_key", "cells", "name", "next_front_seq", "next_seq")

    def __init__(self, name: LaneName) -> None:
        self.name = name
        self.cells: list[Cell] = []
        self.by_key: dict[str, Cell] = {}
        self.next_seq = 1
        self.next_front_seq = 0

    def __len__(self) -> int:
        return len(self.cells)

    def append(self, offset: int, item: ContextItem, updates_offset: int | None) -> Cell:
        cell = Cell(self.next_seq, offset, item, updates_offset, offset)
        self.next_seq += 1
        self.cells.append(cell)
        if item.key is not None:
            self.by_key[item.key] = cell
        return cell

    def new_front_cell(self, offset: int, item: ContextItem) -> Cell:
        cell = Cell(self.next_front_seq, offset, item, None, offset)
        self.next_front_seq -= 1
        return cell


@dataclass(slots=True)
class PendingTrigger:
    offset: int  # newest triggering event
    atMs: int  # first uncovered trigger: the debounce counts from here
    source: TriggerSource


@dataclass(slots=True)
class OpenRequest:
    offset: int
    model: str
    expiresAt: int
    triggerOffset: int
    source: TriggerSource
    # Offset of an `interrupt-current-request` item that arrived while this request was open.
    interruptedBy: int | None = None
    # createdAt of the request event: its timestamp message, when the request is rendered again.
    createdAt: str | None = None


@dataclass(slots=True)
class TokenUsage:
    inputTokens: int = 0
    outputTokens: int = 0
    cachedInputTokens: int = 0
    reasoningOutputTokens: int = 0


@dataclass(slots=True)
class UsageReport:
    """The latest over-threshold usage report: what a compaction would summarize."""

    offset: int
    llmRequestOffset: int
    model: str
    tokens: int
    threshold: int


@dataclass(slots=True)
class ScriptRun:
    """An execution requested (and maybe started) but not yet settled."""

    executionId: str
    offset: int  # of its script-run-requested event
    expiresAt: int
    started: bool = False


@dataclass(slots=True, frozen=True)
class SourceOffsets:
    """How far a stream's commands have been journaled, per command topic (-1: none yet).

    The upstream position stored with what was derived from it (the stream's metadata row): a
    redelivered command at or below its topic's offset is already in the journal.
    """

    appends: int = -1  # agent-appends: any producer
    internal: int = -1  # agent-internal-appends: the workers only

    def covers(self, internal: bool, offset: int) -> bool:
        return offset <= (self.internal if internal else self.appends)

    def advanced(self, internal: bool, offset: int) -> SourceOffsets:
        if internal:
            return SourceOffsets(self.appends, max(self.internal, offset))
        return SourceOffsets(max(self.appends, offset), self.internal)


@dataclass(slots=True)
class AgentState:
    stream_path: str | None = None
    cursor: int = 0  # last folded offset
    system: Lane = field(default_factory=lambda: Lane("system"))
    history: Lane = field(default_factory=lambda: Lane("history"))
    published_through: int = 0
    created: bool = False
    config: AgentConfig = field(default_factory=AgentConfig)
    pending: PendingTrigger | None = None
    open: OpenRequest | None = None
    paused: bool = False
    pause_trigger_offset: int | None = None
    latest_external_trigger: int = 0
    autonomous_turn_count: int = 0
    consecutive_llm_failures: int = 0
    usage: TokenUsage = field(default_factory=TokenUsage)
    compacted_through: int = 0  # highest applied compaction cutoff
    over_threshold: UsageReport | None = None  # newest over-threshold report not yet compacted
    last_request_created_at: str | None = None
    last_event_created_at: str | None = None
    # Script executions requested or started and not yet settled, by execution id (request order).
    scripts: dict[str, ScriptRun] = field(default_factory=dict)
    # Row changes since the last drain: (lane, seq) -> cell, or None for a deleted row.
    changes: dict[tuple[LaneName, int], Cell | None] | None = None

    @property
    def has_system_prompt(self) -> bool:
        return "agent/system-prompt" in self.system.by_key

    @property
    def status(self) -> Literal["idle", "queued", "busy", "running-script", "paused"]:
        if self.open is not None:
            return "busy"
        if self.scripts:
            return "running-script"
        if self.paused:
            return "paused"
        if self.pending is not None:
            return "queued"
        return "idle"

    def mark(self, lane: Lane, cell: Cell) -> None:
        if self.changes is not None:
            self.changes[(lane.name, cell.seq)] = cell

    def mark_deleted(self, lane: Lane, cell: Cell) -> None:
        if self.changes is not None:
            self.changes[(lane.name, cell.seq)] = None

    def drain_changes(self) -> dict[tuple[LaneName, int], Cell | None]:
        changes, self.changes = self.changes or {}, {}
        return changes
