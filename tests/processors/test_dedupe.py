"""Dedupe rows and their retention (docs/behaviour.md §1, "Dedupe window"), without a broker."""

from __future__ import annotations

import pytest

from processors import row_codec, rows
from processors.dedupe import dedupe_rows
from processors.journal import Duplicate, Journaled
from schemas.events import CONTEXT_ADDED
from tests.support.journal_stream import PATH, JournaledStream


def test_1_dedupe_an_append_id_is_a_duplicate_while_within_the_streams_last_n_events() -> None:
    stream = JournaledStream(window=3)
    first = stream.send("one", append_id="send-1")
    assert isinstance(first, Journaled)
    stream.send("two")  # events without an append id count toward the window too
    again = stream.send("one", append_id="send-1")
    assert isinstance(again, Duplicate) and again.offset == first.event.offset


def test_1_dedupe_an_append_id_older_than_the_window_is_forgotten() -> None:
    stream = JournaledStream(window=3)
    stream.send("one", append_id="send-1")  # @1, slot 1
    for n in range(2, 5):
        stream.send(f"n{n}", append_id=f"send-{n}")  # @4 takes slot 1 again: send-1 is forgotten
    assert rows.append_id_key(PATH, "send-1") not in stream.rows
    assert isinstance(stream.send("one", append_id="send-1"), Journaled)


def test_1_dedupe_append_id_rows_stay_within_the_window_however_many_appends() -> None:
    stream = JournaledStream(window=5)
    for n in range(200):
        stream.send(f"n{n}", append_id=f"send-{n}")
    assert stream.count(rows.APPEND_ID) == 5 and stream.count(rows.APPEND_SLOT) == 5
    for n in range(195, 200):  # the last five are still recognised
        assert isinstance(stream.send(f"n{n}", append_id=f"send-{n}"), Duplicate)


def test_1_an_idempotency_key_names_its_event_forever_whatever_the_window() -> None:
    stream = JournaledStream(window=2)
    first = stream.send("keyed", key="web/msg/1")
    for n in range(20):
        stream.send(f"n{n}", append_id=f"send-{n}")
    again = stream.send("keyed", key="web/msg/1")
    assert isinstance(again, Duplicate) and again.offset == first.event.offset


@pytest.mark.parametrize("old", [b"old", row_codec.encode_append_slot("old")])  # format 1, format 2
def test_dedupe_rows_forget_the_slots_previous_append_id_before_recording_the_new_one(old: bytes) -> None:
    stored = {rows.append_slot_key(PATH, 1): old}
    changed = dedupe_rows(PATH, 4, CONTEXT_ADDED, None, None, "new", window=3, read=stored.get)
    assert changed == [
        (rows.append_id_key(PATH, "old"), None),
        (rows.append_id_key(PATH, "new"), b"\xff\x024"),
        (rows.append_slot_key(PATH, 1), b"\xff\x02new"),
    ]


def test_1_dedupe_the_event_at_offset_window_reads_slot_0_which_a_smaller_window_may_have_taken() -> None:
    """Below the window a slot was never taken, so its read is spared; at offset == window (slot 0)
    it must be read: under an earlier, smaller window an event may hold it (docs/operations.md,
    "Changing the append-id window")."""
    stored = {rows.append_slot_key(PATH, 0): row_codec.encode_append_slot("under-window-2")}
    reads: list[bytes] = []

    def read(key: bytes) -> bytes | None:
        reads.append(key)
        return stored.get(key)

    changed = dedupe_rows(PATH, 3, CONTEXT_ADDED, None, None, "new", window=3, read=read)
    assert (rows.append_id_key(PATH, "under-window-2"), None) in changed
    reads.clear()
    below = dedupe_rows(PATH, 2, CONTEXT_ADDED, None, None, "two", window=3, read=read)
    assert reads == [] and [key for key, _ in below] == [rows.append_id_key(PATH, "two"), rows.append_slot_key(PATH, 2)]
