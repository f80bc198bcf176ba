"""What a journaled event sets in motion (docs/architecture.md, "Commit protocol"): `FollowUps.after`
answers an item with no request open at once; these tests hold that shortcut to asking every branch."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pipeline.journal.follow_ups import FollowUps
from pipeline.journal.streams import StreamEntry
from processors.reducer import fold
from processors.render import DEFAULT_BUDGET
from processors.state import AgentState, SourceOffsets
from schemas.capabilities import SCRIPT_RUN_REQUESTED
from schemas.events import decode_event
from tests.support.journal_builder import Journal
from tests.support.journal_strategy import PROPERTY_SETTINGS, journals
from topics.names import topic_names

TOPICS = topic_names()
CODE_ANSWER = "Let me check.\n```python\nprint(1)\n```"


def follow_ups() -> FollowUps:
    return FollowUps(TOPICS, "openai", lambda _model: DEFAULT_BUDGET)


def each_event_after(journal: Journal) -> list[tuple[Any, list[Any], list[Any]]]:
    """Per event, folded in order: (event, what `after` answers, what every branch answers)."""
    fu = follow_ups()
    entry = StreamEntry(AgentState(), SourceOffsets())
    seen = []
    for line in journal.lines():
        event = decode_event(line)
        fold(entry.state, event)
        entry.last_request = None  # each way renders a request itself, not from the other's memory
        quick = fu.after(entry, event)
        entry.last_request = None
        every = fu._requests(entry, event) + fu._scripts(entry, event)
        seen.append((event, quick, every))
    return seen


@given(journals(), st.booleans(), st.booleans())
@PROPERTY_SETTINGS
def test_6_an_item_with_no_request_open_sets_nothing_in_motion_exactly_as_every_branch_says(
    journal: Journal, code_answer: bool, interrupt: bool
) -> None:
    if code_answer:  # an answer to the open request that asks to run code: a run request follows
        journal.assistant(CODE_ANSWER, llmRequestOffset=journal.request())
    if interrupt:  # an item that interrupts the open request: a cancel follows
        journal.request()
        journal.user("stop", policy="interrupt-current-request")
    journal.user("after all that")
    for event, quick, every in each_event_after(journal):
        assert quick == every, f"@{event.offset} {event.type}"


def test_6_the_shortcut_still_lets_an_answer_that_runs_code_and_an_interruption_through() -> None:
    journal = Journal()
    journal.user("hello")
    journal.assistant(CODE_ANSWER, llmRequestOffset=journal.request())
    journal.request()
    journal.user("stop", policy="interrupt-current-request")
    seen = each_event_after(journal)
    assert seen[0][1] == []  # the first item: nothing open, nothing follows
    run_request = seen[2][1]
    assert [topic for topic, _key, _value in run_request] == [TOPICS.internal_appends]
    assert SCRIPT_RUN_REQUESTED.encode() in run_request[0][2]
    cancel = seen[4][1]
    assert [topic for topic, _key, _value in cancel] == [TOPICS.llm_requests]
    assert b'"cancel"' in cancel[0][2]
