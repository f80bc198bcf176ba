"""`agentstream demo`: the quick start, end to end, on this machine.

Starts what is not running, as `agentstream up` does (the local broker, the embedded model unless
OPENAI_API_KEY is set, the journal worker, the LLM caller, the capability host, the router and the
HTTP gateway), creates an agent, sends it a message, prints the conversation as it is journaled
(and the exact request the model saw, headers included), then stops exactly what it started.
Logs of the processes go to .local/logs/.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from pipeline import exit_codes
from pipeline.client import Client
from pipeline.dev import local_stack
from pipeline.settings import Settings
from pipeline.terminal import escape_controls
from processors.reducer import fold_all
from processors.render import render_messages
from processors.state import AgentState
from schemas.events import CONTEXT_ADDED, LLM_REQUEST_REQUESTED, LLM_REQUEST_SETTLED


def _say(text: str = "") -> None:
    print(text, flush=True)


def describe(event: Any) -> str:
    """One readable line per journal event (the model's text too: its control characters written visibly)."""
    if event.type == CONTEXT_ADDED:
        item = event.payload
        text = item.content if len(item.content) < 400 else item.content[:400] + "…"
        return escape_controls(f"@{event.offset} {item.role}: {text}")
    payload = event.payload.model_dump(exclude_none=True) if hasattr(event.payload, "model_dump") else event.payload
    return escape_controls(f"@{event.offset} {event.type.rsplit('/', 1)[-1]} {payload}")


def converse(client: Client, text: str, timeout: float) -> int:
    agent = client.agents.create()
    _say(f"\nagent {agent.path} created; sending: {text!r}\n")
    agent.append(
        {
            "type": CONTEXT_ADDED,
            "payload": {"role": "user", "content": text, "actor": {"type": "user", "origin": "cli"}},
        }
    )
    seen = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = agent.stream.events()
        for event in events[seen:]:
            _say(describe(event))
            if event.type == LLM_REQUEST_REQUESTED:
                state = fold_all(AgentState(), events[: events.index(event) + 1])
                _say(
                    f"\n--- the request @{event.offset} exactly as the model sees it ({client.settings.transport}) ---"
                )
                for message in render_messages(state, client.settings.transport, event.createdAt):
                    _say(escape_controls(f"[{message['role']}]\n{message['content']}\n", keep_newlines=True))
                _say("--- end of request ---\n")
            if event.type == LLM_REQUEST_SETTLED:
                status = event.payload.result.status
                _say(f"\nturn settled: {status}")
                return 0 if status == "succeeded" else 1
        seen = len(events)
        time.sleep(0.3)
    _say(f"no answer within {timeout:.0f}s; see .local/logs/")
    return 1


def register(commands: Any) -> None:
    parser = commands.add_parser("demo", help="start the local stack, talk to a new agent, stop", description=__doc__)
    parser.add_argument("text", nargs="?", default="Hello! In one sentence: what is an append-only journal good for?")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the answer")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    _say("starting the local stack:")
    # Filled in as each part starts: a start that fails halfway still stops what it started.
    launch = local_stack.Launch()
    try:
        local_stack.up(settings, say=_say, launch=launch)
        with Client(settings) as client:
            return converse(client, args.text, args.timeout)
    except local_stack.StackError as error:
        print(f"agentstream demo: {' '.join(str(error).split())}", file=sys.stderr, flush=True)
        return exit_codes.KAFKA  # the local stack (broker, model, workers) could not be started
    finally:
        if launch.started:
            _say("stopping what the demo started:")
            local_stack.down(launch.started, say=_say)
