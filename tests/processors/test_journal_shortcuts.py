"""`journal_command`'s shortcuts for the common command (no idempotency key, not a subscription)
and the dedupe rows built from the key it already made: the same answers as the long way.
Broker-free."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors import grants, idempotency_keys, rows
from processors.dedupe import dedupe_rows
from processors.journal import Journaled, Rejected, journal_command
from processors.state import AgentState, SourceOffsets
from schemas.events import CONTEXT_ADDED, PAYLOAD_MODELS, AppendCommand
from schemas.routing import AGENT_SUBSCRIBED

PATH = "/agents/a"
_TYPES = st.sampled_from([*PAYLOAD_MODELS, "x/other"])
_PAYLOADS = st.sampled_from(
    [
        {},
        {"source": "/elsewhere"},
        {"source": 7},
        {"role": "user", "content": "hi", "refs": [{"type": "event", "streamPath": "/b", "offset": 1}]},
        {"refs": [{"streamPath": "/b"}]},
    ]
)


@settings(max_examples=300, deadline=None)
@given(_TYPES, _PAYLOADS, st.booleans())
def test_without_an_idempotency_key_only_a_subscription_can_be_refused_by_grants(
    event_type: str, payload: dict[str, Any], created: bool
) -> None:
    """What lets `journal_command` skip both checks for a command without a key (not a subscription)."""
    command = AppendCommand.model_construct(streamPath=PATH, type=event_type, payload=payload)
    assert idempotency_keys.own_script_call_execution(None) is None
    if event_type != AGENT_SUBSCRIBED:
        assert grants.subscription_refusal(PATH, created, AgentState().config.grants, command) is None


def test_a_subscription_without_a_key_is_still_checked_against_the_grants() -> None:
    command = AppendCommand(streamPath=PATH, type=AGENT_SUBSCRIBED, payload={"source": "/elsewhere"})
    outcome = journal_command(AgentState(), command, now_ms=0, sources=SourceOffsets(), read=lambda _key: None)
    assert isinstance(outcome, Rejected)
    assert outcome.reason.startswith("forbidden: subscribe:")


@pytest.mark.parametrize("offset", [1, 3, 4, 7])
@pytest.mark.parametrize("key", [None, "k-1"])
def test_dedupe_rows_from_the_callers_append_key_are_the_rows_without_it(offset: int, key: str | None) -> None:
    stored = {rows.append_slot_key(PATH, offset % 3): b"\xff\x02old"}
    args: tuple[Any, ...] = (PATH, offset, CONTEXT_ADDED, key, None if key is None else "d" * 32, "new")
    given_key = dedupe_rows(*args, window=3, read=stored.get, append_key=rows.append_id_key(PATH, "new"))
    assert given_key == dedupe_rows(*args, window=3, read=stored.get)


def test_the_journaled_rows_hold_the_append_id_row_under_its_key() -> None:
    command = AppendCommand(
        streamPath=PATH, type=CONTEXT_ADDED, payload={"role": "user", "content": "hi"}, appendId="id-1"
    )
    outcome = journal_command(AgentState(), command, now_ms=0, sources=SourceOffsets(), read=lambda _key: None)
    assert isinstance(outcome, Journaled)
    assert rows.append_id_key(PATH, "id-1") in dict(outcome.rows)
