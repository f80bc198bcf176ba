"""The console's turn timeline without a broker (docs/operations.md, "Web console", "Timeline"):
which hops a turn has, from which journal timestamps, how they are drawn, and the link to the
turn's trace (behaviour §8)."""

from __future__ import annotations

from pipeline.gateway.console.mirror import JournalMirror, MirroredStream, RawRecord
from pipeline.gateway.console.timeline import (
    LABEL,
    TurnTimes,
    iso_ms,
    trace_link,
    turn_timeline,
    turn_times,
    waterfall,
)
from pipeline.settings import Settings
from schemas.capabilities import SCRIPT_RUN_REQUESTED, SCRIPT_RUN_SETTLED, SCRIPT_RUN_STARTED
from tests.support.journal_builder import Journal

T = 1_780_000_000_000  # an epoch ms to count from


def names(times: TurnTimes) -> list[tuple[str, int]]:
    return [(hop.name, hop.duration_ms) for hop in turn_timeline(times).hops]


def test_a_settled_turn_has_every_hop_from_appended_to_the_answer_journaled() -> None:
    times = TurnTimes(
        request_offset=4,
        trigger_offset=3,
        appended_ms=T,
        trigger_journaled_ms=T + 12,
        scheduled_ms=T + 62,
        answered_ms=T + 1_570,
        call_ms=1_500,
        settled_ms=T + 1_590,
        status="succeeded",
    )
    assert names(times) == [
        ("appended → journaled", 12),
        ("journaled → scheduled", 50),
        ("scheduled → call started", 8),
        ("provider call", 1_500),
        ("answered → journaled", 20),
    ]
    timeline = turn_timeline(times)
    assert [p.name for p in timeline.points] == [
        "appended",
        "trigger journaled",
        "scheduled",
        "call started",
        "answered",
        "settled (succeeded)",
    ]
    assert (timeline.start_ms, timeline.end_ms) == (T, T + 1_590)
    assert [p.offset for p in timeline.points if p.offset] == [3, 4]


def test_a_known_first_token_splits_the_provider_call() -> None:
    times = TurnTimes(4, T, answered_ms=T + 1_000, call_ms=900, first_token_ms=T + 300, settled_ms=T + 1_010)
    assert names(times)[1:3] == [("call started → first token", 200), ("first token → answered", 700)]


def test_without_the_callers_command_the_call_ends_at_the_settlement_journaled() -> None:
    """The settlement command's timestamp may be gone (retention) or unreadable: the call is then
    placed before the settlement's createdAt, and no "answered → journaled" hop is invented."""
    times = TurnTimes(4, T, call_ms=400, settled_ms=T + 500, status="failed")
    assert names(times) == [("scheduled → call started", 100), ("provider call", 400)]


def test_an_open_request_shows_what_happened_so_far() -> None:
    times = TurnTimes(4, T + 30, trigger_offset=3, trigger_journaled_ms=T)
    assert names(times) == [("journaled → scheduled", 30)]


def test_a_hop_against_another_hosts_clock_is_drawn_as_zero_and_marked() -> None:
    times = TurnTimes(4, T + 10, trigger_offset=3, appended_ms=T + 40, trigger_journaled_ms=T)
    hop = turn_timeline(times).hops[0]
    assert (hop.name, hop.duration_ms, hop.skewed) == ("appended → journaled", 0, True)
    assert waterfall(turn_timeline(times)).bars[0].duration == "0 ms (clock skew)"


def test_a_hop_whose_ends_fall_in_the_same_millisecond_is_zero_and_not_clock_skew() -> None:
    """Only a hop whose end comes before its start is clock skew (docs/operations.md, "Timeline")."""
    times = TurnTimes(4, T + 10, trigger_offset=3, appended_ms=T, trigger_journaled_ms=T)
    hop = turn_timeline(times).hops[0]
    assert (hop.name, hop.duration_ms, hop.skewed) == ("appended → journaled", 0, False)
    assert waterfall(turn_timeline(times)).bars[0].duration == "0 ms"


def test_the_script_run_follows_the_answer() -> None:
    times = TurnTimes(
        4,
        T,
        answered_ms=T + 100,
        call_ms=90,
        settled_ms=T + 110,
        script_requested_ms=T + 110,
        script_started_ms=T + 140,
        script_settled_ms=T + 200,
        script_run_ms=45,
        script_status="succeeded",
    )
    assert names(times)[-2:] == [("journaled → script started", 30), ("script run (45 ms in the sandbox)", 60)]
    assert turn_timeline(times).points[-1].name == "script settled (succeeded)"


def test_the_waterfall_puts_every_bar_on_one_scale_inside_the_picture() -> None:
    times = TurnTimes(
        4, T + 10, trigger_offset=3, appended_ms=T, trigger_journaled_ms=T + 5, call_ms=2_000, settled_ms=T + 3_000
    )
    drawing = waterfall(turn_timeline(times), width=900)
    xs = [bar.x for bar in drawing.bars]
    assert xs == sorted(xs) and xs[0] == LABEL
    for bar in drawing.bars:
        assert bar.width >= 2  # a hop of a few ms stays visible
        assert bar.x + bar.width <= drawing.width
        assert (bar.text_anchor == "end") == (bar.text_x < bar.x + bar.width)
    assert drawing.total == "3000 ms" and drawing.ticks[-1][1] == "+3000 ms"
    assert drawing.height == 22 + len(drawing.bars) * 24 + 8


def test_the_times_come_from_the_journal_events_of_the_turn() -> None:
    """The mirror indexes each request's trigger, settlement and script run as it folds the
    journal; `turn_times` reads their createdAt and durationMs (behaviour §4.3, §6.3)."""
    journal = Journal(step_ms=10)
    journal.created()
    journal.system("policy", key="agent/system-prompt")
    trigger = journal.user("run this")
    request = journal.request()
    answer = journal.assistant("```python\n1 + 1\n```", llmRequestOffset=request)
    settled = journal.settle(request, duration_ms=7, text="done")
    execution = f"agent-output:{answer}"
    requested = journal.append(SCRIPT_RUN_REQUESTED, {"code": "1 + 1", "executionId": execution, "expiresAt": 1})
    started = journal.append(SCRIPT_RUN_STARTED, {"executionId": execution})
    settlement = {"status": "succeeded", "result": 2}
    ran = journal.append(SCRIPT_RUN_SETTLED, {"executionId": execution, "durationMs": 3, "settlement": settlement})
    later = journal.user("again")  # the next turn's trigger belongs to no earlier request

    mirror = JournalMirror(Settings(), "agent-journal")
    entry = MirroredStream(journal.stream_path, 0)
    events = {e.offset: e for e in journal.decoded()}
    for offset, event in events.items():
        mirror._add(entry, event, offset, RawRecord(b"", {}, 0))
    turn = entry.turns[request]
    assert (turn.trigger, turn.settled, turn.answer) == (trigger, settled, answer)
    assert (turn.script_requested, turn.script_started, turn.script_settled) == (requested, started, ran)
    assert later not in entry.turns

    scripts = (turn.script_requested, turn.script_started, turn.script_settled)
    times = turn_times(request, events, turn.trigger, turn.settled, scripts, appended_ms=None, answered_ms=None)
    assert times.trigger_journaled_ms == journal.at_ms(trigger) == iso_ms(journal.created_at(trigger))
    assert (times.scheduled_ms, times.settled_ms) == (journal.at_ms(request), journal.at_ms(settled))
    assert (times.call_ms, times.status, times.script_run_ms, times.script_status) == (7, "succeeded", 3, "succeeded")
    assert times.script_settled_ms == journal.at_ms(ran)
    assert times.answered_ms is None  # no command timestamp given: not invented


def test_an_open_request_has_no_answer_even_given_a_command_timestamp() -> None:
    """The answer's time is the settlement command's timestamp (docs/operations.md, "Timeline"): a
    request with no settlement journaled has no answer point, and nothing after it."""
    journal = Journal(step_ms=10)
    journal.created()
    journal.system("policy", key="agent/system-prompt")
    trigger = journal.user("hi")
    request = journal.request()
    events = {e.offset: e for e in journal.decoded()}
    times = turn_times(request, events, trigger, None, appended_ms=None, answered_ms=journal.at_ms(request) + 5)
    assert times.answered_ms is None
    assert [p.name for p in turn_timeline(times).points] == ["trigger journaled", "scheduled"]


def test_the_trace_link_needs_a_jaeger_url_and_a_valid_traceparent() -> None:
    parent = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    url = "http://127.0.0.1:16686/"
    assert trace_link(url, parent) == "http://127.0.0.1:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736"
    assert trace_link(None, parent) is None
    assert trace_link(url, None) is None
    for bad in (b"garbage", b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01", b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00-01"):
        assert trace_link(url, bad) is None, bad
