"""The row codec (docs/architecture.md, "Stored rows"): stored rows load back into exactly the folded
state, the stored names are a fixed format, rows of an older format are upcast on read, and a store
of a newer format stops the worker (docs/operations.md, "Row format")."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.journal.engine import PartitionEngine
from processors import row_codec, rows
from processors.journal import apply_event, payload_hash
from processors.reducer import fold
from processors.state import AgentState, Cell, Lane, OpenRequest, PendingTrigger, ScriptRun, SourceOffsets, UsageReport
from schemas.capabilities import SCRIPT_RUN_REQUESTED, SCRIPT_RUN_SETTLED, SCRIPT_RUN_STARTED
from schemas.config import AgentConfig
from schemas.context import ContextItem
from tests.support.engine_harness import NAMES, PATH, EngineHarness, committer, user
from tests.support.journal_builder import Journal
from tests.support.journal_fakes import DictStore
from tests.support.journal_strategy import PROPERTY_SETTINGS, journals
from tests.support.row_store import state_view
from topics.names import topic_names


def format_1(value: bytes) -> bytes:
    """A row value as format 1 wrote it: format 2 only put the marker in front."""
    assert value[:2] == b"\xff\x02", value
    return value[2:]


def format_1_rows(items: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(key, format_1(value)) for key, value in items]


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
    """Loading the rows equals folding the events, after every event, from rows of this format and
    from the same rows as format 1 wrote them (without the marker: upcast on read); and a state
    loaded from rows midway (the worker evicted it, or restarted) folds the rest exactly as the
    unbroken fold does."""
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
        old, old_sources = row_codec.load_state(format_1(table[rows.meta_key(path)]), format_1_rows(items))
        assert state_view(old) == state_view(folded) and old_sources == sources
        if event.offset in reloads:
            state = loaded  # continue from the rows, as the worker does after evicting the stream
    assert state_view(state) == state_view(folded)


def test_the_stored_names_are_row_format_2() -> None:
    """The stored bytes of format 2, field by field: the marker (0xFF, then the version), then the
    shapes of format 1 unchanged. A change here needs a new ROW_FORMAT and its upcast."""
    state = AgentState(stream_path="/agents/a", cursor=9, published_through=5, created=True)
    state.config = AgentConfig.model_validate({"maxAutonomousTurns": 3})
    state.pending = PendingTrigger(8, 1000, "external")
    state.open = OpenRequest(5, "m", 2000, 4, "agent-loop", None, "2026-01-01T00:00:00.000Z")
    state.over_threshold = UsageReport(7, 5, "m", 600, 500)
    state.scripts = {"x": ScriptRun("x", 6, 3000, True)}
    assert orjson.loads(format_1(row_codec.encode_meta(state, SourceOffsets(3, 4)))) == {
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
    assert list(orjson.loads(format_1(row_codec.encode_meta(state, SourceOffsets(3, 4))))) == stored_names
    assert orjson.loads(format_1(row_codec.encode_idempotency(3, "t", "h"))) == {"offset": 3, "type": "t", "hash": "h"}
    assert orjson.loads(format_1(row_codec.encode_command_positions(1, 2))) == {"appends": 1, "internal": 2}
    assert row_codec.encode_offset(-1) == b"\xff\x02-1" and row_codec.encode_offset(12) == b"\xff\x0212"
    assert row_codec.encode_append_slot("send-ü") == b"\xff\x02" + "send-ü".encode()
    assert row_codec.encode_format() == b"2"  # the format row alone is bare decimal text
    cell = Lane("history").append(4, ContextItem(role="user", content="hi"), 2)
    assert orjson.loads(format_1(row_codec.encode_cell(cell))) == {
        "o": 4,
        "c": 4,
        "s": 1,
        "u": 2,
        "i": {"role": "user", "content": "hi"},
    }


_ITEMS = st.builds(
    ContextItem.model_validate,
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "developer", "assistant", "system"]), "content": st.text(max_size=30)},
        optional={"key": st.text(min_size=1, max_size=8), "actor": st.just({"type": "user", "origin": "web"})},
    ),
)
_NUMBERS = st.integers(-(2**62), 2**62)


@settings(max_examples=300)
@given(_ITEMS, _NUMBERS, _NUMBERS, _NUMBERS, st.none() | _NUMBERS)
def test_an_item_row_is_byte_for_byte_its_fields_under_the_stored_names_in_order(
    item: ContextItem, offset: int, created_offset: int, seq: int, updates_offset: int | None
) -> None:
    """The item row is encoded by hand (hot path): its bytes are the marker, then exactly orjson's
    object of the `CellRow` fields in order, `u` only when set, and the item as the model dumps it
    (text with `%`, quotes or any unicode included)."""
    cell = Cell(seq, offset, item, updates_offset, created_offset)
    fields = {"o": offset, "c": created_offset, "s": seq}
    if updates_offset is not None:
        fields["u"] = updates_offset
    fields["i"] = orjson.Fragment(item.model_dump_json(exclude_none=True))
    assert row_codec.encode_cell(cell) == b"\xff\x02" + orjson.dumps(fields)
    decoded = row_codec.decode_cell(row_codec.encode_cell(cell))
    assert (decoded.offset, decoded.created_offset, decoded.seq, decoded.updates_offset, decoded.item) == (
        offset,
        created_offset,
        seq,
        updates_offset,
        item,
    )


def test_a_row_with_an_unknown_field_is_refused_not_misread() -> None:
    meta = orjson.loads(format_1(row_codec.encode_meta(AgentState(stream_path="/a"), SourceOffsets())))
    meta["newField"] = 1
    for value in (b"\xff\x02" + orjson.dumps(meta), orjson.dumps(meta)):  # format 2, and format 1
        with pytest.raises(ValueError, match="newField"):
            row_codec.decode_meta(value)


@pytest.mark.parametrize("stored", [None, b"1"])
def test_a_store_without_a_format_row_or_of_format_1_opens_and_is_marked_format_2_with_its_first_checkpoint(
    stored: bytes | None,
) -> None:
    """docs/operations.md, "Row format": no format row means format 1 (or a new store); an older
    format is read through the upcasts, and the format row records the newest format written."""
    table = DictStore()
    if stored is not None:
        table.stored[rows.format_key(3)] = stored
    assert row_codec.check_format(stored, 3) == 1

    async def first_checkpoint() -> None:
        engine = PartitionEngine(3, table, topic_names(""), committer(names=topic_names("")), max_cached_streams=10)
        assert table.get(rows.format_key(3)) == stored  # not before the checkpoint commits
        await engine.checkpoints.flush()  # stored with the partition's first checkpoint

    asyncio.run(first_checkpoint())
    assert table.get(rows.format_key(3)) == b"2" == row_codec.encode_format()
    assert row_codec.check_format(b"2", 3) == 2


@pytest.mark.parametrize("stored", [b"3", b"10"])
def test_a_newer_row_format_stops_the_worker_and_says_a_downgrade_needs_that_version_or_a_rebuild(
    stored: bytes,
) -> None:
    table = DictStore()
    table.stored[rows.format_key(0)] = stored
    with pytest.raises(row_codec.RowFormatError) as stopped:
        PartitionEngine(0, table, topic_names(""), committer(names=topic_names("")), max_cached_streams=10)
    message = str(stopped.value)
    assert f"partition 0: the stored rows are in row format {int(stored)}, newer than format 2" in message
    assert "never downgraded" in message and "('Row format')" in message and "agentstream replay --verify" in message
    assert table.get(rows.format_key(0)) == stored  # left as it was


@pytest.mark.parametrize("stored", [b"x", b"0", b"-1", b""])
def test_a_format_row_that_names_no_format_stops_the_worker_and_says_to_rebuild(stored: bytes) -> None:
    table = DictStore()
    table.stored[rows.format_key(0)] = stored
    with pytest.raises(row_codec.RowFormatError, match=r"names no row format .*agentstream replay --verify"):
        PartitionEngine(0, table, topic_names(""), committer(names=topic_names("")), max_cached_streams=10)


# --- the upcast chain (docs/operations.md, "Row format") --------------------------------------------


def test_every_format_before_this_one_has_its_upcast_to_the_next() -> None:
    assert sorted(row_codec.UPCASTS) == list(range(1, row_codec.ROW_FORMAT))


def tagging(tag: str) -> row_codec.Upcast:
    return lambda shape, body: body + f"|{shape}:{tag}".encode()


def test_an_older_row_goes_through_every_step_from_its_version_to_the_newest_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chain as a future format 4 would have it: each step once, none skipped, none past the
    newest format; a row of a newer format is refused, not misread."""
    monkeypatch.setattr(row_codec, "ROW_FORMAT", 4)
    monkeypatch.setattr(row_codec, "UPCASTS", {1: tagging("1>2"), 2: tagging("2>3"), 3: tagging("3>4")})
    assert row_codec.upcast("meta", 1, b"m") == b"m|meta:1>2|meta:2>3|meta:3>4"
    assert row_codec.upcast("cell", 2, b"c") == b"c|cell:2>3|cell:3>4"
    assert row_codec.upcast("offset", 3, b"7") == b"7|offset:3>4"
    assert row_codec.upcast("slot", 4, b"s") == b"s"
    with pytest.raises(row_codec.RowFormatError, match=r"a slot row is in row format 5, newer than format 4"):
        row_codec.upcast("slot", 5, b"s")


def test_decoding_reads_a_rows_version_and_upcasts_only_older_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every decoder goes through the chain: a row without a marker is format 1 and takes step 1;
    a row of this format is read as it is; a marked row names its version."""
    monkeypatch.setitem(row_codec.UPCASTS, 1, lambda shape, body: body + b"0" if shape == "offset" else body)
    assert row_codec.decode_offset(b"7") == 70  # format 1, upcast
    assert row_codec.decode_offset(row_codec.encode_offset(7)) == 7  # this format: as written
    assert row_codec.decode_offset(b"\xff\x027") == 7
    assert row_codec.row_version(b"7") == 1 and row_codec.row_version(b"{}") == 1
    assert row_codec.row_version(b"\xff\x02{}") == 2 and row_codec.row_version(b"\xff\x09") == 9
    with pytest.raises(row_codec.RowFormatError, match="an offset row is in row format 3"):
        row_codec.decode_offset(b"\xff\x037")
    for broken in (b"\xff", b"\xff\x017", b"\xff\x007"):  # format 1 had no marker
        with pytest.raises(ValueError, match="format marker but no format version"):
            row_codec.decode_offset(broken)


def test_a_format_1_value_never_reads_as_marked_whatever_it_holds() -> None:
    """Format 1 wrote UTF-8 only (append ids are any text, even control characters): no value of it
    starts with the marker byte."""
    for append_id in ("\x02x", "\xff", "ÿ", "-1", "{}", "\x00"):
        assert row_codec.decode_append_slot(append_id.encode()) == append_id
        assert row_codec.decode_append_slot(row_codec.encode_append_slot(append_id)) == append_id


def test_the_row_keys_are_those_of_every_row_format() -> None:
    """docs/architecture.md, "Stored rows": every key byte for byte, unchanged since format 1
    (`<kind>\\0<path>\\0…`, 8-byte big-endian seqs and slots, a seq biased by 2^63 so that byte
    order is numeric order)."""
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


def test_a_newer_format_row_met_while_deciding_a_command_stops_the_worker_not_the_command() -> None:
    """docs/operations.md, "Row format": a row a newer version wrote (here a stream's metadata row
    in format 9, its format row lost) raises `RowFormatError` out of the batch, which the worker
    turns into exit 78, instead of dead-lettering the command as bad input."""
    harness = EngineHarness()
    harness.table.stored[rows.meta_key(PATH)] = b"\xff\x09{}"

    async def decide() -> None:
        await harness.handle(harness.command(user("hello", appendId="a-1")))

    with pytest.raises(row_codec.RowFormatError):
        asyncio.run(decide())
    assert harness.kafka.on(NAMES.dlq) == [] and harness.kafka.open == []
