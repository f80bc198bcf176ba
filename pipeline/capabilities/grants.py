"""The functions a script may call; their names and shapes are part of the contract.

- `read_event(ref)`: `"<streamPath>@<offset>"` or `{type: "event", streamPath, offset}` ->
  `{streamPath, offset, type, payload, createdAt}` of that journaled event, or LookupError. A payload
  over 256 KiB of JSON comes back as the start of its JSON text followed by a notice.
- `set_context(key, content)`: a developer item with that key in the agent's own stream (actor the
  script, `dont-trigger-request`).
- `send_to_agent(path, content)`: a developer item in another agent's stream (actor this agent,
  `after-current-request`): that agent takes a turn.
- `now()`: the current time, UTC ISO-8601.

Each run acts with its agent's grants (docs/behaviour.md §6.6), as the journal worker resolved
them from the agent's configuration when it requested the run: `read_event` outside them raises
PermissionError before anything is read (so it tells nothing about the event), and so does
`send_to_agent`, which then appends nothing.

Every append goes through the ordinary client door with an idempotency key derived from the
execution id and a call counter, so a repeated run could never append twice; each call waits until
the journal has the item and returns its offset.

A host that stalled past its session may wake inside a run that another host has meanwhile settled
as crashed. Its calls then must not land after the settlement: the journal refuses a call into the
run's own stream once the run is settled (`processors.journal`), and a call into another stream,
which that stream's journal cannot judge, is made only after checking that the run's own stream
holds no settlement yet (docs/architecture.md, "Fencing").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import orjson

from pipeline.capabilities.references import ReferencedEvents
from pipeline.client import AppendError, Client
from pipeline.kafka.journal_reader import JournalReader
from processors import grants
from processors.globs import in_scope
from processors.idempotency_keys import script_call_key
from schemas.capabilities import SCRIPT_RUN_SETTLED, ScriptGrants
from schemas.config import AgentGrants
from schemas.events import CONTEXT_ADDED
from schemas.limits import path_problem

MAX_PAYLOAD_BYTES = 256 * 1024
APPEND_TIMEOUT_S = 30.0
NAMES = ("read_event", "set_context", "send_to_agent", "now")

Blocking = Callable[..., Awaitable[Any]]  # runs a blocking call in a worker thread


def parse_ref(ref: Any) -> tuple[str, int]:
    """(stream path, offset) of an event ref, or ValueError saying what a ref looks like."""
    if isinstance(ref, str):
        path, at, offset_text = ref.rpartition("@")  # the path itself may contain '@'
        if not at or not offset_text.isdigit():
            raise ValueError(f"not an event ref: {ref!r}; write '<streamPath>@<offset>', e.g. '/agents/a@12'")
        path, offset = path, int(offset_text)
    elif isinstance(ref, dict):
        if ref.get("type", "event") != "event":
            raise ValueError(f"only event refs can be read (type 'event'), not {ref.get('type')!r}")
        path, offset = ref.get("streamPath"), ref.get("offset")
        if not isinstance(path, str) or not isinstance(offset, int) or isinstance(offset, bool):
            raise ValueError("an event ref needs streamPath (a string) and offset (an integer)")
    else:
        raise TypeError(f"read_event takes a ref string or dict, not {type(ref).__name__}")
    problem = path_problem(path)
    if problem is not None:
        raise ValueError(problem)
    if offset < 1:
        raise ValueError(f"offsets start at 1, not {offset}")
    return path, offset


def shown_event(event: dict[str, Any]) -> dict[str, Any]:
    """What `read_event` returns for a journaled event envelope."""
    payload = event.get("payload")
    raw = orjson.dumps(payload)
    if len(raw) > MAX_PAYLOAD_BYTES:
        head = raw[:MAX_PAYLOAD_BYTES].decode(errors="ignore")
        payload = f"{head}\n… cut: the payload is {len(raw)} bytes of JSON; the first {MAX_PAYLOAD_BYTES} are shown"
    return {
        "streamPath": event["streamPath"],
        "offset": event["offset"],
        "type": event["type"],
        "payload": payload,
        "createdAt": event["createdAt"],
    }


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, not {type(value).__name__}")
    return value


class Grants:
    """The granted functions of one execution."""

    def __init__(
        self,
        *,
        path: str,
        execution: str,
        client: Client,
        reader: JournalReader,
        blocking: Blocking,
        references: ReferencedEvents,
        granted: ScriptGrants | None = None,
        requested_at: int = 0,
    ) -> None:
        self.path = path
        # A record written before grants existed gets the defaults, never more.
        self.granted = granted if granted is not None else grants.script_grants(path, AgentGrants())
        self.references = references
        self.execution = execution
        self.requested_at = requested_at  # offset of the run's script-run-requested event
        self.client = client
        self.reader = reader
        self.blocking = blocking
        self.calls = 0

    def functions(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        return {
            "read_event": self.read_event,
            "set_context": self.set_context,
            "send_to_agent": self.send_to_agent,
            "now": self.now,
        }

    async def read_event(self, ref: Any) -> dict[str, Any]:
        path, offset = parse_ref(ref)
        if not await self._may_read(path, offset):
            raise PermissionError(grants.read_refusal(path))
        event = await self.blocking(self.reader.event, path, offset)
        if event is None:
            raise LookupError(f"no event {path}@{offset}: the stream has no event at that offset")
        return shown_event(event)

    async def set_context(self, key: Any, content: Any) -> int:
        key = _text("key", key)
        if not key:
            raise ValueError("key must not be empty")
        item = {
            "role": "developer",
            "content": _text("content", content),
            "key": key,
            "actor": {"type": "script", "executionId": self.execution},
            "llmRequestPolicy": {"behaviour": "dont-trigger-request"},
        }
        return await self._append(self.path, item)

    async def send_to_agent(self, path: Any, content: Any) -> int:
        path = _text("path", path)
        problem = path_problem(path)
        if problem is not None:
            raise ValueError(problem)
        if not in_scope(path, self.granted.send):
            raise PermissionError(grants.send_refusal(path))
        item = {
            "role": "developer",
            "content": _text("content", content),
            "actor": {"type": "agent", "path": self.path},
            "llmRequestPolicy": {"behaviour": "after-current-request"},
        }
        return await self._append(path, item)

    async def now(self) -> str:
        return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")

    async def _may_read(self, path: str, offset: int) -> bool:
        if in_scope(path, self.granted.read):
            return True
        if not self.granted.readReferenced:
            return False
        return bool(await self.blocking(self.references.references, self.path, path, offset))

    async def _settled(self) -> bool:
        """Whether the run's own stream already holds its settlement (another host settled it)."""
        events = await self.blocking(self.reader.events_from, self.path, self.requested_at + 1)
        return any(
            event["type"] == SCRIPT_RUN_SETTLED and (event.get("payload") or {}).get("executionId") == self.execution
            for event in events
        )

    async def _append(self, target: str, item: dict[str, Any]) -> int:
        if target != self.path and await self._settled():
            raise RuntimeError(f"script run {self.execution} was settled by another host: nothing more is sent")
        self.calls += 1
        key = script_call_key(self.path, self.execution, self.calls, target)
        command = {"type": CONTEXT_ADDED, "payload": item, "idempotencyKey": key}
        try:
            receipt = self.client.streams.get(target).append(command)
            result = await receipt.outcome(APPEND_TIMEOUT_S)
        except AppendError as error:
            raise RuntimeError(f"the journal did not confirm the append: {error}") from None
        if result.status == "rejected":
            raise ValueError(f"the journal refused the append to {target}: {result.reason}")
        assert result.offset is not None
        return result.offset
