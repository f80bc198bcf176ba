"""What the console shows, as pure functions of agent state and journal events (no I/O, no clock).

The web layer (`routes`) only fetches and renders; every decision a reader could question (which
status an agent has, which part of a request a prompt cache can reuse, why a turn did or did not
start, which page of a journal to show) is made here and tested without a broker.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from processors import idempotency_keys
from processors.files import IMAGE_TYPES, blob_hex
from processors.render import provider_role, render_cell
from processors.scheduler import backoff_ms, decide
from processors.state import AgentState, Cell
from schemas.events import AGENT_PAUSED, LLM_REQUEST_REQUESTED, InvalidPayloadEvent
from schemas.requests import Transport

STATUS_LABELS = {
    "idle": "idle",
    "queued": "queued",
    "busy": "busy",
    "paused": "paused",
    "running-script": "running a script",
}
STATUSES = tuple(STATUS_LABELS)


# --- agents list ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentRow:
    """One line of the agents page."""

    path: str
    status: str
    last_activity: str | None
    events: int
    open_request: int | None
    model: str | None
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int

    @property
    def status_label(self) -> str:
        return STATUS_LABELS.get(self.status, self.status)


def agent_row(path: str, state: AgentState) -> AgentRow:
    usage = state.usage
    open_request = state.open
    return AgentRow(
        path=path,
        status=state.status,
        last_activity=state.last_event_created_at,
        events=state.cursor,
        open_request=None if open_request is None else open_request.offset,
        model=None if open_request is None else open_request.model,
        input_tokens=usage.inputTokens,
        output_tokens=usage.outputTokens,
        cached_input_tokens=usage.cachedInputTokens,
    )


def filter_rows(rows: list[AgentRow], query: str = "", status: str = "") -> list[AgentRow]:
    """Rows whose path contains `query` (case-insensitive) and, when given, that have `status`;
    the most recently active first (a path breaks ties so the order is stable)."""
    needle = query.strip().lower()
    kept = [r for r in rows if needle in r.path.lower() and (not status or r.status == status)]
    kept.sort(key=lambda r: r.path)
    kept.sort(key=lambda r: r.last_activity or "", reverse=True)
    return kept


# --- paging --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Page:
    """Journal offsets of one page, newest first, and the links around it."""

    offsets: tuple[int, ...]
    has_newer: bool
    newer_before: int | None  # `before` of the newer page; None: the newer page is the newest
    older_before: int | None  # `before` of the older page; None: this page is the oldest


def journal_page(last_offset: int, before: int | None, size: int) -> Page:
    """The page of a gapless journal 1..last_offset holding the `size` events below `before`
    (None: the newest events), newest first."""
    top = last_offset if before is None else min(before - 1, last_offset)
    if top < 1:
        return Page((), last_offset >= 1, None, None)
    bottom = max(1, top - size + 1)
    newer_before = top + size + 1 if top + size < last_offset else None
    return Page(tuple(range(top, bottom - 1, -1)), top < last_offset, newer_before, bottom if bottom > 1 else None)


def slice_page(items: list[Any], page: int, size: int) -> tuple[list[Any], bool]:
    """Items of the 0-based `page`, and whether a later page has any."""
    start = max(page, 0) * size
    return items[start : start + size], len(items) > start + size


# --- journal events ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventView:
    offset: int
    created_at: str
    type: str
    short_type: str
    kind: str  # a CSS class: user, assistant, system, developer, error, turn, invalid
    summary: str
    payload_json: str
    files: tuple[FileView, ...] = ()


@dataclass(frozen=True, slots=True)
class FileView:
    """An attached file as the console links it (docs/behaviour.md §3.3): images as thumbnails."""

    name: str
    content_type: str
    size: int
    href: str  # the console's own route: its session, not a bearer token, reads the bytes
    image: bool


def file_views(files: Any) -> tuple[FileView, ...]:
    views = []
    for file in files or ():
        hex_digest = blob_hex(file.path)
        href = f"/console/files/sha256/{hex_digest}" if hex_digest is not None else ""
        image = hex_digest is not None and file.contentType in IMAGE_TYPES
        views.append(FileView(file.filename, file.contentType, file.size, href, image))
    return tuple(views)


def event_view(event: Any) -> EventView:
    """A journal event as a readable line and its full payload (pretty JSON) to expand."""
    short = event.type.rsplit("/", 1)[-1]
    if isinstance(event, InvalidPayloadEvent):
        summary = f"invalid payload, skipped: {event.reason}"
        return EventView(
            event.offset, event.createdAt, event.type, short, "invalid", summary, _pretty(event.envelope.payload)
        )
    payload = event.payload.model_dump(exclude_none=True) if hasattr(event.payload, "model_dump") else event.payload
    if short == "context-added":
        item = event.payload
        actor = f" [{item.actor.type}]" if item.actor is not None else ""
        key = f" key={item.key}" if item.key else ""
        marker = " (compaction summary)" if item.compaction is not None else ""
        summary = f"{item.role}{actor}{key}{marker}: {_one_line(item.content)}"
        kind = item.role
        if item.files:
            return EventView(
                event.offset,
                event.createdAt,
                event.type,
                short,
                kind,
                summary,
                _pretty(payload),
                file_views(item.files),
            )
    elif short == "error-occurred":
        summary, kind = _one_line(str(payload.get("message", ""))), "error"
    elif short == "llm-request-settled":
        result = payload.get("result", {})
        summary, kind = f"request @{payload.get('requestOffset')} {result.get('status')}", "turn"
        if result.get("status") == "failed":
            summary += f": {_one_line(str(result.get('errorMessage', '')))}"
            kind = "error"
    else:
        summary, kind = _one_line(orjson.dumps(payload).decode()), "turn"
    return EventView(event.offset, event.createdAt, event.type, short, kind, summary, _pretty(payload))


def _one_line(text: str, limit: int = 240) -> str:
    flat = text.replace("\r", "").replace("\n", " ⏎ ")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _pretty(payload: Any) -> str:
    return orjson.dumps(payload, option=orjson.OPT_INDENT_2).decode()


# --- the projection ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProjectionItem:
    lane: str
    offset: int
    key: str | None
    updates_offset: int | None
    role: str  # the item's own role
    provider_role: str  # after trust demotion (§3.1) and the transport's mapping (§3.2)
    demoted: bool  # a developer item the model sees as user text
    published: bool  # sealed by a request: a later item with its key appends an update
    compaction: bool
    content: str  # exactly what the model reads: header line, then the item's content
    files: tuple[FileView, ...] = ()

    @property
    def header_line(self) -> str:
        return self.content.partition("\n")[0]

    @property
    def body(self) -> str:
        return self.content.partition("\n")[2]


def projection_items(state: AgentState, transport: Transport) -> list[ProjectionItem]:
    """Both lanes in the order the model reads them (docs/behaviour.md §2, §3.1)."""
    items = []
    for lane in (state.system, state.history):
        for cell in lane.cells:
            items.append(_projection_item(lane.name, cell, state.published_through, transport))
    return items


def _projection_item(lane: str, cell: Cell, published_through: int, transport: Transport) -> ProjectionItem:
    neutral, content = render_cell(cell)
    item = cell.item
    return ProjectionItem(
        lane=lane,
        offset=cell.offset,
        key=item.key,
        updates_offset=cell.updates_offset,
        role=item.role,
        provider_role=provider_role(neutral, transport),
        demoted=item.role == "developer" and neutral == "user",
        published=cell.offset <= published_through,
        compaction=item.compaction is not None,
        content=content,
        files=file_views(item.files),
    )


# --- requests and the cached prefix --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RenderedMessage:
    role: str
    cached: str  # the part that is a byte-identical prefix of the previous request
    fresh: str  # the rest


def cached_prefix(previous: list[dict[str, Any]] | None, current: list[dict[str, Any]]) -> list[RenderedMessage]:
    """Split each message of `current` into the part a provider's prompt cache can reuse from
    `previous` and the rest.

    A prompt cache matches the serialized request from its first byte, so reuse stops at the first
    difference: every message before it is reused whole, the differing one up to its common
    prefix (only when the role matches: the role is serialized before the content), and nothing
    after it. With no previous request nothing is cached.
    """
    shaded: list[RenderedMessage] = []
    matching = previous is not None
    for index, message in enumerate(current):
        role, content = message["role"], message["content"]
        other = previous[index] if matching and previous is not None and index < len(previous) else None
        if other is None or other["role"] != role or other.get("files") != message.get("files"):
            matching = False
            shaded.append(RenderedMessage(role, "", content))
            continue
        common = _common_prefix_length(other["content"], content)
        shaded.append(RenderedMessage(role, content[:common], content[common:]))
        if common < len(content) or len(other["content"]) != len(content):
            matching = False
    return shaded


def _common_prefix_length(a: str, b: str) -> int:
    limit = min(len(a), len(b))
    if a[:limit] == b[:limit]:
        return limit
    low, high = 0, limit  # the answer is in [low, high): a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        middle = (low + high) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle
    return low


def cached_share(messages: list[RenderedMessage]) -> tuple[int, int]:
    """(cached characters, total characters) of a shaded request."""
    cached = sum(len(m.cached) for m in messages)
    return cached, cached + sum(len(m.fresh) for m in messages)


def previous_request(request_offsets: list[int], offset: int) -> int | None:
    """The request before `offset` in the same stream (what the provider saw last)."""
    earlier = [r for r in request_offsets if r < offset]
    return max(earlier) if earlier else None


def is_request(event: Any) -> bool:
    return event.type == LLM_REQUEST_REQUESTED and not isinstance(event, InvalidPayloadEvent)


# --- turn decisions ------------------------------------------------------------------------------


def _at(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def explain_turn(state: AgentState, now_ms: int, default_model: str, paused_reason: str | None = None) -> list[str]:
    """Why a turn runs, waits or does not start, in sentences (docs/behaviour.md §4.2, §4.3).

    Built on the scheduler's own `decide`, so the explanation cannot drift from what it does.
    """
    lines: list[str] = []
    config = state.config
    for run in state.scripts.values():
        lines.append(
            f"Script {run.executionId} (@{run.offset}) is {'running' if run.started else 'requested, not started yet'}."
        )
    if state.consecutive_llm_failures:
        lines.append(
            f"{state.consecutive_llm_failures} consecutive LLM failure(s) of "
            f"{config.llmRequestRetryPolicy.maxAttempts} attempts allowed."
        )
    open_request = state.open
    pending = state.pending
    decision = decide(state, now_ms, default_model)
    if open_request is not None:
        lines.append(
            f"Request @{open_request.offset} is open (model {open_request.model}, triggered by "
            f"@{open_request.triggerOffset}); it expires at {_at(open_request.expiresAt)}."
        )
        if decision.appends:
            lines.append("It is past its expiry: the scheduler cancels it as expired.")
        if pending is not None:
            lines.append(f"Trigger @{pending.offset} waits for it: one request at a time.")
        return lines
    if pending is None:
        if state.paused:
            lines.append(_paused_line(paused_reason))
        lines.append("No pending trigger: a user message (or another triggering item) starts the next turn.")
        return lines
    trigger = f"Trigger @{pending.offset} ({pending.source})"
    if not state.created:
        lines.append(f"{trigger} is queued: the stream has no agent/created event yet.")
        return lines
    if not state.has_system_prompt:
        lines.append(f"{trigger} is queued: waiting for the system prompt (a system item keyed agent/system-prompt).")
        return lines
    if state.paused:
        lines.append(_paused_line(paused_reason))
        if pending.source == "external":
            lines.append(f"{trigger} is external input: the scheduler resumes the agent and runs the turn.")
        return lines
    if decision.appends and decision.appends[0].type == AGENT_PAUSED:
        lines.append(
            f"Breaker: {trigger} would start turn {state.autonomous_turn_count + 1} without external input "
            f"(limit maxAutonomousTurns = {config.maxAutonomousTurns}): the scheduler pauses the agent."
        )
        return lines
    backoff = backoff_ms(state)
    due = pending.atMs + config.llmRequestDebounceMs + backoff
    parts = f"debounce {config.llmRequestDebounceMs} ms" + (f" + backoff {backoff} ms" if backoff else "")
    if decision.appends:
        lines.append(
            f"{trigger} is due ({parts} from {_at(pending.atMs)}): the scheduler requests a turn now "
            f"(idempotency key {idempotency_keys.request_key(pending.offset)})."
        )
    else:
        lines.append(f"{trigger} waits: {parts} from {_at(pending.atMs)}, due at {_at(due)} (in {due - now_ms} ms).")
    return lines


def _paused_line(reason: str | None) -> str:
    because = f": {reason}" if reason else ""
    return f"Paused{because}. Agent-loop triggers are dropped; external input (a user message) resumes it."
