"""From one HTTP submission to a command ready to produce, or the error to answer. No I/O.

Order: the command's shape and stream path (400), then the append gate (403, nothing produced),
then the payload of a consumed type as the gate stamped it (400), then the size (413).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from processors.gate import Claims, Origin, Refused, admit
from schemas.events import CONSUMED_TYPES, AppendCommand, describe_validation_error, parse_consumed_input
from schemas.gateway import BatchLine, EventSubmission
from topics.names import TopicNames

# Append ids: a random per-process prefix and a counter (unique, and far cheaper than uuid4 per
# command: os.urandom is a system call).
_ID_PREFIX = os.urandom(10).hex()
_ids = itertools.count()


def new_append_id() -> str:
    return f"{_ID_PREFIX}{next(_ids):012x}"


@dataclass(frozen=True, slots=True)
class Problem:
    """An answer other than success: HTTP status, stable error code, a sentence to act on."""

    status: int
    error: str
    detail: str
    rule: str | None = None


@dataclass(frozen=True, slots=True)
class Ready:
    topic: str
    key: bytes
    value: bytes
    stream_path: str
    append_id: str


@dataclass(frozen=True, slots=True)
class Limits:
    max_event_bytes: int
    max_user_file_bytes: int


def parse_json(body: bytes | str) -> Any | Problem:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        return Problem(400, "invalid_json", f"the body is not valid JSON: {error}")


def prepare_submission(
    claims: Claims, stream_path: str, body: Any, append_id: str, topics: TopicNames, limits: Limits
) -> Ready | Problem:
    """`POST /v1/streams/{path}/events`: the body is the decoded JSON `{type, payload, idempotencyKey?}`."""
    try:
        submission = EventSubmission.model_validate(body)
    except ValidationError as error:
        return Problem(400, "invalid_command", describe_validation_error(error, _type_of(body)))
    return prepare_command(
        claims, {**submission.model_dump(exclude_none=True), "streamPath": stream_path}, append_id, topics, limits
    )


def prepare_line(claims: Claims, body: Any, append_id: str, topics: TopicNames, limits: Limits) -> Ready | Problem:
    """One NDJSON line: like a submission, naming its own `streamPath`."""
    try:
        line = BatchLine.model_validate(body)
    except ValidationError as error:
        return Problem(400, "invalid_command", describe_validation_error(error, _type_of(body)))
    return prepare_command(claims, line.model_dump(exclude_none=True), append_id, topics, limits)


def prepare_command(
    claims: Claims, raw: dict[str, Any], append_id: str, topics: TopicNames, limits: Limits, origin: Origin = "web"
) -> Ready | Problem:
    """`origin`: the door the command came through, stamped into a user token's actor."""
    try:
        command = AppendCommand.model_validate({**raw, "appendId": append_id})
    except ValidationError as error:
        return Problem(400, "invalid_command", describe_validation_error(error, raw.get("type")))
    decision = admit(claims, command, max_user_file_bytes=limits.max_user_file_bytes, origin=origin)
    if isinstance(decision, Refused):
        return Problem(403, "forbidden", f"{decision.rule}: {decision.detail}", decision.rule)
    command = decision.command
    if command.type in CONSUMED_TYPES:
        consumed = {"type": command.type, "payload": command.payload}
        try:
            parse_consumed_input(consumed)
        except ValueError as error:
            return Problem(400, "invalid_command", str(error))
    value = command.model_dump_json(exclude_none=True).encode()
    if len(value) > limits.max_event_bytes:
        return Problem(
            413,
            "too_large",
            f"the command is {len(value)} bytes, over the largest event ({limits.max_event_bytes}); "
            "keep bulky data in a file or a referenced event",
        )
    topic = topics.internal_appends if decision.internal else topics.appends
    return Ready(topic, command.streamPath.encode(), value, command.streamPath, append_id)


def _type_of(body: Any) -> str | None:
    value = body.get("type") if isinstance(body, dict) else None
    return value if isinstance(value, str) else None
