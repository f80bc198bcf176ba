"""Build journal events for tests: one builder, gapless offsets (1, 2, 3, ...) and increasing createdAt.

    j = Journal()
    j.system("policy", key="agent/system-prompt")
    hi = j.user("hi")
    r = j.request()
    state = j.fold()           # decode every line with `decode_event` and fold it
    j.lines()                  # the JSON bytes lines, as a journal dump would hold them

Every helper appends one event and returns its offset. Context fields are passed with their wire
names (`key=`, `actor=`, `refs=`, `llmRequestOffset=`, ...); `policy=` is a shortcut for
`llmRequestPolicy={"behaviour": policy}`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from processors.reducer import fold
from processors.state import AgentState
from schemas import events as ev
from schemas.events import decode_event

START = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)
NOOP = "events.iterate.com/test/noop"  # a type the agent does not consume
DONT_TRIGGER = "dont-trigger-request"
INTERRUPT = "interrupt-current-request"
AFTER_CURRENT = "after-current-request"


def iso(moment: datetime) -> str:
    """The journal's createdAt format: UTC, milliseconds, `Z`."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def epoch_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


class Journal:
    def __init__(self, stream_path: str = "/agents/test", *, start: datetime = START, step_ms: int = 1000):
        self.stream_path = stream_path
        self.now = start
        self.step_ms = step_ms
        self.events: list[dict[str, Any]] = []

    # --- the one way to append -----------------------------------------------------------------

    def append(
        self, event_type: str, payload: Any, *, idempotency_key: str | None = None, after_ms: int | None = None
    ) -> int:
        self.now += timedelta(milliseconds=self.step_ms if after_ms is None else after_ms)
        event: dict[str, Any] = {
            "streamPath": self.stream_path,
            "offset": len(self.events) + 1,
            "type": event_type,
            "payload": payload,
            "createdAt": iso(self.now),
        }
        if idempotency_key is not None:
            event["idempotencyKey"] = idempotency_key
        self.events.append(event)
        return event["offset"]

    @property
    def last(self) -> int:
        return len(self.events)

    def created_at(self, offset: int) -> str:
        return self.events[offset - 1]["createdAt"]

    def at_ms(self, offset: int) -> int:
        return epoch_ms(datetime.fromisoformat(self.created_at(offset)))

    # --- context items (§1.2) ------------------------------------------------------------------

    def item(
        self, role: str, content: str = "", *, policy: str | None = None, after_ms: int | None = None, **fields: Any
    ) -> int:
        payload: dict[str, Any] = {"role": role, "content": content}
        if policy is not None:
            payload["llmRequestPolicy"] = {"behaviour": policy}
        payload.update({name: value for name, value in fields.items() if value is not None})
        return self.append(ev.CONTEXT_ADDED, payload, after_ms=after_ms)

    def system(self, content: str = "", **fields: Any) -> int:
        return self.item("system", content, **fields)

    def developer(self, content: str = "", **fields: Any) -> int:
        return self.item("developer", content, **fields)

    def user(self, content: str = "", **fields: Any) -> int:
        return self.item("user", content, **fields)

    def assistant(self, content: str = "", **fields: Any) -> int:
        return self.item("assistant", content, **fields)

    def compaction(self, through: int, summary: str = "summary", **fields: Any) -> int:
        fields.setdefault("policy", DONT_TRIGGER)
        return self.item("developer", summary, compaction={"replacesHistoryThrough": through}, **fields)

    # --- turn events (§1.1) --------------------------------------------------------------------

    def created(self, **provenance: Any) -> int:
        return self.append(ev.AGENT_CREATED, provenance)

    def configured(self, config: dict[str, Any]) -> int:
        return self.append(ev.AGENT_CONFIGURED, {"config": config})

    def request(self, model: str = "test-model", expires_at: int | None = None, **kw: Any) -> int:
        expires = epoch_ms(self.now) + 600_000 if expires_at is None else expires_at
        return self.append(ev.LLM_REQUEST_REQUESTED, {"model": model, "expiresAt": expires}, **kw)

    def settle(
        self, request_offset: int, status: str = "succeeded", *, duration_ms: int | None = None, **result: Any
    ) -> int:
        defaults = {"succeeded": {"text": ""}, "failed": {"errorMessage": "boom"}, "cancelled": {"reason": "expired"}}
        payload: dict[str, Any] = {
            "requestOffset": request_offset,
            "result": {"status": status, **defaults.get(status, {}), **result},
        }
        if duration_ms is not None:
            payload["durationMs"] = duration_ms
        return self.append(ev.LLM_REQUEST_SETTLED, payload)

    def usage(
        self,
        request_offset: int,
        input_tokens: int = 100,
        output_tokens: int = 10,
        *,
        max_context_tokens: int = 1000,
        model: str = "test-model",
        **extra: int,
    ) -> int:
        return self.append(
            ev.TOKEN_USAGE_REPORTED,
            {
                "llmRequestOffset": request_offset,
                "model": model,
                "maxContextTokens": max_context_tokens,
                "inputTokens": input_tokens,
                "outputTokens": output_tokens,
                **extra,
            },
        )

    def paused(self, trigger_offset: int | None = None, reason: str | None = None) -> int:
        payload = {"reason": reason, "triggerOffset": trigger_offset}
        return self.append(ev.AGENT_PAUSED, {k: v for k, v in payload.items() if v is not None})

    def resumed(self, reason: str | None = None) -> int:
        return self.append(ev.AGENT_RESUMED, {} if reason is None else {"reason": reason})

    def error(self, message: str) -> int:
        return self.append(ev.STREAM_ERROR_OCCURRED, {"message": message})

    def noop(self) -> int:
        return self.append(NOOP, {})

    def pad_to(self, offset: int) -> None:
        """Append ignored events until the next append gets `offset`."""
        while self.last + 1 < offset:
            self.noop()

    # --- output --------------------------------------------------------------------------------

    def lines(self, through: int | None = None) -> list[bytes]:
        return [orjson.dumps(e) for e in self.events if through is None or e["offset"] <= through]

    def jsonl(self) -> bytes:
        return b"".join(line + b"\n" for line in self.lines())

    def write(self, path: Path) -> Path:
        path.write_bytes(self.jsonl())
        return path

    def decoded(self, through: int | None = None) -> list[Any]:
        return [decode_event(line) for line in self.lines(through)]

    def fold(self, through: int | None = None, state: AgentState | None = None) -> AgentState:
        state = AgentState() if state is None else state
        for event in self.decoded(through):
            if event.offset > state.cursor:
                fold(state, event)
        return state
