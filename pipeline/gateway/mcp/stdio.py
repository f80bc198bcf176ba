"""`agentstream mcp`: the MCP door over stdio, for a local client that starts it as a subprocess.

The process is a small gateway of its own: the same tools, append gate and tokens file as `/mcp`,
acting with the one token in `AGENTSTREAM_TOKEN` (looked up at every call, so an edit of the tokens
file applies at once). stdout carries the protocol and nothing else; logs go to stderr. It ends when
the client closes stdin.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

from pipeline.settings import Settings, SettingsError

log = logging.getLogger("agentstream.mcp")


def serve(settings: Settings) -> None:
    import anyio

    from pipeline.gateway.tokens import TokenBook, TokensFileError
    from pipeline.logs import setup_logging

    setup_logging(settings)  # on stderr: stdout is the client's
    try:
        tokens = TokenBook(settings.gateway_tokens_file, settings.gateway_tokens_file_grace_s)
    except TokensFileError as error:
        raise SettingsError(str(error)) from None
    if settings.gateway_tokens_file is None or not settings.token:
        log.warning("AGENTSTREAM_GATEWAY_TOKENS_FILE or AGENTSTREAM_TOKEN is unset: every tool call will be refused")
    anyio.run(_serve, settings, tokens)


async def _serve(settings: Settings, tokens: Any) -> None:
    from pipeline.gateway.commands import Limits
    from pipeline.gateway.console.mirror import JournalMirror
    from pipeline.gateway.kafka import CommandProducer, ResultsFollower
    from pipeline.gateway.mcp.door import Door
    from pipeline.gateway.mcp.tools import TokenAuthority, build_server
    from pipeline.gateway.service import Gateway
    from topics.names import topic_names

    loop = asyncio.get_running_loop()
    topics = topic_names(settings.topic_prefix)
    gateway = Gateway(
        settings=settings,
        tokens=tokens,
        topics=topics,
        producer=CommandProducer(settings, topics),
        results=ResultsFollower(settings, topics.results),
        limits=Limits(settings.max_event_bytes, settings.gateway_max_user_file_bytes),
    )
    mirror = JournalMirror(settings, topics.journal)
    gateway.producer.start(loop)
    gateway.results.start(loop)
    server = build_server(Door(gateway, mirror), TokenAuthority(tokens, settings.token), settings)
    try:
        await server.run_stdio_async()
    finally:
        await asyncio.to_thread(mirror.close)
        await asyncio.to_thread(gateway.results.close)
        await asyncio.to_thread(gateway.producer.close)


def _mcp(_: argparse.Namespace) -> int:
    serve(Settings.from_env())
    return 0


def register(commands: Any) -> None:
    mcp = commands.add_parser(
        "mcp",
        help="serve the MCP door over stdio for a local MCP client (token: AGENTSTREAM_TOKEN, checked against "
        "AGENTSTREAM_GATEWAY_TOKENS_FILE)",
    )
    mcp.set_defaults(run=_mcp)
