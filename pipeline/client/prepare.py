"""One append path: from what a caller submitted to the bytes produced to a command topic. No I/O.

Every door appends through `prepare_append`: the client (`Client`), the HTTP gateway, the console
and the MCP door (`pipeline/gateway/commands.py` maps its refusals to HTTP answers). The order:

1. the command's shape and stream path (`invalid`);
2. the door's authority: a gateway token's append gate (`processors/gate.py`), or, for a client
   outside the workers, the worker-only event types (`forbidden`);
3. optionally, the payload of a consumed type as the gate stamped it (`invalid`): the gateway
   refuses it up front, while the client's raw door leaves it to the journal (which dead-letters
   it with the same message);
4. the size of the serialised command against `maxEventBytes` (`too_large`).

Append ids are minted here too, one way for every door.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from processors.gate import DEFAULT_MAX_USER_FILE_BYTES, BlobReaders, Claims, Origin, Refused, admit
from schemas.events import (
    CONSUMED_TYPES,
    AppendCommand,
    describe_validation_error,
    parse_consumed_input,
    worker_only_reason,
)

# A random per-process prefix and a counter: unique, and far cheaper than uuid4 per command
# (os.urandom is a system call).
_ID_PREFIX = os.urandom(10).hex()
_ids = itertools.count()


def new_append_id() -> str:
    return f"{_ID_PREFIX}{next(_ids):012x}"


@dataclass(frozen=True, slots=True)
class Prepared:
    command: AppendCommand  # with the actor the gate stamped
    value: bytes  # what is produced
    internal: bool  # to agent-internal-appends (worker-only types)


@dataclass(frozen=True, slots=True)
class Unfit:
    """Why a command is not produced; nothing was."""

    kind: Literal["invalid", "forbidden", "too_large"]
    detail: str
    rule: str | None = None  # the gate rule, for a `forbidden` from a token


def prepare_append(
    raw: dict[str, Any],
    append_id: str,
    *,
    max_event_bytes: int,
    claims: Claims | None = None,
    workers: bool = False,
    check_payload: bool = False,
    origin: Origin = "web",
    max_user_file_bytes: int = DEFAULT_MAX_USER_FILE_BYTES,
    blob_readers: BlobReaders | None = None,
) -> Prepared | Unfit:
    """`raw`: `{streamPath, type, payload, idempotencyKey?}`. `claims`: the gateway token's (its gate
    decides and stamps, `blob_readers` being the upload streams of the blobs the item attaches);
    without, the door is a client's, and only `workers` may send worker-only types (to the internal
    topic)."""
    try:
        command = AppendCommand.model_validate({**raw, "appendId": append_id})
    except ValidationError as error:
        return Unfit("invalid", describe_validation_error(error, raw.get("type")))
    if claims is not None:
        decision = admit(
            claims, command, max_user_file_bytes=max_user_file_bytes, origin=origin, blob_readers=blob_readers
        )
        if isinstance(decision, Refused):
            return Unfit("forbidden", f"{decision.rule}: {decision.detail}", decision.rule)
        command, internal = decision.command, decision.internal
    else:
        internal = workers
        if not workers:
            forbidden = worker_only_reason(command.type, command.payload)
            if forbidden is not None:
                return Unfit("forbidden", forbidden)
    if check_payload and command.type in CONSUMED_TYPES:
        try:
            parse_consumed_input({"type": command.type, "payload": command.payload})
        except ValueError as error:
            return Unfit("invalid", str(error))
    value = command.model_dump_json(exclude_none=True).encode()
    if len(value) > max_event_bytes:
        return Unfit(
            "too_large",
            f"too_large: the command is {len(value)} bytes, over maxEventBytes ({max_event_bytes}); "
            "keep bulky data in a referenced event or a file",
        )
    return Prepared(command, value, internal)
