"""The console's shared state: who is signed in (`Viewer`), its refusals, and `Console`, which
holds the gateway, the journal mirror, the sessions and the sign-in limits the routes use."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader

from pipeline.gateway.console.guards import LiveStreamSlots, RateLimiter
from pipeline.gateway.console.mirror import JournalMirror, MirroredStream, TurnOffsets
from pipeline.gateway.console.sessions import COOKIE, Session, SessionBook
from pipeline.gateway.console.timeline import TRACEPARENT, TurnTimes, trace_link, turn_times
from pipeline.gateway.console.views import (
    STATUS_LABELS,
    agent_row,
    explain_turn,
)
from pipeline.gateway.service import Gateway
from processors.gate import Claims, in_scope
from processors.render import as_of_request, render_messages, render_request
from schemas.requests import Transport

HERE = Path(__file__).resolve().parent
JOURNAL_PAGE = 50
AGENTS_PAGE = 100
LIVE_STREAM_S = 60.0  # an event stream ends after this; the browser reconnects (and a shutdown never waits long)
KEEPALIVE_S = 15.0
COALESCE_S = 0.2
POLICIES = ("after-current-request", "interrupt-current-request", "dont-trigger-request")
FETCH_HEADER = "x-console-fetch"


@dataclass(frozen=True, slots=True)
class Viewer:
    claims: Claims
    session: Session
    session_id: str

    def sees(self, path: str) -> bool:
        return in_scope(path, self.claims.scope)


class Refused(Exception):
    """Answered as a page (or JSON for scripts): not signed in, not found, bad form."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers or {}


class Console:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.settings = gateway.settings
        self.mirror = JournalMirror(gateway.settings, gateway.topics.journal)
        self.sessions = SessionBook(per_token=gateway.settings.gateway_console_sessions_per_token)
        self.sign_ins_by_token = RateLimiter(gateway.settings.gateway_console_sign_in_rate_per_token)
        self.sign_ins_by_address = RateLimiter(gateway.settings.gateway_console_sign_in_rate_per_address)
        self.live_streams = LiveStreamSlots(
            gateway.settings.gateway_console_live_streams_per_session, gateway.settings.gateway_console_live_streams
        )
        self.templates = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True)
        self.templates.filters["q"] = lambda params: urlencode({k: v for k, v in params.items() if v is not None})

    def close(self) -> None:
        self.mirror.close()

    # --- who is asking ---------------------------------------------------------------------------

    def viewer(self, request: Request) -> Viewer | None:
        session_id = request.cookies.get(COOKIE)
        session = self.sessions.get(session_id)
        if session is None or session_id is None:
            return None
        claims = self.gateway.tokens.claims(session.token)
        if claims is None:  # revoked or removed from the tokens file: the session ends with it
            self.sessions.close(session_id)
            return None
        self.mirror.ensure_started(asyncio.get_running_loop())
        return Viewer(claims, session, session_id)

    def entry_or_refuse(self, viewer: Viewer, path: str | None) -> str:
        """`path` if the viewer may see it and it has events; the same 404 otherwise, so a token
        outside the scope cannot even learn that a stream exists."""
        if not path or not viewer.sees(path) or self.mirror.read(path, lambda _: True) is None:
            raise Refused(404, "no stream with this path in your token's scope (or none yet)")
        return path

    # --- rendering -------------------------------------------------------------------------------

    def page(self, template: str, viewer: Viewer | None, http_status: int = 200, **context: Any) -> HTMLResponse:
        html = self.templates.get_template(template).render(
            viewer=viewer,
            csrf=viewer.session.csrf if viewer else "",
            mirror=self.mirror,
            status_labels=STATUS_LABELS,
            **context,
        )
        return HTMLResponse(html, http_status)

    def status_context(self, path: str) -> dict[str, Any]:
        now_ms = int(time.time() * 1000)

        def view(entry: MirroredStream) -> dict[str, Any]:
            return {
                "row": agent_row(path, entry.state),
                "turn": explain_turn(entry.state, now_ms, self.settings.default_model, entry.pause_reason),
                "paused": entry.state.paused,
            }

        context = self.mirror.read(path, view)
        assert context is not None
        return {"path": path, **context}

    async def turn(self, path: str, offset: int) -> tuple[TurnTimes, str | None] | None:
        """Request `offset`'s turn as the journal records it, and the link to its trace in Jaeger
        (when `AGENTSTREAM_JAEGER_UI_URL` is set and its journal record carries a traceparent)."""

        def view(entry: MirroredStream) -> tuple[int, TurnOffsets] | None:
            turn = entry.turns.get(offset)  # copied under the lock: the follower fills it in
            return None if turn is None else (entry.partition, dataclasses.replace(turn))

        found = self.mirror.read(path, view)
        if found is None:
            return None
        partition, turn = found
        scripts = (turn.script_requested, turn.script_started, turn.script_settled)
        wanted = [o for o in (offset, turn.trigger, turn.settled, *scripts) if o is not None]
        records = {r.event.offset: r for r in await self.mirror.records(path, wanted)}
        if offset not in records:
            return None
        # When the trigger was appended and the answer came back: the Kafka timestamps of the
        # commands behind those journal records (their `source-offset` headers name them).
        appended = await self._command_time(partition, records.get(turn.trigger or 0))
        answered = await self._command_time(partition, records.get(turn.settled or 0))
        events = {o: r.event for o, r in records.items()}
        times = turn_times(offset, events, turn.trigger, turn.settled, scripts, appended, answered)
        request = records[offset]
        parent = request.headers.get(TRACEPARENT)
        if parent is None and turn.trigger in records:
            parent = records[turn.trigger].headers.get(TRACEPARENT)
        return times, trace_link(self.settings.jaeger_ui_url, parent)

    async def _command_time(self, partition: int, record: Any) -> int | None:
        source = None if record is None else record.headers.get("source-offset")
        if source is None or not source.isdigit():
            return None  # a scheduler decision, or an event journaled before the header existed
        internal = record.headers.get("source-topic") == b"internal"
        topic = self.gateway.topics.internal_appends if internal else self.gateway.topics.appends
        found = await self.mirror.command_records(topic, partition, [int(source)])
        command = found.get(int(source))
        return None if command is None else command.timestamp_ms

    async def rendered_request(
        self, path: str, offset: int, transport: Transport
    ) -> tuple[list[dict[str, Any]], str, str] | None:
        """(messages, model, createdAt) of request `offset` as the model saw it, or None."""

        def view(entry: MirroredStream) -> tuple[list[dict[str, Any]] | None, str, str] | None:
            info = entry.requests.get(offset)
            if info is None:
                return None
            as_of = as_of_request(entry.state, offset)  # exact unless a compaction came after it
            budget = self.settings.render_budget_for(info.model)
            messages = None if as_of is None else render_messages(as_of, transport, info.created_at, budget)
            return messages, info.model, info.created_at

        found = self.mirror.read(path, view)
        if found is None:
            return None
        messages, model, created_at = found
        if messages is None:  # re-fold the journal up to the request, as `agentstream agent request` does
            events = await self.mirror.events(path, list(range(1, offset + 1)))
            if not events or events[-1].offset != offset:
                return None
            request = events[-1]
            budget = self.settings.render_budget_for(request.payload.model)
            messages = render_request(events, request, transport, budget)
        return messages, model, created_at
