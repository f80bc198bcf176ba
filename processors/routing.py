"""Routing, pure: subscriptions per source, and what one source event becomes for each subscriber.

    routes = apply_subscription(routes, subscription_event)         # the router table's value
    commands = routed_commands(source_event, size, routes)          # append commands to produce

Each subscriber gets one developer item: a short summary (who did what; never the raw payload or
its secrets), an actor for the source, and a ref to the source event, with the idempotency key
`route/<source>@<offset>` so a re-routed event is a no-op. Events that were themselves routed are
never routed again.

Loops are bounded (docs/behaviour.md §6.7). Request bookkeeping (`llm-request-*`,
`token-usage-reported`, `capability-host/*`) is never routed. From an agent's stream only its
answers (`context-added` with role assistant) are routed unless the subscription names event types,
and the routed item's actor is that agent: an agent-loop trigger, so `maxAutonomousTurns` bounds any
cycle of agents subscribed to each other. From any other stream the actor is an integration kind
(third-party data, external input).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from processors.idempotency_keys import is_routed, route_key
from schemas.events import (
    CAPABILITY_HOST_PREFIX,
    CONTEXT_ADDED,
    LLM_REQUEST_REQUESTED,
    LLM_REQUEST_SETTLED,
    TOKEN_USAGE_REPORTED,
)
from schemas.gateway import GITHUB_WEBHOOK_RECEIVED, SLACK_WEBHOOK_RECEIVED
from schemas.routing import (
    AGENT_SUBSCRIBED,
    AGENT_UNSUBSCRIBED,
    Route,
    SourceRoutes,
    SubscribedPayload,
    UnsubscribedPayload,
)

MAX_SUMMARY_CHARS = 2000
SUBSCRIPTION_TYPES = frozenset({AGENT_SUBSCRIBED, AGENT_UNSUBSCRIBED})


# --- subscriptions -----------------------------------------------------------------------------


def subscription_source(event: Mapping[str, Any]) -> str | None:
    """The source a journaled subscribed/unsubscribed event is about (None: not a valid one)."""
    if event.get("type") not in SUBSCRIPTION_TYPES:
        return None
    payload = event.get("payload")
    source = payload.get("source") if isinstance(payload, dict) else None
    return source if isinstance(source, str) else None


def apply_subscription(routes: SourceRoutes, event: Mapping[str, Any]) -> SourceRoutes:
    """The source's routes after one journaled subscription event of agent `event.streamPath`.

    A repeated `subscribed` replaces the agent's filter and policy; `unsubscribed` removes it.
    A subscription of a stream to itself is ignored (every routed item would be routed again).
    """
    agent = event["streamPath"]
    try:
        if event["type"] == AGENT_SUBSCRIBED:
            subscribed = SubscribedPayload.model_validate(event["payload"])
            if subscribed.source == agent:
                return routes
            route = Route(
                eventTypes=subscribed.eventTypes, llmRequestPolicy=subscribed.llmRequestPolicy, since=event["offset"]
            )
            return {**routes, agent: route}
        if event["type"] == AGENT_UNSUBSCRIBED:
            UnsubscribedPayload.model_validate(event["payload"])
            return {path: route for path, route in routes.items() if path != agent}
    except ValidationError:
        pass  # the journal validates these payloads; an invalid one (journaled before) changes nothing
    return routes


# --- fan-out -----------------------------------------------------------------------------------


REQUEST_BOOKKEEPING = frozenset({LLM_REQUEST_REQUESTED, LLM_REQUEST_SETTLED, TOKEN_USAGE_REPORTED})


def routable(event: Mapping[str, Any]) -> bool:
    """Neither routed itself nor request bookkeeping: never routed to anyone."""
    event_type = event.get("type")
    if not isinstance(event_type, str) or event_type in REQUEST_BOOKKEEPING:
        return False
    return not event_type.startswith(CAPABILITY_HOST_PREFIX) and not is_routed(event.get("idempotencyKey"))


def wants(route: Route, event: Mapping[str, Any], from_agent: bool) -> bool:
    """Whether the subscriber asked for this event: the types it named, or by default every event
    of a non-agent stream and an agent's answers only."""
    event_type = event.get("type")
    if route.eventTypes is not None:
        return event_type in route.eventTypes
    if from_agent:
        payload = event.get("payload")
        return event_type == CONTEXT_ADDED and isinstance(payload, dict) and payload.get("role") == "assistant"
    return True


def routed_commands(
    event: Mapping[str, Any], size_bytes: int, routes: SourceRoutes, *, from_agent: bool
) -> list[dict[str, Any]]:
    """The append commands (no appendId) that route one journaled source event to its subscribers.
    `from_agent`: the source stream is an agent's (docs/behaviour.md §6.7)."""
    if not routes or not routable(event):
        return []
    source, offset, event_type = event["streamPath"], event["offset"], event["type"]
    payload = event.get("payload") if isinstance(event.get("payload"), dict) else {}
    targets = [(path, route) for path, route in routes.items() if path != source and wants(route, event, from_agent)]
    if not targets:
        return []
    actor = {"type": "agent", "path": source} if from_agent else actor_for(source, event_type, payload)
    item: dict[str, Any] = {
        "role": "developer",
        "content": summarize(source, offset, event_type, payload, size_bytes),
        "actor": actor,
        "refs": [{"type": "event", "streamPath": source, "offset": offset, "eventType": event_type}],
    }
    key = route_key(source, offset)
    commands = []
    for path, route in sorted(targets):
        routed = dict(item)
        if route.llmRequestPolicy is not None:
            routed["llmRequestPolicy"] = route.llmRequestPolicy.model_dump()
        commands.append({"streamPath": path, "type": CONTEXT_ADDED, "payload": routed, "idempotencyKey": key})
    return commands


# --- actors ------------------------------------------------------------------------------------


def actor_for(source: str, event_type: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """Who the routed item speaks for: always an integration kind (third-party data)."""
    if event_type == GITHUB_WEBHOOK_RECEIVED:
        sender = _dict(_dict(payload.get("payload")).get("sender"))
        return _compact({"type": "github", "login": _str(sender.get("login")), "senderType": _str(sender.get("type"))})
    if event_type == SLACK_WEBHOOK_RECEIVED:
        inner = _dict(_dict(payload.get("payload")).get("event"))
        bot = _str(_dict(inner.get("bot_profile")).get("name")) or (
            _str(inner.get("username")) if inner.get("bot_id") else None
        )
        return _compact({"type": "slack", "userId": _str(inner.get("user")), "botName": bot})
    return {"type": "integration", "name": integration_name(source)}


def integration_name(source: str) -> str:
    """`/integrations/<name>/…` -> `<name>`; any other stream is named by its path."""
    parts = source.split("/")
    if len(parts) > 2 and parts[1] == "integrations" and parts[2]:
        return parts[2]
    return source


# --- summaries ---------------------------------------------------------------------------------


def summarize(source: str, offset: int, event_type: str, payload: Mapping[str, Any], size_bytes: int) -> str:
    """One short paragraph (at most 2,000 characters) saying what happened, never the raw payload."""
    text = None
    if event_type == GITHUB_WEBHOOK_RECEIVED:
        text = github_summary(_str(payload.get("event")) or "", _dict(payload.get("payload")))
    elif event_type == SLACK_WEBHOOK_RECEIVED:
        text = slack_summary(_dict(payload.get("payload")))
    if text is None:
        text = (
            f"{event_type} received on {source}@{offset} ({size_bytes} bytes); "
            "read the referenced event for the full payload."
        )
    return _clip(_one_paragraph(text), MAX_SUMMARY_CHARS)


def github_summary(event: str, body: Mapping[str, Any]) -> str | None:
    """Who did what to which number and title, for pull requests, issues, comments and pushes."""
    who = _str(_dict(body.get("sender")).get("login")) or "someone"
    repo = _str(_dict(body.get("repository")).get("full_name"))
    where = f" in {repo}" if repo else ""
    action = _str(body.get("action")) or "updated"
    if event == "pull_request":
        pr = _dict(body.get("pull_request"))
        if action == "closed" and pr.get("merged") is True:
            action = "merged"
        return f"GitHub: {who} {_words(action)} pull request {_numbered(pr, body)}{where}.{_url(pr)}"
    if event == "issues":
        issue = _dict(body.get("issue"))
        return f"GitHub: {who} {_words(action)} issue {_numbered(issue, body)}{where}.{_url(issue)}"
    if event == "issue_comment":
        issue = _dict(body.get("issue"))
        kind = "pull request" if issue.get("pull_request") else "issue"
        verb = {"created": "commented on", "edited": "edited a comment on", "deleted": "deleted a comment on"}
        did = verb.get(action, f"{_words(action)} a comment on")
        return f"GitHub: {who} {did} {kind} {_numbered(issue, body)}{where}.{_url(_dict(body.get('comment')))}"
    if event == "pull_request_review":
        pr = _dict(body.get("pull_request"))
        state = _str(_dict(body.get("review")).get("state")) or ""
        verb = {"approved": "approved", "changes_requested": "requested changes on", "commented": "reviewed"}
        did = verb.get(state.lower(), "reviewed") if action == "submitted" else f"{_words(action)} a review of"
        return f"GitHub: {who} {did} pull request {_numbered(pr, body)}{where}.{_url(_dict(body.get('review')))}"
    if event == "pull_request_review_comment":
        pr = _dict(body.get("pull_request"))
        return f"GitHub: {who} {_words(action)} a review comment on pull request {_numbered(pr, body)}{where}."
    if event == "push":
        return _push_summary(body, where)
    return None


def _push_summary(body: Mapping[str, Any], where: str) -> str:
    who = _str(_dict(body.get("pusher")).get("name")) or _str(_dict(body.get("sender")).get("login")) or "someone"
    ref = _str(body.get("ref")) or "a ref"
    branch = ref.removeprefix("refs/heads/").removeprefix("refs/tags/")
    commits = body.get("commits") if isinstance(body.get("commits"), list) else []
    if body.get("deleted") is True:
        return f"GitHub: {who} deleted {branch}{where}."
    count = len(commits)
    text = f"GitHub: {who} pushed {count} commit{'s' if count != 1 else ''} to {branch}{where}"
    head = _str(_dict(body.get("head_commit")).get("message"))
    if head:
        text += f"; head commit: “{_clip(head.splitlines()[0], 200)}”"
    if body.get("forced") is True:
        text += " (force-push)"
    return text + "."


def slack_summary(envelope: Mapping[str, Any]) -> str | None:
    """The author and text of a Slack message (or app mention)."""
    event = _dict(envelope.get("event"))
    if event.get("type") not in ("message", "app_mention"):
        return None
    if event.get("subtype") in ("message_changed", "message_deleted"):
        inner = _dict(event.get("message") or event.get("previous_message"))
        event = {**inner, "channel": event.get("channel")}
    author = _str(event.get("user"))
    who = f"<@{author}>" if author else _str(_dict(event.get("bot_profile")).get("name")) or _str(event.get("username"))
    channel = _str(event.get("channel"))
    place = f" in <#{channel}>" if channel else ""
    text = _str(event.get("text")) or ""
    return f"Slack message from {who or 'someone'}{place}: {text}"


# --- helpers -----------------------------------------------------------------------------------


def _numbered(thing: Mapping[str, Any], body: Mapping[str, Any]) -> str:
    number = thing.get("number", body.get("number"))
    title = _str(thing.get("title"))
    shown = f"#{number}" if isinstance(number, int) else "(no number)"
    return f"{shown} “{_clip(title, 300)}”" if title else shown


def _url(thing: Mapping[str, Any]) -> str:
    url = _str(thing.get("html_url"))
    return f" {url}" if url else ""


def _words(action: str) -> str:
    return action.replace("_", " ")


def _one_paragraph(text: str) -> str:
    return " ".join(text.split())


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _compact(actor: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in actor.items() if v is not None}
