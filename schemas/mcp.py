"""Wire shapes of the MCP door's tools (docs/behaviour.md §9): what each tool answers.

An MCP client sees these as each tool's output schema and gets them as structured content (and the
same JSON as text). Field names follow the journal's wire names (camelCase).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from schemas.context import Role, Wire
from schemas.events import OtherEvent
from schemas.requests import Transport

AgentStatus = Literal["idle", "queued", "busy", "running-script", "paused"]
TurnStatus = Literal["succeeded", "failed", "cancelled"]


class AgentSummary(Wire):
    path: str = Field(description="The agent's stream path: pass it to the other tools.")
    status: AgentStatus = Field(
        description="busy: a model request is open; running-script: its code runs; paused: it takes no "
        "turns until new input; queued: a turn is about to start; idle: waiting for input."
    )
    lastActivity: str | None = Field(description="createdAt of its newest event (UTC, ISO-8601).")
    events: int = Field(description="Events in its journal (the newest offset).")
    openRequest: int | None = Field(description="Offset of the model request in flight, if any.")


class AgentList(Wire):
    agents: list[AgentSummary] = Field(description="Most recently active first.")
    more: bool = Field(description="More agents matched than `limit`: narrow `query` or raise `limit`.")


class CreatedAgent(Wire):
    path: str = Field(description="The new agent's stream path.")
    createdOffset: int = Field(description="Offset of its agent/created event.")
    systemPromptOffset: int = Field(description="Offset of its system prompt (the shipped base policy).")
    alreadyExisted: bool = Field(description="The path was an agent already: nothing new was journaled.")


class SentMessage(Wire):
    streamPath: str
    offset: int = Field(description="Journal offset of the message just sent.")
    answered: bool = Field(description="The turn answering the message settled within wait_seconds.")
    requestOffset: int | None = Field(
        default=None, description="Offset of the model request (the turn) that took the message in."
    )
    status: TurnStatus | None = Field(default=None, description="How that turn settled, once it did.")
    answer: str | None = Field(default=None, description="The agent's answer (status succeeded).")
    answerOffset: int | None = Field(default=None, description="Offset of the answer in the journal.")
    error: str | None = Field(default=None, description="Why the turn failed or was cancelled.")
    note: str = Field(description="What happened and what to do next.")


class ContextMessage(Wire):
    role: Role = Field(description="The provider role the model receives.")
    content: str = Field(description="The item's header line (`@<offset> ...`), then its content.")
    files: list[dict[str, Any]] | None = Field(default=None, description="Attachments of the item, if any.")


class RenderedContext(Wire):
    streamPath: str
    status: AgentStatus
    model: str = Field(description="The model the next request goes to (its size budget applies).")
    transport: Transport
    publishedThrough: int = Field(description="Offset through which earlier requests published the context.")
    messages: list[ContextMessage] = Field(
        description="The next request's messages, in order. The request itself adds a last message with "
        "the date and time it is made."
    )


class EventRange(Wire):
    streamPath: str
    lastOffset: int = Field(description="The stream's newest offset.")
    events: list[OtherEvent] = Field(description="Journaled events in offset order.")
    nextOffset: int | None = Field(
        description="The offset to read on from (from_offset) when later events exist; null at the end."
    )
