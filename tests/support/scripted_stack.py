"""A stack of real worker processes whose model is a scripted OpenAI-compatible server, and agents
born at chosen paths: what the end-to-end tests (authority, MCP, files, console, traces,
monitoring) share. A module keeps only what is its own: its tokens, overrides and extra processes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.client import birth_commands
from tests.gateway_server import GatewayServer, Tokens
from tests.kafka_stack import Stack, ensure_broker
from tests.support.scripted_llm import ScriptedLLM, echo_responder

MODEL = "scripted"
SMALL_HOST = {"concurrency": 2, "max_memory_mb": 64}  # a capability host's config for one test's turns


@dataclass
class Served:
    """A scripted stack with its processes running and the gateway in front of it."""

    stack: Stack
    llm: ScriptedLLM
    gateway: GatewayServer


@contextlib.contextmanager
def served_stack(
    root: Path,
    tokens: Tokens,
    replies: object = echo_responder,
    *,
    model: str = MODEL,
    stack_type: type[Stack] = Stack,
    capabilities: dict[str, Any] | None = None,
    router: dict[str, Any] | None = None,
    gateway: dict[str, Any] | None = None,
    **overrides: Any,
) -> Iterator[Served]:
    """A `stack_type` under `root / "data"` whose LLM caller talks to a scripted model answering
    with `replies`, with `overrides` as its settings; its journal worker and LLM caller running,
    the capability host and the router too when given their config, and the gateway (with
    `gateway` as its own settings) serving `tokens` and ready. Everything is stopped and the
    stack's topics deleted on the way out."""
    ensure_broker()
    with ScriptedLLM(model=model, default=replies) as llm:  # type: ignore[arg-type]
        settings = {
            "openai_base_url": llm.base_url,
            "openai_api_key": "test-key",
            "llm_transport": "openai-compatible",
            "llm_model": model,
            **overrides,
        }
        stack = stack_type(root / "data", **settings)
        try:
            stack.start_worker()
            stack.start_caller()
            if capabilities is not None:
                stack.start_capabilities(**capabilities)
            if router is not None:
                stack.start_router(**router)
            tokens.write()  # the gateway refuses to start without its tokens file
            with GatewayServer(stack.settings.model_copy(update=gateway or {}), tokens.path) as server:
                server.wait_ready()
                yield Served(stack, llm, server)
        finally:
            stack.close()


def birth(stack: Stack, path: str) -> None:
    """An agent at `path`, made with the two events `agents.create()` appends."""
    agent = stack.client.agents.get(path)
    for command in birth_commands():
        agent.append(command).wait(timeout=60)
