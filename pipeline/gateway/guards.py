"""ASGI-level guards of the gateway against slow and vanishing clients.

uvicorn bounds the request head (see `pipeline.gateway.server`) but not the body: `BodyDeadline`
gives each request body a deadline and answers 408 when it passes. A client that goes away while
its body is read is routine on the internet, not an error: one log line, no traceback.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Send

from pipeline.gateway import metrics
from schemas.gateway import ErrorBody

log = logging.getLogger("agentstream.gateway")


CLIENT_CLOSED_REQUEST = 499  # no client reads it; the request metrics count it under this status


class RequestBodyTimeout(Exception):
    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the request body did not arrive within {timeout_s:g} s")
        self.timeout_s = timeout_s


class BodyDeadline:
    """Reading the request body raises `RequestBodyTimeout` once `timeout_s` have passed since the
    request's headers: a client that trickles its body cannot hold a request open. Once the body is
    complete, `receive` is passed through untouched (a streaming response waits on it for the
    client's disconnect)."""

    def __init__(self, app: Any, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        body_complete = False

        async def bounded_receive() -> dict[str, Any]:
            nonlocal body_complete
            if body_complete:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise RequestBodyTimeout(self.timeout_s) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_complete = True
            return message

        await self.app(scope, bounded_receive, send)


def route_name(request: Request) -> str:
    """The route template (never the stream path: logs carry no stream paths)."""
    route = request.scope.get("route")
    template = getattr(route, "path_format", None) or getattr(route, "path", None) or "(unmatched)"
    return request.scope.get("root_path", "") + template


def add_connection_handlers(app: FastAPI) -> None:
    """On the gateway's app and on every mounted app (each has its own exception handlers)."""

    @app.exception_handler(ClientDisconnect)
    async def client_went_away(request: Request, _: ClientDisconnect) -> Response:
        log.info("%s %s: the client disconnected before sending its whole body", request.method, route_name(request))
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    @app.exception_handler(RequestBodyTimeout)
    async def body_too_slow(request: Request, error: RequestBodyTimeout) -> Response:
        metrics.REFUSALS.labels("timeout").inc()
        route = route_name(request)
        log.info("%s %s: cut off a client whose body took over %g s", request.method, route, error.timeout_s)
        body = ErrorBody(error="request_timeout", detail=f"{error}; the connection is closed")
        return Response(
            body.model_dump_json(exclude_none=True),
            status_code=408,
            media_type="application/json",
            headers={"Connection": "close"},  # the rest of the body may still be on its way
        )
