"""The console's HTTP routes: a small app mounted at /console of the gateway (docs/operations.md,
"Web console").

Thin on purpose: authenticate the session, check the stream is in the token's scope, ask the
mirror, let `views` decide, render a template. Pages, fragments, the event stream and form posts
all pass the same checks. Appends go through the API's own preparation (`prepare_submission`: shape,
append gate, size), so the console can do nothing its token could not do over the API.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, urlencode

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles

from pipeline.blobs import BlobStore
from pipeline.client.prepare import new_append_id
from pipeline.gateway import metrics
from pipeline.gateway.commands import Problem, attached_to, prepare_submission
from pipeline.gateway.console.core import (
    AGENTS_PAGE,
    COALESCE_S,
    FETCH_HEADER,
    HERE,
    JOURNAL_PAGE,
    KEEPALIVE_S,
    LIVE_STREAM_S,
    POLICIES,
    Console,
    Refused,
    Viewer,
)
from pipeline.gateway.console.guards import foreign_sign_in, retry_after
from pipeline.gateway.console.mirror import MirroredStream
from pipeline.gateway.console.responses import LiveStream, SecurityHeaders
from pipeline.gateway.console.sessions import COOKIE, SESSION_TTL_S, csrf_ok
from pipeline.gateway.console.timeline import turn_timeline, waterfall
from pipeline.gateway.console.views import (
    agent_row,
    cached_prefix,
    cached_share,
    event_view,
    filter_rows,
    journal_page,
    previous_request,
    projection_items,
    slice_page,
)
from pipeline.gateway.files import blob_readers, file_response, not_readable, readable, store_upload, upload_gate
from pipeline.gateway.files import receive as receive_file
from pipeline.gateway.guards import add_connection_handlers
from pipeline.gateway.service import ApiError, Gateway
from pipeline.gateway.tokens import hash_token
from schemas.events import AGENT_PAUSED, AGENT_RESUMED, CONTEXT_ADDED
from schemas.requests import TRANSPORTS, Transport


def build_console(gateway: Gateway, blobs: BlobStore) -> tuple[FastAPI, Console]:
    """The console app (mount it at /console) and its state (close it on shutdown); `blobs`: the
    blob store its talk box uploads to and its thumbnails come from (docs/behaviour.md §3.3)."""
    console = Console(gateway)
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    app.add_middleware(SecurityHeaders)
    add_connection_handlers(app)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    def for_script(request: Request) -> bool:
        """Fragments, the event stream and fetch() posts are read by the page's script: JSON, not pages."""
        return bool(request.headers.get(FETCH_HEADER)) or request.url.path.startswith(
            ("/console/fragment/", "/console/live")
        )

    @app.exception_handler(Refused)
    async def refused(request: Request, error: Refused) -> Response:
        if for_script(request):
            return JSONResponse({"error": "refused", "detail": error.detail}, error.status, error.headers)
        page = console.page("error.html", console.viewer(request), error.status, detail=error.detail)
        page.headers.update(error.headers)
        return page

    def signed_in(handler: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
        """Pages: a visitor without a session goes to the sign-in form."""

        async def page(request: Request) -> Response:
            viewer = console.viewer(request)
            if viewer is None:
                if request.method == "GET" and not for_script(request):
                    return RedirectResponse("/console/login", 303)
                raise Refused(401, "sign in again: the session ended or its token was revoked")
            return await handler(request, viewer)

        page.__name__ = handler.__name__
        return page

    def param(request: Request, name: str) -> str | None:
        value = request.query_params.get(name)
        return value if value else None

    def int_param(request: Request, name: str) -> int | None:
        value = param(request, name)
        if value is None:
            return None
        if not value.isdigit():
            raise Refused(400, f"{name} must be a positive integer")
        return int(value)

    # --- sign in and out -------------------------------------------------------------------------

    @app.get("/")
    async def root(request: Request) -> Response:
        return RedirectResponse("/console/agents" if console.viewer(request) else "/console/login", 303)

    @app.get("/login")
    async def login_form(request: Request) -> Response:
        return console.page("login.html", None)

    def too_many_sign_ins(wait_s: float, whose: str) -> Response:
        metrics.REFUSALS.labels("sign-in-rate").inc()
        seconds = retry_after(wait_s)
        page = console.page("login.html", None, 429, error=f"too many sign-ins {whose}; try again in {seconds} s")
        page.headers["retry-after"] = seconds
        return page

    @app.post("/login")
    async def login(request: Request) -> Response:
        headers = request.headers
        foreign = foreign_sign_in(headers.get("origin"), headers.get("referer"), headers.get("host"))
        if foreign is not None:  # login CSRF: another site signing the browser in with its own token
            metrics.REFUSALS.labels("origin").inc()
            return console.page("login.html", None, 403, error=foreign)
        # Every attempt counts against its address, good token or not: guessing stays slow.
        address = request.client.host if request.client else "unknown"
        wait_s = console.sign_ins_by_address.take(address)
        if wait_s:
            return too_many_sign_ins(wait_s, "from this address")
        form = await read_form(request, 16 * 1024)
        token = form.get("token", "").strip()
        if not token or gateway.tokens.claims(token) is None:
            return console.page("login.html", None, 401, error="unknown or revoked token")
        # Only real tokens get a bucket: the tokens file bounds how many there are.
        wait_s = console.sign_ins_by_token.take(hash_token(token))
        if wait_s:
            return too_many_sign_ins(wait_s, "with this token")
        response = RedirectResponse("/console/agents", 303)
        response.set_cookie(
            COOKIE,
            console.sessions.open(token),
            max_age=int(SESSION_TTL_S),
            path="/console",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    @app.post("/logout")
    async def logout(request: Request) -> Response:
        viewer = console.viewer(request)
        form = await read_form(request, 16 * 1024)
        if viewer is not None and csrf_ok(viewer.session, form.get("csrf")):
            console.sessions.close(viewer.session_id)
        response = RedirectResponse("/console/login", 303)
        response.delete_cookie(COOKIE, path="/console")
        return response

    # --- agents ----------------------------------------------------------------------------------

    def agent_rows(request: Request, viewer: Viewer) -> dict[str, Any]:
        query = param(request, "q") or ""
        status = param(request, "status") or ""
        page = int_param(request, "page") or 0
        rows = console.mirror.read_all(lambda entry: agent_row(entry.path, entry.state), viewer.sees)
        shown, more = slice_page(filter_rows(rows, query, status), page, AGENTS_PAGE)
        return {"rows": shown, "q": query, "status": status, "page": page, "more": more}

    @app.get("/agents")
    @signed_in
    async def agents(request: Request, viewer: Viewer) -> Response:
        return console.page("agents.html", viewer, **agent_rows(request, viewer))

    @app.get("/fragment/agents")
    @signed_in
    async def agents_fragment(request: Request, viewer: Viewer) -> Response:
        return console.page("_agent_rows.html", viewer, **agent_rows(request, viewer))

    @app.get("/fragment/notice")
    @signed_in
    async def notice_fragment(request: Request, viewer: Viewer) -> Response:
        return console.page("_notice.html", viewer)

    # --- one agent -------------------------------------------------------------------------------

    @app.get("/agent")
    @signed_in
    async def agent(request: Request, viewer: Viewer) -> Response:
        path = console.entry_or_refuse(viewer, param(request, "path"))
        before = int_param(request, "before")
        last = console.mirror.read(path, lambda entry: entry.state.cursor) or 0
        page = journal_page(last, before, JOURNAL_PAGE)
        events = await console.mirror.events(path, list(page.offsets))
        return console.page(
            "agent.html",
            viewer,
            tab="journal",
            page=page,
            events=[event_view(event) for event in events],
            newest=page.offsets[0] if page.offsets else 0,
            live=before is None,
            policies=POLICIES,
            **console.status_context(path),
        )

    @app.get("/fragment/journal")
    @signed_in
    async def journal_fragment(request: Request, viewer: Viewer) -> Response:
        path = console.entry_or_refuse(viewer, param(request, "path"))
        after = int_param(request, "after") or 0
        last = console.mirror.read(path, lambda entry: entry.state.cursor) or 0
        offsets = list(range(last, max(after, last - JOURNAL_PAGE), -1))
        events = await console.mirror.events(path, offsets)
        response = console.page("_journal_rows.html", viewer, events=[event_view(e) for e in events], path=path)
        response.headers["x-journal-cursor"] = str(max(last, after))
        return response

    @app.get("/fragment/status")
    @signed_in
    async def status_fragment(request: Request, viewer: Viewer) -> Response:
        path = console.entry_or_refuse(viewer, param(request, "path"))
        return console.page("_status.html", viewer, **console.status_context(path))

    def projection_context(request: Request, path: str) -> dict[str, Any]:
        transport = transport_param(request)

        def view(entry: MirroredStream) -> dict[str, Any]:
            return {
                "items": projection_items(entry.state, transport),
                "published_through": entry.state.published_through,
            }

        context = console.mirror.read(path, view)
        assert context is not None
        return {"transport": transport, "transports": TRANSPORTS, **context}

    def transport_param(request: Request) -> Transport:
        wanted = param(request, "transport")
        for transport in TRANSPORTS:
            if transport == wanted:
                return transport
        return console.settings.transport

    @app.get("/agent/projection")
    @signed_in
    async def projection(request: Request, viewer: Viewer) -> Response:
        path = console.entry_or_refuse(viewer, param(request, "path"))
        context = {**console.status_context(path), **projection_context(request, path)}
        return console.page("projection.html", viewer, tab="projection", **context)

    @app.get("/fragment/projection")
    @signed_in
    async def projection_fragment(request: Request, viewer: Viewer) -> Response:
        path = console.entry_or_refuse(viewer, param(request, "path"))
        return console.page("_projection.html", viewer, path=path, **projection_context(request, path))

    def requests_context(path: str) -> dict[str, Any]:
        def view(entry: MirroredStream) -> list[dict[str, Any]]:
            open_offset = entry.state.open.offset if entry.state.open is not None else None
            return [
                {"offset": r, "created_at": info.created_at, "model": info.model, "open": r == open_offset}
                for r, info in sorted(entry.requests.items(), reverse=True)
            ]

        return {"requests": console.mirror.read(path, view) or []}

    @app.get("/agent/requests")
    @signed_in
    async def requests(request: Request, viewer: Viewer) -> Response:
        path = console.entry_or_refuse(viewer, param(request, "path"))
        return console.page(
            "requests.html", viewer, tab="requests", **console.status_context(path), **requests_context(path)
        )

    @app.get("/fragment/requests")
    @signed_in
    async def requests_fragment(request: Request, viewer: Viewer) -> Response:
        path = console.entry_or_refuse(viewer, param(request, "path"))
        return console.page("_requests.html", viewer, path=path, **requests_context(path))

    @app.get("/agent/request")
    @signed_in
    async def one_request(request: Request, viewer: Viewer) -> Response:
        path = console.entry_or_refuse(viewer, param(request, "path"))
        offset = int_param(request, "offset")
        transport = transport_param(request)
        offsets = console.mirror.read(path, lambda entry: list(entry.requests)) or []
        if offset is None and offsets:
            offset = max(offsets)
        rendered = None if offset is None else await console.rendered_request(path, offset, transport)
        if offset is None or rendered is None:
            raise Refused(404, f"{path} has no llm-request-requested event at @{offset}")
        messages, model, created_at = rendered
        previous_offset = previous_request(offsets, offset)
        previous = None
        if previous_offset is not None:
            found = await console.rendered_request(path, previous_offset, transport)
            previous = None if found is None else found[0]
        shaded = cached_prefix(previous, messages)
        cached, total = cached_share(shaded)
        turn = await console.turn(path, offset)
        timeline = None if turn is None else turn_timeline(turn[0])
        return console.page(
            "request.html",
            viewer,
            tab="requests",
            offset=offset,
            model=model,
            created_at=created_at,
            messages=shaded,
            previous_offset=previous_offset,
            cached=cached,
            total=total,
            transport=transport,
            transports=TRANSPORTS,
            body_json=orjson.dumps({"model": model, "messages": messages}, option=orjson.OPT_INDENT_2).decode(),
            timeline=timeline,
            waterfall=None if timeline is None else waterfall(timeline),
            trace_url=None if turn is None else turn[1],
            **console.status_context(path),
        )

    # --- live updates ----------------------------------------------------------------------------

    @app.get("/live")
    @signed_in
    async def live(request: Request, viewer: Viewer) -> Response:
        path = param(request, "path")
        if path is not None:
            console.entry_or_refuse(viewer, path)
        wants = (lambda changed: changed == path) if path is not None else viewer.sees
        refusal = console.live_streams.take(viewer.session_id)
        if refusal is not None:
            metrics.REFUSALS.labels("live-streams").inc()
            raise Refused(429, refusal, {"Retry-After": str(int(LIVE_STREAM_S / 2))})
        subscriber = console.mirror.subscribe(wants)

        async def stream() -> AsyncIterator[bytes]:
            yield b"retry: 1000\n\nevent: change\ndata: {}\n\n"  # (re)connected: catch up on anything missed
            deadline = time.monotonic() + LIVE_STREAM_S
            while time.monotonic() < deadline:
                try:
                    await asyncio.wait_for(subscriber.wake.wait(), KEEPALIVE_S)
                except TimeoutError:
                    yield b": keep-alive\n\n"
                    continue
                await asyncio.sleep(COALESCE_S)  # one refresh for a burst of events
                subscriber.wake.clear()
                if console.viewer(request) is None:
                    yield b"event: signed-out\ndata: {}\n\n"
                    return
                yield b"event: change\ndata: {}\n\n"

        def ended() -> None:
            console.mirror.unsubscribe(subscriber)
            console.live_streams.give_back(viewer.session_id)

        return LiveStream(stream(), on_end=ended, media_type="text/event-stream", headers={"x-accel-buffering": "no"})

    # --- talking ---------------------------------------------------------------------------------

    async def append(request: Request, viewer: Viewer, form: dict[str, str], body: dict[str, Any]) -> Response:
        if not csrf_ok(viewer.session, form.get("csrf")):
            raise Refused(403, "the form's CSRF token does not match this session; reload the page")
        path = console.entry_or_refuse(viewer, form.get("path"))
        try:
            readers = await blob_readers(blobs, attached_to(body))
        except ApiError as error:
            raise Refused(error.problem.status, error.problem.detail) from None
        ready = prepare_submission(viewer.claims, path, body, new_append_id(), gateway.topics, gateway.limits, readers)
        if isinstance(ready, Problem):
            raise Refused(ready.status, ready.detail)
        try:
            gateway.require_kafka(True)
            outcome = gateway.results.expect(ready.append_id)
            try:
                await gateway.deliver(ready)
                journaled = await gateway.outcome(ready, outcome)
            finally:
                gateway.results.forget(ready.append_id)
        except ApiError as error:
            raise Refused(error.problem.status, error.problem.detail) from None
        if request.headers.get(FETCH_HEADER):
            return JSONResponse({"offset": journaled.offset, "detail": f"journaled at @{journaled.offset}"})
        return RedirectResponse("/console/agent?" + urlencode({"path": path}), 303)

    async def read_form(request: Request, limit: int) -> dict[str, str]:
        try:
            raw = await gateway.body(request, limit)
        except ApiError as error:
            raise Refused(error.problem.status, error.problem.detail) from None
        try:
            fields = parse_qs(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
        except UnicodeDecodeError:
            raise Refused(400, "the form is not UTF-8") from None
        return {name: values[0] for name, values in fields.items()}

    async def read_upload(request: Request, viewer: Viewer) -> tuple[dict[str, str], dict[str, Any] | None]:
        """A talk form with a file (docs/behaviour.md §3.3): its fields, and the attachment of the
        file once stored, through the steps of the API's upload (gate, size, type). The CSRF token
        and the stream are checked before anything is stored."""
        try:
            upload = await receive_file(request, viewer.claims, gateway, blobs)
        except ApiError as error:
            raise Refused(error.problem.status, error.problem.detail) from None
        try:
            form = upload.fields
            if not csrf_ok(viewer.session, form.get("csrf")):
                raise Refused(403, "the form's CSRF token does not match this session; reload the page")
            path = console.entry_or_refuse(viewer, form.get("path"))
            if upload.file is None or (upload.file.size == 0 and not upload.file.filename):
                return form, None  # no file chosen
            problem = upload_gate(viewer.claims, path)
            if problem is not None:
                raise Refused(problem.status, problem.detail)
            try:
                attachment = await store_upload(blobs, viewer.claims, path, upload.file)
            except ApiError as error:
                raise Refused(error.problem.status, error.problem.detail) from None
            return form, attachment.model_dump()
        finally:
            await asyncio.to_thread(upload.discard)

    @app.post("/agent/say")
    @signed_in
    async def say(request: Request, viewer: Viewer) -> Response:
        attachment = None
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            form, attachment = await read_upload(request, viewer)
        else:
            form = await read_form(request, console.settings.gateway_max_body_bytes)
        policy = form.get("policy") or POLICIES[0]
        if policy not in POLICIES:
            raise Refused(400, f"llmRequestPolicy must be one of {', '.join(POLICIES)}")
        payload: dict[str, Any] = {
            "role": "user",
            "content": form.get("content", ""),
            "llmRequestPolicy": {"behaviour": policy},
        }
        if attachment is not None:
            payload["files"] = [attachment]
        return await append(request, viewer, form, {"type": CONTEXT_ADDED, "payload": payload})

    @app.get("/files/sha256/{hex_digest}")
    @signed_in
    async def file(request: Request, viewer: Viewer) -> Response:
        """A file for a thumbnail or a link: readable with the session's token as over the API."""
        hex_digest = str(request.path_params["hex_digest"])
        try:
            data = await readable(blobs, viewer.claims.scope, hex_digest)
        except ApiError as error:
            raise Refused(error.problem.status, error.problem.detail) from None
        if data is None:
            raise Refused(404, not_readable(hex_digest).problem.detail)
        return file_response(data, hex_digest)

    @app.post("/agent/pause")
    @signed_in
    async def pause(request: Request, viewer: Viewer) -> Response:
        form = await read_form(request, 16 * 1024)
        body = {"type": AGENT_PAUSED, "payload": {"reason": "paused from the web console"}}
        return await append(request, viewer, form, body)

    @app.post("/agent/resume")
    @signed_in
    async def resume(request: Request, viewer: Viewer) -> Response:
        form = await read_form(request, 16 * 1024)
        body = {"type": AGENT_RESUMED, "payload": {"reason": "resumed from the web console"}}
        return await append(request, viewer, form, body)

    return app, console
