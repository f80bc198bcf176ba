"""The gateway's commands (pipeline/gateway/commands.py), without a broker: a submission or an
NDJSON line whose body is already an append command is validated once, and every answer is the
one the full route gives (docs/behaviour.md §7.1, the append gate; §7.2)."""

from __future__ import annotations

import itertools
from typing import Any
from unittest import mock

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from pipeline.gateway import commands
from pipeline.gateway.commands import (
    Limits,
    LineResult,
    Problem,
    Ready,
    accepted_line,
    line_error,
    parse_json,
    prepare_command,
    prepare_line,
    prepare_lines,
    prepare_submission,
)
from processors.gate import Claims
from schemas.events import AGENT_CREATED, CONTEXT_ADDED, describe_validation_error
from schemas.gateway import BatchLine, EventSubmission
from topics.names import topic_names

TOPICS = topic_names("t-")
LIMITS = Limits(max_event_bytes=2_000, max_user_file_bytes=1 << 20)
CLAIMS = [
    Claims("user", ("/agents/**",), user_id="u1"),
    Claims("platform", ("/**",)),
    Claims("integration", ("/integrations/**", "/agents/**")),
    Claims("agent", ("/agents/a/**",), agent_path="/agents/a/one"),
]
APPEND_ID = "0123456789abcdef"

PAYLOADS = st.one_of(
    st.just({"role": "user", "content": "hi"}),
    st.just({"role": "developer", "content": "note"}),
    st.just({"role": "user", "content": "x" * 3_000}),  # too large
    st.just({"role": "user", "content": 5}),  # invalid item
    st.just({"role": "user", "content": "hi", "actor": {"type": "user", "origin": "web"}}),
    st.just({"n": 2**60}),  # a number outside the interoperable range
    st.just({}),
    st.just("not an object"),
)
FIELDS: dict[str, Any] = {
    "type": st.sampled_from([CONTEXT_ADDED, AGENT_CREATED, "acme/other", "", 7]),
    "payload": PAYLOADS,
    "idempotencyKey": st.sampled_from([None, "k-1", "", "agent/request/3"]),
    "streamPath": st.sampled_from(["/agents/a/one", "/integrations/x", "/other", "", "agents/bad", 3]),
    "appendId": st.just("from-the-client"),
    "extra": st.just(1),
}
BODIES = st.one_of(
    st.fixed_dictionaries({}, optional=FIELDS),
    st.sampled_from([[], "text", None, 3]),
)


def full_route_line(claims: Claims, body: Any, append_id: str = APPEND_ID) -> Ready | Problem:
    """What an NDJSON line answers when validated as a line first, then as a command."""
    try:
        line = BatchLine.model_validate(body)
    except ValidationError as error:
        kind = body.get("type") if isinstance(body, dict) and isinstance(body.get("type"), str) else None
        return Problem(400, "invalid_command", describe_validation_error(error, kind))
    return prepare_command(claims, line.model_dump(exclude_none=True), append_id, TOPICS, LIMITS)


def full_route_submission(claims: Claims, path: str, body: Any, append_id: str = APPEND_ID) -> Ready | Problem:
    try:
        submission = EventSubmission.model_validate(body)
    except ValidationError as error:
        kind = body.get("type") if isinstance(body, dict) and isinstance(body.get("type"), str) else None
        return Problem(400, "invalid_command", describe_validation_error(error, kind))
    raw = {**submission.model_dump(exclude_none=True), "streamPath": path}
    return prepare_command(claims, raw, append_id, TOPICS, LIMITS)


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(CLAIMS), BODIES)
def test_7_1_a_line_validated_once_answers_exactly_as_the_full_route(claims: Claims, body: Any) -> None:
    assert prepare_line(claims, body, APPEND_ID, TOPICS, LIMITS) == full_route_line(claims, body)


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(CLAIMS), st.sampled_from(["/agents/a/one", "/integrations/x", "/bad path"]), BODIES)
def test_7_1_a_submission_validated_once_answers_exactly_as_the_full_route(
    claims: Claims, path: str, body: Any
) -> None:
    got = prepare_submission(claims, path, body, APPEND_ID, TOPICS, LIMITS)
    assert got == full_route_submission(claims, path, body)


def test_7_1_a_line_naming_its_own_append_id_is_refused_as_the_line_schema_says() -> None:
    body = {"streamPath": "/agents/a/one", "type": CONTEXT_ADDED, "payload": {"role": "user", "content": "hi"}}
    answer = prepare_line(CLAIMS[0], {**body, "appendId": "mine"}, APPEND_ID, TOPICS, LIMITS)
    assert isinstance(answer, Problem) and answer.error == "invalid_command" and "appendId" in answer.detail
    accepted = prepare_line(CLAIMS[0], body, APPEND_ID, TOPICS, LIMITS)
    assert isinstance(accepted, Ready) and accepted.append_id == APPEND_ID and b'"userId":"u1"' in accepted.value


# Plain items `{role, content}`: the first of a token, stream, type and role goes the full route,
# later ones are filled into the bytes it produced. Content of any text and size, append ids of
# any length, and a warm-up item of the same kind first, so that the template is the one answering.
PLAIN_PATHS = st.sampled_from(
    ["/agents/a/one", "/agents/b", "/integrations/x", "/other", "agents/bad", "/agents/a/../x"]
)
PLAIN_TYPES = st.sampled_from([CONTEXT_ADDED, AGENT_CREATED, "acme/other", ""])
PLAIN_ROLES = st.sampled_from(["user", "developer", "system", "assistant", "tool", ""])
CONTENTS = st.one_of(st.text(st.characters(codec="utf-8")), st.integers(1_500, 2_100).map(lambda n: "é" * (n // 2)))
APPEND_IDS = st.one_of(st.just(APPEND_ID), st.text(min_size=0, max_size=130))


@settings(max_examples=800, deadline=None)
@given(st.sampled_from(CLAIMS), PLAIN_PATHS, PLAIN_TYPES, PLAIN_ROLES, CONTENTS, APPEND_IDS)
def test_7_1_a_plain_item_answers_exactly_as_the_full_route(
    claims: Claims, path: str, event_type: str, role: str, content: str, append_id: str
) -> None:
    def line(text: str) -> dict[str, Any]:
        return {"streamPath": path, "type": event_type, "payload": {"role": role, "content": text}}

    prepare_line(claims, line("warm-up"), APPEND_ID, TOPICS, LIMITS)
    assert prepare_line(claims, line(content), append_id, TOPICS, LIMITS) == full_route_line(
        claims, line(content), append_id
    )
    submission = {"type": event_type, "payload": {"role": role, "content": content}}
    got = prepare_submission(claims, path, submission, append_id, TOPICS, LIMITS)
    assert got == full_route_submission(claims, path, submission, append_id)


def test_7_1_a_plain_item_is_stamped_and_sized_like_any_other() -> None:
    user = CLAIMS[0]
    item = {"streamPath": "/agents/a/one", "type": CONTEXT_ADDED, "payload": {"role": "user", "content": "hi"}}
    first = prepare_line(user, item, "id-1", TOPICS, LIMITS)
    second = prepare_line(user, {**item, "payload": {"role": "user", "content": 'say "hé"\n'}}, "id-2", TOPICS, LIMITS)
    assert isinstance(first, Ready) and isinstance(second, Ready)
    assert second.value == (
        b'{"streamPath":"/agents/a/one","type":"' + CONTEXT_ADDED.encode() + b'","payload":{"role":"user",'
        b'"content":"say \\"h\xc3\xa9\\"\\n","actor":{"type":"user","origin":"web","userId":"u1"}},"appendId":"id-2"}'
    )
    too_large = prepare_line(
        user, {**item, "payload": {"role": "user", "content": "x" * 3_000}}, "id-3", TOPICS, LIMITS
    )
    assert isinstance(too_large, Problem) and too_large.status == 413
    refused = prepare_line(user, {**item, "payload": {"role": "developer", "content": "hi"}}, "id-4", TOPICS, LIMITS)
    assert isinstance(refused, Problem) and refused.rule == "user-role"


# An NDJSON batch's lines prepared together answer as each line prepared alone: accepted with its
# command, or its error, in line order (plain items, other bodies, and lines that are not JSON).
PLAIN_LINES = st.builds(
    lambda path, event_type, role, content: {
        "streamPath": path,
        "type": event_type,
        "payload": {"role": role, "content": content},
    },
    PLAIN_PATHS,
    PLAIN_TYPES,
    PLAIN_ROLES,
    CONTENTS,
)
LINES = st.one_of(BODIES.map(orjson.dumps), PLAIN_LINES.map(orjson.dumps), st.sampled_from([b"{nope", b"[1,", b"\xff"]))


# Batches of plain items only, from few streams, types and roles: a batch looks each template up
# once, and every line of the same stream, type and role (and none other) must share it.
FEW_PLAIN_LINES = st.builds(
    lambda path, event_type, role, content: {
        "streamPath": path,
        "type": event_type,
        "payload": {"role": role, "content": content},
    },
    st.sampled_from(["/agents/a/one", "/agents/b", "/other"]),
    st.sampled_from([CONTEXT_ADDED, "acme/other"]),
    st.sampled_from(["user", "developer", "assistant"]),
    st.sampled_from(["hi", "x" * 1_990]),
).map(orjson.dumps)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(CLAIMS), st.one_of(st.lists(LINES, max_size=8), st.lists(FEW_PLAIN_LINES, max_size=12)))
def test_7_2_a_batch_of_lines_answers_as_each_line_alone(claims: Claims, raw_lines: list[bytes]) -> None:
    lines = [(number, line) for number, line in enumerate(raw_lines, 3)]
    with mock.patch.object(commands, "new_append_id", side_effect=map(str, itertools.count())):
        results, prepared = prepare_lines(claims, lines, TOPICS, LIMITS)
    ids = map(str, itertools.count())
    expected: list[LineResult] = []
    expected_prepared: list[tuple[int, Ready]] = []
    for number, line in lines:
        body = parse_json(line)
        answer = body if isinstance(body, Problem) else prepare_line(claims, body, next(ids), TOPICS, LIMITS)
        if isinstance(answer, Problem):
            expected.append(line_error(number, answer))
        else:
            expected_prepared.append((len(expected), answer))
            expected.append(accepted_line(number, answer))
    assert results == expected
    assert prepared == expected_prepared


# --- §6.6 / §3.3 refs and files the writer could not reach -------------------------------------

ALICE = Claims("user", ("/agents/alice/**",), user_id="alice")
BOB_REF = {"type": "event", "streamPath": "/agents/bob/b1", "offset": 3}
BLOB = "d" * 64
FILE = {"contentType": "text/plain", "filename": "b.txt", "path": f"blobs/sha256/{BLOB}", "size": 1, "url": "u"}


def test_6_6_a_ref_or_file_beyond_the_writer_answers_403_naming_its_rule_on_every_route() -> None:
    """The rules live in the gate (processors/gate.py, `reach_refusal`); every route reaches it."""
    planted = {"type": CONTEXT_ADDED, "payload": {"role": "user", "content": "x", "refs": [BOB_REF]}}
    attached = {"type": CONTEXT_ADDED, "payload": {"role": "user", "content": "x", "files": [FILE]}}
    path = "/agents/alice/a1"
    for body, rule in ((planted, "refs"), (attached, "files")):
        for answer in (
            prepare_submission(ALICE, path, body, APPEND_ID, TOPICS, LIMITS),
            prepare_line(ALICE, {**body, "streamPath": path}, APPEND_ID, TOPICS, LIMITS),
            prepare_command(ALICE, {**body, "streamPath": path}, APPEND_ID, TOPICS, LIMITS),
        ):
            assert isinstance(answer, Problem) and (answer.status, answer.rule) == (403, rule), answer
    readable = {BLOB: ["/agents/alice/uploads"]}
    assert isinstance(prepare_submission(ALICE, path, attached, APPEND_ID, TOPICS, LIMITS, readable), Ready)
    elsewhere = {BLOB: ["/agents/bob/b1"]}
    refused = prepare_submission(ALICE, path, attached, APPEND_ID, TOPICS, LIMITS, elsewhere)
    assert isinstance(refused, Problem) and refused.rule == "files"
    line = orjson.dumps({**attached, "streamPath": path})
    results, prepared = prepare_lines(ALICE, [(1, line)], TOPICS, LIMITS, readable)
    assert len(prepared) == 1, results
    results, prepared = prepare_lines(ALICE, [(1, line)], TOPICS, LIMITS)
    assert not prepared and results[0]["rule"] == "files"


def test_3_3_the_blobs_a_submission_or_a_batch_attaches_are_found_for_the_gate() -> None:
    attached = {"type": CONTEXT_ADDED, "payload": {"role": "user", "content": "x", "files": [FILE, FILE]}}
    assert commands.attached_to(attached) == [BLOB]
    assert commands.attached_to({**attached, "type": "acme/other"}) == []  # grants nothing: not checked
    assert commands.attached_to([attached]) == []
    lines = [(1, orjson.dumps(attached)), (2, b'{"files": '), (3, orjson.dumps({"type": CONTEXT_ADDED}))]
    assert commands.attached_to_lines(lines) == [BLOB]
