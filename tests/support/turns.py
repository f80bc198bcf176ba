"""Audits of agents' turns on the committed journal (behaviour §4.3, behaviour §5.2): every request
settles once, no answer is journaled twice, no agent is left busy."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from processors.reducer import fold_all
from processors.state import AgentState
from schemas.events import CONTEXT_ADDED, LLM_REQUEST_REQUESTED, LLM_REQUEST_SETTLED, decode_event
from tests.kafka_stack import Stack, read_committed


def user(text: str) -> dict[str, Any]:
    return {
        "type": CONTEXT_ADDED,
        "payload": {"role": "user", "content": text, "actor": {"type": "user", "origin": "cli"}},
    }


def journals(stack: Stack) -> dict[str, list[Any]]:
    """Every committed journal event, by stream, in offset order."""
    events: dict[str, list[Any]] = defaultdict(list)
    for message in read_committed(stack.client.topics.journal, timeout=60):
        event = decode_event(message.value())
        events[event.streamPath].append(event)
    return events


def unanswered(events: dict[str, list[Any]], paths: list[str]) -> list[str]:
    """Agents not yet done: nothing journaled yet, a request open or due, or the last user message
    not answered."""
    waiting = []
    for path in paths:
        stream = events.get(path, [])
        if not stream:  # created, but not yet visible to a committed read
            waiting.append(f"{path} (nothing journaled yet)")
            continue
        state = fold_all(AgentState(), stream)
        items = [e for e in stream if e.type == CONTEXT_ADDED]
        last_user = max((e.offset for e in items if e.payload.role == "user"), default=0)
        last_answer = max((e.offset for e in items if e.payload.role == "assistant"), default=0)
        if state.status != "idle" or last_answer < last_user:
            waiting.append(f"{path} ({state.status}, last user @{last_user}, last answer @{last_answer})")
    return waiting


@dataclass
class TurnAudit:
    requests: int = 0
    settled_twice: list[str] = field(default_factory=list)
    answered_twice: list[str] = field(default_factory=list)
    unsettled: list[str] = field(default_factory=list)
    not_succeeded: list[str] = field(default_factory=list)


def audit_turns(events: dict[str, list[Any]], paths: list[str]) -> TurnAudit:
    """Per request R of each stream: how often R settled (one llm-request-settled per request
    offset) and how many assistant items answer R (at most one)."""
    audit = TurnAudit()
    for path in paths:
        stream = events.get(path, [])
        settled = Counter(e.payload.requestOffset for e in stream if e.type == LLM_REQUEST_SETTLED)
        answered = Counter(
            e.payload.llmRequestOffset
            for e in stream
            if e.type == CONTEXT_ADDED and e.payload.role == "assistant" and e.payload.llmRequestOffset is not None
        )
        opened = [e.offset for e in stream if e.type == LLM_REQUEST_REQUESTED]
        audit.requests += len(opened)
        for r in opened:
            if settled[r] == 0:
                audit.unsettled.append(f"{path}@{r}")
            elif settled[r] > 1:
                audit.settled_twice.append(f"{path}@{r}")
        for e in stream:
            if e.type == LLM_REQUEST_SETTLED and e.payload.result.status != "succeeded":
                audit.not_succeeded.append(f"{path}@{e.payload.requestOffset}: {e.payload.result}")
        audit.answered_twice += [f"{path}@{r}" for r, n in answered.items() if n > 1]
    return audit
