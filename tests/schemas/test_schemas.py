"""docs/behaviour.md §1 / §1.1 / §1.2: journal events, the context item, validation and its error messages."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from schemas import events as ev
from schemas.context import ContextItem
from schemas.events import (
    CONSUMED_TYPES,
    EnvelopeError,
    InvalidPayloadEvent,
    OtherEvent,
    decode_event,
    parse_consumed_input,
)

CREATED_AT = "2026-12-02T10:13:51.123Z"
DONT = {"behaviour": "dont-trigger-request"}


def envelope(payload: Any, event_type: str = ev.CONTEXT_ADDED, **fields: Any) -> bytes:
    event = {
        "streamPath": "/agents/a1",
        "offset": 7,
        "type": event_type,
        "payload": payload,
        "createdAt": CREATED_AT,
        **fields,
    }
    return orjson.dumps(event)


def item(**fields: Any) -> dict[str, Any]:
    return {"role": "user", "content": "hi", **fields}


def invalid_reason(payload: Any, event_type: str = ev.CONTEXT_ADDED) -> str:
    decoded = decode_event(envelope(payload, event_type))
    assert isinstance(decoded, InvalidPayloadEvent), f"expected an invalid payload, got {decoded!r}"
    assert decoded.offset == 7 and decoded.type == event_type
    return decoded.reason


# --- §1: the envelope example decodes --------------------------------------------------------


def test_1_contract_example_event_decodes_to_a_typed_context_item() -> None:
    raw = (
        b'{"streamPath": "/agents/a1", "offset": 7, "type": "events.iterate.com/agents/context-added",'
        b' "payload": {"role": "user", "content": "hi", "actor": {"type": "user", "origin": "web"}},'
        b' "idempotencyKey": "web/msg/91f3", "createdAt": "2026-12-02T10:13:51.123Z"}'
    )
    event = decode_event(raw)
    assert event.type == ev.CONTEXT_ADDED
    assert isinstance(event.payload, ContextItem)
    assert (event.offset, event.streamPath, event.idempotencyKey) == (7, "/agents/a1", "web/msg/91f3")
    assert event.payload.actor.type == "user" and event.payload.actor.origin == "web"


# --- §1.2: strict payloads --------------------------------------------------------------------


def test_1_2_unknown_field_order_makes_the_payload_invalid() -> None:
    with pytest.raises(ValidationError):
        ContextItem.model_validate(item(order=3))
    reason = invalid_reason(item(order=3))
    assert "payload.order" in reason
    assert "unknown field" in reason


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (item(actor={"type": "slack", "userId": "U1", "team": "T"}), "payload.actor.team"),
        (item(refs=[{"type": "file", "path": "/a", "line": 3}]), "payload.refs[0].line"),
        (item(llmRequestPolicy={"behaviour": "dont-trigger-request", "why": "x"}), "payload.llmRequestPolicy.why"),
        (
            item(files=[{"contentType": "a", "filename": "f", "path": "/p", "size": 1, "url": "u", "x": 1}]),
            "payload.files[0].x",
        ),
        (
            {
                "role": "developer",
                "content": "s",
                "llmRequestPolicy": DONT,
                "compaction": {"replacesHistoryThrough": 2, "extra": 1},
            },
            "payload.compaction.extra",
        ),
    ],
)
def test_1_2_unknown_nested_field_is_invalid_and_named(payload: dict[str, Any], field: str) -> None:
    reason = invalid_reason(payload)
    assert field in reason and "unknown field" in reason


@pytest.mark.parametrize("role", ["system", "developer", "user", "assistant"])
def test_1_2_role_accepts_the_four_roles(role: str) -> None:
    assert ContextItem.model_validate({"role": role, "content": ""}).role == role


def test_1_2_role_other_value_is_invalid_and_named() -> None:
    reason = invalid_reason({"role": "tool", "content": "x"})
    assert "payload.role" in reason and "'tool'" in reason


def test_1_2_content_required_and_may_be_empty() -> None:
    assert ContextItem.model_validate({"role": "user", "content": ""}).content == ""
    reason = invalid_reason({"role": "user"})
    assert "payload.content" in reason and "required field is missing" in reason


def test_1_2_key_must_be_non_empty() -> None:
    assert ContextItem.model_validate(item(key="k")).key == "k"
    reason = invalid_reason(item(key=""))
    assert "payload.key" in reason and "at least 1 character" in reason


ACTORS = [
    {"type": "user", "origin": "web"},
    {"type": "user", "origin": "mcp"},
    {"type": "user", "origin": "cli", "userId": "u-1"},
    {"type": "agent", "path": "/agents/other"},
    {"type": "script", "executionId": "exec-1"},
    {"type": "integration", "name": "github"},
    {"type": "slack"},
    {"type": "slack", "userId": "U1", "botName": "bot"},
    {"type": "telegram"},
    {"type": "telegram", "userId": "42", "username": "tg"},
    {"type": "email"},
    {"type": "email", "address": "a@b.c", "name": "A"},
    {"type": "github"},
    {"type": "github", "login": "octocat", "senderType": "User"},
]


@pytest.mark.parametrize("actor", ACTORS, ids=lambda a: "-".join(sorted(a)) + ":" + a["type"])
def test_1_2_every_actor_form_is_accepted(actor: dict[str, Any]) -> None:
    event = decode_event(envelope(item(actor=actor)))
    assert not isinstance(event, InvalidPayloadEvent), getattr(event, "reason", "")
    assert event.payload.actor.model_dump(exclude_none=True) == actor


@pytest.mark.parametrize(
    ("actor", "expect"),
    [
        ({"type": "user", "origin": "sms"}, ["payload.actor.origin", "'sms'"]),
        ({"type": "user"}, ["payload.actor.origin", "required field is missing"]),
        ({"type": "agent"}, ["payload.actor.path", "required field is missing"]),
        ({"type": "agent", "path": ""}, ["payload.actor.path", "invalid stream path"]),
        ({"type": "script"}, ["payload.actor.executionId", "required field is missing"]),
        ({"type": "integration"}, ["payload.actor.name", "required field is missing"]),
        ({"type": "robot"}, ["payload.actor", "unknown type 'robot'", "'slack'", "'github'"]),
        ({"type": "slack", "userId": 3}, ["payload.actor.userId", "string"]),
        ("slack", ["payload.actor", "object"]),
    ],
)
def test_1_2_invalid_actor_is_rejected_naming_the_field_and_why(actor: Any, expect: list[str]) -> None:
    reason = invalid_reason(item(actor=actor))
    for fragment in expect:
        assert fragment in reason, reason


REFS = [
    {"type": "event", "streamPath": "/integrations/github/main", "offset": 240},
    {"type": "event", "streamPath": "/a", "offset": 1, "eventType": "events.iterate.com/x"},
    {"type": "user", "userId": "u-1"},
    {"type": "file", "path": "/workspace/a.py"},
    {"type": "git-commit", "repoPath": "/repo", "commitOid": "abc123"},
]


@pytest.mark.parametrize("ref", REFS, ids=lambda r: r["type"] + str(len(r)))
def test_1_2_every_ref_form_is_accepted(ref: dict[str, Any]) -> None:
    event = decode_event(envelope(item(refs=[ref])))
    assert not isinstance(event, InvalidPayloadEvent), getattr(event, "reason", "")
    assert event.payload.refs[0].model_dump(exclude_none=True) == ref


@pytest.mark.parametrize(
    ("ref", "expect"),
    [
        ({"type": "event", "streamPath": "/a", "offset": 0}, ["payload.refs[0].offset", "greater than 0"]),
        ({"type": "event", "streamPath": "/a", "offset": -3}, ["payload.refs[0].offset", "greater than 0"]),
        ({"type": "event", "streamPath": "/a", "offset": "5"}, ["payload.refs[0].offset", "integer"]),
        ({"type": "event", "streamPath": "/a"}, ["payload.refs[0].offset", "required field is missing"]),
        ({"type": "user"}, ["payload.refs[0].userId", "required field is missing"]),
        ({"type": "file"}, ["payload.refs[0].path", "required field is missing"]),
        ({"type": "git-commit", "repoPath": "/r"}, ["payload.refs[0].commitOid", "required field is missing"]),
        ({"type": "url", "href": "x"}, ["payload.refs[0]", "unknown type 'url'", "'git-commit'"]),
    ],
)
def test_1_2_invalid_ref_is_rejected_naming_the_field_and_why(ref: dict[str, Any], expect: list[str]) -> None:
    reason = invalid_reason(item(refs=[ref]))
    for fragment in expect:
        assert fragment in reason, reason


def test_1_2_files_are_accepted_and_size_must_not_be_negative() -> None:
    attachment = {"contentType": "image/png", "filename": "a.png", "path": "/f/a.png", "size": 12, "url": "https://x/a"}
    event = decode_event(envelope(item(files=[attachment])))
    assert event.payload.files[0].model_dump() == attachment
    reason = invalid_reason(item(files=[{**attachment, "size": -1}]))
    assert "payload.files[0].size" in reason
    reason = invalid_reason(item(files=[{"contentType": "x"}]))
    assert "payload.files[0].url" in reason and "required field is missing" in reason


@pytest.mark.parametrize("behaviour", ["after-current-request", "interrupt-current-request", "dont-trigger-request"])
def test_1_2_every_llm_request_policy_is_accepted(behaviour: str) -> None:
    parsed = ContextItem.model_validate(item(llmRequestPolicy={"behaviour": behaviour}))
    assert parsed.llmRequestPolicy.behaviour == behaviour


def test_1_2_unknown_llm_request_policy_is_rejected() -> None:
    reason = invalid_reason(item(llmRequestPolicy={"behaviour": "now"}))
    assert "payload.llmRequestPolicy.behaviour" in reason and "'now'" in reason


@pytest.mark.parametrize("value", [0, -1, "3", 1.5])
def test_1_2_llm_request_offset_must_be_a_positive_integer(value: Any) -> None:
    reason = invalid_reason({"role": "assistant", "content": "x", "llmRequestOffset": value})
    assert "payload.llmRequestOffset" in reason


# --- §1.2: compaction rules --------------------------------------------------------------------


def compaction(**fields: Any) -> dict[str, Any]:
    return {
        "role": "developer",
        "content": "summary",
        "compaction": {"replacesHistoryThrough": 5},
        "llmRequestPolicy": DONT,
        **fields,
    }


def test_1_2_valid_compaction_is_accepted_with_optional_usage() -> None:
    parsed = ContextItem.model_validate(compaction())
    assert parsed.compaction.replacesHistoryThrough == 5
    with_usage = compaction(compaction={"replacesHistoryThrough": 5, "usage": {"inputTokens": 3}})
    assert ContextItem.model_validate(with_usage).compaction.usage == {"inputTokens": 3}


def test_1_2_compaction_with_a_key_is_invalid() -> None:
    reason = invalid_reason(compaction(key="k"))
    assert "compaction" in reason and "'key'" in reason


def test_1_2_compaction_without_explicit_policy_is_invalid() -> None:
    payload = compaction()
    del payload["llmRequestPolicy"]
    reason = invalid_reason(payload)
    assert "compaction" in reason and "dont-trigger-request" in reason and "explicitly" in reason


@pytest.mark.parametrize("behaviour", ["after-current-request", "interrupt-current-request"])
def test_1_2_compaction_with_a_triggering_policy_is_invalid(behaviour: str) -> None:
    reason = invalid_reason(compaction(llmRequestPolicy={"behaviour": behaviour}))
    assert "dont-trigger-request" in reason


@pytest.mark.parametrize("role", ["system", "user", "assistant"])
def test_1_2_compaction_must_have_role_developer(role: str) -> None:
    reason = invalid_reason(compaction(role=role))
    assert "'developer'" in reason and repr(role) in reason


@pytest.mark.parametrize("through", [0, -2])
def test_1_2_compaction_cutoff_must_be_positive(through: int) -> None:
    reason = invalid_reason(compaction(compaction={"replacesHistoryThrough": through}))
    assert "payload.compaction.replacesHistoryThrough" in reason and "greater than 0" in reason


# --- §1 / §1.1: envelope errors vs payload errors ---------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expect"),
    [
        (b"not json", "Invalid JSON"),
        (b"[]", "object"),
        (orjson.dumps({"type": ev.CONTEXT_ADDED}), "offset: required field is missing"),
        (envelope(item(), offset=0), "offset: Input should be greater than 0"),
        (envelope(item(), createdAt="2026-12-02T10:13:51Z"), "createdAt"),
        (envelope(item(), createdAt="2026-12-02"), "createdAt"),
        (envelope(item(), streamPath="agents/a1"), "streamPath"),
        (envelope(item(), type=5), "type"),
    ],
)
def test_1_not_an_envelope_raises_envelope_error_naming_the_field(raw: bytes, expect: str) -> None:
    with pytest.raises(EnvelopeError) as info:
        decode_event(raw)
    assert expect in str(info.value)


def test_1_1_other_event_types_are_journaled_with_any_object_payload() -> None:
    event = decode_event(envelope({"anything": [1, {"x": None}]}, "events.iterate.com/github/push"))
    assert isinstance(event, OtherEvent)
    assert event.payload == {"anything": [1, {"x": None}]}


def test_1_1_agent_created_accepts_any_object_payload() -> None:
    event = decode_event(envelope({"by": "cli", "nested": {"a": [1]}}, ev.AGENT_CREATED))
    assert not isinstance(event, InvalidPayloadEvent)
    assert event.type == ev.AGENT_CREATED


def test_1_2_payload_error_is_distinct_from_envelope_error_and_keeps_the_envelope() -> None:
    decoded = decode_event(envelope(item(order=1), idempotencyKey="k/1"))
    assert isinstance(decoded, InvalidPayloadEvent)
    assert decoded.envelope.idempotencyKey == "k/1" and decoded.envelope.streamPath == "/agents/a1"
    assert decoded.reason.startswith(f"invalid {ev.CONTEXT_ADDED} event: ")


VALID_PAYLOADS: dict[str, dict[str, Any]] = {
    ev.CONTEXT_ADDED: item(),
    ev.AGENT_CREATED: {"anything": True},
    ev.AGENT_CONFIGURED: {"config": {"llm": {"model": "m"}, "llmRequestRetryPolicy": {"maxAttempts": 2}}},
    ev.LLM_REQUEST_REQUESTED: {"model": "m", "expiresAt": 1_700_000_000_000},
    ev.LLM_REQUEST_SETTLED: {"requestOffset": 3, "durationMs": 12, "result": {"status": "succeeded", "text": "ok"}},
    ev.TOKEN_USAGE_REPORTED: {
        "llmRequestOffset": 3,
        "model": "m",
        "maxContextTokens": 100,
        "inputTokens": 1,
        "outputTokens": 2,
        "cachedInputTokens": 0,
        "reasoningOutputTokens": 1,
    },
    ev.AGENT_PAUSED: {"reason": "limit", "triggerOffset": 4},
    ev.AGENT_RESUMED: {"reason": "user"},
    ev.STREAM_ERROR_OCCURRED: {"message": "boom"},
    ev.AGENT_SUBSCRIBED: {
        "source": "/integrations/github/1",
        "eventTypes": ["events.iterate.com/github/webhook-received"],
    },
    ev.AGENT_UNSUBSCRIBED: {"source": "/integrations/github/1"},
    ev.SCRIPT_RUN_REQUESTED: {"code": "1 + 1", "executionId": "agent-output:5", "expiresAt": 1_700_000_000_000},
    ev.SCRIPT_RUN_STARTED: {"executionId": "agent-output:5"},
    ev.SCRIPT_RUN_SETTLED: {
        "executionId": "agent-output:5",
        "durationMs": 3,
        "settlement": {"status": "succeeded", "result": {"a": [1, 2]}, "stdout": "hi"},
    },
}


def test_1_1_the_consumed_types_are_exactly_the_contract_table() -> None:
    assert set(VALID_PAYLOADS) == set(CONSUMED_TYPES)


@pytest.mark.parametrize("event_type", sorted(VALID_PAYLOADS))
def test_1_1_each_consumed_type_decodes_its_valid_payload(event_type: str) -> None:
    event = decode_event(envelope(VALID_PAYLOADS[event_type], event_type))
    assert not isinstance(event, InvalidPayloadEvent), getattr(event, "reason", "")
    assert not isinstance(event, OtherEvent)
    assert event.type == event_type


@pytest.mark.parametrize(
    ("event_type", "payload", "expect"),
    [
        (
            ev.AGENT_CONFIGURED,
            {"config": {"llmRequestRetryPolicy": {"maxTries": 2}}},
            ["payload.config.llmRequestRetryPolicy.maxTries", "unknown field"],
        ),
        (ev.AGENT_CONFIGURED, {"config": {"colour": "red"}}, ["payload.config.colour", "unknown field"]),
        (ev.AGENT_CONFIGURED, {}, ["payload.config", "required field is missing"]),
        (ev.LLM_REQUEST_REQUESTED, {"model": "m"}, ["payload.expiresAt", "required field is missing"]),
        (ev.LLM_REQUEST_REQUESTED, {"model": "", "expiresAt": 1}, ["payload.model"]),
        (
            ev.LLM_REQUEST_SETTLED,
            {"requestOffset": 3, "result": {"status": "failed"}},
            ["payload.result.errorMessage", "required field is missing"],
        ),
        (
            ev.LLM_REQUEST_SETTLED,
            {"requestOffset": 3, "result": {"status": "cancelled", "reason": "bored"}},
            ["payload.result.reason", "'bored'"],
        ),
        (ev.LLM_REQUEST_SETTLED, {"requestOffset": 3, "result": {"status": "weird"}}, ["payload.result", "'weird'"]),
        (
            ev.LLM_REQUEST_SETTLED,
            {"requestOffset": 0, "result": {"status": "succeeded", "text": ""}},
            ["payload.requestOffset", "greater than 0"],
        ),
        (
            ev.TOKEN_USAGE_REPORTED,
            {"llmRequestOffset": 3, "model": "m", "maxContextTokens": 9, "inputTokens": -1, "outputTokens": 0},
            ["payload.inputTokens"],
        ),
        (ev.AGENT_PAUSED, {"why": "x"}, ["payload.why", "unknown field"]),
        (ev.AGENT_RESUMED, {"reason": 3}, ["payload.reason"]),
        (ev.STREAM_ERROR_OCCURRED, {}, ["payload.message", "required field is missing"]),
    ],
)
def test_1_1_invalid_consumed_payload_names_the_field_and_why(
    event_type: str, payload: dict[str, Any], expect: list[str]
) -> None:
    reason = invalid_reason(payload, event_type)
    assert reason.startswith(f"invalid {event_type} event: ")
    for fragment in expect:
        assert fragment in reason, reason


def test_1_1_settlement_results_accept_each_status() -> None:
    for result in (
        {"status": "succeeded", "text": "t", "usage": {"inputTokens": 1}},
        {"status": "failed", "errorMessage": "e"},
        {"status": "cancelled", "reason": "interrupted-by-user-input", "partialText": "p"},
        {"status": "cancelled", "reason": "expired"},
    ):
        event = decode_event(envelope({"requestOffset": 2, "result": result}, ev.LLM_REQUEST_SETTLED))
        assert not isinstance(event, InvalidPayloadEvent), event.reason
        assert event.payload.result.status == result["status"]


# --- §5: parse_consumed_input accepts exactly the consumed inputs ------------------------------


@pytest.mark.parametrize("event_type", sorted(VALID_PAYLOADS))
def test_5_parse_consumed_input_accepts_each_consumed_type(event_type: str) -> None:
    value = {"type": event_type, "payload": VALID_PAYLOADS[event_type], "idempotencyKey": "k/1"}
    parsed = parse_consumed_input(value)
    assert parsed.type == event_type and parsed.idempotencyKey == "k/1"
    assert parse_consumed_input(orjson.dumps(value)).type == event_type
    assert parse_consumed_input(orjson.dumps(value).decode()).type == event_type


@pytest.mark.parametrize("event_type", ["events.iterate.com/github/push", "events.iterate.com/agents/context"])
def test_5_parse_consumed_input_rejects_other_types_naming_them(event_type: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_consumed_input({"type": event_type, "payload": {}})
    message = str(info.value)
    assert repr(event_type) in message and "unknown type" in message
    assert repr(ev.CONTEXT_ADDED) in message  # lists what is expected


def test_5_parse_consumed_input_rejects_journal_assigned_fields() -> None:
    with pytest.raises(ValueError) as info:
        parse_consumed_input({"type": ev.AGENT_RESUMED, "payload": {}, "offset": 3})
    assert "offset" in str(info.value) and "unknown field" in str(info.value)


def test_5_parse_consumed_input_validates_the_payload_with_the_same_schema() -> None:
    with pytest.raises(ValueError) as info:
        parse_consumed_input({"type": ev.CONTEXT_ADDED, "payload": item(order=2)})
    assert "payload.order" in str(info.value) and "unknown field" in str(info.value)
    with pytest.raises(ValueError) as info:
        parse_consumed_input({"type": ev.CONTEXT_ADDED, "payload": compaction(key="k")})
    assert "'key'" in str(info.value)


def test_5_parse_consumed_input_rejects_a_missing_type() -> None:
    with pytest.raises(ValueError) as info:
        parse_consumed_input({"payload": {}})
    assert "'type'" in str(info.value)


def test_1_2_one_line_per_problem_each_naming_its_field() -> None:
    reason = invalid_reason({"role": "robot", "order": 1})
    body = reason.removeprefix(f"invalid {ev.CONTEXT_ADDED} event: ")
    fields = re.findall(r"(?:^|; )(payload\.\w+): ", body)
    assert sorted(fields) == ["payload.content", "payload.order", "payload.role"]


@pytest.mark.parametrize(
    ("event_type", "payload", "field", "lowest"),
    [
        (ev.LLM_REQUEST_REQUESTED, {"model": "m"}, "expiresAt", 0),
        (ev.LLM_REQUEST_SETTLED, {"result": {"status": "failed", "errorMessage": "x"}}, "requestOffset", 1),
        (
            ev.LLM_REQUEST_SETTLED,
            {"requestOffset": 1, "result": {"status": "failed", "errorMessage": "x"}},
            "durationMs",
            0,
        ),
        (
            ev.TOKEN_USAGE_REPORTED,
            {"llmRequestOffset": 1, "model": "m", "inputTokens": 0, "outputTokens": 0},
            "maxContextTokens",
            1,
        ),
        (
            ev.TOKEN_USAGE_REPORTED,
            {"llmRequestOffset": 1, "model": "m", "maxContextTokens": 1, "outputTokens": 0},
            "inputTokens",
            0,
        ),
        (ev.AGENT_PAUSED, {}, "triggerOffset", 1),
        (ev.CONTEXT_ADDED, {"role": "assistant", "content": "x"}, "llmRequestOffset", 1),
    ],
)
def test_1_1_numbers_hold_at_the_lowest_value_the_table_allows(
    event_type: str, payload: dict[str, Any], field: str, lowest: int
) -> None:
    """§1.1/§1.2: `expiresAt (epoch ms, ≥ 0)`, offsets `> 0`, `maxContextTokens (> 0)`, counts `≥ 0`."""
    accepted = parse_consumed_input({"type": event_type, "payload": {**payload, field: lowest}})
    assert getattr(accepted.payload, field) == lowest
    with pytest.raises(ValueError, match=field):
        parse_consumed_input({"type": event_type, "payload": {**payload, field: lowest - 1}})


def test_1_2_an_empty_file_and_a_compaction_through_1_are_valid() -> None:
    """§1.2: a file's `size (≥ 0)`; `compaction {replacesHistoryThrough (> 0)}`."""
    attachment = {"contentType": "text/plain", "filename": "empty", "path": "/f/e", "size": 0, "url": "u"}
    assert ContextItem.model_validate({"role": "user", "content": "", "files": [attachment]}).files[0].size == 0
    summary = {
        "role": "developer",
        "content": "s",
        "compaction": {"replacesHistoryThrough": 1},
        "llmRequestPolicy": {"behaviour": "dont-trigger-request"},
    }
    assert ContextItem.model_validate(summary).compaction.replacesHistoryThrough == 1
