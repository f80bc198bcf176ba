"""What the journal engine reads, and what deciding one command produced (pipeline/journal/engine.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from processors import rows


@dataclass(slots=True)
class CommandRecord:
    """One Kafka record of a command topic as the engine reads it (its value parses as an `AppendCommand`)."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]
    internal: bool = False  # read from agent-internal-appends (only the workers produce there)
    # A scheduler decision journaled at once: read from no topic, so no source offset to record.
    scheduled: bool = False


@dataclass(slots=True)
class HandledCommand:
    """What deciding one command produced, before it is staged in the checkpoint."""

    command: CommandRecord
    rows: list[rows.Row]
    # The command's outcome for its client (key, value), when it carries an append id.
    outcome: tuple[bytes, bytes] | None = None
    # Records that follow the journal record (LLM requests, script commands): in the same
    # transaction, so nothing downstream ever sees an event the journal might still lose.
    after: list[tuple[str, bytes, bytes]] = field(default_factory=list)  # (topic, key, value)
    journal: tuple[bytes, list[tuple[str, bytes]]] | None = None  # journal record and its headers
    reject_reason: str | None = None  # set: the command goes to the dead-letter topic
    event: Any = None  # the journaled event
    # The traceparent every record written on its behalf carries (docs/behaviour.md §8).
    trace: bytes | None = None
