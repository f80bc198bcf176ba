"""Dedupe rows and how long they are kept (docs/behaviour.md §1, "Dedupe window"). Pure.

Two kinds of rows recognise a command whose event is journaled already:

- an idempotency-key row (`k`) per event that has a key: kept forever, since a key names one
  exact event forever;
- an append-id row (`a`) per command that carries an `appendId`. An append id only catches the
  same command sent twice (a producer's retry, a client sending a command again), which happens
  soon after the first send; a record the worker reads again after a crash is recognised by its
  source offset instead (`SourceOffsets`). So append ids are kept for a window of the stream's
  last `window` events: the append id of the event at offset o takes slot `o mod window` of the
  stream (an `r` row), and the next event with an append id in that slot forgets it. Memory and
  disk per stream are bounded by the window, and the rows are a function of the journal alone
  (replay rebuilds them exactly).
"""

from __future__ import annotations

from collections.abc import Callable

from processors import row_codec, rows

DEFAULT_APPEND_ID_WINDOW = 10_000

RowReader = Callable[[bytes], "bytes | None"]


def dedupe_rows(
    path: str,
    offset: int,
    event_type: str,
    idempotency_key: str | None,
    digest: str | None,
    append_id: str | None,
    *,
    window: int,
    read: RowReader,
    append_key: bytes | None = None,
) -> list[rows.Row]:
    """The dedupe rows a journaled event writes (and the append-id row it makes the window forget).

    `digest` is the payload hash, required with an idempotency key; `read` sees every row written
    before this event; `append_key`, when given, is `rows.append_id_key(path, append_id)` (the
    caller built it to look the append id up).
    """
    changed: list[rows.Row] = []
    if idempotency_key is not None:
        assert digest is not None, "an idempotency key row needs the payload digest"
        changed.append(
            (rows.idempotency_key(path, idempotency_key), row_codec.encode_idempotency(offset, event_type, digest))
        )
    if append_id is not None:
        slot = rows.append_slot_key(path, offset % window)
        # Below the window, slot `offset` was never taken (an earlier event of any window size
        # takes a lower slot), so the read is spared: most streams never fill their window.
        forgotten = read(slot) if offset >= window else None
        if forgotten is not None:
            changed.append((rows.append_id_key(path, row_codec.decode_append_slot(forgotten)), None))
        if append_key is None:
            append_key = rows.append_id_key(path, append_id)
        changed.append((append_key, row_codec.encode_offset(offset)))
        changed.append((slot, row_codec.encode_append_slot(append_id)))
    return changed
