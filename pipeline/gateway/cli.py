"""`agentstream gateway` (serve HTTP) and `agentstream token create` (mint a bearer token)."""

from __future__ import annotations

import argparse
import gc
import logging
from typing import Any

from pydantic import ValidationError

from pipeline import tracing
from pipeline.settings import Settings, SettingsError
from schemas.gateway import TIERS, Tier, TokenEntry


def serve(settings: Settings) -> None:
    """Run the gateway in the foreground (uvicorn with uvloop and httptools) until SIGTERM/SIGINT."""
    import uvicorn

    from pipeline.gateway.app import build_app
    from pipeline.gateway.server import uvicorn_config
    from pipeline.gateway.tokens import TokenBook, TokensFileError
    from pipeline.logs import setup_logging

    setup_logging(settings)
    try:
        tokens = TokenBook(settings.gateway_tokens_file, settings.gateway_tokens_file_grace_s)
    except TokensFileError as error:
        raise SettingsError(str(error)) from None
    if settings.gateway_tokens_file is None:
        logging.getLogger("agentstream.gateway").warning(
            "AGENTSTREAM_GATEWAY_TOKENS_FILE is unset: every request will be refused (401)"
        )
    if settings.gateway_metrics_port:
        from prometheus_client import start_http_server

        # where the other workers serve theirs, on the same address
        start_http_server(settings.gateway_metrics_port, addr=settings.metrics_host)
    tracing.configure("gateway")  # only with OTEL_* set (docs/behaviour.md §8)
    server = uvicorn.Server(uvicorn_config(build_app(settings, tokens), settings))
    # Everything loaded so far (FastAPI, pydantic's schemas, the app: some 100 000 objects) lives
    # as long as the process: out of the cyclic collector's view, a full collection no longer
    # rescans it, which paused every request in flight for tens of milliseconds.
    gc.collect()
    gc.freeze()
    server.run()


def _gateway(_: argparse.Namespace) -> int:
    serve(Settings.from_env())
    return 0


def mint_token(
    tier: Tier,
    scope: list[str],
    name: str | None = None,
    agent_path: str | None = None,
    user_id: str | None = None,
) -> tuple[str, TokenEntry]:
    """A new bearer token and its tokens-file entry (which holds only the token's sha256).

    Raises ValueError with the entry's problems, one line (a bad tier, scope or agent path).
    """
    from pipeline.gateway.tokens import hash_token, new_token

    token = new_token()
    try:
        entry = TokenEntry(
            sha256=hash_token(token), tier=tier, scope=scope, name=name, agentPath=agent_path, userId=user_id
        )
    except ValidationError as error:
        raise ValueError("; ".join(e["msg"].removeprefix("Value error, ") for e in error.errors())) from None
    return token, entry


def _token_create(args: argparse.Namespace) -> int:
    from pipeline.gateway.tokens import token_entry_yaml

    token, entry = mint_token(args.tier, args.scope, args.name, args.agent_path, args.user_id)
    print(f"token (shown once; store it now): {token}")
    print("add to the gateway tokens file under `tokens:`:")
    print(token_entry_yaml(entry))
    return 0


def register(commands: Any) -> None:
    gateway = commands.add_parser(
        "gateway",
        help="serve the HTTP ingestion gateway (AGENTSTREAM_GATEWAY_* settings; OpenAPI docs at /docs)",
    )
    gateway.set_defaults(run=_gateway)

    token = commands.add_parser("token", help="gateway bearer tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = token_commands.add_parser(
        "create", help="mint a token: prints it once, and the entry (its sha256) for the tokens file"
    )
    create.add_argument("--tier", required=True, choices=TIERS, help="what the token may append (the append gate)")
    create.add_argument(
        "--scope",
        required=True,
        action="append",
        help="stream path glob the token may write (repeatable; * within a segment, ** across), e.g. '/agents/**'",
    )
    create.add_argument("--agent-path", help="agent tier: the agent the gateway stamps as the items' actor")
    create.add_argument("--user-id", help="user tier: the userId stamped into the user actor")
    create.add_argument("--name", help="a label for people and logs")
    create.set_defaults(run=_token_create)
