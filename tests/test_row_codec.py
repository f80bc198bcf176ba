"""The row codec (docs/architecture.md, "Rows"): stored rows load back into exactly the folded state,
the stored names are a fixed format, and a store of another format stops the worker."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.journal.engine import PartitionEngine
from processors import row_codec, rows
from processors.journal import apply_event, payload_hash
from processors.reducer import fold
from processors.state import AgentState, Lane, OpenRequest, PendingTrigger, ScriptRun, SourceOffsets, UsageReport
from schemas.capabilities import SCRIPT_RUN_REQUESTED, SCRIPT_RUN_SETTLED, SCRIPT_RUN_STARTED
from schemas.config import AgentConfig
from schemas.context import ContextItem
from tests.journal import Journal
from tests.support.journal_fakes import DictStore, FakeTransactions
from tests.test_properties import PROPERTY_SETTINGS, journals
from topics.names import topic_names


def lane_view(lane: Lane) -> tuple[Any, ...]:
    cells = [(c.seq, c.offset, c.created_offset, c.updates_offset, c.item) for c in lane.cells]
    return lane.next_seq, lane.next_front_seq, cells, {key: cell.seq for key, cell in lane.by_key.items()}


def state_view(state: AgentState) -> dict[str, Any]:
    """Everything a state holds but the row-change bookkeeping, comparable with ==."""
    view = {name: getattr(state, name) for name in AgentState.__dataclass_fields__ if name not in ("changes",)}
    view["system"], view["history"] = lane_view(state.system), lane_view(state.history)
    return view


@st.composite
def journals_with_scripts(draw: st.DrawFn) -> Journal:
    """The property journals, with script runs requested, started and settled among their events."""
    j = draw(journals(max_events=24))
    for n in range(draw(st.integers(0, 3))):
        execution = f"agent-output:{n}"
        j.append(SCRIPT_RUN_REQUESTED, {"code": "1", "executionId": execution, "expiresAt": 10**13})
        if draw(st.booleans()):
            j.append(SCRIPT_RUN_STARTED, {"executionId": execution})
        if draw(st.booleans()):
            settlement = {"status": "succeeded", "result": n}
            j.append(SCRIPT_RUN_SETTLED, {"executionId": execution, "settlement": settlement})
    j.item("user", "after the scripts", key="k1")
    return j


@PROPERTY_SETTINGS
@given(journals_with_scripts(), st.sets(st.integers(1, 40)))
def test_rows_written_after_any_events_load_as_the_fold_of_those_events(j: Journal, reloads: set[int]) -> None:
    """Loading the rows equals folding the events, after every event; and a state loaded from rows
    midway (the worker evicted it, or restarted) folds the rest exactly as the unbroken fold does."""
    table: dict[bytes, bytes] = {}
    path = j.stream_path
    state, folded = AgentState(stream_path=path), AgentState(stream_path=path)
    sources = SourceOffsets()
    for event, line in zip(j.decoded(), j.lines(), strict=True):
        sources = sources.advanced(event.offset % 2 == 0, event.offset)
        digest = None if event.idempotencyKey is None else payload_hash(event.type, orjson.loads(line)["payload"])
        for key, value in apply_event(state, event, sources, None, digest, window=8, read=table.get):
            if value is None:
                table.pop(key, None)
            else:
                table[key] = value
        fold(folded, event)
        items = sorted((k, v) for k, v in table.items() if k.startswith(rows.items_prefix(path)))
        loaded, loaded_sources = row_codec.load_state(table[rows.meta_key(path)], items)
        assert state_view(loaded) == state_view(folded)
        assert loaded_sources == sources
        if event.offset in reloads:
            state = loaded  # continue from the rows, as the worker does after evicting the stream
    assert state_view(state) == state_view(folded)


def test_the_stored_names_are_row_format_1() -> None:
    """The stored bytes of format 1, field by field: a change here needs a new ROW_FORMAT."""
    state = AgentState(stream_path="/agents/a", cursor=9, published_through=5, created=True)
    state.config = AgentConfig.model_validate({"maxAutonomousTurns": 3})
    state.pending = PendingTrigger(8, 1000, "external")
    state.open = OpenRequest(5, "m", 2000, 4, "agent-loop", None, "2026-01-01T00:00:00.000Z")
    state.over_threshold = UsageReport(7, 5, "m", 600, 500)
    state.scripts = {"x": ScriptRun("x", 6, 3000, True)}
    assert orjson.loads(row_codec.encode_meta(state, SourceOffsets(3, 4))) == {
        "path": "/agents/a",
        "cursor": 9,
        "sourceOffset": 3,
        "internalSourceOffset": 4,
        "publishedThrough": 5,
        "created": True,
        "config": {"maxAutonomousTurns": 3},
        "pending": {"offset": 8, "atMs": 1000, "source": "external"},
        "open": {
            "offset": 5,
            "model": "m",
            "expiresAt": 2000,
            "triggerOffset": 4,
            "source": "agent-loop",
            "interruptedBy": None,
            "createdAt": "2026-01-01T00:00:00.000Z",
        },
        "paused": False,
        "pauseTriggerOffset": None,
        "latestExternalTrigger": 0,
        "autonomousTurnCount": 0,
        "consecutiveLlmFailures": 0,
        "usage": {"inputTokens": 0, "outputTokens": 0, "cachedInputTokens": 0, "reasoningOutputTokens": 0},
        "compactedThrough": 0,
        "overThreshold": {"offset": 7, "llmRequestOffset": 5, "model": "m", "tokens": 600, "threshold": 500},
        "lastRequestCreatedAt": None,
        "lastEventCreatedAt": None,
        "scripts": [{"executionId": "x", "offset": 6, "expiresAt": 3000, "started": True}],
        "seqs": [1, 0, 1, 0],
    }
    stored_names = [field.alias or name for name, field in row_codec.MetaRow.model_fields.items()]
    assert list(orjson.loads(row_codec.encode_meta(state, SourceOffsets(3, 4)))) == stored_names  # in order
    assert orjson.loads(row_codec.encode_idempotency(3, "t", "h")) == {"offset": 3, "type": "t", "hash": "h"}
    assert orjson.loads(row_codec.encode_command_positions(1, 2)) == {"appends": 1, "internal": 2}
    cell = Lane("history").append(4, ContextItem(role="user", content="hi"), 2)
    assert orjson.loads(row_codec.encode_cell(cell)) == {
        "o": 4,
        "c": 4,
        "s": 1,
        "u": 2,
        "i": {"role": "user", "content": "hi"},
    }


def test_a_row_with_an_unknown_field_is_refused_not_misread() -> None:
    meta = orjson.loads(row_codec.encode_meta(AgentState(stream_path="/a"), SourceOffsets()))
    meta["newField"] = 1
    with pytest.raises(ValueError, match="newField"):
        row_codec.decode_meta(orjson.dumps(meta))


def test_a_store_without_a_format_row_is_format_1_and_gets_its_row() -> None:
    row_codec.check_format(None, 0)
    table = DictStore()

    async def first_checkpoint() -> None:
        engine = PartitionEngine(3, table, topic_names(""), FakeTransactions(), max_cached_streams=10)
        await engine.checkpoints.flush()  # stored with the partition's first checkpoint

    asyncio.run(first_checkpoint())
    assert table.get(rows.format_key(3)) == b"1" == row_codec.encode_format()


@pytest.mark.parametrize("stored", [b"2", b"x"])
def test_another_row_format_stops_the_worker_and_says_to_rebuild_with_replay(stored: bytes) -> None:
    table = DictStore()
    table.stored[rows.format_key(0)] = stored
    with pytest.raises(row_codec.RowFormatError, match=r"row format .*agentstream replay"):
        PartitionEngine(0, table, topic_names(""), FakeTransactions(), max_cached_streams=10)


def test_the_row_keys_are_row_format_1() -> None:
    """docs/architecture.md, "Rows": every key byte for byte (`<kind>\\0<path>\\0…`, 8-byte big-endian
    seqs and slots, a seq biased by 2^63 so that byte order is numeric order)."""
    path = "/agents/a"
    assert rows.meta_key(path) == b"m\x00/agents/a"
    assert rows.items_prefix(path) == b"i\x00/agents/a\x00"
    assert rows.item_key(path, "system", 1) == b"i\x00/agents/a\x00s" + (2**63 + 1).to_bytes(8, "big")
    assert rows.item_key(path, "history", -2) == b"i\x00/agents/a\x00h" + (2**63 - 2).to_bytes(8, "big")
    assert rows.idempotency_key(path, "web/msg/1") == b"k\x00/agents/a\x00web/msg/1"
    assert rows.append_id_key(path, "send-1") == b"a\x00/agents/a\x00send-1"
    assert rows.append_slot_key(path, 3) == b"r\x00/agents/a\x00" + (3).to_bytes(8, "big")
    assert rows.position_key(7) == b"p\x007"
    assert rows.command_positions_key(7) == b"c\x007"
    assert rows.format_key(7) == b"v\x007"


@settings(deadline=None)
@given(seqs=st.lists(st.integers(min_value=-(2**40), max_value=2**40), min_size=2, max_size=20, unique=True))
def test_item_keys_sort_in_seq_order_and_name_their_lane_and_seq(seqs: list[int]) -> None:
    """A prefix scan returns a stream's items in lane order: negative seqs (summaries) first."""
    for lane in ("system", "history"):
        keys = [rows.item_key("/agents/a", lane, seq) for seq in seqs]
        assert [rows.item_of_key(key) for key in sorted(keys)] == [(lane, seq) for seq in sorted(seqs)]
        assert all(rows.stream_of_key(key) == "/agents/a" for key in keys)


def test_5_1_6_a_command_at_or_below_its_topics_recorded_offset_is_already_journaled() -> None:
    """§5.1.6: a command read again is recognised by its offset in its command topic, per topic."""
    sources = SourceOffsets(appends=10, internal=4)
    assert sources.covers(False, 10) and not sources.covers(False, 11)
    assert sources.covers(True, 4) and not sources.covers(True, 5)
    assert sources.advanced(True, 3) == SourceOffsets(10, 4)  # a position never goes back
    assert sources.advanced(False, 9) == SourceOffsets(10, 4)
    assert sources.advanced(True, 6) == SourceOffsets(10, 6)
    assert sources.advanced(False, 12) == SourceOffsets(12, 4)


def test_item_rows_written_after_the_metadata_row_are_ignored_when_loading() -> None:
    """`load_state`: rows of a crash between an event's item rows and its metadata row lie outside
    the recorded seq range (`next_front_seq < seq < next_seq`) and are left out; re-folding the
    journal tail writes them again."""
    j = Journal()
    j.system("policy", key="agent/system-prompt")
    j.user("one")
    state = j.fold()
    path = state.stream_path
    assert path is not None
    meta = row_codec.encode_meta(state, SourceOffsets())
    items = [
        (rows.item_key(path, lane.name, c.seq), row_codec.encode_cell(c))
        for lane in (state.system, state.history)
        for c in lane.cells
    ]
    # The next history item (seq == next_seq) and a summary (seq == next_front_seq) were stored, their
    # metadata row was not.
    late = Lane("history")
    late.next_seq, late.next_front_seq = state.history.next_seq, state.history.next_front_seq
    appended = late.append(9, ContextItem(role="user", content="late"), None)
    summary = late.new_front_cell(10, ContextItem(role="developer", content="s"))
    items += [
        (rows.item_key(path, "history", appended.seq), row_codec.encode_cell(appended)),
        (rows.item_key(path, "history", summary.seq), row_codec.encode_cell(summary)),
    ]
    loaded, _ = row_codec.load_state(meta, sorted(items))
    assert state_view(loaded) == state_view(state)
    assert [cell.item.content for cell in loaded.history.cells] == ["one"]
