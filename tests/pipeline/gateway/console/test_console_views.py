"""The console's pure decisions, without a broker: statuses, paging, event lines, the projection as
the model sees it, the cached prefix of a request, turn explanations, sessions."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from pipeline.gateway.console.mirror import RecordCache
from pipeline.gateway.console.sessions import SessionBook, csrf_ok
from pipeline.gateway.console.views import (
    agent_row,
    cached_prefix,
    cached_share,
    event_view,
    explain_turn,
    filter_rows,
    journal_page,
    previous_request,
    projection_items,
    slice_page,
)
from processors.reducer import epoch_ms, fold_all
from processors.render import DEFAULT_BUDGET, as_of_request, render_messages, render_request
from processors.state import AgentState
from schemas.events import decode_event

PATH = "/agents/console"
T0 = "2026-12-02T10:00:00.000Z"


class Journal:
    """Events of one stream, numbered as the journal numbers them."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def add(self, type_: str, payload: dict[str, Any], created_at: str = T0) -> int:
        offset = len(self.events) + 1
        raw = {"streamPath": PATH, "offset": offset, "type": type_, "payload": payload, "createdAt": created_at}
        self.events.append(decode_event(raw))
        return offset

    def item(self, role: str, content: str, created_at: str = T0, **extra: Any) -> int:
        return self.add(
            "events.iterate.com/agents/context-added", {"role": role, "content": content, **extra}, created_at
        )

    def born(self) -> Journal:
        self.add("events.iterate.com/agent/created", {})
        self.item("system", "be brief", key="agent/system-prompt")
        return self

    def request(self, created_at: str = T0) -> int:
        return self.add(
            "events.iterate.com/agent/llm-request-requested", {"model": "m", "expiresAt": 10**13}, created_at
        )

    def state(self) -> AgentState:
        return fold_all(AgentState(), self.events)


# --- statuses and the agents list ------------------------------------------------------------------


def test_status_rows_name_each_state_an_agent_can_be_in() -> None:
    journal = Journal().born()
    assert agent_row(PATH, journal.state()).status_label == "idle"
    journal.item("user", "hi")
    assert agent_row(PATH, journal.state()).status_label == "queued"
    request = journal.request()
    row = agent_row(PATH, journal.state())
    assert (row.status_label, row.open_request, row.model) == ("busy", request, "m")
    journal.add(
        "events.iterate.com/agent/llm-request-settled",
        {"requestOffset": request, "result": {"status": "succeeded", "text": "x"}},
    )
    journal.add("events.iterate.com/agent/paused", {"reason": "lunch"})
    assert agent_row(PATH, journal.state()).status_label == "paused"


def test_status_a_running_script_is_its_own_status() -> None:
    journal = Journal().born()
    journal.add(
        "events.iterate.com/capability-host/script-run-requested",
        {"code": "1", "executionId": "agent-output:9", "expiresAt": 10**13},
    )
    assert agent_row(PATH, journal.state()).status_label == "running a script"


def test_token_usage_and_last_activity_come_from_the_fold() -> None:
    journal = Journal().born()
    journal.item("user", "hi")
    request = journal.request()
    journal.add(
        "events.iterate.com/agent/token-usage-reported",
        {"llmRequestOffset": request, "model": "m", "maxContextTokens": 10**6, "inputTokens": 40, "outputTokens": 2,
         "cachedInputTokens": 32},
        "2026-12-02T10:00:05.000Z",
    )  # fmt: skip
    row = agent_row(PATH, journal.state())
    assert (row.input_tokens, row.output_tokens, row.cached_input_tokens) == (40, 2, 32)
    assert row.last_activity == "2026-12-02T10:00:05.000Z" and row.events == 5


def test_filter_by_path_and_status_most_recent_first() -> None:
    base = agent_row(PATH, AgentState())
    rows = [
        replace(base, path="/agents/b", last_activity="2026-01-01T00:00:00.000Z"),
        replace(base, path="/agents/a", last_activity="2026-02-01T00:00:00.000Z"),
        replace(base, path="/integrations/x", status="busy"),
    ]
    assert [r.path for r in filter_rows(rows)] == ["/agents/a", "/agents/b", "/integrations/x"]
    assert [r.path for r in filter_rows(rows, "AGENTS/")] == ["/agents/a", "/agents/b"]
    assert [r.path for r in filter_rows(rows, "", "busy")] == ["/integrations/x"]


# --- paging ----------------------------------------------------------------------------------------


def test_journal_pages_are_newest_first_with_links_both_ways() -> None:
    newest = journal_page(120, None, 50)
    assert newest.offsets[0] == 120 and newest.offsets[-1] == 71 and len(newest.offsets) == 50
    assert not newest.has_newer and newest.older_before == 71
    middle = journal_page(120, newest.older_before, 50)
    assert middle.offsets == tuple(range(70, 20, -1)) and middle.has_newer and middle.newer_before is None
    oldest = journal_page(120, middle.older_before, 50)
    assert oldest.offsets == tuple(range(20, 0, -1)) and oldest.older_before is None
    assert oldest.has_newer and oldest.newer_before == 71
    assert journal_page(0, None, 50).offsets == ()
    assert journal_page(10, 999, 5).offsets == (10, 9, 8, 7, 6)


def test_slice_page_says_whether_more_follow() -> None:
    assert slice_page(list(range(5)), 0, 2) == ([0, 1], True)
    assert slice_page(list(range(5)), 2, 2) == ([4], False)
    assert slice_page(list(range(5)), -3, 2) == ([0, 1], True)


# --- journal events --------------------------------------------------------------------------------


def test_event_lines_are_readable_and_keep_the_payload_to_expand() -> None:
    journal = Journal().born()
    journal.item("user", "line one\nline two", actor={"type": "user", "origin": "web"})
    journal.add("events.iterate.com/stream/error-occurred", {"message": "boom"})
    journal.add("events.iterate.com/github/webhook-received", {"event": "push"})
    user, error, other = (event_view(e) for e in journal.events[2:])
    assert user.kind == "user" and user.summary == "user [user]: line one ⏎ line two"
    assert '"content": "line one\\nline two"' in user.payload_json
    assert (error.kind, error.summary) == ("error", "boom")
    assert other.short_type == "webhook-received" and other.kind == "turn" and '"push"' in other.summary


def test_an_invalid_payload_is_shown_as_skipped_with_its_reason() -> None:
    journal = Journal()
    journal.add("events.iterate.com/agents/context-added", {"role": "user", "content": "x", "order": 1})
    view = event_view(journal.events[0])
    assert view.kind == "invalid" and "skipped" in view.summary and '"order": 1' in view.payload_json


def test_a_compaction_summary_is_marked_in_the_journal_line() -> None:
    journal = Journal().born()
    journal.item("user", "old")
    journal.request()
    journal.item(
        "developer",
        "summary",
        compaction={"replacesHistoryThrough": 4},
        llmRequestPolicy={"behaviour": "dont-trigger-request"},
    )
    assert "(compaction summary)" in event_view(journal.events[-1]).summary


# --- the projection as the model sees it ------------------------------------------------------------


def test_projection_items_show_provider_roles_after_demotion_and_which_slots_settle() -> None:
    journal = Journal().born()
    journal.item("developer", "from github", actor={"type": "github", "login": "octocat"})
    journal.item("developer", "platform note")
    journal.request()
    journal.item("developer", "draft", key="task")
    items = projection_items(journal.state(), "openai-compatible")
    github, platform, draft = items[1:]
    assert (github.role, github.provider_role, github.demoted) == ("developer", "user", True)
    assert (platform.provider_role, platform.demoted) == ("system", False)  # no developer role on this transport
    assert projection_items(journal.state(), "openai")[2].provider_role == "developer"
    assert github.published and not draft.published and draft.key == "task"
    assert github.header_line == '@3 actor=github:"octocat"' and github.body == "from github"


def test_projection_items_mark_the_compaction_summary() -> None:
    journal = Journal().born()
    journal.item("user", "old")
    request = journal.request()
    journal.item(
        "developer",
        "the summary",
        compaction={"replacesHistoryThrough": request},
        llmRequestPolicy={"behaviour": "dont-trigger-request"},
    )
    history = [i for i in projection_items(journal.state(), "openai") if i.lane == "history"]
    assert [i.compaction for i in history] == [True] and history[0].provider_role == "user"


# --- the cached prefix -----------------------------------------------------------------------------


def test_cached_prefix_shades_what_the_previous_request_shares_byte_for_byte() -> None:
    journal = Journal().born()
    journal.item("user", "first")
    first = journal.request("2026-12-02T10:00:01.000Z")
    journal.item("assistant", "answer", llmRequestOffset=first)
    journal.item("user", "second")
    before = render_messages(fold_all(AgentState(), journal.events[:first]), "openai", "2026-12-02T10:00:01.000Z")
    second = journal.request("2026-12-02T10:00:09.000Z")
    after = render_messages(journal.state(), "openai", "2026-12-02T10:00:09.000Z")
    shaded = cached_prefix(before, after)
    # Protocol, system prompt and the first user item are reused whole. The previous request's
    # timestamp stood where the answer stands now: the shared prefix ends there (the timestamp is
    # last in every request so that it never breaks more than this).
    assert [m.fresh for m in shaded[:3]] == ["", "", ""] and shaded[2].cached.endswith("first")
    assert before[3]["content"].startswith("Current date and time") and shaded[3].role == "assistant"
    assert all(m.cached == "" for m in shaded[3:])
    assert shaded[-1].fresh.endswith("10:00:09.000Z") and second == 7
    cached, total = cached_share(shaded)
    assert 0 < cached < total


def test_cached_prefix_nothing_without_a_previous_request_and_stops_at_a_role_change() -> None:
    current = [{"role": "system", "content": "abc"}, {"role": "user", "content": "x"}]
    assert cached_share(cached_prefix(None, current)) == (0, 4)
    previous = [{"role": "system", "content": "abc"}, {"role": "developer", "content": "x"}]
    shaded = cached_prefix(previous, current)
    assert (shaded[0].cached, shaded[1].cached) == ("abc", "")
    longer = [{"role": "system", "content": "abcdef"}, {"role": "user", "content": "x"}]
    assert [(m.cached, m.fresh) for m in cached_prefix(longer, current)] == [("abc", ""), ("", "x")]


@pytest.mark.parametrize(("a", "b", "common"), [("", "", 0), ("abc", "abd", 2), ("abc", "abc", 3), ("x", "y", 0)])
def test_cached_prefix_common_prefix_of_message_contents(a: str, b: str, common: int) -> None:
    shaded = cached_prefix([{"role": "user", "content": a}], [{"role": "user", "content": b}])
    assert len(shaded[0].cached) == common and shaded[0].cached + shaded[0].fresh == b


def test_previous_request_is_the_one_before() -> None:
    assert previous_request([3, 9, 14], 14) == 9
    assert previous_request([3, 9, 14], 3) is None


# --- turn decisions explained ----------------------------------------------------------------------


def test_turn_waiting_for_the_system_prompt_is_queued_not_busy() -> None:
    journal = Journal()
    journal.add("events.iterate.com/agent/created", {})
    journal.item("user", "hi")
    lines = explain_turn(journal.state(), epoch_ms(T0) + 10_000, "m")
    assert lines == [
        "Trigger @2 (external) is queued: waiting for the system prompt (a system item keyed agent/system-prompt)."
    ]


def test_turn_debounce_then_due() -> None:
    journal = Journal().born()
    journal.item("user", "hi")
    at = epoch_ms(T0)
    waiting = explain_turn(journal.state(), at + 100, "m")
    assert waiting == [
        "Trigger @3 (external) waits: debounce 250 ms from 2026-12-02T10:00:00.000Z, "
        "due at 2026-12-02T10:00:00.250Z (in 150 ms)."
    ]
    due = explain_turn(journal.state(), at + 250, "m")
    assert "is due" in due[0] and "agent/request/3" in due[0]


def test_turn_backoff_after_a_failure_is_added_to_the_debounce() -> None:
    journal = Journal().born()
    journal.item("user", "hi")
    request = journal.request()
    journal.add(
        "events.iterate.com/agent/llm-request-settled",
        {"requestOffset": request, "result": {"status": "failed", "errorMessage": "429"}},
    )
    lines = explain_turn(journal.state(), epoch_ms(T0), "m")
    assert lines[0] == "1 consecutive LLM failure(s) of 3 attempts allowed."
    assert "debounce 250 ms + backoff 10000 ms" in lines[1] and "(agent-loop)" in lines[1]


def test_turn_an_open_request_holds_the_next_trigger() -> None:
    journal = Journal().born()
    journal.item("user", "hi")
    journal.request()
    journal.item("user", "more")
    lines = explain_turn(journal.state(), epoch_ms(T0), "m")
    assert lines[0].startswith("Request @4 is open (model m, triggered by @3)")
    assert lines[1] == "Trigger @5 waits for it: one request at a time."


def test_turn_breaker_and_pause_are_explained() -> None:
    journal = Journal().born()
    journal.add("events.iterate.com/agent/configured", {"config": {"maxAutonomousTurns": 0}})
    journal.item("developer", "loop on")
    lines = explain_turn(journal.state(), epoch_ms(T0) + 1000, "m")
    assert (
        lines[0].startswith("Breaker: Trigger @4 (agent-loop) would start turn 1")
        and "maxAutonomousTurns = 0" in lines[0]
    )
    journal.add("events.iterate.com/agent/paused", {"reason": "autonomous turn limit reached"})
    lines = explain_turn(journal.state(), epoch_ms(T0) + 1000, "m", "autonomous turn limit reached")
    assert lines[0].startswith("Paused: autonomous turn limit reached.")
    journal.item("user", "go on")
    lines = explain_turn(journal.state(), epoch_ms(T0) + 1000, "m", "autonomous turn limit reached")
    assert "resumes the agent" in lines[-1]


def test_turn_idle_says_what_starts_the_next_turn() -> None:
    assert explain_turn(Journal().born().state(), 0, "m") == [
        "No pending trigger: a user message (or another triggering item) starts the next turn."
    ]


# --- sessions and the record cache ------------------------------------------------------------------


def test_sessions_are_opaque_expire_and_check_their_csrf_token() -> None:
    book = SessionBook(ttl_s=10, per_token=2)
    first = book.open("token-1", now=0)
    session = book.get(first, now=5)
    assert session is not None and session.token == "token-1" and "token-1" not in first
    assert csrf_ok(session, session.csrf) and not csrf_ok(session, "forged") and not csrf_ok(session, None)
    assert book.get(first, now=10) is None  # expired
    other = book.open("other-token", now=20)
    second, third, fourth = (book.open("t", now=20 + i) for i in range(3))
    assert book.get(second, now=23) is None and book.get(fourth, now=23) is not None  # the token's oldest out
    assert book.get(other, now=23) is not None  # another token's session is never evicted
    book.close(fourth)
    assert book.get(fourth, now=23) is None and book.get(third, now=23) is not None
    assert book.get(None) is None


def test_record_cache_stays_within_its_byte_budget() -> None:
    cache = RecordCache(1600)
    for offset in range(1, 40):
        cache.put((PATH, offset), b"x" * 100)
    assert cache.get((PATH, 1)) is None and cache.get((PATH, 39)) == b"x" * 100
    cache.put((PATH, 99), b"y" * 1000)  # over a sixteenth of the budget: not kept
    assert cache.get((PATH, 99)) is None


def test_a_request_rendered_from_the_live_state_equals_the_refold_up_to_it() -> None:
    """The console renders a past request from the folded state (`as_of_request`) and falls back to
    re-folding the journal (`agentstream agent request`'s way) only after a compaction: both agree."""
    journal = Journal().born()
    journal.item("user", "first")
    first = journal.request("2026-12-02T10:00:01.000Z")
    journal.item("assistant", "answer", llmRequestOffset=first)
    journal.item("developer", "draft", key="task")
    journal.item("user", "second")
    journal.request("2026-12-02T10:00:05.000Z")
    journal.item("developer", "draft 2", key="task")
    state = journal.state()
    for request in (e for e in journal.events if e.type.endswith("llm-request-requested")):
        as_of = as_of_request(state, request.offset)
        assert as_of is not None
        live = render_messages(as_of, "openai", request.createdAt)
        assert live == render_request(journal.events, request, "openai", DEFAULT_BUDGET)
