"""What an agent may reach: its grants (docs/behaviour.md §6.6), pure.

Whoever may append to an agent can make it run code through the model, so the agent's scripts act
with the agent's own authority and never the host's. An agent's project is its path without the
last segment; agents of one project trust each other, agents of different projects do not.

    grants = effective_grants(agent_path, config.grants)
    may_read(grants, target_path)        # globs only; referenced events are checked by the host
    may_send(grants, target_path)
    may_subscribe(grants, source_path)

Defaults, each replaced by a configured list of globs (`agent/configured {config: {grants: …}}`):
- read: the agent's own stream, plus exactly the events its own items reference (`refs` of type
  `event`, e.g. a routed webhook);
- send: the agents of its project (`<project>/*`);
- subscribe: every stream of its project (`<project>/**`) and `/integrations/**`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from processors.globs import in_scope
from processors.idempotency_keys import is_routed
from schemas.capabilities import ScriptGrants
from schemas.config import AgentGrants
from schemas.events import CONTEXT_ADDED, AppendCommand
from schemas.routing import AGENT_SUBSCRIBED

INTEGRATIONS = "/integrations/**"


@dataclass(frozen=True, slots=True)
class EffectiveGrants:
    read: tuple[str, ...]
    read_referenced: bool  # the default read grant: events the agent's own items reference
    send: tuple[str, ...]
    subscribe: tuple[str, ...]


def project_of(agent_path: str) -> str:
    """`/agents/acme/a1` -> `/agents/acme`; an agent one segment deep has the root (``) as project."""
    return agent_path.rpartition("/")[0]


def effective_grants(agent_path: str, configured: AgentGrants) -> EffectiveGrants:
    project = project_of(agent_path)
    return EffectiveGrants(
        read=tuple(configured.read) if configured.read is not None else (agent_path,),
        read_referenced=configured.read is None,
        send=tuple(configured.send) if configured.send is not None else (f"{project}/*",),
        subscribe=tuple(configured.subscribe) if configured.subscribe is not None else (f"{project}/**", INTEGRATIONS),
    )


def script_grants(agent_path: str, configured: AgentGrants) -> ScriptGrants:
    """What a script run of the agent acts with: the read and send grants, carried in its
    `script-runs` record so the capability host checks each call against them."""
    granted = effective_grants(agent_path, configured)
    return ScriptGrants(read=list(granted.read), readReferenced=granted.read_referenced, send=list(granted.send))


def may_read(grants: EffectiveGrants, target_path: str) -> bool:
    """Whether the read globs cover the target's stream (a referenced event may still be readable)."""
    return in_scope(target_path, grants.read)


def may_send(grants: EffectiveGrants, target_path: str) -> bool:
    return in_scope(target_path, grants.send)


def may_subscribe(grants: EffectiveGrants, source_path: str) -> bool:
    return in_scope(source_path, grants.subscribe)


def read_refusal(target_path: str) -> str:
    """The one message for a refused read: it names the path asked for and nothing about the event."""
    return f"{target_path} is outside this agent's read grants"


def send_refusal(target_path: str) -> str:
    return f"{target_path} is outside this agent's send grants"


def subscribe_refusal(agent_path: str, source_path: str, grants: EffectiveGrants) -> str:
    allowed = list(grants.subscribe)
    return f"forbidden: subscribe: {source_path} is outside the subscribe grants of {agent_path} {allowed}"


def subscription_refusal(agent_path: str, created: bool, configured: AgentGrants, command: AppendCommand) -> str | None:
    """Why the journal refuses this command into an agent's stream (None: no grant is involved).

    An `agent/subscribed` must name a source inside the agent's subscribe grants, and only an agent
    (`agent/created` journaled) subscribes. A routed item is checked again when it arrives, against
    the subscriber's grants as they are now: the router cannot see them.
    """
    if command.type == AGENT_SUBSCRIBED:
        source = command.payload.get("source")
    elif command.type == CONTEXT_ADDED and is_routed(command.idempotencyKey):
        source = _routed_source(command.payload)
    else:
        return None
    if not isinstance(source, str):
        return None  # the payload's own validation says what is wrong
    if not created:
        return f"forbidden: subscribe: {agent_path} is not an agent (no agent/created journaled); only agents subscribe"
    grants = effective_grants(agent_path, configured)
    if not may_subscribe(grants, source):
        return subscribe_refusal(agent_path, source, grants)
    return None


def _routed_source(item: dict[str, Any]) -> str | None:
    refs = item.get("refs")
    first = refs[0] if isinstance(refs, list) and refs else None
    return first.get("streamPath") if isinstance(first, dict) else None


def referenced_events(event: dict[str, Any]) -> list[tuple[str, int]]:
    """The (stream path, offset) of every event ref of a journaled context item: what the item
    lets its agent read under the default read grant."""
    if event.get("type") != CONTEXT_ADDED:
        return []
    payload = event.get("payload")
    refs = payload.get("refs") if isinstance(payload, dict) else None
    found = []
    for ref in refs if isinstance(refs, list) else ():
        if isinstance(ref, dict) and ref.get("type") == "event":
            path, offset = ref.get("streamPath"), ref.get("offset")
            if isinstance(path, str) and isinstance(offset, int) and not isinstance(offset, bool):
                found.append((path, offset))
    return found
