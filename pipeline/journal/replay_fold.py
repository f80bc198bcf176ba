"""Replay's fold: journal records -> the rows of one partition, one batch at a time (no I/O here).

The rows are exactly those `PartitionEngine.catch_up` stores for the same records on an empty
store (same decoding, same reducer, same row codec `processors.row_codec`; the unit tests
check the two against each other and against the live path). Three things make it cheaper:

- the cheapest exact decoding per record (see `decode_record`). The idempotency row needs the
  digest of the event's raw payload (`processors.journal.payload_hash`); hashing the validated
  payload model dumped again would not be byte-identical: validation coerces
  (`compactionTriggerFraction: 1` becomes `1.0`), and a different digest turns a retried command
  into an idempotency conflict. So the digest always hashes the parsed JSON payload.
- rows are encoded once per batch, not once per event. The reducer records which item rows an
  event changed (`state.changes`); the fold drains them, with the metadata row of every stream
  the batch touched, when the batch is taken. An item replaced or dropped within a batch is
  encoded once or never, and the metadata row (the costliest encoding) once per stream per batch.
  The stored result is the same: each row's last value within the batch.
- the dedupe rows are staged by the fold itself, in `processors.dedupe.dedupe_rows`' order and with
  its encodings, from key prefixes built once per stream (test_replay_dedupe.py holds them to the
  live path's, small windows that fill included).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable, Sequence
from typing import get_args

import orjson

from processors import dedupe, row_codec, rows
from processors.dedupe import RowReader
from processors.journal import payload_hash
from processors.reducer import fold
from processors.state import AgentState, LaneName, SourceOffsets
from schemas.events import (
    CONSUMED_TYPES,
    EnvelopeError,
    InvalidPayloadEvent,
    JournalEvent,
    decode_event,
)
from topics.headers import H_APPEND_ID, H_SOURCE_OFFSET, H_SOURCE_TOPIC, INTERNAL

log = logging.getLogger("agentstream.replay")

# (kafka offset, value, headers as confluent-kafka gives them: a list of (name, bytes) or None)
Record = tuple[int, bytes, Sequence[tuple[str, bytes]] | None]
Event = JournalEvent | InvalidPayloadEvent

_TYPE_FIELD = b'"type":"'  # the envelope's third field as the worker writes it (streamPath holds no quote)
_CONSUMED = frozenset(event_type.encode() for event_type in CONSUMED_TYPES)
_SLOT = struct.Struct(">Q")  # an append-id window slot's number, the last part of its key (`rows.append_slot_key`)
# An item's seq, the last part of its key (`rows.item_key`): biased so that byte order is numeric order.
_SEQ, _SEQ_BIAS = struct.Struct(">Q"), 1 << 63
_LANES: tuple[LaneName, ...] = get_args(LaneName)
# Row values built inline from a format (test_replay_fold.py holds them to the codec's functions):
_MARK = row_codec.encode_append_slot("")  # an append-id slot: the marker, then the id's bytes
_OFFSET_ROW = row_codec.encode_offset(0)[:-1] + b"%d"  # an append-id row: the marker, then the offset


def decode_record(value: bytes) -> tuple[Event, str | None]:
    """The event of a journal record and, if it has an idempotency key, its payload digest:
    `payload_hash(event.type, <the raw payload>)`, byte for byte the engine's and the live path's.
    Raises `EnvelopeError` where `decode_event` does.

    Each record is parsed by the cheapest exact route (measured): an event type the agent consumes
    is validated straight from the bytes, and only a keyed one is parsed again for its digest
    (validating a typed payload from a parsed dict costs more than that second parse saves). Any
    other type is parsed once and validated from the dict, where `decode_event` parses it twice
    (typed, then as `OtherEvent`) and a keyed one a third time for the digest.
    """
    if _sniffed_type(value) not in _CONSUMED:
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError:
            parsed = None  # decode_event decides (and words the error) as in the engine
        if type(parsed) is dict:
            # Hashed before validation: the digest is of the raw payload whatever a validator does.
            digest = None
            if parsed.get("idempotencyKey") is not None:
                digest = payload_hash(parsed.get("type"), parsed.get("payload"))
            event = decode_event(parsed)
            return event, digest if event.idempotencyKey is not None else None
    event = decode_event(value)
    if event.idempotencyKey is None:
        return event, None
    return event, payload_hash(event.type, orjson.loads(value)["payload"])


def _sniffed_type(value: bytes) -> bytes | None:
    """The event type, read off the bytes without parsing: it only picks the route, so a record
    laid out otherwise is decoded exactly all the same."""
    start = value.find(_TYPE_FIELD)
    if start < 0:
        return None
    start += len(_TYPE_FIELD)
    end = value.find(b'"', start)
    return None if end < 0 else value[start:end]


def journal_headers(headers: Sequence[tuple[str, bytes]] | None) -> tuple[bool, int, bytes | None]:
    """(read from the internal command topic, source offset, append id as UTF-8) of a journal record.

    The append id is checked to be UTF-8 (`UnicodeDecodeError` as the live path's decoding raises)
    and kept in bytes: its rows hold it encoded."""
    internal, source_offset, append_id = False, -1, None
    for name, value in headers or ():
        if name == H_SOURCE_OFFSET:
            source_offset = int(value)
        elif name == H_SOURCE_TOPIC:
            internal = value == INTERNAL
        elif name == H_APPEND_ID:
            value.decode()  # only checked: a key and a slot hold the bytes of the decoded id
            append_id = value
    return internal, source_offset, append_id


class _Stream:
    __slots__ = (
        "append_id_prefix",
        "appends",
        "idempotency_prefix",
        "internal",
        "item_prefixes",
        "path",
        "slot_prefix",
        "state",
    )

    def __init__(self, path: str) -> None:
        self.path = path
        self.state = AgentState(stream_path=path, changes={})
        # `SourceOffsets` as two counters: the frozen value is built once per batch, for the metadata row.
        self.appends = self.internal = -1
        # The stream's dedupe keys without their last part, built once: the fold writes
        # `processors.dedupe.dedupe_rows`'s rows itself, one or two per event.
        self.idempotency_prefix = rows.idempotency_key(path, "")
        self.append_id_prefix = rows.append_id_key(path, "")
        self.slot_prefix = rows.append_slot_key(path, 0)[: -_SLOT.size]
        # Its item keys likewise, per lane (`row_codec.change_rows`' keys, built once per stream).
        self.item_prefixes = {lane: rows.item_key(path, lane, 0)[: -_SEQ.size] for lane in _LANES}

    def sources(self) -> SourceOffsets:
        return SourceOffsets(self.appends, self.internal)


class PartitionFold:
    """Every stream of one partition, folded from its journal into a fresh store, batch by batch.

    `fold(records)` any number of times, then `take()` the rows to write: item, metadata and
    dedupe rows, the partition's journal position and its row format (value None: delete).
    `read` sees the rows taken and written before (the append-id window reads them).
    """

    def __init__(
        self,
        partition: int,
        *,
        append_id_window: int = dedupe.DEFAULT_APPEND_ID_WINDOW,
        read: RowReader = lambda _key: None,
    ) -> None:
        self.partition = partition
        self.append_id_window = append_id_window
        self.read = read
        self.streams: dict[str, _Stream] = {}
        self.folded = 0  # events folded (records skipped as already folded or not events excluded)
        # A replayed store is in this version's row format, like the live one.
        self._rows: dict[bytes, bytes | None] = {rows.format_key(partition): row_codec.encode_format()}
        self._touched: dict[str, _Stream] = {}
        self._position: int | None = None

    def fold(self, records: Iterable[Record]) -> int:
        """Fold journal records of this partition in offset order; how many events were folded."""
        streams, staged, touched = self.streams, self._rows, self._touched
        # Bound once: this loop runs once per journal record.
        read, window, pack_slot = self._read, self.append_id_window, _SLOT.pack
        encode_idempotency, offset_row = row_codec.encode_idempotency, _OFFSET_ROW
        folded = 0
        kafka_offset = None  # the last record's offset is the partition's position
        for kafka_offset, value, headers in records:
            try:
                event, digest = decode_record(value)
            except EnvelopeError as error:
                log.error("journal partition %d offset %d is not an event: %s", self.partition, kafka_offset, error)
                continue
            path = event.streamPath
            stream = streams.get(path)
            if stream is None:
                stream = streams[path] = _Stream(path)
            state = stream.state
            if event.offset <= state.cursor:
                continue  # journaled twice (a zombie writer): the first one counts, as in catch-up
            internal, source_offset, append_id = journal_headers(headers)
            if isinstance(event, InvalidPayloadEvent):
                log.error("journal @%d of %s has an invalid payload (skipped): %s", event.offset, path, event.reason)
            fold(state, event)
            # `SourceOffsets.advanced`
            if internal:
                if source_offset > stream.internal:
                    stream.internal = source_offset
            elif source_offset > stream.appends:
                stream.appends = source_offset
            # `dedupe.dedupe_rows`, staged in its order (tests/pipeline/journal/test_replay_dedupe.py).
            key = event.idempotencyKey
            if key is not None:
                staged[stream.idempotency_prefix + key.encode()] = encode_idempotency(event.offset, event.type, digest)
            if append_id is not None:
                offset = event.offset
                slot = stream.slot_prefix + pack_slot(offset % window)
                if offset >= window:  # below it, the slot was never taken (see `dedupe_rows`)
                    forgotten = read(slot)
                    if forgotten is not None:
                        staged[stream.append_id_prefix + row_codec.decode_append_slot(forgotten).encode()] = None
                # `row_codec.encode_offset(offset)` and `row_codec.encode_append_slot(<the id>)`, inline
                staged[stream.append_id_prefix + append_id] = offset_row % offset
                staged[slot] = _MARK + append_id
            touched[path] = stream
            folded += 1
        if kafka_offset is not None:
            self._position = kafka_offset
        self.folded += folded
        return folded

    def _read(self, key: bytes) -> bytes | None:
        if key in self._rows:
            return self._rows[key]
        return self.read(key)

    def take(self) -> dict[bytes, bytes | None]:
        """The rows changed since the last take (each with its latest value); starts a new batch."""
        staged = self._rows
        encode_cell, pack_seq = row_codec.encode_cell, _SEQ.pack
        for path, stream in self._touched.items():
            # `row_codec.change_rows`, with the stream's key prefixes
            prefixes = stream.item_prefixes
            for (lane, seq), cell in stream.state.drain_changes().items():
                staged[prefixes[lane] + pack_seq(seq + _SEQ_BIAS)] = None if cell is None else encode_cell(cell)
            staged[rows.meta_key(path)] = row_codec.encode_meta(stream.state, stream.sources())
        if self._position is not None:
            staged[rows.position_key(self.partition)] = row_codec.encode_offset(self._position)
        self._rows, self._touched, self._position = {}, {}, None
        return staged
