"""The row codec: the bytes of every stored row value, the row format version, and the upcasts
that read rows of older formats.

Each row's wire shape is a pydantic model below; its field aliases (camelCase) are the stored
names, so renaming a Python attribute of the state never changes the stored format. Encoding is
on the hot path (a metadata row per journaled event), so it builds plain dicts keyed by those
aliases and dumps them with orjson; decoding validates through the models.

`ROW_FORMAT` names this encoding (docs/operations.md, "Row format"). Every row value but the
format row starts with a marker naming the format it was written in (`MARK`, then the version in
one byte); values without it are format 1, written before the marker existed. Decoding reads that
version and upcasts the row step by step (`UPCASTS`) to this format's shape before validating it,
so a store of older rows keeps working and each row is rewritten in this format when an event
touches it. Each partition's format row (`processors.rows.format_key`) names the newest format
its rows were written in; a worker that finds a newer one stops with `RowFormatError` (a
downgrade is not supported). A change to any row's shape raises `ROW_FORMAT` and adds the one
upcast from the previous format.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Annotated, Any, Literal

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

ROW_FORMAT = 2

# Every row value but the format row's starts with MARK and its format version, one byte each.
# No format-1 value starts with MARK: format 1 wrote UTF-8 only (JSON, decimal text, append ids),
# and 0xFF never occurs in UTF-8. So a value without it is format 1.
MARK = 0xFF
_CURRENT = bytes((MARK, ROW_FORMAT))  # the marker this version writes
_CURRENT_TEXT = _CURRENT.decode("latin-1")  # the same bytes, for rows built as ASCII text


class RowFormatError(RuntimeError):
    """The store holds rows of a format this version cannot read: a restart will not help."""


# What an operator can do about rows of a newer format (docs/operations.md, "Row format").
_REMEDY = (
    "Rows are never downgraded: run that version (or a newer one), or rebuild the rows from agent-journal with "
    "this version as docs/operations.md ('Row format') describes (`agentstream replay --verify` checks the "
    "rebuilt rows)"
)


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


# --- format and upcasts --------------------------------------------------------------------------

# A row value's shape, named for its decoder: the upcasts of a new format are per shape (`a` and
# `p` rows share the offset shape).
Shape = Literal["meta", "cell", "idempotency", "offset", "slot", "positions"]
Upcast = Callable[[Shape, bytes], bytes]


def upcast_v1_to_v2(shape: Shape, body: bytes) -> bytes:
    """Format 2 added only the version marker: every format-1 shape is format 2's."""
    return body


# UPCASTS[n] takes a row body (its value without the marker) from format n to format n + 1.
UPCASTS: dict[int, Upcast] = {1: upcast_v1_to_v2}


def upcast(shape: Shape, version: int, body: bytes) -> bytes:
    """`body`, written in format `version`, in this format's shape: every step from `version` on."""
    if version > ROW_FORMAT:
        article = "an" if shape[0] in "aeiou" else "a"
        raise RowFormatError(
            f"{article} {shape} row is in row format {version}, newer than format {ROW_FORMAT} that this agentstream "
            "reads: a newer version wrote it. " + _REMEDY
        )
    while version < ROW_FORMAT:
        body = UPCASTS[version](shape, body)
        version += 1
    return body


def row_version(value: bytes) -> int:
    """The format a row value was written in (no marker: format 1)."""
    if value[:1] != _CURRENT[:1]:
        return 1
    if len(value) < 2 or value[1] < 2:  # format 1 had no marker
        raise ValueError(f"row value {value[:8]!r} has a format marker but no format version after it")
    return value[1]


def _body(shape: Shape, value: bytes) -> bytes:
    """A stored row value as this version writes it, without its marker."""
    if value[:2] == _CURRENT:
        return value[2:]
    version = row_version(value)
    return upcast(shape, version, value if version == 1 else value[2:])


def encode_format() -> bytes:
    return str(ROW_FORMAT).encode()


def check_format(value: bytes | None, partition: int) -> int:
    """The format a partition's format row names (None, absent: 1), if this version reads it; else
    `RowFormatError`.

    Absent means a new store, or one written before the format row existed (format 1 exactly).
    An older format is read through the upcasts; the caller records `ROW_FORMAT` once it writes.
    """
    if value is None:
        return 1
    try:
        stored = int(value)
    except ValueError:
        stored = 0
    if 1 <= stored <= ROW_FORMAT:
        return stored
    found = value.decode(errors="backslashreplace")
    if stored > ROW_FORMAT:
        raise RowFormatError(
            f"partition {partition}: the stored rows are in row format {stored}, newer than format {ROW_FORMAT} "
            f"that this agentstream reads and writes: a newer version wrote them. {_REMEDY}"
        )
    raise RowFormatError(
        f"partition {partition}: the format row holds {found!r}, which names no row format (this agentstream "
        f"reads formats 1 to {ROW_FORMAT}). Rebuild the rows from agent-journal as docs/operations.md "
        "('Row format') describes (`agentstream replay --verify` checks the rebuilt rows)"
    )


# --- items -----------------------------------------------------------------------------------------

_ITEM_JSON = ContextItem.__pydantic_serializer__.to_json  # model_dump_json's bytes, minus its wrapper
_CELL = _aliases(CellRow)
# By hand, one bytes formatting per changed item: the marker, the numbers under `CellRow`'s stored
# names, and the item's JSON spliced in as the serializer gives it (`u` only when set). The stored
# names are pure ASCII, so latin-1 turns the text into those bytes one for one.
_CELL_HEAD = f'{_CURRENT_TEXT}{{"{_CELL["offset"]}":%d,"{_CELL["created_offset"]}":%d,"{_CELL["seq"]}":%d'
_CELL_ROW = f'{_CELL_HEAD},"{_CELL["item"]}":%b}}'.encode("latin-1")
_UPDATING_CELL_ROW = f'{_CELL_HEAD},"{_CELL["updates_offset"]}":%d,"{_CELL["item"]}":%b}}'.encode("latin-1")


def encode_cell(cell: Cell) -> bytes:
    item = _ITEM_JSON(cell.item, exclude_none=True)
    if cell.updates_offset is None:
        return _CELL_ROW % (cell.offset, cell.created_offset, cell.seq, item)
    return _UPDATING_CELL_ROW % (cell.offset, cell.created_offset, cell.seq, cell.updates_offset, item)


def decode_cell_row(value: bytes) -> CellRow:
    return CellRow.model_validate_json(_body("cell", value))


def decode_cell(value: bytes) -> Cell:
    row = decode_cell_row(value)
    return Cell(row.seq, row.offset, row.item, row.updates_offset, row.created_offset)


# --- metadata ----------------------------------------------------------------------------------------


def encode_meta(state: AgentState, sources: SourceOffsets) -> bytes:
    """Everything but the items, and how far the stream's commands are journaled per topic.

    Written once per journaled event, so by hand: dict literals under the stored names of `MetaRow`
    (tests/processors/test_row_codec.py checks they are exactly its fields, in order).
    """
    pending, request, usage, report = state.pending, state.open, state.usage, state.over_threshold
    return _CURRENT + orjson.dumps(
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
    return MetaRow.model_validate_json(_body("meta", value))


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
    return _CURRENT + orjson.dumps(_wire(IdempotencyRow, offset=offset, type=event_type, hash=payload_hash))


def decode_idempotency_row(value: bytes) -> IdempotencyRow:
    return IdempotencyRow.model_validate_json(_body("idempotency", value))


def decode_idempotency(value: bytes) -> tuple[int, str, str]:
    row = decode_idempotency_row(value)
    return row.offset, row.type, row.hash


def encode_offset(offset: int) -> bytes:
    """An append-id row and a journal position row: an offset as decimal text."""
    return b"%b%d" % (_CURRENT, offset)


def decode_offset(value: bytes) -> int:
    return int(_body("offset", value))


def encode_append_slot(append_id: str) -> bytes:
    """A slot of a stream's append-id window: the append id holding it, as text."""
    return _CURRENT + append_id.encode()


def decode_append_slot(value: bytes) -> str:
    return _body("slot", value).decode()


def encode_command_positions(appends: int, internal: int) -> bytes:
    return _CURRENT + orjson.dumps(_wire(CommandPositionsRow, appends=appends, internal=internal))


def decode_command_positions_row(value: bytes) -> CommandPositionsRow:
    return CommandPositionsRow.model_validate_json(_body("positions", value))


def decode_command_positions(value: bytes) -> tuple[int, int]:
    row = decode_command_positions_row(value)
    return row.appends, row.internal


def decode_row(key: bytes, value: bytes) -> Any:
    """Any row's value as this version reads it (upcast, validated; the format row's version):
    what `agentstream replay --verify` compares, so that rows of an older format equal their
    rebuild. `ValueError` for a key of no known kind or a value its kind refuses."""
    kind = key.partition(rows.SEP)[0]
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise ValueError(f"no kind of row has keys starting {kind!r}")
    return decoder(value)


def _decode_format(value: bytes) -> int:
    return int(value)  # decimal text, no marker: it says which format the others are in


_DECODERS: dict[bytes, Callable[[bytes], Any]] = {
    rows.META: decode_meta_row,
    rows.ITEM: decode_cell_row,
    rows.IDEMPOTENCY: decode_idempotency_row,
    rows.APPEND_ID: decode_offset,
    rows.APPEND_SLOT: decode_append_slot,
    rows.POSITION: decode_offset,
    rows.COMMAND_POSITIONS: decode_command_positions_row,
    rows.FORMAT: _decode_format,
}


def change_rows(path: str, changes: dict[tuple[LaneName, int], Cell | None]) -> Iterator[rows.Row]:
    """The item rows of a stream's drained changes (value None: the item row is deleted)."""
    for (lane, seq), cell in changes.items():
        yield rows.item_key(path, lane, seq), None if cell is None else encode_cell(cell)
