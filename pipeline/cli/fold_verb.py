"""`agentstream fold`: fold a dumped journal and print exactly what the model saw."""

from __future__ import annotations

import argparse
import sys
from typing import IO, Any

import orjson

from pipeline import exit_codes
from pipeline.terminal import escape_controls, escape_json_controls
from processors.reducer import JournalOrderError, fold
from processors.render import projection_json, render_messages, turn_json
from processors.state import AgentState
from schemas.events import LLM_REQUEST_REQUESTED, EnvelopeError, InvalidPayloadEvent, decode_event
from schemas.requests import TRANSPORTS


def register(verbs: Any) -> None:
    parser = verbs.add_parser(
        "fold",
        help="fold journal events (JSON Lines) into the projection and the request messages",
        description=(
            "Read journal events of one stream as JSON Lines (FILE or stdin), fold those with "
            "offset <= N, and print the projection, the turn state and the request messages as if "
            "the last folded event were the request."
        ),
    )
    parser.add_argument("file", nargs="?", metavar="FILE", help="JSON Lines file (default: stdin)")
    parser.add_argument("--through", type=int, metavar="N", help="fold events with offset <= N only")
    parser.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default="openai",
        help="openai keeps the developer role; openai-compatible maps it to system (default: openai)",
    )
    parser.set_defaults(run=run)


def fold_lines(lines: IO[bytes], through: int | None, warn: IO[str]) -> tuple[AgentState, Any]:
    """Fold every event of `lines` up to `through`; returns the state and the last folded event."""
    state = AgentState()
    last: Any = None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            event = decode_event(line)
        except EnvelopeError as error:
            raise BadInput(f"line {number}: not a journal event envelope: {error}") from None
        if through is not None and event.offset > through:
            continue
        if isinstance(event, InvalidPayloadEvent):
            print(escape_controls(f"warning: line {number} (@{event.offset}) skipped: {event.reason}"), file=warn)
        try:
            fold(state, event)
        except JournalOrderError as error:
            raise BadInput(f"line {number}: {error}") from None
        last = event
    return state, last


def running_scripts(state: AgentState) -> list[dict[str, Any]]:
    """Executions requested or started and not yet settled (the `running-script` status)."""
    return [
        {"executionId": run.executionId, "offset": run.offset, "expiresAt": run.expiresAt, "started": run.started}
        for run in state.scripts.values()
    ]


class BadInput(Exception):
    pass


def run(args: argparse.Namespace) -> int:
    try:
        if args.file is None:
            state, last = fold_lines(sys.stdin.buffer, args.through, sys.stderr)
        else:
            with open(args.file, "rb") as lines:
                state, last = fold_lines(lines, args.through, sys.stderr)
    except (BadInput, OSError) as error:
        print(f"agentstream fold: {escape_controls(str(error))}", file=sys.stderr)
        return exit_codes.USAGE
    is_request = (
        last is not None
        and getattr(last, "type", None) == LLM_REQUEST_REQUESTED
        and not isinstance(last, InvalidPayloadEvent)
    )
    output = {
        "projection": projection_json(state),
        "turn": turn_json(state),
        "messages": render_messages(state, args.transport, last.createdAt if is_request else None),
    }
    if state.scripts:  # status "running-script": say which
        output["turn"]["runningScripts"] = running_scripts(state)
    text = escape_json_controls(orjson.dumps(output, option=orjson.OPT_INDENT_2).decode())
    sys.stdout.buffer.write(text.encode() + b"\n")
    return 0
