"""One stream journaled as the journal worker journals it (`processors.journal.journal_command`), with
its rows in a dict and a clock the test sets: the pure journal decisions without an engine or a broker.

    stream = JournaledStream(window=3)
    outcome = stream.append(CONTEXT_ADDED, {"role": "user", "content": "hi"}, key="web/msg/1")
    stream.send("hi", append_id="send-1")      # a user item, the clock one second on
    stream.now_ms = stream.now_ms - 5_000      # the wall clock steps back
"""

from __future__ import annotations

from typing import Any

from processors import rows
from processors.dedupe import DEFAULT_APPEND_ID_WINDOW
from processors.journal import Journaled, Outcome, journal_command
from processors.state import AgentState, SourceOffsets
from schemas.events import CONTEXT_ADDED, AppendCommand

PATH = "/agents/a"
START_MS = 1_796_000_000_000  # 2026-11-30T00:53:20.000Z
STEP_MS = 1000


class JournaledStream:
    """A stream's state and rows, changed only by what `journal_command` journals."""

    def __init__(self, window: int = DEFAULT_APPEND_ID_WINDOW, path: str = PATH) -> None:
        self.window = window
        self.path = path
        self.state = AgentState(stream_path=path)
        self.rows: dict[bytes, bytes] = {}
        self.now_ms = START_MS

    def append(
        self,
        event_type: str,
        payload: dict[str, Any],
        *,
        key: str | None = None,
        append_id: str | None = None,
        now_ms: int | None = None,
    ) -> Outcome:
        """Journal one command at `now_ms` (default: the stream's clock, unchanged)."""
        command: dict[str, Any] = {"streamPath": self.path, "type": event_type, "payload": payload}
        if append_id is not None:
            command["appendId"] = append_id
        if key is not None:
            command["idempotencyKey"] = key
        outcome = journal_command(
            self.state,
            AppendCommand.model_validate(command),
            now_ms=self.now_ms if now_ms is None else now_ms,
            sources=SourceOffsets(),
            read=self.rows.get,
            append_id_window=self.window,
        )
        if isinstance(outcome, Journaled):
            for row_key, value in outcome.rows:
                if value is None:
                    self.rows.pop(row_key, None)
                else:
                    self.rows[row_key] = value
        return outcome

    def send(self, content: str, *, append_id: str | None = None, key: str | None = None) -> Outcome:
        """A user item, one step of the clock after the previous send."""
        self.now_ms += STEP_MS
        return self.append(CONTEXT_ADDED, {"role": "user", "content": content}, key=key, append_id=append_id)

    def count(self, kind: bytes) -> int:
        """How many rows of one kind (`rows.APPEND_ID`, `rows.IDEMPOTENCY`, …) the stream holds."""
        return sum(1 for key in self.rows if key.startswith(kind + rows.SEP))
