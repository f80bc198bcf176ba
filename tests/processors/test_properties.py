"""Property tests on random, realistic journals: docs/behaviour.md §2 (projection) and §3 (rendering).

The journals come from tests/support/journal_strategy.py: every kind of event, valid or not, in
any order a journal can hold.
"""

from __future__ import annotations

import io
import operator
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.cli.fold_verb import fold_lines
from processors.files import TRANSPORT_INPUTS, render_files
from processors.reducer import fold
from processors.render import (
    CONTEXT_PROTOCOL,
    MIN_ITEM_BYTES,
    MIN_REQUEST_BYTES,
    TIMESTAMP_PREFIX,
    RenderBudget,
    as_of_request,
    omitted_notice,
    projection_json,
    render_cell,
    render_messages,
    turn_json,
)
from processors.state import AgentState, Cell
from schemas.context import THIRD_PARTY_ACTOR_TYPES
from schemas.events import (
    CONTEXT_ADDED,
    LLM_REQUEST_REQUESTED,
    STREAM_ERROR_OCCURRED,
    InvalidPayloadEvent,
    decode_event,
)
from schemas.requests import TRANSPORTS, Message
from tests.support.journal_builder import DONT_TRIGGER, Journal
from tests.support.journal_strategy import ACTORS, BLOBS, CONTENTS, FILE, KEYS, PROPERTY_SETTINGS, journals


def dump(messages: list[dict[str, Any]]) -> bytes:
    return orjson.dumps(messages)


def request_offsets(events: list[Any]) -> list[int]:
    return [e.offset for e in events if not isinstance(e, InvalidPayloadEvent) and e.type == LLM_REQUEST_REQUESTED]


def fresh(events: list[Any], through: int | None = None) -> AgentState:
    state = AgentState()
    for event in events:
        if through is None or event.offset <= through:
            fold(state, event)
    return state


def render_request(state: AgentState, j: Journal, r: int, transport: Any = "openai") -> bytes:
    return dump(render_messages(state, transport, j.created_at(r)))


# --- §3: request R is reproducible byte for byte ---------------------------------------------


@PROPERTY_SETTINGS
@given(journals())
def test_3_request_messages_depend_only_on_events_up_to_r_and_replay_identically(j: Journal) -> None:
    events = j.decoded()
    requests = set(request_offsets(events))
    incremental = AgentState()
    at_request: dict[tuple[int, str], bytes] = {}
    for event in events:
        fold(incremental, event)
        if event.offset in requests:
            for transport in TRANSPORTS:
                first = render_request(incremental, j, event.offset, transport)
                assert render_request(incremental, j, event.offset, transport) == first  # deterministic
                at_request[(event.offset, transport)] = first
    jsonl = j.jsonl()
    for (r, transport), rendered in at_request.items():
        # A retry folds the prefix afresh: same bytes.
        assert render_request(fresh(events, through=r), j, r, transport) == rendered
        # `agentstream fold --through R` over the whole journal (events after R exist): same bytes.
        state, last = fold_lines(io.BytesIO(jsonl), r, io.StringIO())
        assert last.offset == r
        assert render_request(state, j, r, transport) == rendered
    # Cached renders (cells rendered at earlier requests, then replaced or compacted) never go stale.
    for transport in TRANSPORTS:
        assert dump(render_messages(incremental, transport)) == dump(render_messages(fresh(events), transport))


# --- §3: prefix stability between requests -------------------------------------------------------


def changes_prefix(event: Any) -> bool:
    """A system-lane change or an applied compaction (the two things that may rewrite the prefix)."""
    if isinstance(event, InvalidPayloadEvent) or event.type != CONTEXT_ADDED:
        return False
    item = event.payload
    if item.compaction is not None:
        return item.compaction.replacesHistoryThrough < event.offset
    return item.role == "system"


@PROPERTY_SETTINGS
@given(journals())
def test_3_earlier_request_is_a_prefix_of_a_later_one_without_compaction_or_system_change(j: Journal) -> None:
    events = j.decoded()
    requests = request_offsets(events)
    for i, r1 in enumerate(requests):
        for r2 in requests[i + 1 :]:
            if any(changes_prefix(e) for e in events if r1 < e.offset <= r2):
                break
            for transport in TRANSPORTS:
                earlier = render_messages(fresh(events, r1), transport, j.created_at(r1))[:-1]
                later = render_messages(fresh(events, r2), transport, j.created_at(r2))
                assert dump(later[: len(earlier)]) == dump(earlier)


def sent(messages: list[dict[str, Any]], transport: str, budget: int | None = None) -> list[dict[str, Any]]:
    """The messages as the caller sends them: files rendered from the blobs (§3.3)."""
    records = [Message.model_validate(message) for message in messages]
    return render_files(records, BLOBS, TRANSPORT_INPUTS[transport], budget)


@PROPERTY_SETTINGS
@given(journals(file_odds=3))
def test_3_3_with_files_an_earlier_request_as_sent_is_a_prefix_of_a_later_one(j: Journal) -> None:
    """§3.3 stability: the parts of a published item are byte-identical in every later request, so
    a prompt-cache prefix holds with files as without them."""
    events = j.decoded()
    requests = request_offsets(events)
    for i, r1 in enumerate(requests):
        for r2 in requests[i + 1 :]:
            if any(changes_prefix(e) for e in events if r1 < e.offset <= r2):
                break
            for transport in TRANSPORTS:
                earlier = sent(render_messages(fresh(events, r1), transport, j.created_at(r1))[:-1], transport)
                later = sent(render_messages(fresh(events, r2), transport, j.created_at(r2)), transport)
                assert dump(later[: len(earlier)]) == dump(earlier)


@PROPERTY_SETTINGS
@given(journals(file_odds=2), st.sampled_from([8 * 1024, 16 * 1024, 64 * 1024, None]))
def test_3_3_files_as_sent_are_deterministic_and_within_budget_unless_every_file_is_a_hint(
    j: Journal, budget: int | None
) -> None:
    """§3.3: "file bytes count against the request budget; over it, the newest files fall back to
    hint lines first"; the same request always sends the same bytes."""
    events = j.decoded()
    for r in request_offsets(events):
        for transport in TRANSPORTS:
            messages = render_messages(fresh(events, r), transport, j.created_at(r))
            first = sent(messages, transport, budget)
            assert dump(sent(messages, transport, budget)) == dump(first)
            unlimited = sent(messages, transport)
            if budget is None or len(dump(unlimited)) <= budget:
                assert first == unlimited  # within budget: exactly as without one
                continue
            hints = sent(messages, transport, 0)  # every file a hint line
            assert len(dump(first)) <= budget or first == hints
            # The files that kept their bytes are the oldest ones: a prefix of the file order.
            carried = [isinstance(m["content"], list) or "[file: " in m["content"] for m in first]
            full = [isinstance(m["content"], list) or "[file: " in m["content"] for m in unlimited]
            kept = [c for c, f in zip(carried, full, strict=True) if f]
            assert kept == sorted(kept, reverse=True)


# --- §3.1: third-party text never gets instruction roles ------------------------------------------


def item_cells(state: AgentState) -> list[Cell]:
    return [*state.system.cells, *state.history.cells]


@PROPERTY_SETTINGS
@given(journals())
def test_3_1_external_actor_and_summary_content_never_rendered_as_system_or_developer(j: Journal) -> None:
    events = j.decoded()
    ends = [*request_offsets(events), j.last]
    for end in ends:
        state = fresh(events, end)
        cells = item_cells(state)
        for transport in TRANSPORTS:
            messages = render_messages(state, transport, j.created_at(end))
            assert len(messages) == len(cells) + 2
            for cell, message in zip(cells, messages[1:-1], strict=True):
                assert message["content"].startswith(f"@{cell.offset}")
                item = cell.item
                third_party = item.actor is not None and item.actor.type in THIRD_PARTY_ACTOR_TYPES
                if third_party or item.compaction is not None:
                    assert message["role"] not in ("system", "developer"), (item, message)


# --- §2: folding is a pure function of the journal, however it is split ---------------------------


@PROPERTY_SETTINGS
@given(journals(), st.data())
def test_2_folding_in_one_pass_equals_folding_in_any_split(j: Journal, data: st.DataObject) -> None:
    events = j.decoded()
    one_pass = fresh(events)
    k = data.draw(st.integers(0, len(events)), label="split")
    split = AgentState()
    for event in events[:k]:
        fold(split, event)
    render_messages(split)  # populate render caches mid-way
    for event in events[k:]:
        fold(split, event)
    rebuilt = AgentState()
    for line in j.lines():  # from the bytes again, a state rebuilt from scratch
        fold(rebuilt, decode_event(line))
    for state in (split, rebuilt):
        assert projection_json(state) == projection_json(one_pass)
        assert turn_json(state) == turn_json(one_pass)
        assert dump(render_messages(state)) == dump(render_messages(one_pass))


# --- §2.6: compaction never drops an item above its cutoff ------------------------------------------


@PROPERTY_SETTINGS
@given(journals())
def test_2_6_compaction_never_drops_an_item_above_its_cutoff(j: Journal) -> None:
    state = AgentState()
    for event in j.decoded():
        before = projection_json(state)
        fold(state, event)
        if isinstance(event, InvalidPayloadEvent) or event.type != CONTEXT_ADDED:
            continue
        compaction = event.payload.compaction
        if compaction is None:
            continue
        after = projection_json(state)
        cutoff = compaction.replacesHistoryThrough
        if cutoff >= event.offset:
            assert after == before  # §2.6: ignored entirely
            continue
        kept = [item for item in before["history"] if item["offset"] > cutoff]
        assert after["history"][0]["offset"] == event.offset
        assert after["history"][1:] == kept
        assert after["publishedThrough"] == max(before["publishedThrough"], cutoff)


# --- §2: the projection equals a naive model written straight from the rules -----------------------


Row = tuple[int, str, str, str | None, int | None]  # offset, role, content, key, updatesOffset


def lanes(state: AgentState) -> tuple[list[Row], list[Row], int]:
    def rows(cells: list[Cell]) -> list[Row]:
        return [(c.offset, c.item.role, c.item.content, c.item.key, c.updates_offset) for c in cells]

    return rows(state.system.cells), rows(state.history.cells), state.published_through


@PROPERTY_SETTINGS
@given(journals())
def test_2_projection_matches_a_naive_model_of_rules_2_1_to_2_6(j: Journal) -> None:
    state = AgentState()
    system: list[Row] = []
    history: list[Row] = []
    published = 0
    for event in j.decoded():
        open_offset = state.open.offset if state.open is not None else None  # §4.2, from the reducer
        fold(state, event)
        if isinstance(event, InvalidPayloadEvent):
            pass
        elif event.type == LLM_REQUEST_REQUESTED:  # §2.4
            published = event.offset
        elif event.type == STREAM_ERROR_OCCURRED:  # §4.3 transcription
            history.append((event.offset, "developer", f"Error on stream: {event.payload.message}", None, None))
        elif event.type == CONTEXT_ADDED:
            item = event.payload
            row: Row = (event.offset, item.role, item.content, item.key, None)
            if item.compaction is not None:  # §2.6
                cutoff = item.compaction.replacesHistoryThrough
                if cutoff < event.offset:
                    published = max(published, cutoff)
                    last = {r[3]: i for i, r in enumerate(system) if r[3] is not None}
                    system = [r for i, r in enumerate(system) if r[3] is None or last[r[3]] == i]
                    history = [row] + [r for r in history if r[0] > cutoff]
            elif item.role == "assistant" and item.llmRequestOffset not in (None, open_offset):
                pass  # §2.5
            else:
                lane = system if item.role == "system" else history  # §2.1
                found = [i for i, r in enumerate(lane) if item.key is not None and r[3] == item.key]
                if not found:
                    lane.append(row)
                elif lane[found[-1]][0] <= published:  # §2.3 published
                    lane.append((*row[:4], lane[found[-1]][0]))
                else:  # §2.3 unpublished: in place, inheriting updatesOffset
                    lane[found[-1]] = (*row[:4], lane[found[-1]][4])
        assert lanes(state) == (system, history, published), f"after @{event.offset}"


# --- §3 size budget: any projection renders within its budget ---------------------------------------

# Contents up to a few kB, in characters whose JSON takes 1 to 6 bytes each.
SIZED_CONTENTS = st.one_of(
    st.sampled_from(CONTENTS),
    st.builds(operator.mul, st.sampled_from(["x", "é", "\x01", "🙂", '"', "a\n"]), st.integers(0, 4000)),
)


@st.composite
def sized_journals(draw: st.DrawFn) -> Journal:
    """Journals whose projections are often far larger than the budgets drawn with them."""
    j = Journal()
    j.system("policy", key="agent/system-prompt")
    for _ in range(draw(st.integers(1, 24))):
        kind = draw(st.sampled_from(["history"] * 6 + ["system", "system", "turn", "compaction"]))
        content = draw(SIZED_CONTENTS)
        if kind == "history":
            role = draw(st.sampled_from(["developer", "user", "user", "assistant"]))
            files = [FILE] if draw(st.integers(0, 9)) == 0 else None
            j.item(role, content, key=draw(st.sampled_from(KEYS)), actor=draw(st.sampled_from(ACTORS)), files=files)
        elif kind == "system":
            j.system(content, key=draw(st.sampled_from(KEYS)))
        elif kind == "turn":
            r = j.request()
            j.assistant(content, llmRequestOffset=r)
            j.settle(r, "succeeded")
        else:
            j.compaction(through=draw(st.integers(1, j.last)), summary=content)
    j.request()
    return j


@st.composite
def budgets(draw: st.DrawFn) -> RenderBudget:
    request_bytes = draw(st.integers(MIN_REQUEST_BYTES, 48 * 1024))
    return RenderBudget(request_bytes, draw(st.integers(MIN_ITEM_BYTES, request_bytes)))


def json_bytes(value: Any) -> int:
    return len(orjson.dumps(value))


@PROPERTY_SETTINGS
@given(sized_journals(), budgets(), st.sampled_from(TRANSPORTS))
def test_3_budget_a_request_is_never_over_its_budget(j: Journal, budget: RenderBudget, transport: Any) -> None:
    """Whatever the projection holds: the messages fit the request budget, every item the item cap."""
    r = j.last
    messages = render_messages(fresh(j.decoded()), transport, j.created_at(r), budget)
    assert json_bytes(messages) <= budget.request_bytes
    assert messages[0]["content"] == CONTEXT_PROTOCOL
    assert messages[-1]["content"] == TIMESTAMP_PREFIX + j.created_at(r)
    assert all(json_bytes(m["content"]) <= budget.item_bytes for m in messages[1:-1])


@PROPERTY_SETTINGS
@given(sized_journals(), budgets(), st.sampled_from(TRANSPORTS))
def test_3_budget_rendering_is_deterministic_so_a_retry_is_byte_identical(
    j: Journal, budget: RenderBudget, transport: Any
) -> None:
    r = j.last
    events = j.decoded()
    state = fresh(events)
    first = dump(render_messages(state, transport, j.created_at(r), budget))
    assert dump(render_messages(state, transport, j.created_at(r), budget)) == first  # cached cells
    assert dump(render_messages(fresh(events), transport, j.created_at(r), budget)) == first  # a fresh fold


@PROPERTY_SETTINGS
@given(sized_journals(), st.sampled_from(TRANSPORTS), st.data())
def test_3_budget_a_request_within_its_budget_renders_exactly_as_without_one(
    j: Journal, transport: Any, data: st.DataObject
) -> None:
    r = j.last
    state = fresh(j.decoded())
    unlimited = render_messages(state, transport, j.created_at(r), None)
    needed = max(MIN_REQUEST_BYTES, json_bytes(unlimited))
    largest = max([MIN_ITEM_BYTES, *(json_bytes(m["content"]) for m in unlimited[1:-1])])
    request_bytes = data.draw(st.integers(needed, needed + 2000), label="request_bytes")
    item_bytes = data.draw(st.integers(largest, max(largest, request_bytes)), label="item_bytes")
    budget = RenderBudget(request_bytes, item_bytes)
    assert dump(render_messages(state, transport, j.created_at(r), budget)) == dump(unlimited)


@PROPERTY_SETTINGS
@given(journals())
def test_3_budget_ordinary_requests_render_unchanged_under_the_default_budget(j: Journal) -> None:
    events = j.decoded()
    for end in [*request_offsets(events), j.last]:
        state = fresh(events, end)
        for transport in TRANSPORTS:
            budgeted = render_messages(state, transport, j.created_at(end))
            assert dump(budgeted) == dump(render_messages(state, transport, j.created_at(end), None))


@PROPERTY_SETTINGS
@given(sized_journals(), budgets(), st.sampled_from(TRANSPORTS))
def test_3_budget_only_the_oldest_history_is_left_out_and_one_notice_names_it(
    j: Journal, budget: RenderBudget, transport: Any
) -> None:
    r = j.last
    state = fresh(j.decoded())
    messages = render_messages(state, transport, j.created_at(r), budget)
    notices = [i for i, m in enumerate(messages) if m["content"].startswith("[Left out of this request to keep")]
    assert len(notices) <= 1
    history = state.history.cells
    if not notices:
        kept = messages[len(messages) - 1 - len(history) : -1]
        omitted: list[Cell] = []
    else:
        kept = messages[notices[0] + 1 : -1]
        omitted = history[: len(history) - len(kept)]
        assert omitted, "a notice with nothing left out"
        offsets = [cell.offset for cell in omitted]
        chars = sum(len(render_cell(cell)[1]) for cell in omitted)
        assert messages[notices[0]]["content"] == omitted_notice(len(omitted), min(offsets), max(offsets), chars)
    # What is kept is the newest history, in lane order, each item under its own header (or cut).
    for cell, message in zip(history[len(omitted) :], kept, strict=True):
        assert message["content"].startswith(f"@{cell.offset}") or message["content"].endswith(
            f"The journal keeps it whole at @{cell.offset}.]"
        )


# --- rendering a request again (as_of_request) -------------------------------------------------------

later_steps = st.lists(
    st.tuples(
        st.sampled_from(["system", "developer", "user", "assistant"]),
        st.sampled_from([None, "k1", "k2", "agent/system-prompt"]),
        st.text(max_size=12),
    ),
    max_size=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=later_steps, after=later_steps, more_requests=st.booleans())
def test_a_request_renders_again_exactly_from_a_state_folded_past_it(
    before: list[tuple[str, str | None, str]], after: list[tuple[str, str | None, str]], more_requests: bool
) -> None:
    """Property: for any items before and after request R (keyed slots included, even a later
    request), rendering `as_of_request(state, R)` gives R's messages byte for byte."""
    j = Journal()
    j.user("start")
    for role, key, text in before:
        j.item(role, text, **({"key": key} if key else {}))
    r = j.request()
    expected = render_messages(j.fold(), "openai-compatible", j.created_at(r))
    for index, (role, key, text) in enumerate(after):
        j.item(role, text, **({"key": key} if key else {}))
        if more_requests and index == len(after) // 2:
            j.request()
    view = as_of_request(j.fold(), r)
    assert view is not None
    assert orjson.dumps(render_messages(view, "openai-compatible", j.created_at(r))) == orjson.dumps(expected)


def test_a_request_cannot_render_again_after_a_compaction_rewrote_history() -> None:
    j = Journal()
    j.user("a")
    r = j.request()
    j.user("b")
    j.compaction(r, policy=DONT_TRIGGER)
    assert as_of_request(j.fold(), r) is None
