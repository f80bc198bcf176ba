"""The outcome of one append command, published on `agent-append-results` for the client that
sent it (commands carrying an `appendId` only)."""

from __future__ import annotations

from typing import Annotated, Literal

import orjson
from pydantic import Field

from schemas.context import Wire
from schemas.limits import StreamPath

AppendStatus = Literal["journaled", "duplicate", "rejected"]


class AppendOutcome(Wire):
    appendId: Annotated[str, Field(min_length=1, max_length=128)]
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
