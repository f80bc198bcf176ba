"""How the gateway is served: uvicorn (uvloop, httptools) with bounds on slow and oversized heads.

uvicorn's own options cover idle kept-alive connections (`timeout_keep_alive`). It has no timeout
for reading a request's head, and with httptools no limit on its size (h11's
`h11_max_incomplete_event_size` does not apply to it): a client could hold a connection open
forever, one header byte at a time, or send megabytes of headers. `guarded_protocol` adds both to
uvicorn's httptools protocol, at the socket, where the head is read (an ASGI app only sees a
request once its head is complete). Request bodies get their deadline from
`pipeline.gateway.guards.BodyDeadline`, which can still answer 408; this protocol only makes sure a
connection whose body is overdue is not kept alive afterwards.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from pipeline.gateway import metrics
from pipeline.settings import Settings


def _refusal(status: int, reason: str, detail: str) -> bytes:
    body = detail.encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def guarded_protocol(header_timeout_s: float, body_timeout_s: float, max_header_bytes: int) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a deadline for each request's head (and its body) and a
    size limit for the head."""
    head_too_slow = _refusal(
        408, "Request Timeout", f"the request line and headers did not arrive within {header_timeout_s:g} s\n"
    )
    head_too_large = _refusal(
        431, "Request Header Fields Too Large", f"the request line and headers exceed {max_header_bytes} bytes\n"
    )

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._deadline: asyncio.TimerHandle | None = None
            self._reading_head = True  # a connection starts with a request head to read
            self._head_begun = False  # a byte of the head has arrived
            self._head_bytes = 0

        # --- the deadlines ------------------------------------------------------------------

        def _arm(self, seconds: float, overdue: Any) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, overdue)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _responding(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _refuse(self, answer: bytes) -> None:
            """Answer (unless a pipelined response is still being written) and close."""
            if self.transport.is_closing():
                return
            if not self._responding():
                self.transport.write(answer)
            self.transport.close()

        def _head_overdue(self) -> None:
            self._deadline = None
            if self._head_begun:
                metrics.REFUSALS.labels("timeout").inc()
                self._refuse(head_too_slow)
            elif not self.transport.is_closing():
                self.transport.close()  # never sent a byte: nothing to answer

        def _body_overdue(self) -> None:
            self._deadline = None
            if self.cycle is None:
                return
            self.cycle.keep_alive = False  # no further request on this connection
            if self.cycle.response_complete:  # answered without reading the body: stop waiting for it
                self.transport.close()

        # --- uvicorn's protocol and httptools' parser callbacks -----------------------------

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm(header_timeout_s, self._head_overdue)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.transport.is_closing():
                return
            if self._reading_head:
                self._head_bytes += len(data)
            super().data_received(data)
            # Checked after parsing: a chunk that completes the head may carry body bytes too.
            if self._reading_head and self._head_bytes > max_header_bytes:
                metrics.REFUSALS.labels("size").inc()
                self._refuse(head_too_large)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_begun = True
            if self._deadline is None:  # a further request on a kept-alive connection
                self._arm(header_timeout_s, self._head_overdue)

        def on_headers_complete(self) -> None:
            self._reading_head = False
            self._arm(body_timeout_s, self._body_overdue)
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()
            self._reading_head, self._head_begun, self._head_bytes = True, False, 0

    return GuardedHttpToolsProtocol


def uvicorn_config(app: Any, settings: Settings) -> uvicorn.Config:
    """The gateway's server: uvloop, httptools with the guards above, no access log."""
    return uvicorn.Config(
        app,
        host=settings.gateway_host,
        port=settings.gateway_port,
        loop="uvloop",
        http=guarded_protocol(
            settings.gateway_header_timeout_s, settings.gateway_body_timeout_s, settings.gateway_max_header_bytes
        ),
        timeout_keep_alive=settings.gateway_keep_alive_timeout_s,
        log_level=settings.log_level.lower(),
        access_log=False,  # request metrics are on /metrics; access logs would carry stream paths
        server_header=False,
    )
