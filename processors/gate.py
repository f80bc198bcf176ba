"""The append gate: what a caller of the HTTP gateway may append, decided from its token alone.

    admit(claims, command) -> Admitted(command with the stamped actor, internal?) | Refused(rule, detail)

A pure function: no I/O, no clock. The gateway validates the command's shape first (400), asks
the gate (403 naming the rule on refusal, nothing produced), then produces what the gate
returned. Tiers:

- `user` (people through a web front end or an MCP client): only `context-added` with role `user`
  to agent streams, plus `agent/paused` / `agent/resumed`; the gateway stamps the user actor from
  the token (its `origin` names the door: `web` or `mcp`), so a client-supplied actor, `key`,
  `compaction`, `llmRequestOffset` or an oversized file is refused.
- `integration`: any non-worker event to `/integrations/...`; to agent streams only developer
  items carrying an integration-kind actor (third-party data, never instructions).
- `agent` (scripts, other agents): developer items to agent streams, the actor stamped from the
  token's agent path.
- `platform`: anything, including worker-only commands (which go to the internal topic).

Every tier is also bounded by its token's scope: path globs where `*` matches within one path
segment and `**` across segments. And for every tier but platform (docs/behaviour.md §6.6, §6.8):
- only agents are agents: `agent/created`, `agent/configured`, `agent/subscribed` and system items
  are refused anywhere (an integration could otherwise make its own agent under `/integrations/`);
- the idempotency keys the system mints (`agent/…`, `route/…`, …) are refused, so nobody can take
  a key a worker will need and silence a turn, a route or a result.
A subscription's source must lie inside the appending token's scope too.

And for every tier, platform included, an item widens nothing its writer could not reach
(docs/behaviour.md §3.3, §6.6): an agent may read the events its own items reference, and the model
is sent the files its items attach, so an event ref must name a stream inside the token's scope and
an attached blob must be one the token could GET (uploaded to a stream inside its scope). The
gateway looks up which streams each attached blob was uploaded to and passes them in; a blob it did
not look up counts as readable by nobody.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from processors.files import blob_hex
from processors.globs import in_scope
from processors.idempotency_keys import RESERVED_KEY_PREFIXES, is_reserved
from schemas.context import INTEGRATION_ACTOR_TYPES
from schemas.events import (
    AGENT_CONFIGURED,
    AGENT_CREATED,
    AGENT_PAUSED,
    AGENT_RESUMED,
    CONTEXT_ADDED,
    AppendCommand,
    worker_only_reason,
)
from schemas.gateway import Tier
from schemas.routing import AGENT_SUBSCRIBED

AGENT_STREAMS = "/agents/"
INTEGRATION_STREAMS = "/integrations/"
# Actor types an integration may speak as: all are third-party data to the model.
USER_TYPES = frozenset({CONTEXT_ADDED, AGENT_PAUSED, AGENT_RESUMED})
# What makes a stream an agent, and what only the platform may therefore append (§6.6).
AGENT_ONLY_TYPES = frozenset({AGENT_CREATED, AGENT_CONFIGURED, AGENT_SUBSCRIBED})
DEFAULT_MAX_USER_FILE_BYTES = 25 * 1024 * 1024
# The door a user token's item came through, stamped into its actor: the HTTP API and the console
# (`web`), or the MCP door (`mcp`).
Origin = Literal["web", "mcp"]

# Every rule name the gate can answer (bounded: a Prometheus label, and what a 403 names).
RULES = (
    "scope",
    "reserved-key",
    "agent-only-types",
    "subscribe",
    "refs",
    "files",
    "worker-only",
    "user-agent-streams-only",
    "user-types",
    "user-role",
    "user-actor-stamped",
    "user-no-key",
    "user-no-compaction",
    "user-no-llm-request-offset",
    "user-file-size",
    "integration-streams",
    "integration-agent-types",
    "integration-role",
    "integration-actor",
    "integration-no-compaction",
    "integration-no-llm-request-offset",
    "agent-agent-streams-only",
    "agent-types",
    "agent-role",
    "agent-actor-stamped",
    "agent-no-compaction",
    "agent-no-llm-request-offset",
)


@dataclass(frozen=True, slots=True)
class Claims:
    """What a bearer token grants (from the tokens file; never the token itself)."""

    tier: Tier
    scope: tuple[str, ...]
    agent_path: str | None = None  # agent tier: the stamped actor's path
    user_id: str | None = None  # user tier: the stamped actor's userId
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Admitted:
    command: AppendCommand  # with the actor the gateway stamps
    internal: bool  # worker-only: goes to the internal command topic


@dataclass(frozen=True, slots=True)
class Refused:
    rule: str
    detail: str


GateDecision = Admitted | Refused


# Which streams each blob was uploaded to, by its sha256 hex (`BlobStore.refs`).
BlobReaders = Mapping[str, Collection[str]]


def admit(
    claims: Claims,
    command: AppendCommand,
    *,
    max_user_file_bytes: int = DEFAULT_MAX_USER_FILE_BYTES,
    origin: Origin = "web",
    blob_readers: BlobReaders | None = None,
) -> GateDecision:
    """`blob_readers`: the upload streams of every blob the item attaches (see `attached_blobs`);
    one missing counts as uploaded nowhere."""
    path = command.streamPath
    if not in_scope(path, claims.scope):
        return Refused("scope", f"{path} is outside this token's scope {list(claims.scope)}")
    if claims.tier == "platform":
        source = command.payload.get("source") if command.type == AGENT_SUBSCRIBED else None
        if isinstance(source, str) and not in_scope(source, claims.scope):
            # Only platform tokens subscribe (the other tiers are refused agent-only types below).
            return Refused("subscribe", f"{source} is outside this token's scope {list(claims.scope)}")
        widened = reach_refusal(claims.scope, command, blob_readers or {})
        if widened is not None:
            return widened
        return Admitted(command, internal=worker_only_reason(command.type, command.payload) is not None)
    if is_reserved(command.idempotencyKey):
        return Refused(
            "reserved-key",
            f"idempotency key {command.idempotencyKey!r} is reserved for the system (keys starting with "
            f"{', '.join(RESERVED_KEY_PREFIXES)}); choose another key",
        )
    if claims.tier == "user":
        decision = _user(claims, command, max_user_file_bytes, origin)
    else:
        tier_rules = {"integration": _integration, "agent": _agent}[claims.tier]
        decision = tier_rules(claims, command, max_user_file_bytes)
    if isinstance(decision, Refused):
        return decision
    worker_only = worker_only_reason(decision.command.type, decision.command.payload)
    if worker_only is not None:
        return Refused("worker-only", f"{worker_only}; only a platform token may send it")
    if command.type in AGENT_ONLY_TYPES or (command.type == CONTEXT_ADDED and command.payload.get("role") == "system"):
        what = "system items" if command.type == CONTEXT_ADDED else command.type
        return Refused("agent-only-types", f"{what} make and shape agents: only a platform token may send them")
    widened = reach_refusal(claims.scope, command, blob_readers or {})
    return decision if widened is None else widened


# --- what an item lets its agent reach (§3.3, §6.6) --------------------------------------------


def reach_refusal(scope: tuple[str, ...], command: AppendCommand, blob_readers: BlobReaders) -> Refused | None:
    """Why an item would let its agent reach what its writer could not, or None.

    An event ref is a read grant (the agent's scripts may `read_event` it), so its stream must be
    inside the writer's scope: otherwise whoever may append to an agent could choose what it reads.
    An attachment's bytes go to the model, so its blob must be readable with the writer's token
    (uploaded to a stream inside its scope), as `GET /v1/files/sha256/<hex>` would decide. Only
    attachments the caller would fetch (`blobs/sha256/<hex>` paths) are checked: any other path is
    only ever shown as a hint line. Malformed refs and files are left to the payload's validation."""
    if command.type != CONTEXT_ADDED:
        return None  # other event types grant nothing: the host reads refs of context items only
    item = command.payload
    refs, files = item.get("refs"), item.get("files")
    for ref in refs if isinstance(refs, list) else ():
        if not isinstance(ref, dict) or ref.get("type") != "event":
            continue
        target = ref.get("streamPath")
        if isinstance(target, str) and not in_scope(target, scope):
            return Refused(
                "refs",
                f"the event ref {target}@{ref.get('offset')} is outside this token's scope {list(scope)}: "
                "an item may reference only events its writer could read (its agent may read what it references)",
            )
    for file in files if isinstance(files, list) else ():
        hex_digest = _blob_of(file)
        if hex_digest is not None and not any(in_scope(stream, scope) for stream in blob_readers.get(hex_digest, ())):
            return Refused(
                "files",
                f"file {file.get('filename')!r} ({file['path']}) is not readable with this token: upload it to a "
                "stream inside its scope first (the bytes are stored once however often they are uploaded)",
            )
    return None


def attached_blobs(payload: Any) -> list[str]:
    """The content addresses a context item's attachments name (what `admit` needs readers for),
    each once, in order."""
    files = payload.get("files") if isinstance(payload, dict) else None
    found = (_blob_of(file) for file in (files if isinstance(files, list) else ()))
    return list(dict.fromkeys(hex_digest for hex_digest in found if hex_digest is not None))


def _blob_of(file: Any) -> str | None:
    """The content address an attachment names, the one the caller would fetch; else None."""
    path = file.get("path") if isinstance(file, dict) else None
    return blob_hex(path) if isinstance(path, str) else None


# --- tiers -------------------------------------------------------------------------------------


def _user(claims: Claims, command: AppendCommand, max_file_bytes: int, origin: Origin) -> GateDecision:
    if not command.streamPath.startswith(AGENT_STREAMS):
        return Refused("user-agent-streams-only", f"a user token appends only to agent streams ({AGENT_STREAMS}…)")
    if command.type not in USER_TYPES:
        return Refused("user-types", f"a user token may send only {sorted(USER_TYPES)}, not {command.type}")
    if command.type != CONTEXT_ADDED:
        return Admitted(command, internal=False)
    item = command.payload
    if item.get("actor") is not None:
        return Refused("user-actor-stamped", "remove 'actor': the gateway stamps the user actor from the token")
    forbidden = _present(item, ("key", "user-no-key"), ("compaction", "user-no-compaction"))
    if forbidden is not None:
        return forbidden
    if item.get("llmRequestOffset") is not None:
        return Refused("user-no-llm-request-offset", "a user item cannot name an LLM request (llmRequestOffset)")
    for file in item.get("files") or ():
        size = file.get("size", 0) if isinstance(file, dict) else 0
        if isinstance(size, int) and size > max_file_bytes:
            return Refused(
                "user-file-size",
                f"file {file.get('filename')!r} is {size} bytes; a user file may be at most {max_file_bytes} bytes",
            )
    if item.get("role") != "user":
        return Refused("user-role", f"a user token sends role 'user' only, not {item.get('role')!r}")
    actor: dict[str, Any] = {"type": "user", "origin": origin}
    if claims.user_id is not None:
        actor["userId"] = claims.user_id
    return Admitted(_with_actor(command, actor), internal=False)


def _integration(claims: Claims, command: AppendCommand, _max_file_bytes: int) -> GateDecision:
    path = command.streamPath
    if path.startswith(INTEGRATION_STREAMS):
        return Admitted(command, internal=False)  # raw events; worker-only types are refused after
    if not path.startswith(AGENT_STREAMS):
        return Refused(
            "integration-streams",
            f"an integration token appends to {INTEGRATION_STREAMS}… or, as developer items, to {AGENT_STREAMS}…",
        )
    if command.type != CONTEXT_ADDED:
        return Refused("integration-agent-types", f"to agent streams an integration sends only {CONTEXT_ADDED}")
    item = command.payload
    if item.get("compaction") is not None:
        return Refused("integration-no-compaction", "compaction summaries are written by the workers")
    if item.get("role") != "developer":
        return Refused("integration-role", f"an integration sends role 'developer' to agents, not {item.get('role')!r}")
    actor = item.get("actor")
    actor_type = actor.get("type") if isinstance(actor, dict) else None
    if actor_type not in INTEGRATION_ACTOR_TYPES:
        return Refused(
            "integration-actor",
            f"an integration item needs an actor of type {sorted(INTEGRATION_ACTOR_TYPES)} (got {actor_type!r})",
        )
    if item.get("llmRequestOffset") is not None:
        return Refused("integration-no-llm-request-offset", "an integration item cannot name an LLM request")
    return Admitted(command, internal=False)


def _agent(claims: Claims, command: AppendCommand, _max_file_bytes: int) -> GateDecision:
    if not command.streamPath.startswith(AGENT_STREAMS):
        return Refused("agent-agent-streams-only", f"an agent token appends only to agent streams ({AGENT_STREAMS}…)")
    if command.type != CONTEXT_ADDED:
        return Refused("agent-types", f"an agent token sends only {CONTEXT_ADDED}, not {command.type}")
    item = command.payload
    if item.get("compaction") is not None:
        return Refused("agent-no-compaction", "compaction summaries are written by the workers")
    if item.get("role") != "developer":
        return Refused("agent-role", f"an agent token sends role 'developer' only, not {item.get('role')!r}")
    if item.get("actor") is not None:
        return Refused("agent-actor-stamped", "remove 'actor': the gateway stamps the agent actor from the token")
    if item.get("llmRequestOffset") is not None:
        return Refused("agent-no-llm-request-offset", "an agent item cannot name an LLM request (llmRequestOffset)")
    assert claims.agent_path is not None  # TokenEntry requires it for the agent tier
    return Admitted(_with_actor(command, {"type": "agent", "path": claims.agent_path}), internal=False)


def _present(item: dict[str, Any], *fields: tuple[str, str]) -> Refused | None:
    for field, rule in fields:
        if item.get(field) is not None:
            return Refused(rule, f"a user item cannot set {field!r}")
    return None


def _with_actor(command: AppendCommand, actor: dict[str, Any]) -> AppendCommand:
    return command.model_copy(update={"payload": {**command.payload, "actor": actor}})


def admit_upload(claims: Claims, stream_path: str) -> Refused | None:
    """Who may upload a file to `stream_path` (docs/behaviour.md §3.3): the scope and the streams the
    token's tier appends to, as for the items that will carry the file. None: admitted."""
    if not in_scope(stream_path, claims.scope):
        return Refused("scope", f"{stream_path} is outside this token's scope {list(claims.scope)}")
    if claims.tier == "user" and not stream_path.startswith(AGENT_STREAMS):
        return Refused("user-agent-streams-only", f"a user token uploads only to agent streams ({AGENT_STREAMS}…)")
    if claims.tier == "agent" and not stream_path.startswith(AGENT_STREAMS):
        return Refused("agent-agent-streams-only", f"an agent token uploads only to agent streams ({AGENT_STREAMS}…)")
    if claims.tier == "integration" and not stream_path.startswith((AGENT_STREAMS, INTEGRATION_STREAMS)):
        return Refused(
            "integration-streams", f"an integration token uploads to {INTEGRATION_STREAMS}… or {AGENT_STREAMS}…"
        )
    return None
