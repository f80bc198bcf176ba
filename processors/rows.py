"""The projection as store rows: the keys. One metadata row per stream plus one row per context item.

Keys sort so that a prefix scan returns a stream's items in lane order:

    m\\0<path>                          stream metadata (turn state, cursor, seq counters)
    i\\0<path>\\0<lane><seq>              one context item; <seq> is 8 bytes, order-preserving
    k\\0<path>\\0<idempotencyKey>         the event an idempotency key names
    a\\0<path>\\0<appendId>               the offset a client append id was journaled at
    r\\0<path>\\0<slot>                   the append id recorded in one slot of the stream's
                                        dedupe window (`processors.dedupe`)
    p\\0<partition>                     journal position folded into this partition's rows
    c\\0<partition>                     command topics' positions: where reading resumes (not
                                        derived from the journal; replay has none)
    v\\0<partition>                     the row format version (`processors.row_codec`)

An event rewrites only the rows it touched, so bytes written per event do not grow with the
projection. The values are `processors.row_codec`'s. Pure: no store or Kafka here.
"""

from __future__ import annotations

import functools
import struct

from processors.state import LaneName

META, ITEM, IDEMPOTENCY, APPEND_ID, APPEND_SLOT = b"m", b"i", b"k", b"a", b"r"
POSITION, COMMAND_POSITIONS, FORMAT = b"p", b"c", b"v"
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


@functools.lru_cache(maxsize=65_536)
def _stream_prefix(kind: bytes, path: str) -> bytes:
    # Cached: a stream's keys are built several times per event, always from the same few prefixes.
    return kind + SEP + _path_bytes(path) + SEP


@functools.lru_cache(maxsize=65_536)
def meta_key(path: str) -> bytes:
    return META + SEP + _path_bytes(path)


def items_prefix(path: str) -> bytes:
    return _stream_prefix(ITEM, path)


def item_key(path: str, lane: LaneName, seq: int) -> bytes:
    return _stream_prefix(ITEM, path) + _LANE_TAGS[lane] + _SEQ.pack(seq + _SEQ_BIAS)


def idempotency_key(path: str, key: str) -> bytes:
    return _stream_prefix(IDEMPOTENCY, path) + key.encode()


def append_id_key(path: str, append_id: str) -> bytes:
    return _stream_prefix(APPEND_ID, path) + append_id.encode()


def append_slot_key(path: str, slot: int) -> bytes:
    return _stream_prefix(APPEND_SLOT, path) + _SEQ.pack(slot)


def position_key(partition: int) -> bytes:
    return POSITION + SEP + str(partition).encode()


def command_positions_key(partition: int) -> bytes:
    return COMMAND_POSITIONS + SEP + str(partition).encode()


def format_key(partition: int) -> bytes:
    return FORMAT + SEP + str(partition).encode()


def stream_of_key(key: bytes) -> str | None:
    """The stream path a row belongs to (None for partition rows)."""
    kind, _, rest = key.partition(SEP)
    if kind == META:
        return rest.decode()
    if kind in (ITEM, IDEMPOTENCY, APPEND_ID, APPEND_SLOT):
        return rest.split(SEP, 1)[0].decode()
    return None


# --- items -------------------------------------------------------------------------------------


def item_of_key(key: bytes) -> tuple[LaneName, int]:
    """The lane and seq an item row's key names."""
    lane: LaneName = "system" if key[-9:-8] == _LANE_TAGS["system"] else "history"
    return lane, _SEQ.unpack(key[-8:])[0] - _SEQ_BIAS
