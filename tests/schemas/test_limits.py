"""What the journal accepts at all (docs/behaviour.md, "What the journal accepts"): stream path
grammar, injective storage keys, interoperable numbers, nesting depth and who may write what.
Broker-free."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors import rows
from schemas.context import ContextItem
from schemas.events import (
    CONTEXT_ADDED,
    LLM_REQUEST_REQUESTED,
    LLM_REQUEST_SETTLED,
    TOKEN_USAGE_REPORTED,
    AppendCommand,
    decode_event,
    parse_consumed_input,
    worker_only_reason,
)
from schemas.limits import INT_MAX, INT_MIN, MAX_JSON_DEPTH, number_problem, path_problem

SEGMENT_CHARS = "ABCXYZabcxyz0189._~:@+-"


# --- stream paths --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/a",
        "/agents/support-7",
        "/integrations/github/install-789",
        "/x/y.z/_~:@+-",
        "/" + "a" * 128,
        "/" + "/".join(["abc"] * 128),  # 512 characters exactly
        "/.well-known",
        "/a/...",
    ],
)
def test_stream_path_grammar_accepts_valid_paths(path: str) -> None:
    assert path_problem(path) is None
    assert AppendCommand.model_validate({"streamPath": path, "type": "t", "payload": {}}).streamPath == path


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("", "invalid stream path"),
        ("/", "invalid stream path"),
        ("agents/a", "invalid stream path"),
        ("/agents/", "invalid stream path"),
        ("/agents//a", "invalid stream path"),
        ("/agents/V\x00z4", "invalid stream path"),  # NUL: the storage key separator
        ("/agents/a\nb", "invalid stream path"),  # newline: a fake header line
        ("/agents/a b", "invalid stream path"),
        ("/agents/\u202eevil", "invalid stream path"),  # bidi override
        ("/agents/\u00e9", "invalid stream path"),
        ("/agents/a\tb", "invalid stream path"),
        ("/agents/.", "'.' and '..' segments"),
        ("/agents/../b", "'.' and '..' segments"),
        ("/" + "a" * 129, "invalid stream path"),
        ("/" + "/".join(["abc"] * 128) + "d", "over 512"),
    ],
)
def test_stream_path_grammar_refuses_anything_else_with_a_one_line_reason(path: str, why: str) -> None:
    problem = path_problem(path)
    assert problem is not None and why in problem
    assert "\n" not in problem and "\x00" not in problem
    with pytest.raises(ValueError, match="streamPath"):
        AppendCommand.model_validate({"streamPath": path, "type": "t", "payload": {}})


@pytest.mark.parametrize("where", ["actor", "ref"])
def test_paths_inside_payloads_follow_the_same_grammar(where: str) -> None:
    bad = "/agents/a\nactor=user:web"  # would forge a second header line when rendered
    payload: dict[str, Any] = {"role": "developer", "content": "x"}
    if where == "actor":
        payload["actor"] = {"type": "agent", "path": bad}
    else:
        payload["refs"] = [{"type": "event", "streamPath": bad, "offset": 1}]
    with pytest.raises(ValueError, match="invalid stream path"):
        ContextItem.model_validate(payload)
    payload_ok = dict(payload)
    if where == "actor":
        payload_ok["actor"] = {"type": "agent", "path": "/agents/a"}
    else:
        payload_ok["refs"] = [{"type": "event", "streamPath": "/agents/a", "offset": 1}]
    ContextItem.model_validate(payload_ok)


def test_journal_envelopes_with_invalid_paths_are_not_events() -> None:
    raw = b'{"streamPath":"/a\\u0000b","offset":1,"type":"t","payload":{},"createdAt":"2026-12-02T10:13:51.123Z"}'
    with pytest.raises(ValueError, match="invalid stream path"):
        decode_event(raw)


# --- injective storage keys ------------------------------------------------------------------------

segments = st.text(alphabet=SEGMENT_CHARS, min_size=1, max_size=6).filter(lambda s: s not in (".", ".."))
valid_paths = st.lists(segments, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))


def all_keys(path: str, key: str = "k", append_id: str = "a") -> list[bytes]:
    return [
        rows.meta_key(path),
        rows.item_key(path, "system", 1),
        rows.item_key(path, "history", -3),
        rows.idempotency_key(path, key),
        rows.append_id_key(path, append_id),
    ]


@settings(max_examples=300, deadline=None)
@given(p=valid_paths, q=valid_paths, key=st.text(max_size=8), append_id=st.text(max_size=8))
def test_no_stream_key_range_contains_another_streams_keys(p: str, q: str, key: str, append_id: str) -> None:
    """Property: the rows of q are never inside any range a read of p covers (its prefix scan,
    its exact keys), whatever idempotency keys and append ids q's rows carry, and every key names
    its own stream."""
    for k in all_keys(q, key, append_id):
        assert rows.stream_of_key(k) == q
        if p != q:
            assert not k.startswith(rows.items_prefix(p))
            assert k not in all_keys(p, key, append_id)


@pytest.mark.parametrize("make", [rows.meta_key, rows.items_prefix])
def test_row_keys_refuse_a_path_holding_the_separator(make: Any) -> None:
    with pytest.raises(ValueError, match="NUL"):
        make("/agents/V\x00z4")


def test_the_injection_of_the_review_cannot_be_expressed_as_keys() -> None:
    # The finding: /agents/V's prefix scan returned /agents/V\x00z4's rows. Such a path has no keys.
    victim = rows.items_prefix("/agents/V")
    neighbour = rows.items_prefix("/agents/V/z4")
    assert not neighbour.startswith(victim)


# --- numbers and depth ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [INT_MIN, INT_MAX, 0, -1, 2**53 + 1, 1.5, -0.0, 1e308, True, None, "1e400"])
def test_interoperable_numbers_are_kept_exactly(value: Any) -> None:
    command = AppendCommand.model_validate_json(
        AppendCommand.model_validate({"streamPath": "/a", "type": "t", "payload": {"n": value}}).model_dump_json()
    )
    assert command.payload["n"] == value and type(command.payload["n"]) is type(value)


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b'{"n":100000000000000000000000000000}', "n"),
        (b'{"n":18446744073709551616}', "n"),  # 2^64
        (b'{"n":-9223372036854775809}', "n"),  # -2^63 - 1
        (b'{"a":{"b":[1,2,1e400]}}', "a.b[2]"),
        (b'{"n":-1e400}', "n"),
        (b'{"n":NaN}', "n"),
    ],
)
def test_numbers_outside_the_interoperable_range_are_invalid_naming_the_field(raw: bytes, where: str) -> None:
    with pytest.raises(ValueError) as caught:
        AppendCommand.model_validate_json(b'{"streamPath":"/a","type":"com.example/n","payload":' + raw + b"}")
    assert f"{where}: " in str(caught.value)


def test_numbers_are_checked_through_the_client_door_too() -> None:
    """A ref offset of 10**20 passes the context item's own field rule (a positive int) but not
    the command's number rule: nothing the journal could not serialize reaches Kafka."""
    item = {"role": "user", "content": "x", "refs": [{"type": "event", "streamPath": "/a", "offset": 10**20}]}
    parse_consumed_input({"type": CONTEXT_ADDED, "payload": item})  # the item model alone lets it by
    with pytest.raises(ValueError, match=r"refs\[0\]\.offset: integer of 21 digits"):
        AppendCommand.model_validate({"streamPath": "/a", "type": CONTEXT_ADDED, "payload": item})


def test_non_finite_floats_from_python_are_invalid() -> None:
    for bad in (math.inf, -math.inf, math.nan):
        assert number_problem({"x": [bad]}) is not None


def test_nesting_deeper_than_the_limit_is_invalid_with_a_clear_reason() -> None:
    deep: Any = []
    for _ in range(MAX_JSON_DEPTH + 1):
        deep = [deep]
    assert "nested deeper than" in (number_problem({"x": deep}) or "")
    shallow: Any = []
    for _ in range(MAX_JSON_DEPTH - 2):
        shallow = [shallow]
    assert number_problem({"x": shallow}) is None


def nested_payload(levels: int) -> dict[str, Any]:
    """A payload `levels` objects deep: `{}` is one level, `{"a": {}}` two."""
    payload: dict[str, Any] = {}
    for _ in range(levels - 1):
        payload = {"a": payload}
    return payload


def test_5_1_2_a_payload_may_nest_exactly_128_levels_and_not_129() -> None:
    """§5.1.2: "A payload may nest at most 128 levels deep", for the command and the journaled event."""
    assert number_problem(nested_payload(128)) is None
    assert number_problem(nested_payload(129)) == "nested deeper than 128 levels; flatten the payload"
    command = {"streamPath": "/a", "type": "com.example/deep"}
    AppendCommand.model_validate_json(orjson.dumps({**command, "payload": nested_payload(128)}))
    with pytest.raises(ValueError, match="nested deeper than 128 levels"):
        AppendCommand.model_validate_json(orjson.dumps({**command, "payload": nested_payload(129)}))
    event = {**command, "offset": 1, "createdAt": "2026-12-02T10:13:51.123Z"}
    assert decode_event(orjson.dumps({**event, "payload": nested_payload(128)})).offset == 1
    with pytest.raises(ValueError, match="nested deeper than 128 levels"):
        decode_event(orjson.dumps({**event, "payload": nested_payload(129)}))


@pytest.mark.parametrize(
    ("raw", "value"),
    [(b"-9223372036854775808", -(2**63)), (b"18446744073709551615", 2**64 - 1)],
)
def test_5_1_2_the_ends_of_the_range_minus_2_63_and_2_64_minus_1_are_kept_exactly(raw: bytes, value: int) -> None:
    """§5.1.2: integers inside -2^63 ... 2^64 - 1 are kept exactly, from JSON and from Python."""
    command = AppendCommand.model_validate_json(
        b'{"streamPath":"/a","type":"com.example/n","payload":{"n":' + raw + b"}}"
    )
    assert command.payload["n"] == value
    assert orjson.dumps(command.payload) == b'{"n":' + raw + b"}"
    assert AppendCommand.model_validate({"streamPath": "/a", "type": "t", "payload": {"n": value}}).payload == {
        "n": value
    }
    assert number_problem({"n": value}) is None


@pytest.mark.parametrize("value", [-(2**63) - 1, 2**64])
def test_5_1_2_one_beyond_either_end_is_invalid(value: int) -> None:
    assert number_problem({"n": [value]}) == (
        f"n[0]: integer of {len(str(abs(value)))} digits is outside the interoperable range -2^63..2^64-1; "
        "send it as a string"
    )
    with pytest.raises(ValueError, match="n: integer of"):
        AppendCommand.model_validate({"streamPath": "/a", "type": "t", "payload": {"n": value}})


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_5_1_2_non_finite_floats_are_invalid_naming_the_field(value: float) -> None:
    with pytest.raises(ValueError, match=r"n: .* is not a finite number"):
        AppendCommand.model_validate({"streamPath": "/a", "type": "t", "payload": {"n": value}})


def test_5_1_1_a_segment_of_exactly_128_characters_and_a_path_of_exactly_512_are_valid() -> None:
    """§5.1.1: "A segment is 1-128 characters ... The whole path is at most 512 characters"."""
    assert path_problem("/" + "s" * 128) is None
    assert path_problem("/" + "s" * 129) is not None
    exactly_512 = "/" + "s" * 127 + "/" + "t" * 127 + "/" + "u" * 127 + "/" + "v" * 127
    assert len(exactly_512) == 512 and path_problem(exactly_512) is None
    assert path_problem(exactly_512 + "w") == "stream path is 513 characters, over 512"


# --- who may write what ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event_type", "payload"),
    [
        (LLM_REQUEST_REQUESTED, {"model": "m", "expiresAt": 1}),
        (LLM_REQUEST_SETTLED, {"requestOffset": 3, "result": {"status": "succeeded", "text": "hi"}}),
        (TOKEN_USAGE_REPORTED, {}),
        ("events.iterate.com/capability-host/script-run-settled", {}),
        (CONTEXT_ADDED, {"role": "assistant", "content": "x", "llmRequestOffset": 3}),
        (CONTEXT_ADDED, {"role": "developer", "content": "s", "compaction": {"replacesHistoryThrough": 2}}),
    ],
)
def test_worker_only_events_are_named_forbidden(event_type: str, payload: dict[str, Any]) -> None:
    reason = worker_only_reason(event_type, payload)
    assert reason is not None and reason.startswith(f"forbidden: {event_type}") and "written by the workers" in reason


@pytest.mark.parametrize(
    ("event_type", "payload"),
    [
        (CONTEXT_ADDED, {"role": "assistant", "content": "a raw assistant item without a request"}),
        (CONTEXT_ADDED, {"role": "user", "content": "hi"}),
        (CONTEXT_ADDED, {"role": "developer", "content": "x", "llmRequestOffset": 3}),
        ("events.iterate.com/agent/paused", {}),
        ("events.iterate.com/agent/resumed", {}),
        ("events.iterate.com/github/webhook-received", {"compaction": 1}),
    ],
)
def test_everything_else_may_come_from_any_producer(event_type: str, payload: dict[str, Any]) -> None:
    assert worker_only_reason(event_type, payload) is None
