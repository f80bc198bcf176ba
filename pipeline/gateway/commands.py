"""From one HTTP submission to a command ready to produce, or the error to answer. No I/O.

Every command goes through the one append path (`pipeline/client/prepare.py`); this module turns
its refusals into answers: shape and stream path 400, the append gate 403 (nothing produced), the
payload of a consumed type as the gate stamped it 400, the size 413.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from pipeline.client.prepare import Unfit, new_append_id, prepare_append
from processors.gate import BlobReaders, Claims, Origin, attached_blobs
from schemas.events import CONTEXT_ADDED, describe_validation_error
from schemas.gateway import BatchLine, BatchLineError, BatchLineJournaled, EventSubmission, Journaled
from schemas.limits import MAX_APPEND_ID_CHARS
from topics.names import TopicNames


@dataclass(frozen=True, slots=True)
class Problem:
    """An answer other than success: HTTP status, stable error code, a sentence to act on."""

    status: int
    error: str
    detail: str
    rule: str | None = None


@dataclass(slots=True)  # not frozen: a frozen init costs a call per field, and a batch builds one per line
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
        return _invalid_json(error)


def _invalid_json(error: orjson.JSONDecodeError) -> Problem:
    return Problem(400, "invalid_json", f"the body is not valid JSON: {error}")


def attached_to(body: Any) -> list[str]:
    """The blobs a submitted command's item attaches (`{type, payload}`): the gate needs to know
    where each was uploaded (`processors.gate.reach_refusal`)."""
    if type(body) is not dict or body.get("type") != CONTEXT_ADDED:
        return []
    return attached_blobs(body.get("payload"))


def attached_to_lines(lines: list[tuple[int, bytes]]) -> list[str]:
    """The blobs the items of an NDJSON batch attach, each once. Only a line that mentions `files`
    is decoded here; one that hides the word behind JSON escapes gets no readers looked up, and the
    gate then refuses its attachments (it fails closed)."""
    found: dict[str, None] = {}
    for _, line in lines:
        if b"files" not in line:
            continue
        try:
            body = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # answered as invalid JSON when the line is prepared
        found.update(dict.fromkeys(attached_to(body)))
    return list(found)


def prepare_submission(
    claims: Claims,
    stream_path: str,
    body: Any,
    append_id: str,
    topics: TopicNames,
    limits: Limits,
    blob_readers: BlobReaders | None = None,
) -> Ready | Problem:
    """`POST /v1/streams/{path}/events`: the body is the decoded JSON `{type, payload, idempotencyKey?}`.
    `blob_readers`: the upload streams of the blobs its item attaches (`processors.gate.admit`)."""
    if type(body) is dict and "streamPath" not in body and "appendId" not in body:
        fast = _validated_once(claims, {**body, "streamPath": stream_path}, append_id, topics, limits, blob_readers)
        if fast is not None:
            return fast
    try:
        submission = EventSubmission.model_validate(body)
    except ValidationError as error:
        return Problem(400, "invalid_command", describe_validation_error(error, _type_of(body)))
    raw = {**submission.model_dump(exclude_none=True), "streamPath": stream_path}
    return prepare_command(claims, raw, append_id, topics, limits, blob_readers=blob_readers)


def prepare_line(
    claims: Claims,
    body: Any,
    append_id: str,
    topics: TopicNames,
    limits: Limits,
    blob_readers: BlobReaders | None = None,
) -> Ready | Problem:
    """One NDJSON line: like a submission, naming its own `streamPath`."""
    if type(body) is dict and "appendId" not in body:
        fast = _validated_once(claims, body, append_id, topics, limits, blob_readers)
        if fast is not None:
            return fast
    try:
        line = BatchLine.model_validate(body)
    except ValidationError as error:
        return Problem(400, "invalid_command", describe_validation_error(error, _type_of(body)))
    return prepare_command(
        claims, line.model_dump(exclude_none=True), append_id, topics, limits, blob_readers=blob_readers
    )


def prepare_lines(
    claims: Claims,
    lines: list[tuple[int, bytes]],
    topics: TopicNames,
    limits: Limits,
    blob_readers: BlobReaders | None = None,
) -> tuple[list[LineResult], list[tuple[int, Ready]]]:
    """An NDJSON batch's lines `(number, bytes)`, each answered as `prepare_line` answers it with a
    new append id: every line's result in order (`accepted_line`, or `line_error`), and each
    accepted line's command with the index of its result. A plain item takes its template at once
    (`prepare_line` would try it first too). `blob_readers`: as for `prepare_submission`, for the
    blobs of every line (`attached_blobs_of_lines`)."""
    results: list[LineResult] = []
    prepared: list[tuple[int, Ready]] = []
    loads, decode_error, append, plain_item = orjson.loads, orjson.JSONDecodeError, results.append, _plain_item
    known: dict[tuple[str, str, str], tuple[_ItemTemplate, bytes] | None] = {}
    for number, line in lines:
        try:
            body = loads(line)
        except decode_error as error:
            append(line_error(number, _invalid_json(error)))
            continue
        append_id = new_append_id()
        ready = plain_item(claims, body, append_id, topics, limits, known) if type(body) is dict else None
        if ready is None:
            ready = prepare_line(claims, body, append_id, topics, limits, blob_readers)
            if isinstance(ready, Problem):
                append(line_error(number, ready))
                continue
        prepared.append((len(results), ready))
        append(accepted_line(number, ready))
    return results, prepared


def prepare_command(
    claims: Claims,
    raw: dict[str, Any],
    append_id: str,
    topics: TopicNames,
    limits: Limits,
    *,
    origin: Origin = "web",
    blob_readers: BlobReaders | None = None,
) -> Ready | Problem:
    """One command through the one append path (`pipeline/client/prepare.py`), as an HTTP answer.

    `origin`: the user actor's origin the gate stamps (`web`; `mcp` for the MCP door).
    `blob_readers`: the upload streams of the blobs the item attaches; without them an item that
    attaches a blob is refused (403, rule `files`)."""
    prepared = prepare_append(
        raw,
        append_id,
        max_event_bytes=limits.max_event_bytes,
        claims=claims,
        check_payload=True,
        origin=origin,
        max_user_file_bytes=limits.max_user_file_bytes,
        blob_readers=blob_readers,
    )
    if isinstance(prepared, Unfit):
        return _problem(prepared)
    command = prepared.command
    topic = topics.internal_appends if prepared.internal else topics.appends
    return Ready(topic, command.streamPath.encode(), prepared.value, command.streamPath, append_id)


def _validated_once(
    claims: Claims,
    raw: dict[str, Any],
    append_id: str,
    topics: TopicNames,
    limits: Limits,
    blob_readers: BlobReaders | None = None,
) -> Ready | Problem | None:
    """A body that carries no `appendId` (and, for a submission, no `streamPath`) is an append
    command once both are added, so it goes through the append path's own validation alone: a
    command valid there is valid as a submission or a line too. An invalid one returns None, and
    the caller answers it by the full route, whose messages name what the client sent."""
    plain = _plain_item(claims, raw, append_id, topics, limits)
    if plain is not None:
        return plain
    ready = prepare_command(claims, raw, append_id, topics, limits, blob_readers=blob_readers)
    if isinstance(ready, Problem) and ready.error == "invalid_command":
        return None
    return ready


# --- plain items: `{streamPath, type, payload: {role, content}}` -------------------------------
# What a chat front end sends most. Nothing the append path checks (shape, stream path, the gate,
# the item's contract) looks at a string `content` beyond its size, so for one token, stream,
# type and role the command it produces differs only by the content and the append id, each
# serialised as a JSON string. The first such item goes the full route with stand-ins for both,
# which gives the bytes around them (or no template, if it is refused); later ones fill them in,
# and the size is checked on the result. tests/pipeline/gateway/test_commands.py holds every answer
# to the full route's.

_CONTENT_STAND_IN = "agentstream-content-stand-in"
_APPEND_ID_STAND_IN = "agentstream-append-id-stand-in"
_MAX_TEMPLATES = 10_000


@dataclass(frozen=True, slots=True)
class _ItemTemplate:
    topic: str
    before_content: bytes
    before_append_id: bytes
    after_append_id: bytes


# Keyed by the identity of the token's claims (one object per token until its file is reloaded),
# the topics and the limits, which the entry holds so that their ids are not reused: hashing the
# dataclasses themselves would cost more than the rest of the lookup.
_templates: dict[
    tuple[int, int, int, str, str, str], tuple[Claims, TopicNames, Limits, tuple[_ItemTemplate, bytes] | None]
] = {}


def _plain_item(
    claims: Claims,
    raw: dict[str, Any],
    append_id: str,
    topics: TopicNames,
    limits: Limits,
    known: dict[tuple[str, str, str], tuple[_ItemTemplate, bytes] | None] | None = None,
) -> Ready | None:
    """`raw` prepared from its template, or None: not a plain item, refused, or over the size.

    `known`: the templates (and the stream path's bytes) already looked up for these claims,
    topics and limits, by stream path, type and role: a batch keeps one, which spares each line
    the lookup in `_templates`."""
    payload, path, event_type = raw.get("payload"), raw.get("streamPath"), raw.get("type")
    if len(raw) != 3 or type(payload) is not dict or len(payload) != 2:
        return None
    role, content = payload.get("role"), payload.get("content")
    if type(content) is not str or type(role) is not str or type(path) is not str or type(event_type) is not str:
        return None
    if not 0 < len(append_id) <= MAX_APPEND_ID_CHARS:
        return None
    if known is None:
        found = _template(claims, path, event_type, role, topics, limits)
    else:
        found = known.get((path, event_type, role), _UNKNOWN)
        if found is _UNKNOWN:
            found = known[path, event_type, role] = _template(claims, path, event_type, role, topics, limits)
    if found is None:
        return None
    template, key_bytes = found
    value = b"".join(
        (
            template.before_content,
            orjson.dumps(content),
            template.before_append_id,
            orjson.dumps(append_id),
            template.after_append_id,
        )
    )
    if len(value) > limits.max_event_bytes:
        return None
    return Ready(template.topic, key_bytes, value, path, append_id)


_UNKNOWN: Any = object()


def _template(
    claims: Claims, path: str, event_type: str, role: str, topics: TopicNames, limits: Limits
) -> tuple[_ItemTemplate, bytes] | None:
    """The template of a plain item (and its stream path's bytes, the record's key), or None."""
    key = (id(claims), id(topics), id(limits), path, event_type, role)
    entry = _templates.get(key)
    if entry is None:
        if len(_templates) >= _MAX_TEMPLATES:
            _templates.clear()
        template = _item_template(claims, path, event_type, role, topics, limits)
        entry = _templates[key] = (claims, topics, limits, None if template is None else (template, path.encode()))
    return entry[3]


def _item_template(
    claims: Claims, path: str, event_type: str, role: str, topics: TopicNames, limits: Limits
) -> _ItemTemplate | None:
    raw = {"streamPath": path, "type": event_type, "payload": {"role": role, "content": _CONTENT_STAND_IN}}
    probe = prepare_command(claims, raw, _APPEND_ID_STAND_IN, topics, limits)
    if not isinstance(probe, Ready):
        return None
    before_content, *rest = probe.value.split(orjson.dumps(_CONTENT_STAND_IN))
    if len(rest) != 1:
        return None
    before_append_id, *after = rest[0].split(orjson.dumps(_APPEND_ID_STAND_IN))
    if len(after) != 1:
        return None
    return _ItemTemplate(probe.topic, before_content, before_append_id, after[0])


# --- the NDJSON batch's answer ------------------------------------------------------------------
# A batch answers up to 10 000 lines: each result is the dict `model_dump(exclude_none=True)` of its
# `schemas.gateway` model gives (an accepted line, the common one, built directly: a model per
# line cost more than preparing it), serialised once (tests/pipeline/gateway/test_commands.py
# checks the bytes against `BatchResults`).

LineResult = dict[str, Any]


def accepted_line(number: int, ready: Ready) -> LineResult:
    """`BatchLineAccepted`: its fields in the model's order."""
    return {"streamPath": ready.stream_path, "appendId": ready.append_id, "line": number}


def journaled_line(number: int, answer: Journaled) -> LineResult:
    return BatchLineJournaled(line=number, **answer.model_dump()).model_dump(exclude_none=True)


def line_error(number: int, problem: Problem) -> LineResult:
    error = BatchLineError(
        line=number, status=problem.status, error=problem.error, detail=problem.detail, rule=problem.rule
    )
    return error.model_dump(exclude_none=True)


def is_line_error(result: LineResult) -> bool:
    return "error" in result


def batch_answer(results: list[LineResult]) -> bytes:
    """`BatchResults` as JSON, from each line's result in line order."""
    failed = sum(map(is_line_error, results))
    return orjson.dumps({"accepted": len(results) - failed, "failed": failed, "results": results})


def _problem(unfit: Unfit) -> Problem:
    if unfit.kind == "forbidden":
        return Problem(403, "forbidden", unfit.detail, unfit.rule)
    if unfit.kind == "too_large":
        return Problem(413, "too_large", unfit.detail)
    return Problem(400, "invalid_command", unfit.detail)


def _type_of(body: Any) -> str | None:
    value = body.get("type") if isinstance(body, dict) else None
    return value if isinstance(value, str) else None
