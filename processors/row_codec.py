"""The row codec: the bytes of every stored row value, and the row format version.

Each row's wire shape is a pydantic model below; its field aliases (camelCase) are the stored
names, so renaming a Python attribute of the state never changes the stored format. Encoding is
on the hot path (a metadata row per journaled event), so it builds plain dicts keyed by those
aliases and dumps them with orjson; decoding validates through the models.

`ROW_FORMAT` names this encoding. Every partition's store holds it in its format row
(`processors.rows.format_key`); a worker that finds another version stops with `RowFormatError`
rather than misreading rows. Stores written before the format row existed hold format 1 exactly.
Change `ROW_FORMAT` with any incompatible change here (docs/operations.md, "Row format").
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from processors import rows
from processors.state import (
    AgentState,
    Cell,
    Lane,
    LaneName,
    OpenRequest,
    PendingTrigger,
    ScriptRun,
    SourceOffsets,
    TokenUsage,
    TriggerSource,
    UsageReport,
)
from schemas.config import AgentConfig
from schemas.context import ContextItem

ROW_FORMAT = 1


class RowFormatError(RuntimeError):
    """The store holds rows of a format this version cannot read: a restart will not help."""


class _Row(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class PendingRow(_Row):
    offset: int
    at_ms: int
    source: TriggerSource


class OpenRow(_Row):
    offset: int
    model: str
    expires_at: int
    trigger_offset: int
    source: TriggerSource
    interrupted_by: int | None = None
    created_at: str | None = None


class UsageRow(_Row):
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_output_tokens: int = 0


class UsageReportRow(_Row):
    offset: int
    llm_request_offset: int
    model: str
    tokens: int
    threshold: int


class ScriptRunRow(_Row):
    execution_id: str
    offset: int
    expires_at: int
    started: bool = False


class MetaRow(_Row):
    """`m` row: a stream's state without its items, and how far its commands are journaled."""

    path: str
    cursor: int
    source_offset: int
    internal_source_offset: int = -1  # absent in rows written before the internal topic existed
    published_through: int
    created: bool
    config: AgentConfig  # stored as a patch over the defaults
    pending: PendingRow | None
    open: OpenRow | None
    paused: bool
    pause_trigger_offset: int | None
    latest_external_trigger: int
    autonomous_turn_count: int
    consecutive_llm_failures: int
    usage: UsageRow
    compacted_through: int
    over_threshold: UsageReportRow | None
    last_request_created_at: str | None
    last_event_created_at: str | None
    scripts: list[ScriptRunRow] = []  # absent in rows written before script runs existed
    # Next seqs: system next, system next front, history next, history next front.
    seqs: tuple[int, int, int, int]


class CellRow(_Row):
    """`i` row: one projected item (short names: there is one per item)."""

    offset: Annotated[int, Field(alias="o")]
    created_offset: Annotated[int, Field(alias="c")]
    seq: Annotated[int, Field(alias="s")]
    updates_offset: Annotated[int | None, Field(alias="u")] = None
    item: Annotated[ContextItem, Field(alias="i")]


class IdempotencyRow(_Row):
    """`k` row: the event an idempotency key names, and its payload digest."""

    offset: int
    type: str
    hash: str


class CommandPositionsRow(_Row):
    """`c` row: the last done offset of each command topic (-1: none)."""

    appends: int
    internal: int


@functools.cache
def _aliases(model: type[_Row]) -> dict[str, str]:
    return {name: field.alias or name for name, field in model.model_fields.items()}


def _wire(row: type[_Row], /, **fields: Any) -> dict[str, Any]:
    """`fields` under the stored names of `row`; every field of the row must be given."""
    names = _aliases(row)
    assert len(fields) == len(names), f"{row.__name__}: encode every field"
    return {names[name]: value for name, value in fields.items()}


# --- format --------------------------------------------------------------------------------------


def encode_format() -> bytes:
    return str(ROW_FORMAT).encode()


def check_format(value: bytes | None, partition: int) -> None:
    """Raise `RowFormatError` unless a partition's format row (None: absent) is `ROW_FORMAT`.

    Absent means a new store, or one written before the format row existed (format 1 exactly).
    """
    if value is None or value == encode_format():
        return
    found = value.decode(errors="backslashreplace")
    raise RowFormatError(
        f"partition {partition}: the stored rows are in row format {found!r}, and this agentstream reads "
        f"format {ROW_FORMAT}: they were written by another version. Run the version that wrote them, or "
        "rebuild the rows from agent-journal as docs/operations.md ('Row format') describes "
        "(`agentstream replay --verify` checks the rebuilt rows)"
    )


# --- items -----------------------------------------------------------------------------------------

_ITEM_JSON = ContextItem.__pydantic_serializer__.to_json  # model_dump_json's bytes, minus its wrapper
_CELL = _aliases(CellRow)


def encode_cell(cell: Cell) -> bytes:
    # By hand: the item's JSON is spliced in as the serializer gives it (one per changed item).
    names = _CELL
    head = f'{{"{names["offset"]}":{cell.offset},"{names["created_offset"]}":{cell.created_offset}'
    head += f',"{names["seq"]}":{cell.seq}'
    if cell.updates_offset is not None:
        head += f',"{names["updates_offset"]}":{cell.updates_offset}'
    return f'{head},"{names["item"]}":'.encode() + _ITEM_JSON(cell.item, exclude_none=True) + b"}"


def decode_cell(value: bytes) -> Cell:
    row = CellRow.model_validate_json(value)
    return Cell(row.seq, row.offset, row.item, row.updates_offset, row.created_offset)


# --- metadata ----------------------------------------------------------------------------------------


def encode_meta(state: AgentState, sources: SourceOffsets) -> bytes:
    """Everything but the items, and how far the stream's commands are journaled per topic.

    Written once per journaled event, so by hand: dict literals under the stored names of `MetaRow`
    (tests/test_row_codec.py checks they are exactly its fields, in order).
    """
    pending, request, usage, report = state.pending, state.open, state.usage, state.over_threshold
    return orjson.dumps(
        {
            "path": state.stream_path,
            "cursor": state.cursor,
            "sourceOffset": sources.appends,
            "internalSourceOffset": sources.internal,
            "publishedThrough": state.published_through,
            "created": state.created,
            "config": _config_patch(state.config),
            "pending": None
            if pending is None
            else {"offset": pending.offset, "atMs": pending.atMs, "source": pending.source},
            "open": None
            if request is None
            else {
                "offset": request.offset,
                "model": request.model,
                "expiresAt": request.expiresAt,
                "triggerOffset": request.triggerOffset,
                "source": request.source,
                "interruptedBy": request.interruptedBy,
                "createdAt": request.createdAt,
            },
            "paused": state.paused,
            "pauseTriggerOffset": state.pause_trigger_offset,
            "latestExternalTrigger": state.latest_external_trigger,
            "autonomousTurnCount": state.autonomous_turn_count,
            "consecutiveLlmFailures": state.consecutive_llm_failures,
            "usage": {
                "inputTokens": usage.inputTokens,
                "outputTokens": usage.outputTokens,
                "cachedInputTokens": usage.cachedInputTokens,
                "reasoningOutputTokens": usage.reasoningOutputTokens,
            },
            "compactedThrough": state.compacted_through,
            "overThreshold": None
            if report is None
            else {
                "offset": report.offset,
                "llmRequestOffset": report.llmRequestOffset,
                "model": report.model,
                "tokens": report.tokens,
                "threshold": report.threshold,
            },
            "lastRequestCreatedAt": state.last_request_created_at,
            "lastEventCreatedAt": state.last_event_created_at,
            "scripts": [
                {
                    "executionId": run.executionId,
                    "offset": run.offset,
                    "expiresAt": run.expiresAt,
                    "started": run.started,
                }
                for run in state.scripts.values()
            ],
            "seqs": (
                state.system.next_seq,
                state.system.next_front_seq,
                state.history.next_seq,
                state.history.next_front_seq,
            ),
        }
    )


_config_patches: dict[int, tuple[AgentConfig, dict[str, Any]]] = {}


def _config_patch(config: AgentConfig) -> dict[str, Any]:
    """The configuration as stored: a patch over the defaults. Configurations are immutable and few
    (most agents keep the defaults): each is dumped once, found by identity (hashing a model
    walks all its fields)."""
    found = _config_patches.get(id(config))
    if found is not None and found[0] is config:
        return found[1]
    if len(_config_patches) >= 65_536:  # configs of streams long gone: start over
        _config_patches.clear()
    patch = config.model_dump(exclude_defaults=True)
    _config_patches[id(config)] = (config, patch)  # holds the config: its id is not reused meanwhile
    return patch


def decode_meta_row(value: bytes) -> MetaRow:
    return MetaRow.model_validate_json(value)


def decode_meta(value: bytes) -> tuple[AgentState, SourceOffsets]:
    """The state without items, and the recorded source offsets."""
    meta = decode_meta_row(value)
    pending, request, usage, report = meta.pending, meta.open, meta.usage, meta.over_threshold
    state = AgentState(
        stream_path=meta.path,
        cursor=meta.cursor,
        published_through=meta.published_through,
        created=meta.created,
        config=meta.config,
        pending=None if pending is None else PendingTrigger(pending.offset, pending.at_ms, pending.source),
        open=None
        if request is None
        else OpenRequest(
            request.offset,
            request.model,
            request.expires_at,
            request.trigger_offset,
            request.source,
            request.interrupted_by,
            request.created_at,
        ),
        paused=meta.paused,
        pause_trigger_offset=meta.pause_trigger_offset,
        latest_external_trigger=meta.latest_external_trigger,
        autonomous_turn_count=meta.autonomous_turn_count,
        consecutive_llm_failures=meta.consecutive_llm_failures,
        usage=TokenUsage(
            usage.input_tokens, usage.output_tokens, usage.cached_input_tokens, usage.reasoning_output_tokens
        ),
        compacted_through=meta.compacted_through,
        over_threshold=None
        if report is None
        else UsageReport(report.offset, report.llm_request_offset, report.model, report.tokens, report.threshold),
        last_request_created_at=meta.last_request_created_at,
        last_event_created_at=meta.last_event_created_at,
        scripts={
            run.execution_id: ScriptRun(run.execution_id, run.offset, run.expires_at, run.started)
            for run in meta.scripts
        },
    )
    state.system.next_seq, state.system.next_front_seq, state.history.next_seq, state.history.next_front_seq = meta.seqs
    return state, SourceOffsets(meta.source_offset, meta.internal_source_offset)


def load_state(meta_value: bytes, item_rows: Iterable[tuple[bytes, bytes]]) -> tuple[AgentState, SourceOffsets]:
    """Rebuild a stream's state from its metadata row and its item rows (in key order).

    Rows written after the metadata row (a crash between an event's item rows and its metadata
    row) lie outside the recorded seq range and are ignored; re-folding the journal tail rewrites
    them identically.
    """
    state, sources = decode_meta(meta_value)
    for key, value in item_rows:
        lane_name, seq = rows.item_of_key(key)
        lane = state.system if lane_name == "system" else state.history
        if not lane.next_front_seq < seq < lane.next_seq:
            continue
        _restore_cell(lane, decode_cell(value))
    return state, sources


def _restore_cell(lane: Lane, cell: Cell) -> None:
    lane.cells.append(cell)
    key = cell.item.key
    if key is not None:
        lane.by_key[key] = cell  # rows come in lane order, so the last occurrence wins


# --- dedupe and positions ------------------------------------------------------------------------------


def encode_idempotency(offset: int, event_type: str, payload_hash: str) -> bytes:
    return orjson.dumps(_wire(IdempotencyRow, offset=offset, type=event_type, hash=payload_hash))


def decode_idempotency(value: bytes) -> tuple[int, str, str]:
    row = IdempotencyRow.model_validate_json(value)
    return row.offset, row.type, row.hash


def encode_offset(offset: int) -> bytes:
    """An append-id row and a journal position row: an offset as decimal text."""
    return str(offset).encode()


def decode_offset(value: bytes) -> int:
    return int(value)


def encode_command_positions(appends: int, internal: int) -> bytes:
    return orjson.dumps(_wire(CommandPositionsRow, appends=appends, internal=internal))


def decode_command_positions(value: bytes) -> tuple[int, int]:
    row = CommandPositionsRow.model_validate_json(value)
    return row.appends, row.internal


def change_rows(path: str, changes: dict[tuple[LaneName, int], Cell | None]) -> Iterator[rows.Row]:
    """The item rows of a stream's drained changes (value None: the item row is deleted)."""
    for (lane, seq), cell in changes.items():
        yield rows.item_key(path, lane, seq), None if cell is None else encode_cell(cell)
