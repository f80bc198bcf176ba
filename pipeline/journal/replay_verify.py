"""`replay --verify`: every row on which the live store and a replayed store disagree.

Both stores are walked side by side in key order, so stores of any size compare in constant memory.
Rows are compared as this version reads them (decoded, rows of an older format upcast), so a live
store still holding older rows equals its rebuild in the current format (docs/operations.md, "Row
format"). Bookkeeping the journal cannot rebuild is left out (Faust's changelog offset, the command
topics' read positions, the journal position the live worker records one checkpoint late, and the
format row, which says how rows are encoded, not what they hold).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from pipeline.journal.replay_store import FAUST_OFFSET_KEY, open_rows
from processors import row_codec, rows

# Rows verify does not compare.
BOOKKEEPING = (rows.COMMAND_POSITIONS + rows.SEP, rows.POSITION + rows.SEP, rows.FORMAT + rows.SEP)


@dataclass(frozen=True, slots=True)
class RowDifference:
    """One row that the live store and the replayed store do not agree on."""

    partition: int
    key: bytes
    live: bytes | None
    replayed: bytes | None
    detail: str = ""  # what differs, when both stores hold the row

    @property
    def stream(self) -> str | None:
        return _owner(self.key)

    @property
    def kind(self) -> str:
        if self.replayed is None:
            return "live only"
        return "replay only" if self.live is None else "values differ"

    def __str__(self) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        return f"partition {self.partition}: {describe_key(self.key)}: {self.kind}{detail}"


def _owner(key: bytes) -> str | None:
    """The stream a row belongs to; None for partition rows and rows no stream can own."""
    try:
        return rows.stream_of_key(key)
    except ValueError:  # not UTF-8: garbage, no stream's row
        return None


def _text(raw: bytes) -> str:
    text = raw.decode(errors="backslashreplace")
    return text if text.isprintable() else repr(text)  # one line whatever the row holds


def describe_key(key: bytes) -> str:
    """A row key for people: which stream, which kind of row."""
    kind, _, rest = key.partition(rows.SEP)
    path, _, tail = rest.partition(rows.SEP)
    if kind == rows.META and _owner(key) is not None:
        return f"{_text(rest)} metadata row"
    if kind == rows.ITEM and len(tail) == 9 and _owner(key) is not None:
        lane = {b"s": "system", b"h": "history"}.get(tail[:1], _text(tail[:1]))
        seq = struct.unpack(">Q", tail[1:])[0] - (1 << 63)
        return f"{_text(path)} item row ({lane} lane, seq {seq})"
    if kind == rows.IDEMPOTENCY and _owner(key) is not None:
        return f"{_text(path)} idempotency row (key {_text(tail)})"
    if kind == rows.APPEND_ID and _owner(key) is not None:
        return f"{_text(path)} append-id row ({_text(tail)})"
    if kind == rows.APPEND_SLOT and len(tail) == 8 and _owner(key) is not None:
        return f"{_text(path)} append-id window row (slot {struct.unpack('>Q', tail)[0]})"
    if kind == rows.POSITION:
        return f"journal position row ({_text(rest)})"
    if kind == rows.FORMAT:
        return f"row format row ({_text(rest)})"
    return f"row {key!r} (no stream owns it)"


def compare(key: bytes, live: bytes, replayed: bytes) -> str | None:
    """None when both values read the same (decoded, upcast to this version's format); else what
    differs, for people: the stored names of the fields that differ, both values of a scalar row,
    or why a side cannot be read (then the bytes decide)."""
    if live == replayed:
        return None
    decoded: list[object] = []
    unreadable: dict[str, str] = {}
    for side, value in (("live", live), ("replayed", replayed)):
        try:
            decoded.append(row_codec.decode_row(key, value))
        except (ValueError, row_codec.RowFormatError) as error:
            unreadable[side] = str(error).splitlines()[0]
    if len(set(unreadable.values())) == 1 and len(unreadable) == 2:
        return f"both rows unreadable: {unreadable['live']}"
    if unreadable:
        return "; ".join(f"{side} row unreadable: {reason}" for side, reason in unreadable.items())
    before, after = decoded
    if before == after:
        return None
    if isinstance(before, BaseModel) and isinstance(after, BaseModel):
        old, new = before.model_dump(by_alias=True), after.model_dump(by_alias=True)
        return "differing fields: " + ", ".join(name for name in old if old[name] != new.get(name))
    return f"live {before!r}, replayed {after!r}"


def _rows_at(path: Path) -> Iterator[tuple[bytes, bytes]]:
    """Every row of one partition's store in key order, but bookkeeping the journal cannot
    rebuild: Faust's changelog offset, the command topics' read positions, the journal position
    `p`, which the live worker records one checkpoint late (a lower bound for recovery;
    docs/architecture.md, "Commit protocol"), and the format row `v` (a live store may still be
    in an older format, read through the upcasts)."""
    if not path.exists():
        return
    db = open_rows(path, read_only=True)
    try:
        for key, value in db.items():
            if key != FAUST_OFFSET_KEY and not key.startswith(BOOKKEEPING):
                yield bytes(key), bytes(value)
    finally:
        db.close()


def _merged(
    live: Iterator[tuple[bytes, bytes]], replayed: Iterator[tuple[bytes, bytes]]
) -> Iterator[tuple[bytes, bytes | None, bytes | None]]:
    """(key, live value, replayed value) over both stores, walked side by side in key order.

    Both iterate sorted (RocksDB's bytewise order), so a store of any size is compared in
    constant memory.
    """
    left, right = next(live, None), next(replayed, None)
    while left is not None or right is not None:
        if right is None or (left is not None and left[0] < right[0]):
            assert left is not None
            yield left[0], left[1], None
            left = next(live, None)
        elif left is None or right[0] < left[0]:
            yield right[0], None, right[1]
            right = next(replayed, None)
        else:
            yield left[0], left[1], right[1]
            left, right = next(live, None), next(replayed, None)


def verify(replayed_dir: Path, live_paths: dict[int, Path], only_path: str | None = None) -> list[RowDifference]:
    """Every row that differs between the live and the replayed store (missing on either side too).

    All rows are compared, not only those a stream's state is loaded from: a stray row (a stream's
    row in another partition, an item no event made, a key no stream owns) is a difference. Values
    are compared decoded (`compare`), not byte for byte. With `only_path` only that stream's rows
    are compared.
    """
    differences: list[RowDifference] = []
    for partition, live_path in sorted(live_paths.items()):
        replayed = _rows_at(replayed_dir / f"rows-{partition}.db")
        for key, live, again in _merged(_rows_at(live_path), replayed):
            if only_path is not None and _owner(key) != only_path:
                continue
            if live is None or again is None:
                differences.append(RowDifference(partition, key, live, again))
                continue
            detail = compare(key, live, again)
            if detail is not None:
                differences.append(RowDifference(partition, key, live, again, detail))
    return differences
