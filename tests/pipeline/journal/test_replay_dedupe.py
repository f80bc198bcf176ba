"""Replay writes the dedupe rows itself (`PartitionFold.fold`, keys from per-stream prefixes), not
through `processors.dedupe.dedupe_rows`: its rows must be the live path's, byte for byte, also
when a small append-id window fills and slots forget older append ids, across batch boundaries.
No broker."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.journal.replay_fold import PartitionFold, Record
from processors import rows
from processors.journal import Journaled, journal_command
from processors.state import AgentState, SourceOffsets
from schemas.events import CONTEXT_ADDED, AppendCommand
from topics.headers import H_APPEND_ID, H_SOURCE_OFFSET

PATHS = ["/agents/a", "/agents/b/c", "/agents/~x"]

# One command: (stream, append id or None, idempotency key or None); few ids, so they repeat.
COMMANDS = st.lists(
    st.tuples(
        st.sampled_from(PATHS),
        st.none() | st.sampled_from(["x", "y", "z", "w", "ü/1"]),
        st.none() | st.sampled_from(["k1", "k2", "k3"]),
    ),
    max_size=40,
)


def live_journal(commands: list[tuple[str, str | None, str | None]], window: int) -> tuple[list[Record], dict]:
    """The records and rows of the live path (`journal_command`) with this append-id window;
    commands it refuses (a duplicate append id or key) are not journaled, as in the worker."""
    states: dict[str, AgentState] = {}
    stored: dict[bytes, bytes | None] = {}
    records: list[Record] = []
    for n, (path, append_id, key) in enumerate(commands):
        command: dict = {"streamPath": path, "type": CONTEXT_ADDED, "payload": {"role": "user", "content": f"{n}"}}
        if append_id is not None:
            command["appendId"] = append_id
        if key is not None:
            command["idempotencyKey"] = key
        state = states.setdefault(path, AgentState(stream_path=path))
        outcome = journal_command(
            state,
            AppendCommand.model_validate_json(orjson.dumps(command)),
            now_ms=1_796_000_000_000 + n,
            sources=SourceOffsets(n, -1),
            read=stored.get,
            append_id_window=window,
        )
        if not isinstance(outcome, Journaled):
            continue
        stored.update(outcome.rows)
        headers = [(H_SOURCE_OFFSET, str(n).encode())]
        if append_id is not None:
            headers.append((H_APPEND_ID, append_id.encode()))
        records.append((len(records), outcome.record, headers))
    return records, stored


DEDUPE_KINDS = (rows.IDEMPOTENCY + rows.SEP, rows.APPEND_ID + rows.SEP, rows.APPEND_SLOT + rows.SEP)


def dedupe_only(stored: dict[bytes, bytes | None]) -> dict[bytes, bytes]:
    return {key: value for key, value in stored.items() if value is not None and key.startswith(DEDUPE_KINDS)}


@settings(max_examples=300, deadline=None)
@given(commands=COMMANDS, window=st.integers(1, 4), batch=st.integers(1, 7))
def test_replayed_dedupe_rows_equal_the_live_paths(
    commands: list[tuple[str, str | None, str | None]], window: int, batch: int
) -> None:
    records, live = live_journal(commands, window)
    stored: dict[bytes, bytes | None] = {}
    fold = PartitionFold(0, append_id_window=window, read=stored.get)  # `read`: the rows written before
    for start in range(0, len(records), batch):
        fold.fold(records[start : start + batch])
        stored.update(fold.take())
    assert dedupe_only(stored) == dedupe_only(live)


def test_a_full_window_forgets_the_append_id_its_slot_held() -> None:
    records, live = live_journal([("/agents/a", "x", None), ("/agents/a", "y", "k"), ("/agents/a", "z", None)], 2)
    stored: dict[bytes, bytes | None] = {}
    fold = PartitionFold(0, append_id_window=2, read=stored.get)
    for record in records:
        fold.fold([record])
        stored.update(fold.take())
    assert rows.append_id_key("/agents/a", "x") not in dedupe_only(stored)  # slot 0 now holds z
    assert dedupe_only(stored) == dedupe_only(live)
    assert rows.append_slot_key("/agents/a", 0) in stored and rows.idempotency_key("/agents/a", "k") in stored
