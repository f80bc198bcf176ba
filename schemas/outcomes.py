"""The outcome of one append command, published on `agent-append-results` for the client that
sent it (commands carrying an `appendId` only).

A results record holds the outcomes of many commands: a JSON array of outcome objects, one or more
records per partition and checkpoint of the journal worker (docs/behaviour.md §1, "Outcomes").
Readers also take a record holding a single outcome object, which versions before the batching
wrote."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Literal

import orjson
from pydantic import Field, TypeAdapter

from schemas.context import Wire
from schemas.limits import AppendId, StreamPath

AppendStatus = Literal["journaled", "duplicate", "rejected"]


class AppendOutcome(Wire):
    appendId: AppendId
    streamPath: StreamPath
    status: AppendStatus
    offset: Annotated[int, Field(gt=0, strict=True)] | None = None  # journaled/duplicate: the event's offset
    reason: str | None = None  # rejected: why (the same text as the dead-letter record's)

    @staticmethod
    def encode_trusted(
        append_id: str, stream_path: str, status: AppendStatus, offset: int | None = None, reason: str | None = None
    ) -> bytes:
        """The JSON of an outcome built from values the journal already validated (one per
        journaled append): what `model_dump_json(exclude_none=True)` gives, without validating again."""
        body: dict[str, object] = {"appendId": append_id, "streamPath": stream_path, "status": status}
        if offset is not None:
            body["offset"] = offset
        if reason is not None:
            body["reason"] = reason
        return orjson.dumps(body)


_OUTCOME_LIST = TypeAdapter(list[AppendOutcome])

# A results record stays well under Kafka's default 1 MB message limit: a checkpoint's outcomes
# are split into records of at most this many bytes (one outcome alone may exceed it).
MAX_OUTCOME_RECORD_BYTES = 256 * 1024


def decode_outcomes(value: bytes) -> list[AppendOutcome]:
    """The outcomes one results record holds: an array of them, or one outcome object. Raises
    `pydantic.ValidationError` for anything else."""
    if value[:1] == b"[":
        return _OUTCOME_LIST.validate_json(value)
    return [AppendOutcome.model_validate_json(value)]


def outcome_records(encoded: list[bytes], max_bytes: int = MAX_OUTCOME_RECORD_BYTES) -> Iterator[bytes]:
    """Results records holding `encoded` outcomes (each from `encode_trusted`), in order: JSON
    arrays of at most `max_bytes` (an outcome bigger than that has a record of its own)."""
    start, size = 0, 1  # the brackets, less the comma the first outcome does not need
    for index, outcome in enumerate(encoded):
        grown = size + 1 + len(outcome)
        if index > start and grown > max_bytes:
            yield b"[" + b",".join(encoded[start:index]) + b"]"
            start, grown = index, 2 + len(outcome)
        size = grown
    if start < len(encoded):
        yield b"[" + b",".join(encoded[start:]) + b"]"
