"""What `send_message` appends and waits for, and which events `read_events` returns. Pure: no I/O,
no clock.

A message is answered by the first model request journaled after it: that request renders every item
up to its own offset (docs/behaviour.md §3), so it has the message in its context, whatever triggered
it. The answer is that request's settlement: the caller journals the assistant item and then
`llm-request-settled` (§4.3), whose `succeeded` result carries the text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from processors.gate import Claims
from schemas.events import (
    CONTEXT_ADDED,
    LLM_REQUEST_REQUESTED,
    LLM_REQUEST_SETTLED,
    InvalidPayloadEvent,
    OtherEvent,
)
from schemas.mcp import SentMessage, TurnStatus

MCP_USER_ACTOR = {"type": "user", "origin": "mcp"}


def user_message(claims: Claims, path: str, text: str, interrupt: bool) -> dict[str, Any]:
    """The command `send_message` appends: a user item, which triggers a turn (or interrupts the one
    in flight). The gate stamps a user token's actor itself (origin `mcp`, the token's userId) and
    refuses one the client supplies; no other tier is stamped, so for those the door names the
    origin, and the gate still decides whether the tier may send a user item at all."""
    payload: dict[str, Any] = {"role": "user", "content": text}
    if interrupt:
        payload["llmRequestPolicy"] = {"behaviour": "interrupt-current-request"}
    if claims.tier != "user":
        payload["actor"] = dict(MCP_USER_ACTOR)
    return {"streamPath": path, "type": CONTEXT_ADDED, "payload": payload}


def event_window(last_offset: int, from_offset: int | None, limit: int) -> range:
    """The offsets `read_events` returns from a stream whose newest is `last_offset`: at most
    `limit` from `from_offset` on, or the newest `limit` when `from_offset` is None."""
    first = max(1, last_offset - limit + 1) if from_offset is None else max(1, from_offset)
    return range(first, min(last_offset, first + limit - 1) + 1)


def as_envelope(event: Any) -> OtherEvent:
    """A journaled event in its wire shape, whatever its type (an invalid payload as it was written)."""
    if isinstance(event, InvalidPayloadEvent):
        return event.envelope
    if isinstance(event, OtherEvent):
        return event
    return OtherEvent.model_validate(event.model_dump(mode="json", exclude_none=True))


def within_bytes(events: list[OtherEvent], max_bytes: int) -> list[OtherEvent]:
    """The leading events whose JSON fits in `max_bytes` together; the first one always, so a reader
    paging on from the last offset it got always moves."""
    kept: list[OtherEvent] = []
    size = 0
    for event in events:
        size += len(event.model_dump_json(exclude_none=True))
        if kept and size > max_bytes:
            break
        kept.append(event)
    return kept


@dataclass(slots=True)
class TurnWatch:
    """Follows a stream's events after the message at `message_offset` to the turn that answers it."""

    message_offset: int
    seen_through: int = 0
    requests: list[int] = field(default_factory=list)  # requested after the message, in order
    model: str | None = None
    answer_offset: int | None = None
    request_offset: int | None = None  # the request that settled
    status: TurnStatus | None = None
    text: str | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        self.seen_through = max(self.seen_through, self.message_offset)

    @property
    def settled(self) -> bool:
        return self.status is not None

    def see(self, event: Any) -> None:
        """Take in the stream's next event (events at or before `seen_through` are ignored)."""
        if event.offset <= self.seen_through or self.settled:
            return
        self.seen_through = event.offset
        if isinstance(event, InvalidPayloadEvent):
            return
        if event.type == LLM_REQUEST_REQUESTED:
            self.requests.append(event.offset)
            self.model = self.model or event.payload.model
        elif event.type == CONTEXT_ADDED:
            item = event.payload
            if item.role == "assistant" and item.llmRequestOffset in self.requests:
                self.answer_offset = event.offset
        elif event.type == LLM_REQUEST_SETTLED and event.payload.requestOffset in self.requests:
            # Only the open request settles (§4.3), so the first settlement of a request made after the
            # message is the turn that had it in context.
            result = event.payload.result
            self.request_offset = event.payload.requestOffset
            self.status = result.status
            if result.status == "succeeded":
                self.text = result.text
            elif result.status == "failed":
                self.error = result.errorMessage
            else:
                self.error = f"cancelled ({result.reason})"

    def progress_note(self) -> str:
        """What the turn is doing, for a progress notification."""
        if self.settled:
            return f"turn @{self.request_offset} {self.status}"
        if self.requests:
            return f"turn @{self.requests[-1]} running (model {self.model})"
        return f"message journaled at @{self.message_offset}; waiting for the agent's turn to start"


def sent_message(path: str, offset: int, watch: TurnWatch | None, waited_s: float) -> SentMessage:
    """`send_message`'s answer: the turn's outcome if it settled, else where to look for it later."""
    later = f"call read_events with from_offset={offset + 1} later to read the answer"
    if watch is None:
        note = f"journaled at @{offset}; not waiting (wait_seconds=0): {later}"
        return SentMessage(streamPath=path, offset=offset, answered=False, note=note)
    if not watch.settled:
        where = f"turn @{watch.requests[-1]} is still running" if watch.requests else "no turn has started yet"
        note = f"journaled at @{offset}; no answer within {waited_s:g} s ({where}): {later}"
        return SentMessage(
            streamPath=path,
            offset=offset,
            answered=False,
            requestOffset=watch.requests[-1] if watch.requests else None,
            note=note,
        )
    notes = {
        "succeeded": "answered",
        "failed": "the model call failed; the agent retries by itself up to its maxAttempts",
        "cancelled": "the turn was cancelled before it answered",
    }
    assert watch.status is not None
    return SentMessage(
        streamPath=path,
        offset=offset,
        answered=True,
        requestOffset=watch.request_offset,
        status=watch.status,
        answer=watch.text if watch.status == "succeeded" else None,
        answerOffset=watch.answer_offset,
        error=watch.error,
        note=f"journaled at @{offset}; turn @{watch.request_offset}: {notes[watch.status]}",
    )
