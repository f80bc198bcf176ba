"""One append command decided by the pure core: the scheduler's, the follow-ups of agent-run code
and the LLM caller's outcomes (docs/behaviour.md §4.2, §4.3, §6). Its idempotency key comes from
`processors.idempotency_keys`, so a repeated decision is journaled once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Append:
    """A command to append to a stream: `type`, `payload`, `idempotencyKey`."""

    type: str
    payload: dict[str, Any]
    idempotencyKey: str

    def event(self) -> dict[str, Any]:
        """The command for a client whose stream is already chosen (`stream.append`)."""
        return {"type": self.type, "payload": self.payload, "idempotencyKey": self.idempotencyKey}

    def command(self, path: str) -> dict[str, Any]:
        """The whole command for the stream at `path`, as produced to a command topic."""
        return {"streamPath": path, **self.event()}
