"""`agentstream agent ...`: create an agent, talk to it, watch its journal, see what the model saw."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson
from pydantic import ValidationError

from pipeline.client import AppendTimeout, Client
from pipeline.settings import Settings
from pipeline.terminal import escape_controls, escape_json_controls
from processors.reducer import fold_all
from processors.render import projection_json, render_messages, render_request
from processors.state import AgentState
from schemas.events import CONTEXT_ADDED, LLM_REQUEST_REQUESTED, AppendCommand, InvalidPayloadEvent
from schemas.requests import TRANSPORTS
from topics.admin import require_topics
from topics.names import topic_names

PATH_RULE = (
    "a stream path is '/' followed by segments joined by '/', each 1-128 characters of "
    "A-Z a-z 0-9 . _ ~ : @ + - and not '.' or '..', at most 512 characters in all (e.g. /agents/support-7)"
)

_COLOURS = {"user": "32", "assistant": "36", "system": "35", "developer": "33", "error": "31", "turn": "90"}


def _paint(text: str, kind: str, colour: bool) -> str:
    return f"\x1b[{_COLOURS[kind]}m{text}\x1b[0m" if colour else text


def event_line(event: Any, colour: bool = False) -> str:
    """One readable line per journal event, its control characters (newlines too) written visibly."""
    short = event.type.rsplit("/", 1)[-1]
    head = f"@{event.offset} {event.createdAt}"
    if isinstance(event, InvalidPayloadEvent):
        return _paint(escape_controls(f"{head} {short} (invalid payload, skipped: {event.reason})"), "error", colour)
    if event.type == CONTEXT_ADDED:
        item = event.payload
        actor = f" [{item.actor.type}]" if item.actor is not None else ""
        key = f" key={item.key}" if item.key else ""
        return _paint(escape_controls(f"{head} {item.role}{actor}{key}: {item.content}"), item.role, colour)
    payload = event.payload.model_dump(exclude_none=True) if hasattr(event.payload, "model_dump") else event.payload
    kind = "error" if short == "error-occurred" else "turn"
    return _paint(escape_controls(f"{head} {short} {orjson.dumps(payload).decode()}"), kind, colour)


def check_path(path: str) -> str:
    """`path` if it is a valid stream path, else a one-line ValueError saying what a valid one is."""
    try:
        AppendCommand.model_validate({"streamPath": path, "type": "x", "payload": {}})
    except ValidationError:
        shown = repr(path) if len(path) <= 80 else repr(path[:77]) + "..."
        raise ValueError(f"invalid stream path {shown}: {PATH_RULE}") from None
    return path


def _client() -> Client:
    """A client, once Kafka answers and has the topics it needs (else one line, exit 3)."""
    settings = Settings.from_env()
    names = topic_names(settings.topic_prefix)
    require_topics(
        settings.bootstrap_servers,
        [names.appends, names.results, names.journal],
        settings.partitions,
        client_config=settings.kafka_client_config(),
    )
    return Client(settings)


def _not_found(path: str) -> LookupError:
    return LookupError(f"no events in {path}: check the path (agentstream agent create prints it)")


def _events_or_fail(client: Client, path: str) -> list[Any]:
    events = client.streams.get(path).events()
    if not events:
        raise _not_found(path)
    return events


def _create(args: argparse.Namespace) -> int:
    with _client() as client:
        agent = client.agents.create()
        client.flush()
        print(agent.path)
    return 0


def _say(args: argparse.Namespace) -> int:
    payload: dict[str, Any] = {"role": "user", "content": args.text, "actor": {"type": "user", "origin": "cli"}}
    if args.interrupt and args.no_trigger:
        raise ValueError("--interrupt and --no-trigger exclude each other")
    if args.interrupt:
        payload["llmRequestPolicy"] = {"behaviour": "interrupt-current-request"}
    elif args.no_trigger:
        payload["llmRequestPolicy"] = {"behaviour": "dont-trigger-request"}
    check_path(args.path)
    with _client() as client:
        receipt = client.agents.get(args.path).append({"type": CONTEXT_ADDED, "payload": payload})
        try:
            offset = receipt.wait(args.timeout)
        except AppendTimeout:
            client.flush(10)  # raises if the append never reached Kafka: then that is the error
            raise AppendTimeout(
                f"the append to {args.path} was delivered to Kafka, but no outcome arrived within "
                f"{args.timeout:g}s; it may still be journaled: check with "
                f"`agentstream agent tail {args.path} --no-follow`"
            ) from None
        print(f"@{offset}")
    return 0


def _tail(args: argparse.Namespace) -> int:
    colour = sys.stdout.isatty() and not args.json
    check_path(args.path)
    printed = 0
    with _client() as client:
        for event in client.iter_journal(args.path, follow=not args.no_follow):
            if args.json:
                envelope = event.envelope if isinstance(event, InvalidPayloadEvent) else event
                print(escape_json_controls(envelope.model_dump_json(exclude_none=True)), flush=True)
            else:
                print(event_line(event, colour), flush=True)
            printed += 1
    if not printed:  # only reached without --follow: following waits for the first event
        raise _not_found(args.path)
    return 0


def _show(args: argparse.Namespace) -> int:
    check_path(args.path)
    with _client() as client:
        state = fold_all(AgentState(), _events_or_fail(client, args.path))
        if args.json:
            print(escape_json_controls(orjson.dumps(projection_json(state), option=orjson.OPT_INDENT_2).decode()))
            return 0
        print(f"# {args.path}: status {state.status}, published through @{state.published_through}")
        for run in state.scripts.values():  # a running script: which one, and whether it has started
            started = "started" if run.started else "requested"
            print(escape_controls(f"# script {run.executionId} (@{run.offset}) {started}"))
        for message in render_messages(state, args.transport or client.settings.transport)[1:]:
            print(escape_controls(f"[{message['role']}]\n{message['content']}\n", keep_newlines=True))
    return 0


def _request(args: argparse.Namespace) -> int:
    check_path(args.path)
    with _client() as client:
        events = _events_or_fail(client, args.path)
        requests = [e for e in events if e.type == LLM_REQUEST_REQUESTED and not isinstance(e, InvalidPayloadEvent)]
        if args.offset is not None:
            requests = [e for e in requests if e.offset == args.offset]
        if not requests:
            which = f"@{args.offset}" if args.offset is not None else "any"
            raise LookupError(f"{args.path} has no llm-request-requested event at {which}")
        request = requests[-1]
        transport = args.transport or client.settings.transport
        budget = client.settings.render_budget_for(request.payload.model)
        body = {"model": request.payload.model, "messages": render_request(events, request, transport, budget)}
        print(escape_json_controls(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode()))
    return 0


def register(verbs: Any) -> None:
    agent = verbs.add_parser("agent", help="create agents, talk to them, inspect what they saw")
    actions = agent.add_subparsers(dest="agent_verb", required=True, metavar="ACTION")

    create = actions.add_parser("create", help="create an agent (agent/created + base policy); prints its path")
    create.set_defaults(run=_create)

    say = actions.add_parser("say", help="append a user message; prints its offset")
    say.add_argument("path")
    say.add_argument("text")
    say.add_argument("--interrupt", action="store_true", help="interrupt the request in flight")
    say.add_argument("--no-trigger", action="store_true", help="record only; do not start a turn")
    say.add_argument("--timeout", type=float, default=30.0, help="seconds to wait until journaled")
    say.set_defaults(run=_say)

    tail = actions.add_parser("tail", help="follow a stream's journal live, one line per event")
    tail.add_argument("path")
    tail.add_argument("--json", action="store_true", help="one JSON event per line")
    tail.add_argument("--no-follow", action="store_true", help="stop at the current end")
    tail.set_defaults(run=_tail)

    show = actions.add_parser("show", help="the projection with headers, as the model would see it")
    show.add_argument("path")
    show.add_argument("--json", action="store_true", help="the projection as JSON")
    show.add_argument("--transport", choices=TRANSPORTS)
    show.set_defaults(run=_show)

    request = actions.add_parser("request", help="the exact rendered body of request R (default: the latest)")
    request.add_argument("path")
    request.add_argument("--offset", type=int, metavar="R")
    request.add_argument("--transport", choices=TRANSPORTS)
    request.set_defaults(run=_request)
