"""The MCP door's tools on the official SDK's `MCPServer` (docs/behaviour.md §9).

Each tool's JSON schema comes from its annotated parameters (descriptions and bounds included) and
its output schema from its `schemas.mcp` result. Who is calling is the transport's answer
(`Authority`): the bearer token of the HTTP request, or `AGENTSTREAM_TOKEN` for stdio. A `DoorError`
becomes a tool error (`isError`, the reason as text) the model can read and act on; an unknown or
revoked token is an MCP error, the call never reaching a tool.
"""

# No `from __future__ import annotations`: the SDK reads these signatures at runtime, and
# `send_message`'s bound on wait_seconds is a value of `build_server`'s scope.

from collections.abc import Awaitable, Callable
from typing import Annotated, Literal, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_REQUEST, ToolAnnotations
from pydantic import Field

from pipeline.gateway.mcp.door import Door, DoorError
from pipeline.gateway.tokens import TokenBook
from pipeline.settings import Settings
from processors.gate import Claims
from schemas.mcp import AgentList, CreatedAgent, EventRange, RenderedContext, SentMessage
from schemas.requests import Transport

SERVER_NAME = "agentstream"
MAX_AGENTS = 1000
MAX_EVENTS = 500

INSTRUCTIONS = """\
agentstream keeps LLM agents whose memory is an append-only journal: every message, model request,
answer and script run is an event with an offset (@N), its coordinate in the agent's stream.
list_agents finds the agents this token may reach; send_message talks to one and returns its answer
(or, if the turn takes longer than wait_seconds, the offset to read it from later with read_events);
read_context shows exactly what the agent's model will see in its next request; read_events reads a
stream's journal. Only a platform token may create_agent."""

# Who is calling: the claims of the caller's token, or an MCPError when it has none that is valid.
Authority = Callable[[Context], Claims]

UNAUTHORIZED = "unauthorized"

StreamPath = Annotated[
    str,
    Field(
        description="The agent's stream path, as list_agents or create_agent gives it (e.g. /agents/acme/helper).",
        min_length=1,
        max_length=512,
    ),
]

T = TypeVar("T")


class TokenAuthority:
    """`agentstream mcp`'s caller: one token (AGENTSTREAM_TOKEN), looked up in the tokens file at
    every call as the gateway looks up a request's, so an edit or a revocation applies at once."""

    def __init__(self, tokens: TokenBook, token: str | None) -> None:
        self._tokens = tokens
        self._token = token.strip() if token else None

    def __call__(self, _: Context) -> Claims:
        if not self._token:
            raise MCPError(
                INVALID_REQUEST,
                f"{UNAUTHORIZED}: set AGENTSTREAM_TOKEN to a bearer token of the gateway tokens file",
                {"error": UNAUTHORIZED},
            )
        claims = self._tokens.claims(self._token)
        if claims is None:
            raise MCPError(
                INVALID_REQUEST,
                f"{UNAUTHORIZED}: AGENTSTREAM_TOKEN is unknown or revoked (not in the gateway tokens file)",
                {"error": UNAUTHORIZED},
            )
        return claims


async def _answer(work: Awaitable[T]) -> T:
    try:
        return await work
    except DoorError as error:
        raise ToolError(str(error)) from None


def build_server(door: Door, authority: Authority, settings: Settings) -> MCPServer:
    server = MCPServer(
        SERVER_NAME,
        title="agentstream",
        instructions=INSTRUCTIONS,
        log_level=settings.log_level,  # type: ignore[arg-type]  # DEBUG, INFO or WARNING
        # The door publishes no events: no subscriptions/listen stream to hold open (and to keep a
        # shutting-down gateway waiting).
        subscriptions=False,
    )
    max_wait = settings.mcp_max_wait_s
    reading = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(title="List agents", annotations=reading)
    async def list_agents(
        ctx: Context,
        query: Annotated[str, Field(description="Only agents whose path contains this text (any case).")] = "",
        limit: Annotated[int, Field(ge=1, le=MAX_AGENTS, description="At most this many agents.")] = 100,
    ) -> AgentList:
        """List the agents this token may reach (inside its scope), most recently active first: each
        with its path, status (idle, queued, busy, running-script, paused), last activity, journal
        length and the model request in flight. Use a path with send_message, read_context and
        read_events."""
        return await _answer(door.list_agents(authority(ctx), query, limit))

    @server.tool(
        title="Create an agent",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True),
    )
    async def create_agent(
        ctx: Context,
        path: Annotated[
            str | None,
            Field(
                description="Stream path for the new agent, e.g. /agents/acme/helper (its project is "
                "the path without the last segment). Default: /agents/<random id>.",
                min_length=1,
                max_length=512,
            ),
        ] = None,
    ) -> CreatedAgent:
        """Create an agent: journal agent/created and the shipped base system prompt in a new stream
        (creating an existing agent again changes nothing). Only a platform token may create agents:
        the append gate refuses any other, and nothing is appended."""
        return await _answer(door.create_agent(authority(ctx), path))

    @server.tool(title="Send a message", annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
    async def send_message(
        ctx: Context,
        path: StreamPath,
        text: Annotated[str, Field(description="The message, as the user's words to the agent.")],
        wait_seconds: Annotated[
            float,
            Field(
                ge=0,
                le=max_wait,
                description=f"How long to wait for the agent's answer (0 to {max_wait:g}); 0: return once "
                "the message is journaled.",
            ),
        ] = min(30.0, max_wait),
        interrupt: Annotated[
            bool,
            Field(description="Abort the agent's turn in flight (its partial output is kept) and answer this."),
        ] = False,
    ) -> SentMessage:
        """Send a user message to an agent and wait up to wait_seconds for its answer. The message is
        journaled first (its offset is returned); the agent's next turn then answers it. Progress
        notifications report the turn while it runs. If it settles in time, `answered` is true with
        the answer (or why the turn failed); otherwise call read_events from offset + 1 later: the
        answer is an assistant context item there."""
        return await _answer(
            door.send_message(authority(ctx), path, text, interrupt, wait_seconds, ctx.report_progress)
        )

    @server.tool(title="Read an agent's next request", annotations=reading)
    async def read_context(
        ctx: Context,
        path: StreamPath,
        transport: Annotated[
            Literal["openai", "openai-compatible"] | None,
            Field(description="Render for this provider transport; default: the deployment's."),
        ] = None,
    ) -> RenderedContext:
        """The messages the agent's model will receive in its next request, exactly as rendered: the
        context-protocol system message, the system items, then the history. Each item starts with a
        header line (`@<offset> key=... updates=@<n> actor=... refs=[...]`) and then its content;
        offsets are journal coordinates, not a reading order."""
        chosen: Transport | None = transport
        return await _answer(door.read_context(authority(ctx), path, chosen))

    @server.tool(title="Read journaled events", annotations=reading)
    async def read_events(
        ctx: Context,
        path: StreamPath,
        from_offset: Annotated[
            int | None,
            Field(ge=1, description="First offset to return; default: the newest `limit` events."),
        ] = None,
        limit: Annotated[int, Field(ge=1, le=MAX_EVENTS, description="At most this many events.")] = 50,
    ) -> EventRange:
        """Read a stream's journaled events in offset order: offset, type, payload, createdAt and
        idempotencyKey of each. Messages and answers are events of type
        events.iterate.com/agents/context-added (payload: role, content, actor...); a model turn is an
        llm-request-requested event and its llm-request-settled. lastOffset is the newest offset."""
        return await _answer(door.read_events(authority(ctx), path, from_offset, limit))

    return server
