"""A stack of real worker processes whose model is a scripted OpenAI-compatible server, and agents
born at chosen paths: what the authority and MCP tests share."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from pipeline.client import birth_commands
from tests.kafka_stack import Stack, ensure_broker
from tests.support.scripted_llm import ScriptedLLM

MODEL = "scripted"


@contextlib.contextmanager
def scripted_stack(root: Path, replies: object) -> Iterator[Stack]:
    """A `Stack` (its topics, no process started yet) whose LLM caller would talk to a scripted
    model answering with `replies`; the stack is closed on the way out."""
    ensure_broker()
    with ScriptedLLM(model=MODEL, default=replies) as llm:  # type: ignore[arg-type]
        stack = Stack(
            root / "data",
            openai_base_url=llm.base_url,
            openai_api_key="sk-test",
            llm_transport="openai-compatible",
            llm_model=MODEL,
        )
        try:
            yield stack
        finally:
            stack.close()


def birth(stack: Stack, path: str) -> None:
    """An agent at `path`, made with the two events `agents.create()` appends."""
    agent = stack.client.agents.get(path)
    for command in birth_commands():
        agent.append(command).wait(timeout=60)
