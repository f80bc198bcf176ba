"""The projection as store rows: one metadata row per stream plus one row per context item.

Keys sort so that a prefix scan returns a stream's items in lane order:

    m\\0<path>                          stream metadata (turn state, cursor, seq counters)
    i\\0<path>\\0<lane><seq>              one context item; <seq> is 8 bytes, order-preserving
    k\\0<path>\\0<idempotencyKey>         the event an idempotency key names
    a\\0<path>\\0<appendId>               the offset a client append id was journaled at
    p\\0<partition>                     journal position folded into this partition's rows
    c\\0<partition>                     command topics' positions: where reading resumes (not
                                        derived from the journal; replay has none)

An event rewrites only the rows it touched, so bytes written per event do not grow with the
projection. Pure: no store or Kafka here.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

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
    UsageReport,
)
from schemas.config import AgentConfig
from schemas.context import ContextItem

META, ITEM, IDEMPOTENCY, APPEND_ID, POSITION, COMMAND_POSITIONS = b"m", b"i", b"k", b"a", b"p", b"c"
SEP = b"\x00"
_LANE_TAGS: dict[LaneName, bytes] = {"system": b"s", "history": b"h"}
_SEQ = struct.Struct(">Q")
_SEQ_BIAS = 1 << 63  # seqs go negative (compaction summaries); bias keeps byte order = numeric order

Row = tuple[bytes, bytes | None]  # value None deletes the row


def _path_bytes(path: str) -> bytes:
    """A path as a key component. The separator can never occur inside it, so every key names
    exactly one stream and a stream's prefix scan can never reach another stream's rows (valid
    stream paths cannot contain NUL; this guard keeps keys injective whatever the caller checked)."""
    if "\x00" in path:
        raise ValueError(f"stream path {path!r} contains NUL; it cannot name rows")
    return path.encode()


def meta_key(path: str) -> bytes:
    return META + SEP + _path_bytes(path)


def items_prefix(path: str) -> bytes:
    return ITEM + SEP + _path_bytes(path) + SEP


def item_key(path: str, lane: LaneName, seq: int) -> bytes:
    return items_prefix(path) + _LANE_TAGS[lane] + _SEQ.pack(seq + _SEQ_BIAS)


def idempotency_key(path: str, key: str) -> bytes:
    return IDEMPOTENCY + SEP + _path_bytes(path) + SEP + key.encode()


def append_id_key(path: str, append_id: str) -> bytes:
    return APPEND_ID + SEP + _path_bytes(path) + SEP + append_id.encode()


def position_key(partition: int) -> bytes:
    return POSITION + SEP + str(partition).encode()


def command_positions_key(partition: int) -> bytes:
    return COMMAND_POSITIONS + SEP + str(partition).encode()


def stream_of_key(key: bytes) -> str | None:
    """The stream path a row belongs to (None for partition rows)."""
    kind, _, rest = key.partition(SEP)
    if kind == META:
        return rest.decode()
    if kind in (ITEM, IDEMPOTENCY, APPEND_ID):
        return rest.split(SEP, 1)[0].decode()
    return None


# --- items -------------------------------------------------------------------------------------


_ITEM_JSON = ContextItem.__pydantic_serializer__.to_json  # model_dump_json's bytes, minus its wrapper


def encode_cell(cell: Cell) -> bytes:
    body = _ITEM_JSON(cell.item, exclude_none=True)
    head = f'{{"o":{cell.offset},"c":{cell.created_offset},"s":{cell.seq}'
    if cell.updates_offset is not None:
        head += f',"u":{cell.updates_offset}'
    return f'{head},"i":'.encode() + body + b"}"


def decode_cell(value: bytes) -> Cell:
    row = orjson.loads(value)
    return Cell(row["s"], row["o"], ContextItem.model_validate(row["i"]), row.get("u"), row["c"])


def change_rows(path: str, changes: dict[tuple[LaneName, int], Cell | None]) -> Iterator[Row]:
    for (lane, seq), cell in changes.items():
        yield item_key(path, lane, seq), None if cell is None else encode_cell(cell)


# --- metadata ----------------------------------------------------------------------------------


def encode_meta(state: AgentState, sources: SourceOffsets) -> bytes:
    """Everything but the items, and how far the stream's commands are journaled per topic."""
    return orjson.dumps(
        {
            "path": state.stream_path,
            "cursor": state.cursor,
            "sourceOffset": sources.appends,
            "internalSourceOffset": sources.internal,
            "publishedThrough": state.published_through,
            "created": state.created,
            "config": _config_patch(state.config),
            "pending": None if state.pending is None else _slots(state.pending),
            "open": None if state.open is None else _slots(state.open),
            "paused": state.paused,
            "pauseTriggerOffset": state.pause_trigger_offset,
            "latestExternalTrigger": state.latest_external_trigger,
            "autonomousTurnCount": state.autonomous_turn_count,
            "consecutiveLlmFailures": state.consecutive_llm_failures,
            "usage": _slots(state.usage),
            "compactedThrough": state.compacted_through,
            "overThreshold": None if state.over_threshold is None else _slots(state.over_threshold),
            "lastRequestCreatedAt": state.last_request_created_at,
            "lastEventCreatedAt": state.last_event_created_at,
            "scripts": [_slots(run) for run in state.scripts.values()],
            "seqs": [
                state.system.next_seq,
                state.system.next_front_seq,
                state.history.next_seq,
                state.history.next_front_seq,
            ],
        }
    )


@functools.lru_cache(maxsize=1024)
def _config_patch(config: AgentConfig) -> dict[str, Any]:
    # Configurations are immutable and few (most agents keep the defaults): dump each once.
    return config.model_dump(exclude_defaults=True)


def _slots(value: Any) -> dict[str, Any]:
    return {name: getattr(value, name) for name in value.__slots__}


def decode_meta(value: bytes) -> tuple[AgentState, SourceOffsets]:
    """The state without items, and the recorded source offsets."""
    meta = orjson.loads(value)
    state = AgentState(
        stream_path=meta["path"],
        cursor=meta["cursor"],
        published_through=meta["publishedThrough"],
        created=meta["created"],
        config=AgentConfig.model_validate(meta["config"]),
        pending=None if meta["pending"] is None else PendingTrigger(**meta["pending"]),
        open=None if meta["open"] is None else OpenRequest(**meta["open"]),
        paused=meta["paused"],
        pause_trigger_offset=meta["pauseTriggerOffset"],
        latest_external_trigger=meta["latestExternalTrigger"],
        autonomous_turn_count=meta["autonomousTurnCount"],
        consecutive_llm_failures=meta["consecutiveLlmFailures"],
        usage=TokenUsage(**meta["usage"]),
        compacted_through=meta["compactedThrough"],
        over_threshold=None if meta["overThreshold"] is None else UsageReport(**meta["overThreshold"]),
        last_request_created_at=meta["lastRequestCreatedAt"],
        last_event_created_at=meta["lastEventCreatedAt"],
        # Rows written before script runs existed have no "scripts".
        scripts={run["executionId"]: ScriptRun(**run) for run in meta.get("scripts", ())},
    )
    seqs = meta["seqs"]
    state.system.next_seq, state.system.next_front_seq = seqs[0], seqs[1]
    state.history.next_seq, state.history.next_front_seq = seqs[2], seqs[3]
    return state, SourceOffsets(meta["sourceOffset"], meta.get("internalSourceOffset", -1))


def load_state(meta_value: bytes, item_rows: Iterable[tuple[bytes, bytes]]) -> tuple[AgentState, SourceOffsets]:
    """Rebuild a stream's state from its metadata row and its item rows (in key order).

    Rows written after the metadata row (a crash between an event's item rows and its metadata
    row) lie outside the recorded seq range and are ignored; re-folding the journal tail rewrites
    them identically.
    """
    state, sources = decode_meta(meta_value)
    for key, value in item_rows:
        lane = state.system if key[-9:-8] == _LANE_TAGS["system"] else state.history
        seq = _SEQ.unpack(key[-8:])[0] - _SEQ_BIAS
        if not lane.next_front_seq < seq < lane.next_seq:
            continue
        _restore_cell(lane, decode_cell(value))
    return state, sources


def _restore_cell(lane: Lane, cell: Cell) -> None:
    lane.cells.append(cell)
    key = cell.item.key
    if key is not None:
        lane.by_key[key] = cell  # rows come in lane order, so the last occurrence wins


def encode_idempotency(offset: int, event_type: str, payload_hash: str) -> bytes:
    return orjson.dumps({"offset": offset, "type": event_type, "hash": payload_hash})


def decode_idempotency(value: bytes) -> tuple[int, str, str]:
    row = orjson.loads(value)
    return row["offset"], row["type"], row["hash"]
