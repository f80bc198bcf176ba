"""Routing subscriptions: an agent asks for the events of another stream (an integration's, say).

    events.iterate.com/agent/subscribed   {source, eventTypes?, llmRequestPolicy?}   in the agent's stream
    events.iterate.com/agent/unsubscribed {source}

The router (`agentstream worker router`) keeps, per source stream, the agents subscribed to it
(`SourceRoutes`, its table's value) and appends a summary of every source event to each of them.
This module imports nothing from `schemas.events`, which registers these payloads.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, TypeAdapter

from schemas.context import LlmRequestPolicy, NonEmpty, PositiveInt, Wire
from schemas.limits import StreamPath

AGENT_SUBSCRIBED = "events.iterate.com/agent/subscribed"
AGENT_UNSUBSCRIBED = "events.iterate.com/agent/unsubscribed"


class SubscribedPayload(Wire):
    source: StreamPath
    # Only these event types of the source are routed; absent: every event.
    eventTypes: Annotated[list[NonEmpty], Field(min_length=1)] | None = None
    # How each routed item triggers the agent's next turn; absent: the agent's default.
    llmRequestPolicy: LlmRequestPolicy | None = None


class UnsubscribedPayload(Wire):
    source: StreamPath


class Route(Wire):
    """One subscriber of a source, as the router's table holds it."""

    eventTypes: list[str] | None = None
    llmRequestPolicy: LlmRequestPolicy | None = None
    since: PositiveInt  # offset of the subscription event in the subscriber's stream


# The router table's value for one source: subscriber agent path -> its route.
SourceRoutes = dict[str, Route]
SOURCE_ROUTES: TypeAdapter[SourceRoutes] = TypeAdapter(SourceRoutes)
