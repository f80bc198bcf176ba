"""The console's response plumbing: a live event stream that gives its slot back however it ends,
and the security headers every console response carries."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Send

SECURITY_HEADERS = {
    # No inline script or style at all: model and user text can never become code.
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    # The console's URLs name streams: never sent to other sites. Same-origin requests keep their
    # Origin (with no-referrer a browser posts `Origin: null`) for the sign-in's origin check.
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


class LiveStream(StreamingResponse):
    """An event stream that gives back what it holds (its mirror subscription, its slot) however it
    ends: finished, cancelled by the client's disconnect, or never started at all (the generator's
    own `finally` would not run if it never started)."""

    def __init__(self, content: AsyncIterator[bytes], *, on_end: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._on_end = on_end

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_end()


class SecurityHeaders:
    """Adds the content-security policy and friends to every console response (static files too)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.decode().lower() not in SECURITY_HEADERS]
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
