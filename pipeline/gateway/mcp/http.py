"""The MCP door on the gateway: streamable HTTP at `/mcp`, behind the gateway's bearer tokens.

`BearerGuard` checks every request's token as the HTTP API does (`Gateway.authenticate`: a bad or
missing one answers 401 `{error, detail}` before the SDK sees anything), hands the token's claims
to the tools in the request's scope, and names the token as the session's owner, so the SDK answers
a session id presented with another token as if the session did not exist. The SDK's session
manager serves the rest; the gateway's lifespan runs it (`HttpDoor.sessions.run()`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import Context
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_REQUEST
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Send

from pipeline.gateway.mcp.door import Door
from pipeline.gateway.mcp.tools import UNAUTHORIZED, build_server
from pipeline.gateway.service import ApiError, error_response
from pipeline.gateway.tokens import hash_token
from processors.gate import Claims

if TYPE_CHECKING:
    from pipeline.gateway.console.mirror import JournalMirror
    from pipeline.gateway.service import Gateway

PATH = "/mcp"
CLAIMS_KEY = "agentstream.claims"  # an ASGI scope extension key: the caller's claims, set by BearerGuard

AsgiApp = Any


def request_claims(ctx: Context) -> Claims:
    """The claims `BearerGuard` put in the scope of the HTTP request that carried this call."""
    request = ctx.request_context.request
    claims = request.scope.get(CLAIMS_KEY) if isinstance(request, Request) else None
    if not isinstance(claims, Claims):  # never reached through BearerGuard; refuse rather than guess
        raise MCPError(INVALID_REQUEST, f"{UNAUTHORIZED}: no bearer token on this request", {"error": UNAUTHORIZED})
    return claims


class BearerGuard:
    def __init__(self, gateway: Gateway, app: AsgiApp) -> None:
        self.gateway = gateway
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        request = Request(scope)
        try:
            claims = self.gateway.authenticate(request)
        except ApiError as error:
            await error_response(error.problem, error.headers)(scope, receive, send)
            return
        owner = hash_token(request.headers["authorization"].partition(" ")[2].strip())
        user = AuthenticatedUser(AccessToken(token=owner, client_id=owner, scopes=[]))
        await self.app({**scope, CLAIMS_KEY: claims, "user": user}, receive, send)


class HttpDoor:
    """The MCP door of one gateway: its route, and the sessions its lifespan runs."""

    def __init__(self, gateway: Gateway, mirror: JournalMirror) -> None:
        settings = gateway.settings
        self.server = build_server(Door(gateway, mirror), request_claims, settings)
        # The SDK builds its session manager with the app. DNS-rebinding protection (a Host and Origin
        # allow-list) stays off: every request needs a bearer token, which a rebinding page cannot
        # have, and a deployment reaches the gateway by names no list here would know.
        self.server.streamable_http_app(
            streamable_http_path=PATH,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            max_request_body_size=settings.gateway_max_body_bytes,
        )
        self.sessions: StreamableHTTPSessionManager = self.server.session_manager
        # POST carries each call (progress and answer on its response stream), DELETE ends a session.
        # No GET: the door pushes nothing unsolicited, and an idle event stream would keep a gateway
        # that is shutting down waiting for ever; 405 is how a server says it offers no such stream.
        self.route = Route(
            PATH, endpoint=BearerGuard(gateway, self.sessions.handle_request), methods=["POST", "DELETE"]
        )
