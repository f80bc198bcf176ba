"""docs/behaviour.md §2 (the projection) and the state parts of §4 (turn bookkeeping), rule by rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from processors.reducer import JournalOrderError, fold, trigger_source
from processors.render import projection_json, turn_json
from processors.state import AgentState
from schemas.context import ContextItem
from schemas.events import decode_event
from tests.support.journal_builder import DONT_TRIGGER, INTERRUPT, Journal

PROMPT = "agent/system-prompt"


def lane(state: AgentState, name: str) -> list[tuple[Any, ...]]:
    """(offset, content, updatesOffset) per item of a lane, in lane order."""
    return [(i["offset"], i["content"], i.get("updatesOffset")) for i in projection_json(state)[name]]


def offsets(state: AgentState, name: str) -> list[int]:
    return [i["offset"] for i in projection_json(state)[name]]


# --- §2.1 lanes, §2.2 order -------------------------------------------------------------------


def test_2_1_system_role_goes_to_system_lane_every_other_role_to_history() -> None:
    j = Journal()
    s = j.system("s")
    d = j.developer("d")
    u = j.user("u")
    a = j.assistant("a")
    state = j.fold()
    assert offsets(state, "system") == [s]
    assert offsets(state, "history") == [d, u, a]
    assert [i["role"] for i in projection_json(state)["history"]] == ["developer", "user", "assistant"]


def test_2_2_items_follow_stream_order_within_each_lane() -> None:
    j = Journal()
    expected: dict[str, list[int]] = {"system": [], "history": []}
    for n, role in enumerate(["user", "system", "developer", "system", "user", "assistant", "system"]):
        expected["system" if role == "system" else "history"].append(j.item(role, f"c{n}"))
    state = j.fold()
    assert offsets(state, "system") == expected["system"]
    assert offsets(state, "history") == expected["history"]


def test_2_2_there_is_no_ordering_field_an_order_field_invalidates_the_item() -> None:
    j = Journal()
    first = j.user("first")
    j.user("second", order=0)
    state = j.fold()
    assert offsets(state, "history") == [first]
    assert state.cursor == 2


# --- §2.3 keyed slots ---------------------------------------------------------------------------


def test_2_3_keyed_slot_none_found_appends_without_updates_offset() -> None:
    j = Journal()
    j.user("x")
    k = j.developer("v1", key="k")
    state = j.fold()
    assert lane(state, "history")[-1] == (k, "v1", None)


def test_2_3_keyed_slot_unpublished_is_replaced_in_place() -> None:
    j = Journal()
    p = j.developer("v1", key="k")
    x = j.user("x")
    n = j.developer("v2", key="k")
    state = j.fold()
    assert lane(state, "history") == [(n, "v2", None), (x, "x", None)]  # same position, p gone
    assert p not in offsets(state, "history")


def test_2_3_keyed_slot_published_appends_with_updates_offset() -> None:
    j = Journal()
    p = j.developer("v1", key="k")
    j.request()
    n = j.developer("v2", key="k")
    state = j.fold()
    assert lane(state, "history") == [(p, "v1", None), (n, "v2", p)]  # P stays unchanged


def test_2_3_publication_boundary_by_request_item_just_before_is_published() -> None:
    j = Journal()
    p = j.developer("v1", key="k")  # p == R - 1  <= publishedThrough
    r = j.request()
    assert p == r - 1
    n = j.developer("v2", key="k")
    state = j.fold()
    assert state.published_through == r
    assert lane(state, "history") == [(p, "v1", None), (n, "v2", p)]


def test_2_3_publication_boundary_by_request_item_just_after_is_unpublished() -> None:
    j = Journal()
    r = j.request()
    p = j.developer("v1", key="k")  # p == R + 1  > publishedThrough
    assert p == r + 1
    n = j.developer("v2", key="k")
    state = j.fold()
    assert lane(state, "history") == [(n, "v2", None)]


def test_2_3_publication_boundary_by_compaction_item_at_cutoff_is_published() -> None:
    j = Journal()
    j.user("old")
    p = j.developer("v1", key="k")  # offset == C
    j.compaction(through=p)
    n = j.developer("v2", key="k")
    state = j.fold()
    assert state.published_through == p
    # P itself was compacted away (offset <= C): the slot lookup finds nothing, so N appends fresh.
    assert lane(state, "history")[1:] == [(n, "v2", None)]


def test_2_3_publication_boundary_by_compaction_item_above_cutoff_is_unpublished() -> None:
    j = Journal()
    c = j.user("old")
    p = j.developer("v1", key="k")  # offset == C + 1: survives and stays unpublished
    assert p == c + 1
    j.compaction(through=c)
    n = j.developer("v2", key="k")
    state = j.fold()
    assert state.published_through == c
    assert lane(state, "history")[1:] == [(n, "v2", None)]  # P replaced in place


def test_2_3_system_slot_published_by_compaction_cutoff_appends_with_updates() -> None:
    """The system lane is not cut by compaction, so an item at offset <= C stays and is published."""
    j = Journal()
    p = j.system("v1", key="k")
    j.user("u")
    j.compaction(through=p + 1)
    n = j.system("v2", key="k")
    state = j.fold()
    assert lane(state, "system") == [(p, "v1", None), (n, "v2", p)]


def test_2_3_system_slot_exactly_at_the_compaction_cutoff_is_published_so_the_next_appends_an_update() -> None:
    """§2.3 with §2.6: the compaction sets publishedThrough to C; a system item at offset C stays
    (the system lane is not cut) and is published (`P.offset <= publishedThrough`), so the next item
    with its key appends with `updatesOffset = P.offset` and P stays as it was."""
    j = Journal()
    j.user("u")
    p = j.system("v1", key="k")
    j.compaction(through=p)
    n = j.system("v2", key="k")
    state = j.fold()
    assert state.published_through == p
    assert lane(state, "system") == [(p, "v1", None), (n, "v2", p)]


def test_2_3_system_slot_just_above_compaction_cutoff_is_replaced() -> None:
    j = Journal()
    c = j.user("u")
    p = j.system("v1", key="k")
    assert p == c + 1
    j.compaction(through=c)
    n = j.system("v2", key="k")
    state = j.fold()
    assert lane(state, "system") == [(n, "v2", None)]


def test_2_3_unpublished_replacement_inherits_updates_offset() -> None:
    j = Journal()
    p = j.developer("v1", key="k")
    j.request()
    n1 = j.developer("v2", key="k")
    x = j.user("x")
    n2 = j.developer("v3", key="k")
    state = j.fold()
    assert n1 != n2
    assert lane(state, "history") == [(p, "v1", None), (n2, "v3", p), (x, "x", None)]


def test_2_3_replacement_of_item_without_updates_offset_has_none() -> None:
    j = Journal()
    j.developer("v1", key="k")
    n = j.developer("v2", key="k")
    state = j.fold()
    assert lane(state, "history") == [(n, "v2", None)]


def test_2_3_published_lookup_uses_the_last_occurrence_of_the_key() -> None:
    j = Journal()
    p = j.developer("v1", key="k")
    j.request()
    n1 = j.developer("v2", key="k")
    j.request()
    n2 = j.developer("v3", key="k")
    n3 = j.developer("v4", key="k")  # n2 unpublished: replaced, inherits updates=n1
    state = j.fold()
    assert n2 < n3
    assert lane(state, "history") == [(p, "v1", None), (n1, "v2", p), (n3, "v4", n1)]


def test_2_3_slot_lookup_is_per_lane() -> None:
    j = Journal()
    s = j.system("sys", key="k")
    h = j.developer("hist", key="k")  # does not replace the system item
    s2 = j.system("sys2", key="k")  # replaces the system item only
    state = j.fold()
    assert lane(state, "system") == [(s2, "sys2", None)]
    assert lane(state, "history") == [(h, "hist", None)]
    assert s not in offsets(state, "system")


def test_2_3_role_is_not_part_of_slot_identity_in_history() -> None:
    j = Journal()
    j.user("as user", key="k")
    x = j.assistant("x")
    d = j.developer("as developer", key="k")
    state = j.fold()
    history = projection_json(state)["history"]
    assert [(i["offset"], i["role"]) for i in history] == [(d, "developer"), (x, "assistant")]


def test_2_3_role_is_not_part_of_slot_identity_published_case() -> None:
    j = Journal()
    p = j.user("as user", key="k")
    j.request()
    d = j.developer("as developer", key="k")
    state = j.fold()
    assert lane(state, "history") == [(p, "as user", None), (d, "as developer", p)]


def test_2_3_unkeyed_items_always_append() -> None:
    j = Journal()
    a = j.developer("same")
    b = j.developer("same")
    state = j.fold()
    assert offsets(state, "history") == [a, b]


def test_2_3_offsets_in_a_lane_need_not_increase() -> None:
    j = Journal()
    j.developer("v1", key="k")
    x = j.user("x")
    n = j.developer("v2", key="k")
    assert offsets(j.fold(), "history") == [n, x]
    assert n > x


# --- §2.4 publication ---------------------------------------------------------------------------


def test_2_4_request_that_opens_sets_published_through() -> None:
    j = Journal()
    j.user("hi")
    r = j.request()
    state = j.fold()
    assert state.open is not None and state.open.offset == r
    assert state.published_through == r


def test_2_4_request_without_trigger_still_publishes() -> None:
    j = Journal()
    p = j.developer("v1", key="k", policy=DONT_TRIGGER)
    r = j.request()
    n = j.developer("v2", key="k", policy=DONT_TRIGGER)
    state = j.fold()
    assert state.open is None
    assert state.published_through == r
    assert lane(state, "history") == [(p, "v1", None), (n, "v2", p)]


def test_2_4_superseded_request_while_another_is_open_still_publishes() -> None:
    j = Journal()
    j.user("hi")
    r1 = j.request()
    j.user("more")
    r2 = j.request()  # r1 still open: r2 does not open, but seals
    state = j.fold()
    assert state.open.offset == r1
    assert state.published_through == r2


def test_2_4_request_while_paused_still_publishes() -> None:
    j = Journal()
    j.paused()
    j.user("hi")
    r = j.request()
    state = j.fold()
    assert state.open is None and state.published_through == r


def test_2_4_cancelled_request_stays_published() -> None:
    j = Journal()
    p = j.developer("v1", key="k")
    r = j.request()
    j.settle(r, "cancelled", reason="expired")
    n = j.developer("v2", key="k")
    state = j.fold()
    assert state.published_through == r
    assert lane(state, "history")[-1] == (n, "v2", p)


# --- §2.5 assistant items ----------------------------------------------------------------------


def test_2_5_assistant_answer_to_the_open_request_is_appended() -> None:
    j = Journal()
    j.user("hi")
    r = j.request()
    a = j.assistant("hello", llmRequestOffset=r)
    state = j.fold()
    assert projection_json(state)["history"][-1] == {
        "offset": a,
        "role": "assistant",
        "content": "hello",
        "llmRequestOffset": r,
    }


def test_2_5_assistant_answer_with_no_request_open_is_dropped() -> None:
    j = Journal()
    j.user("hi")
    r = j.request()
    j.settle(r)
    j.assistant("late", llmRequestOffset=r)
    assert [i["content"] for i in projection_json(j.fold())["history"]] == ["hi"]


def test_2_5_assistant_answer_to_another_request_is_dropped() -> None:
    j = Journal()
    j.user("hi")
    r1 = j.request()
    r2 = j.request()  # superseded, never open
    j.assistant("for r2", llmRequestOffset=r2)
    j.assistant("bogus", llmRequestOffset=r2 + 50)
    state = j.fold()
    assert state.open.offset == r1
    assert [i["content"] for i in projection_json(state)["history"]] == ["hi"]


def test_2_5_dropped_assistant_item_does_not_touch_its_key_slot() -> None:
    j = Journal()
    k = j.assistant("v1", key="k")
    j.assistant("v2", key="k", llmRequestOffset=40)
    assert lane(j.fold(), "history") == [(k, "v1", None)]


def test_2_5_assistant_without_llm_request_offset_is_always_appended() -> None:
    j = Journal()
    a1 = j.assistant("no request at all")
    j.user("hi")
    r = j.request()
    a2 = j.assistant("while open, no offset")
    j.settle(r)
    a3 = j.assistant("after settle")
    assert offsets(j.fold(), "history") == [a1, a1 + 1, a2, a3]


# --- §2.6 compaction ------------------------------------------------------------------------


@pytest.mark.parametrize("delta", [0, 1, 10])
def test_2_6_compaction_with_cutoff_at_or_above_its_own_offset_is_ignored_entirely(delta: int) -> None:
    j = Journal()
    j.system("a", key="k")
    j.request()
    j.system("b", key="k")
    j.user("u")
    before = j.fold()
    s = j.compaction(through=j.last + 1 + delta)
    after = j.fold()
    assert after.cursor == s
    assert projection_json(after) == projection_json(before)
    assert turn_json(after) == turn_json(before)


def test_2_6_compaction_raises_published_through_to_its_cutoff() -> None:
    j = Journal()
    j.user("a")
    j.user("b")
    c = j.user("c")
    j.compaction(through=c)
    assert j.fold().published_through == c


def test_2_6_compaction_below_published_through_keeps_the_higher_value() -> None:
    j = Journal()
    first = j.user("a")
    r = j.request()
    j.user("b")
    j.compaction(through=first)
    state = j.fold()
    assert state.published_through == r


def test_2_6_compaction_keeps_unkeyed_system_items_and_the_last_of_each_key() -> None:
    j = Journal()
    u1 = j.system("u1")
    a1 = j.system("a1", key="a")
    b1 = j.system("b1", key="b")
    j.request()
    a2 = j.system("a2", key="a")
    u2 = j.system("u2")
    j.request()
    a3 = j.system("a3", key="a")
    j.user("h")
    before = lane(j.fold(), "system")
    assert before == [
        (u1, "u1", None),
        (a1, "a1", None),
        (b1, "b1", None),
        (a2, "a2", a1),
        (u2, "u2", None),
        (a3, "a3", a2),
    ]
    j.compaction(through=j.last)
    # In place, each keeps its own updatesOffset even though it now points at a dropped item.
    assert lane(j.fold(), "system") == [(u1, "u1", None), (b1, "b1", None), (u2, "u2", None), (a3, "a3", a2)]


def test_2_6_history_becomes_summary_then_items_above_cutoff_in_order() -> None:
    j = Journal()
    j.user("1")
    j.assistant("2")
    c = j.developer("3")
    x = j.user("4")
    y = j.developer("5")
    s = j.compaction(through=c, summary="the summary")
    z = j.user("7")
    state = j.fold()
    assert lane(state, "history") == [(s, "the summary", None), (x, "4", None), (y, "5", None), (z, "7", None)]
    assert projection_json(state)["history"][0]["compaction"] == {"replacesHistoryThrough": c}


def test_2_6_replaced_slot_above_cutoff_survives_at_its_early_position() -> None:
    j = Journal()
    j.developer("v1", key="k")  # position 0
    j.user("x")
    y = j.user("y")
    c = y - 1
    n = j.developer("v2", key="k")  # unpublished: replaces at position 0 with offset > C
    s = j.compaction(through=c)
    state = j.fold()
    assert lane(state, "history") == [(s, "summary", None), (n, "v2", None), (y, "y", None)]


def test_2_6_dangling_updates_offset_is_kept() -> None:
    j = Journal()
    p = j.developer("v1", key="k")
    r = j.request()
    n = j.developer("v2", key="k")
    s = j.compaction(through=r)
    state = j.fold()
    assert lane(state, "history") == [(s, "summary", None), (n, "v2", p)]
    assert p not in offsets(state, "history")


def test_2_6_compacted_key_is_gone_so_the_next_item_appends_fresh() -> None:
    j = Journal()
    j.developer("v1", key="k")
    j.request()
    j.compaction(through=j.last)
    n = j.developer("v2", key="k")
    assert lane(j.fold(), "history")[-1] == (n, "v2", None)


def test_2_6_compaction_of_a_compaction_drops_the_older_summary_at_or_below_cutoff() -> None:
    j = Journal()
    j.user("a")
    s1 = j.compaction(through=1, summary="s1")
    b = j.user("b")
    c = j.user("c")
    s2 = j.compaction(through=b, summary="s2")
    assert s1 <= b
    assert lane(j.fold(), "history") == [(s2, "s2", None), (c, "c", None)]


def test_2_6_compaction_of_a_compaction_keeps_the_older_summary_above_cutoff() -> None:
    j = Journal()
    a = j.user("a")
    b = j.user("b")
    s1 = j.compaction(through=b, summary="s1")
    c = j.user("c")
    s2 = j.compaction(through=a, summary="s2")  # lower cutoff than s1
    state = j.fold()
    assert lane(state, "history") == [(s2, "s2", None), (s1, "s1", None), (c, "c", None)]
    assert state.published_through == b


def test_2_6_compaction_keeps_a_stream_error_item_above_cutoff() -> None:
    j = Journal()
    c = j.user("a")
    e = j.error("disk full")
    s = j.compaction(through=c)
    assert offsets(j.fold(), "history") == [s, e]


def test_2_6_compaction_does_not_trigger_a_request() -> None:
    j = Journal()
    j.user("hi")
    r = j.request()
    j.settle(r)
    j.compaction(through=r)
    state = j.fold()
    assert state.pending is None and state.status == "idle"


def test_2_6_invalid_compaction_payload_is_skipped() -> None:
    j = Journal()
    j.user("a")
    j.compaction(through=1, key="k")  # a key on a summary: invalid
    j.compaction(through=1, policy="after-current-request")  # not dont-trigger: invalid
    j.item("developer", "s", compaction={"replacesHistoryThrough": 1})  # no policy: invalid
    state = j.fold()
    assert [i["content"] for i in projection_json(state)["history"]] == ["a"]
    assert state.published_through == 0


# --- §4.1 triggers --------------------------------------------------------------------------------


EXTERNAL_DEV_ACTORS = [
    {"type": "user", "origin": "web"},
    {"type": "integration", "name": "x"},
    {"type": "slack"},
    {"type": "telegram"},
    {"type": "email"},
    {"type": "github"},
]
LOOP_DEV_ACTORS = [None, {"type": "agent", "path": "/agents/b"}, {"type": "script", "executionId": "e"}]


def ci(role: str, actor: dict[str, Any] | None = None, policy: str | None = None) -> ContextItem:
    fields: dict[str, Any] = {"role": role, "content": "x"}
    if actor is not None:
        fields["actor"] = actor
    if policy is not None:
        fields["llmRequestPolicy"] = {"behaviour": policy}
    return ContextItem.model_validate(fields)


@pytest.mark.parametrize("policy", [None, "after-current-request", "interrupt-current-request"])
def test_4_1_trigger_source_none_for_system_and_assistant(policy: str | None) -> None:
    assert trigger_source(ci("system", policy=policy)) is None
    assert trigger_source(ci("assistant", policy=policy)) is None


@pytest.mark.parametrize("role", ["user", "developer"])
def test_4_1_trigger_source_none_for_dont_trigger_request(role: str) -> None:
    assert trigger_source(ci(role, policy=DONT_TRIGGER)) is None


@pytest.mark.parametrize("actor", [None, *EXTERNAL_DEV_ACTORS, *LOOP_DEV_ACTORS], ids=str)
def test_4_1_trigger_source_external_for_user_items_any_actor(actor: dict[str, Any] | None) -> None:
    assert trigger_source(ci("user", actor)) == "external"


@pytest.mark.parametrize("actor", EXTERNAL_DEV_ACTORS, ids=lambda a: a["type"])
def test_4_1_trigger_source_external_for_developer_from_external_actor(actor: dict[str, Any]) -> None:
    assert trigger_source(ci("developer", actor)) == "external"
    assert trigger_source(ci("developer", actor, "interrupt-current-request")) == "external"


@pytest.mark.parametrize("actor", LOOP_DEV_ACTORS, ids=str)
def test_4_1_trigger_source_agent_loop_for_developer_without_actor_or_agent_or_script(
    actor: dict[str, Any] | None,
) -> None:
    assert trigger_source(ci("developer", actor)) == "agent-loop"


def test_4_1_triggering_item_becomes_the_pending_trigger() -> None:
    j = Journal()
    u = j.user("hi")
    state = j.fold()
    assert turn_json(state)["pendingTrigger"] == {"offset": u, "atMs": j.at_ms(u), "source": "external"}


def test_4_1_non_triggering_items_leave_no_pending_trigger() -> None:
    j = Journal()
    j.system("s", key=PROMPT)
    j.assistant("a")
    j.user("u", policy=DONT_TRIGGER)
    j.developer("d", policy=DONT_TRIGGER)
    assert j.fold().pending is None


def test_4_1_newest_trigger_wins_and_debounce_counts_from_the_first() -> None:
    j = Journal()
    first = j.user("a")
    j.user("b", policy=DONT_TRIGGER)
    newest = j.developer("c")  # agent-loop
    state = j.fold()
    assert turn_json(state)["pendingTrigger"] == {"offset": newest, "atMs": j.at_ms(first), "source": "agent-loop"}


@pytest.mark.parametrize(
    "created_at",
    [
        "2026-12-02T10:13:51.123Z",
        "2004-04-29T19:51:17.610Z",
        "2039-02-04T21:32:50.140Z",
        "1987-02-01T08:58:37.096Z",
    ],
)
def test_4_1_pending_trigger_at_ms_is_the_exact_epoch_ms_of_created_at(created_at: str) -> None:
    """§4.1/§4.2: `atMs` is the trigger's createdAt in epoch milliseconds (the debounce and
    `expiresAt = trigger.atMs + llmRequestExpiryMs` count from it), exactly, not float-truncated."""
    moment = datetime.fromisoformat(created_at)
    j = Journal(start=moment)
    j.user("hi", after_ms=0)
    assert j.created_at(1) == created_at
    expected = (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
    assert j.fold().pending.atMs == expected


def test_4_1_debounce_restarts_after_a_request_covers_the_trigger() -> None:
    j = Journal()
    j.user("a")
    r = j.request()
    j.settle(r)
    second = j.user("b")
    pending = turn_json(j.fold())["pendingTrigger"]
    assert pending == {"offset": second, "atMs": j.at_ms(second), "source": "external"}


def test_4_1_external_trigger_resets_autonomous_count_and_failures() -> None:
    j = Journal()
    j.developer("loop")
    r = j.request()
    j.settle(r, "failed")
    state = j.fold()
    assert (state.autonomous_turn_count, state.consecutive_llm_failures) == (1, 1)
    j.user("hi")
    state = j.fold()
    assert (state.autonomous_turn_count, state.consecutive_llm_failures) == (0, 0)


@pytest.mark.parametrize("actor", LOOP_DEV_ACTORS, ids=str)
def test_4_1_agent_loop_trigger_does_not_reset_counts(actor: dict[str, Any] | None) -> None:
    j = Journal()
    j.developer("loop")
    r = j.request()
    j.settle(r, "failed")
    j.developer("again", actor=actor)
    state = j.fold()
    assert (state.autonomous_turn_count, state.consecutive_llm_failures) == (1, 1)


# --- §4.2 one open request ------------------------------------------------------------------------


def test_4_2_request_opens_when_pending_none_open_and_not_paused() -> None:
    j = Journal()
    u = j.user("hi")
    r = j.request(model="m1", expires_at=1234)
    state = j.fold()
    assert state.pending is None
    assert turn_json(state)["openRequest"] == {"offset": r, "model": "m1", "expiresAt": 1234, "triggerOffset": u}
    assert state.status == "busy"


def test_4_2_request_without_pending_trigger_does_not_open() -> None:
    j = Journal()
    j.request()
    state = j.fold()
    assert state.open is None and state.status == "idle"


def test_4_2_request_while_one_is_open_does_not_open_and_keeps_pending() -> None:
    j = Journal()
    j.user("a")
    r1 = j.request()
    b = j.user("b")
    j.request()
    state = j.fold()
    assert state.open.offset == r1
    assert state.pending is not None and state.pending.offset == b


def test_4_2_request_while_paused_does_not_open_and_keeps_pending() -> None:
    j = Journal()
    j.paused()
    u = j.user("a")
    j.request()
    state = j.fold()
    assert state.open is None
    assert state.pending.offset == u and state.status == "paused"


def test_4_2_agent_loop_turn_counts_autonomous_external_does_not() -> None:
    j = Journal()
    j.user("ext")
    r = j.request()
    j.settle(r)
    assert j.fold().autonomous_turn_count == 0
    for n in range(3):
        j.developer(f"loop {n}")
        r = j.request()
        j.settle(r)
    assert j.fold().autonomous_turn_count == 3


def test_4_2_trigger_waiting_only_for_system_prompt_is_queued() -> None:
    j = Journal()
    j.created()
    j.user("early")
    state = j.fold()
    assert not state.has_system_prompt
    assert state.status == "queued"
    j.system("prompt", key=PROMPT)
    state = j.fold()
    assert state.has_system_prompt and state.status == "queued"


def test_4_2_second_agent_created_is_a_no_op() -> None:
    j = Journal()
    j.created(by="a")
    before = j.fold()
    j.created(by="b")
    after = j.fold()
    assert after.created and projection_json(after) == projection_json(before)
    assert turn_json(after) == turn_json(before)


# --- §4.3 settling ------------------------------------------------------------------------------


def test_4_3_settlement_of_the_open_request_closes_it() -> None:
    j = Journal()
    j.user("hi")
    r = j.request()
    j.assistant("ok", llmRequestOffset=r)
    j.settle(r, text="ok")
    state = j.fold()
    assert state.open is None and state.status == "idle"


@pytest.mark.parametrize("status", ["succeeded", "failed", "cancelled"])
def test_4_3_settlement_for_another_offset_is_ignored(status: str) -> None:
    j = Journal()
    j.user("hi")
    r = j.request()
    j.settle(r + 7, status)
    j.settle(r - 1, status)
    state = j.fold()
    assert state.open is not None and state.open.offset == r
    assert state.consecutive_llm_failures == 0 and state.pending is None


def test_4_3_settlement_with_nothing_open_is_ignored() -> None:
    j = Journal()
    r = j.request()
    j.settle(r, "failed")
    state = j.fold()
    assert state.consecutive_llm_failures == 0 and state.pending is None


def test_4_3_failure_becomes_agent_loop_trigger_until_max_attempts_then_gives_up() -> None:
    j = Journal()
    j.user("hi")
    for attempt in (1, 2):
        r = j.request()
        f = j.settle(r, "failed", errorMessage=f"e{attempt}")
        state = j.fold()
        assert state.consecutive_llm_failures == attempt
        assert turn_json(state)["pendingTrigger"] == {"offset": f, "atMs": j.at_ms(f), "source": "agent-loop"}
    r = j.request()
    j.settle(r, "failed")
    state = j.fold()
    assert state.consecutive_llm_failures == 3
    assert state.pending is None and state.status == "idle"  # gave up


def test_4_3_max_attempts_comes_from_config() -> None:
    j = Journal()
    j.configured({"llmRequestRetryPolicy": {"maxAttempts": 1}})
    j.user("hi")
    r = j.request()
    j.settle(r, "failed")
    assert j.fold().pending is None


def test_context_overflow_compacted_retries_without_spending_an_attempt() -> None:
    """Context that outgrows the model recovers by itself: a request whose history was compacted
    through it before it failed retries even on its last attempt; a second overflow (a newer
    request than the compaction) counts as a failure."""
    j = Journal()
    j.configured({"llmRequestRetryPolicy": {"maxAttempts": 1}})
    j.user("hi")
    r = j.request()
    j.compaction(r, "summary of everything", policy=DONT_TRIGGER)
    f = j.settle(r, "failed", errorMessage="context window exceeded; compacted, retrying")
    state = j.fold()
    assert state.consecutive_llm_failures == 0
    assert turn_json(state)["pendingTrigger"] == {"offset": f, "atMs": j.at_ms(f), "source": "agent-loop"}
    r2 = j.request()
    j.settle(r2, "failed", errorMessage="overflow again")
    state = j.fold()
    assert state.consecutive_llm_failures == 1 and state.pending is None  # gave up: maxAttempts 1


def test_4_3_success_resets_consecutive_failures() -> None:
    j = Journal()
    j.user("hi")
    r = j.request()
    j.settle(r, "failed")
    r = j.request()
    j.settle(r, "succeeded")
    state = j.fold()
    assert state.consecutive_llm_failures == 0 and state.pending is None


def test_4_3_cancelled_settlement_closes_without_trigger() -> None:
    j = Journal()
    j.user("hi")
    r = j.request()
    j.settle(r, "cancelled", reason="expired")
    state = j.fold()
    assert state.open is None and state.pending is None and state.consecutive_llm_failures == 0


def test_4_3_stream_error_is_transcribed_as_developer_item_without_trigger() -> None:
    j = Journal()
    e = j.error("LLM request @3 failed: boom")
    state = j.fold()
    [projected] = projection_json(state)["history"]
    assert {k: v for k, v in projected.items() if k != "llmRequestPolicy"} == {
        "offset": e,
        "role": "developer",
        "content": "Error on stream: LLM request @3 failed: boom",
        "actor": {"type": "integration", "name": "stream-error"},
    }
    item = state.history.cells[0].item
    assert item.llmRequestPolicy is not None and item.llmRequestPolicy.behaviour == DONT_TRIGGER
    assert state.pending is None


def test_4_4_interrupt_while_open_is_recorded_and_triggers() -> None:
    j = Journal()
    j.user("a")
    j.request()
    i = j.user("stop", policy=INTERRUPT)
    state = j.fold()
    assert state.open.interruptedBy == i
    assert state.pending.offset == i


# --- §4.3 pause / resume ------------------------------------------------------------------------


def test_4_3_pause_sets_status_paused_and_drops_pending_agent_loop_trigger() -> None:
    j = Journal()
    d = j.developer("loop")
    j.paused(trigger_offset=d, reason="autonomous turn limit reached (100 consecutive turns without external input)")
    state = j.fold()
    assert state.paused and state.status == "paused" and state.pending is None


def test_4_3_agent_loop_triggers_are_dropped_while_paused() -> None:
    j = Journal()
    j.paused()
    j.developer("loop")
    j.developer("script", actor={"type": "script", "executionId": "e"})
    assert j.fold().pending is None


def test_4_3_failed_settlement_trigger_is_dropped_while_paused() -> None:
    j = Journal()
    j.user("a")
    r = j.request()
    j.paused()  # an open request still runs while paused
    state = j.fold()
    assert state.open is not None and state.status == "busy"
    j.settle(r, "failed")
    state = j.fold()
    assert state.pending is None and state.status == "paused"


def test_4_3_external_trigger_while_paused_stays_pending() -> None:
    j = Journal()
    j.paused()
    u = j.user("hi")
    state = j.fold()
    assert state.paused and state.pending.offset == u and state.pending.source == "external"
    assert state.status == "paused"


def test_4_3_resumed_clears_pause_and_pending_external_trigger_is_queued() -> None:
    j = Journal()
    j.paused()
    u = j.user("hi")
    j.resumed(reason="external input")
    state = j.fold()
    assert not state.paused and state.status == "queued" and state.pending.offset == u
    r = j.request()
    assert j.fold().open.offset == r


def test_4_3_stale_pause_older_than_latest_external_trigger_is_ignored() -> None:
    j = Journal()
    d = j.developer("loop")
    u = j.user("hi")
    j.paused(trigger_offset=d)
    state = j.fold()
    assert not state.paused and state.pending.offset == u


def test_4_3_pause_for_the_latest_external_trigger_is_not_stale() -> None:
    j = Journal()
    u = j.user("hi")
    j.paused(trigger_offset=u)
    assert j.fold().paused


def test_4_3_agent_loop_trigger_after_resume_counts_again() -> None:
    j = Journal()
    j.paused()
    j.resumed()
    d = j.developer("loop")
    assert j.fold().pending.offset == d


# --- §4.7 configuration ---------------------------------------------------------------------------


def test_4_7_defaults() -> None:
    config = AgentState().config
    assert config.llm.model is None
    assert config.llmRequestDebounceMs == 250
    assert config.llmRequestExpiryMs == 600_000
    assert (
        config.llmRequestRetryPolicy.maxAttempts,
        config.llmRequestRetryPolicy.backoffBaseMs,
        config.llmRequestRetryPolicy.backoffMaxMs,
    ) == (3, 10_000, 60_000)
    assert config.maxAutonomousTurns == 100
    assert config.compactionTriggerFraction == 0.5
    assert config.scriptResultHistoryLimit == 30_000


def test_4_7_config_deep_merge_objects_recurse_scalars_replace() -> None:
    j = Journal()
    j.configured({"llm": {"model": "a"}, "llmRequestRetryPolicy": {"backoffBaseMs": 5}})
    j.configured({"llmRequestRetryPolicy": {"maxAttempts": 7}, "llmRequestDebounceMs": 10})
    j.configured({"llm": {"model": "b"}})
    config = j.fold().config
    assert config.llm.model == "b"
    assert (
        config.llmRequestRetryPolicy.maxAttempts,
        config.llmRequestRetryPolicy.backoffBaseMs,
        config.llmRequestRetryPolicy.backoffMaxMs,
    ) == (7, 5, 60_000)
    assert config.llmRequestDebounceMs == 10
    assert config.maxAutonomousTurns == 100


@pytest.mark.parametrize(
    "patch",
    [
        {"colour": 1},
        {"llmRequestRetryPolicy": {"maxTries": 2}},
        {"llm": {"x": 1}},
        {"llmRequestDebounceMs": -1},
        {"maxAutonomousTurns": "5"},
    ],
)
def test_4_7_invalid_config_patch_event_is_skipped(patch: dict[str, Any]) -> None:
    j = Journal()
    j.configured({"llmRequestDebounceMs": 99})
    j.configured({"maxAutonomousTurns": 1, **patch})  # valid field + invalid one: all or nothing
    state = j.fold()
    assert state.config.llmRequestDebounceMs == 99
    assert state.config.maxAutonomousTurns == 100  # the whole event was skipped
    assert state.cursor == 2


@pytest.mark.parametrize(
    "patch",
    [
        {"llmRequestDebounceMs": None},
        {"llm": None},
        {"llmRequestRetryPolicy": None},
        {"llmRequestRetryPolicy": {"maxAttempts": None}},
    ],
)
def test_4_7_config_patch_with_null_never_crashes_the_reducer(patch: dict[str, Any]) -> None:
    """§1.2/§4.7: a journaled `agent/configured` whose patch holds `null` must either be rejected as
    invalid (then skipped) or treated as absent; the reducer must never crash on it."""
    j = Journal()
    j.configured({"llmRequestDebounceMs": 99})
    j.configured(patch)
    j.user("after")
    state = j.fold()  # must not raise
    assert state.cursor == 3
    assert state.config.llmRequestDebounceMs == 99
    assert state.config.llmRequestRetryPolicy.maxAttempts == 3
    assert state.config.llm.model is None


# --- token totals, invalid payloads, order --------------------------------------------------------


def test_4_token_usage_totals_accumulate_every_report() -> None:
    j = Journal()
    j.user("hi")
    r = j.request()
    j.usage(r, 100, 10, cachedInputTokens=40)
    j.usage(r, 50, 5, reasoningOutputTokens=3)
    j.usage(999, 1, 1)  # totals count every report, whichever request it names
    assert turn_json(j.fold())["tokenUsage"] == {
        "inputTokens": 151,
        "outputTokens": 16,
        "cachedInputTokens": 40,
        "reasoningOutputTokens": 3,
    }


def test_4_5_over_threshold_report_is_remembered_until_compacted() -> None:
    j = Journal()
    j.user("hi")
    r = j.request()
    j.usage(r, 400, 99, max_context_tokens=1000)  # 499 < 500
    assert j.fold().over_threshold is None
    u = j.usage(r, 400, 100, max_context_tokens=1000)  # 500 >= floor(1000 * 0.5)
    report = j.fold().over_threshold
    assert (report.offset, report.llmRequestOffset, report.tokens, report.threshold) == (u, r, 500, 500)
    j.compaction(through=r)
    assert j.fold().over_threshold is None


def test_4_5_the_threshold_is_the_floor_of_max_context_tokens_times_the_fraction() -> None:
    """§4.5: `inputTokens + outputTokens >= floor(maxContextTokens * compactionTriggerFraction)`:
    4099 * 0.5 = 2049.5, so 2049 tokens are over the threshold 2049 and 2048 are not."""
    j = Journal()
    j.user("hi")
    r = j.request()
    j.usage(r, 2000, 48, max_context_tokens=4099)
    assert j.fold().over_threshold is None
    u = j.usage(r, 2000, 49, max_context_tokens=4099)
    report = j.fold().over_threshold
    assert report is not None
    assert (report.offset, report.tokens, report.threshold) == (u, 2049, 2049)


def test_1_2_invalid_payload_is_skipped_without_crashing() -> None:
    j = Journal()
    j.user("ok")
    j.append("events.iterate.com/agents/context-added", {"role": "user", "content": "x", "order": 1})
    j.append("events.iterate.com/agent/llm-request-requested", {"model": "m"})
    j.append("events.iterate.com/agent/paused", {"triggerOffset": "soon"})
    j.append("events.iterate.com/agent/llm-request-settled", {"requestOffset": 1})
    j.noop()
    state = j.fold()
    assert state.cursor == j.last
    assert [i["content"] for i in projection_json(state)["history"]] == ["ok"]
    assert state.published_through == 0 and not state.paused and state.pending.offset == 1


@pytest.mark.parametrize("second", [1, 2, 3])
def test_2_events_out_of_offset_order_raise_journal_order_error(second: int) -> None:
    j = Journal()
    j.user("a")
    j.user("b")
    j.user("c")
    events = j.decoded()
    state = AgentState()
    fold(state, events[2])  # @3
    with pytest.raises(JournalOrderError):
        fold(state, events[second - 1])


def test_2_events_of_another_stream_raise_journal_order_error() -> None:
    a, b = Journal("/agents/a"), Journal("/agents/b")
    a.user("x")
    b.user("y")
    b.user("z")
    state = a.fold()
    with pytest.raises(JournalOrderError):
        fold(state, b.decoded()[1])


def test_2_reducer_is_a_pure_function_of_the_journal() -> None:
    j = Journal()
    j.system("p", key=PROMPT)
    j.user("hi", key="k")
    r = j.request()
    j.assistant("x", llmRequestOffset=r)
    j.settle(r, text="x")
    j.user("again", key="k")
    j.compaction(through=r)
    one, two = j.fold(), j.fold()
    assert projection_json(one) == projection_json(two) and turn_json(one) == turn_json(two)
    replay = AgentState()
    for line in j.lines():
        fold(replay, decode_event(line))
    assert projection_json(replay) == projection_json(one)
