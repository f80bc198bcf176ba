"""An HTTP request's own W3C `traceparent` header is continued (docs/behaviour.md §8): the commands
the request appends carry it on (tracing off) or start their `agentstream.append` spans under it
(tracing on). What they carry is the parsed header written anew (55 bytes), never the client's
bytes: a long header would otherwise be copied onto every record of a batch. Plain ASGI, so it
costs one header scan per request."""

from __future__ import annotations

from typing import Any

from starlette.types import Receive, Send

from pipeline import tracing
from processors.traceparent import TRACEPARENT, carried

_HEADER = TRACEPARENT.encode()


class TraceParentMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        value = None
        if scope["type"] == "http":
            for name, header in scope.get("headers") or ():
                if name == _HEADER:
                    value = carried(header)
                    break
        if value is None:
            await self.app(scope, receive, send)
            return
        token = tracing.PARENT.set(value)
        try:
            await self.app(scope, receive, send)
        finally:
            tracing.PARENT.reset(token)
