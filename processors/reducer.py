"""The reducer: (agent state, journal event) -> agent state. docs/behaviour.md §2 and the state parts of §4.

The state is updated in place for speed (no lane is ever copied per event); the result is still a
pure function of the journal: the same events in the same order always give the same state.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from processors.state import AgentState, Cell, OpenRequest, PendingTrigger, ScriptRun, TriggerSource, UsageReport
from schemas.capabilities import SCRIPT_RUN_REQUESTED, SCRIPT_RUN_SETTLED, SCRIPT_RUN_STARTED
from schemas.config import merge_config
from schemas.context import EXTERNAL_INPUT_ACTOR_TYPES, ContextItem, IntegrationActor, LlmRequestPolicy
from schemas.events import (
    AGENT_CONFIGURED,
    AGENT_CREATED,
    AGENT_PAUSED,
    AGENT_RESUMED,
    CONTEXT_ADDED,
    LLM_REQUEST_REQUESTED,
    LLM_REQUEST_SETTLED,
    STREAM_ERROR_OCCURRED,
    TOKEN_USAGE_REPORTED,
    InvalidPayloadEvent,
)

SYSTEM_PROMPT_KEY = "agent/system-prompt"


STREAM_ERROR_ACTOR = IntegrationActor(type="integration", name="stream-error")
DONT_TRIGGER = LlmRequestPolicy(behaviour="dont-trigger-request")


class JournalOrderError(ValueError):
    """Events must fold strictly in offset order, one stream per state."""


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def epoch_ms(created_at: str) -> int:
    """Exact epoch milliseconds of a createdAt (integer arithmetic: no float truncation)."""
    return (datetime.fromisoformat(created_at) - _EPOCH) // _MS


def trigger_source(item: ContextItem) -> TriggerSource | None:
    if item.role in ("system", "assistant"):
        return None
    policy = item.llmRequestPolicy
    if policy is not None and policy.behaviour == "dont-trigger-request":
        return None
    if item.role == "user":
        return "external"
    actor = item.actor
    if actor is not None and actor.type in EXTERNAL_INPUT_ACTOR_TYPES:  # §4.1; others are agent-loop feedback
        return "external"
    return "agent-loop"


def fold(state: AgentState, event: Any) -> AgentState:
    """Fold one decoded journal event (see `schemas.events.decode_event`) into `state`."""
    offset = event.offset
    if offset <= state.cursor:
        raise JournalOrderError(
            f"event @{offset} arrives after @{state.cursor}: a stream's events must fold in offset order"
        )
    path = event.streamPath
    if state.stream_path is None:
        state.stream_path = path
    elif path != state.stream_path:
        raise JournalOrderError(f"event @{offset} belongs to {path}, not {state.stream_path}")
    state.cursor = offset
    state.last_event_created_at = event.createdAt
    if isinstance(event, InvalidPayloadEvent):
        return state  # never crash on a bad journaled payload: skip it
    handler = _HANDLERS.get(event.type)
    if handler is not None:
        handler(state, event)
    return state


def fold_all(state: AgentState, events: Iterable[Any]) -> AgentState:
    for event in events:
        fold(state, event)
    return state


# --- context ------------------------------------------------------------------------------------


def _context_added(state: AgentState, event: Any) -> None:
    add_context(state, event.offset, event.payload, event.createdAt)


def add_context(state: AgentState, offset: int, item: ContextItem, created_at: str) -> None:
    if item.compaction is not None:
        _compact(state, offset, item)
        return
    if (
        item.role == "assistant"
        and item.llmRequestOffset is not None
        and (state.open is None or state.open.offset != item.llmRequestOffset)
    ):
        return  # §2.5: an answer to a request that is not open is dropped
    lane = state.system if item.role == "system" else state.history
    key = item.key
    if key is None:
        state.mark(lane, lane.append(offset, item, None))
    else:
        previous = lane.by_key.get(key)
        if previous is None:
            state.mark(lane, lane.append(offset, item, None))
        elif previous.offset <= state.published_through:
            state.mark(lane, lane.append(offset, item, previous.offset))
        else:
            previous.replace(offset, item)
            state.mark(lane, previous)
    source = trigger_source(item)
    if source is not None:
        _trigger(state, offset, created_at, source, item)


def _trigger(state: AgentState, offset: int, created_at: str, source: TriggerSource, item: Any) -> None:
    if source == "external":
        state.latest_external_trigger = offset
        state.autonomous_turn_count = 0
        state.consecutive_llm_failures = 0
    elif state.paused:
        return  # paused: agent-loop triggers are dropped
    if (
        item is not None
        and state.open is not None
        and item.llmRequestPolicy is not None
        and item.llmRequestPolicy.behaviour == "interrupt-current-request"
        and state.open.interruptedBy is None
    ):
        state.open.interruptedBy = offset
    pending = state.pending
    if pending is None:
        state.pending = PendingTrigger(offset, epoch_ms(created_at), source)
    else:  # newest wins; the debounce keeps counting from the first uncovered trigger
        pending.offset = offset
        pending.source = source


def _compact(state: AgentState, offset: int, item: ContextItem) -> None:
    assert item.compaction is not None
    cutoff = item.compaction.replacesHistoryThrough
    if cutoff >= offset:
        return  # §2.6: a summary may not erase history that follows it
    state.published_through = max(state.published_through, cutoff)
    state.compacted_through = max(state.compacted_through, cutoff)
    if state.over_threshold is not None and state.over_threshold.llmRequestOffset <= cutoff:
        state.over_threshold = None
    _collapse_system_lane(state)
    _drop_history_through(state, cutoff, offset, item)


def _collapse_system_lane(state: AgentState) -> None:
    lane = state.system
    if len(lane.by_key) == 0:
        return
    kept: list[Cell] = []
    for cell in lane.cells:
        key = cell.item.key
        if key is None or lane.by_key[key] is cell:
            kept.append(cell)
        else:
            state.mark_deleted(lane, cell)
    lane.cells = kept


def _drop_history_through(state: AgentState, cutoff: int, offset: int, summary: ContextItem) -> None:
    lane = state.history
    cells = lane.cells
    # Leading cells may be earlier summaries (created out of offset order); the rest are in
    # created_offset order, so everything from `boundary` on was created after the cutoff and
    # therefore survives without being looked at.
    lead = 0
    while lead < len(cells) and cells[lead].item.compaction is not None:
        lead += 1
    boundary = bisect_right(cells, cutoff, lo=lead, key=lambda cell: cell.created_offset)
    kept: list[Cell] = []
    for cell in cells[:boundary]:
        if cell.offset > cutoff:
            kept.append(cell)
            continue
        state.mark_deleted(lane, cell)
        key = cell.item.key
        if key is not None and lane.by_key.get(key) is cell:
            del lane.by_key[key]
    summary_cell = lane.new_front_cell(offset, summary)
    state.mark(lane, summary_cell)
    del cells[:boundary]
    cells[0:0] = [summary_cell, *kept]


# --- turn bookkeeping -----------------------------------------------------------------------


def _created(state: AgentState, event: Any) -> None:
    state.created = True


def _configured(state: AgentState, event: Any) -> None:
    state.config = merge_config(state.config, event.payload.config)


def _requested(state: AgentState, event: Any) -> None:
    offset = event.offset
    state.published_through = offset  # §2.4: every request seals, even one that never opens
    state.last_request_created_at = event.createdAt
    pending = state.pending
    if pending is not None and state.open is None and not state.paused:
        state.open = OpenRequest(
            offset=offset,
            model=event.payload.model,
            expiresAt=event.payload.expiresAt,
            triggerOffset=pending.offset,
            source=pending.source,
            createdAt=event.createdAt,
        )
        state.pending = None
        if pending.source == "agent-loop":
            state.autonomous_turn_count += 1


def _settled(state: AgentState, event: Any) -> None:
    payload = event.payload
    if state.open is None or payload.requestOffset != state.open.offset:
        return  # §4.3: only the open request can be settled
    state.open = None
    result = payload.result
    if result.status == "succeeded":
        state.consecutive_llm_failures = 0
    elif result.status == "failed":
        if state.compacted_through >= payload.requestOffset:
            # The request outgrew the model's context and its history was compacted: the retry
            # answers from the summary. Not a provider failure, so it spends no attempt (a second
            # overflow is a newer request than the compaction, and counts).
            _trigger(state, event.offset, event.createdAt, "agent-loop", None)
            return
        state.consecutive_llm_failures += 1
        if state.consecutive_llm_failures < state.config.llmRequestRetryPolicy.maxAttempts:
            _trigger(state, event.offset, event.createdAt, "agent-loop", None)


def _usage_reported(state: AgentState, event: Any) -> None:
    report = event.payload
    usage = state.usage
    usage.inputTokens += report.inputTokens
    usage.outputTokens += report.outputTokens
    usage.cachedInputTokens += report.cachedInputTokens or 0
    usage.reasoningOutputTokens += report.reasoningOutputTokens or 0
    tokens = report.inputTokens + report.outputTokens
    threshold = int(report.maxContextTokens * state.config.compactionTriggerFraction)
    if tokens >= threshold and report.llmRequestOffset > state.compacted_through:
        state.over_threshold = UsageReport(event.offset, report.llmRequestOffset, report.model, tokens, threshold)


def _paused(state: AgentState, event: Any) -> None:
    trigger_offset = event.payload.triggerOffset
    if trigger_offset is not None and trigger_offset < state.latest_external_trigger:
        return  # §4.3: a pause older than the latest external input is stale
    state.paused = True
    state.pause_trigger_offset = trigger_offset
    if state.pending is not None and state.pending.source == "agent-loop":
        state.pending = None


def _resumed(state: AgentState, event: Any) -> None:
    state.paused = False
    state.pause_trigger_offset = None


def _stream_error(state: AgentState, event: Any) -> None:
    item = ContextItem(
        role="developer",
        content=f"Error on stream: {event.payload.message}",
        actor=STREAM_ERROR_ACTOR,
        llmRequestPolicy=DONT_TRIGGER,
    )
    lane = state.history
    state.mark(lane, lane.append(event.offset, item, None))


# --- script runs ---------------------------------------------------------------------------------


def _script_requested(state: AgentState, event: Any) -> None:
    payload = event.payload
    if payload.executionId not in state.scripts:
        state.scripts[payload.executionId] = ScriptRun(payload.executionId, event.offset, payload.expiresAt)


def _script_started(state: AgentState, event: Any) -> None:
    run = state.scripts.get(event.payload.executionId)
    if run is not None:
        run.started = True


def _script_settled(state: AgentState, event: Any) -> None:
    state.scripts.pop(event.payload.executionId, None)


_HANDLERS = {
    CONTEXT_ADDED: _context_added,
    AGENT_CREATED: _created,
    AGENT_CONFIGURED: _configured,
    LLM_REQUEST_REQUESTED: _requested,
    LLM_REQUEST_SETTLED: _settled,
    TOKEN_USAGE_REPORTED: _usage_reported,
    AGENT_PAUSED: _paused,
    AGENT_RESUMED: _resumed,
    STREAM_ERROR_OCCURRED: _stream_error,
    SCRIPT_RUN_REQUESTED: _script_requested,
    SCRIPT_RUN_STARTED: _script_started,
    SCRIPT_RUN_SETTLED: _script_settled,
}


def state_through(events: Iterable[Any], offset: int) -> AgentState:
    """The state folded from a stream's events (offset order) up to and including `offset`."""
    state = AgentState()
    for event in events:
        if event.offset > offset:
            break
        fold(state, event)
    return state
