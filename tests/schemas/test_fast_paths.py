"""The journal worker's shortcuts through validation answer exactly as the long way does.

- `number_problem` first asks `_numbers_fine` (one pass, level by level); only a value it doubts
  is walked again to name the problem. The two must agree on every value, or a payload the walk
  refuses would be journaled.
- `validate_append_command` and `EVENT_VALIDATORS` are the models' own validators, called without
  `model_validate`'s keyword handling: the same model, instance and error for every input.

Broker-free.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas import limits
from schemas.events import (
    CONTEXT_ADDED,
    EVENT_VALIDATORS,
    PAYLOAD_MODELS,
    TYPED_EVENTS,
    AppendCommand,
    OtherEvent,
    describe_validation_error,
    validate_append_command,
    validate_other_event,
)
from schemas.limits import INT_MAX, INT_MIN, MAX_JSON_DEPTH, number_problem

_EDGE_INTS = st.sampled_from([INT_MIN - 1, INT_MIN, -1, 0, 1, INT_MAX, INT_MAX + 1, 1 << 100, -(1 << 100)])
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=4),
    st.integers(),
    _EDGE_INTS,
    st.floats(allow_nan=True, allow_infinity=True),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=3), inner, max_size=4),
        st.tuples(inner),  # not a JSON container: neither way looks inside
    ),
    max_leaves=30,
)


@settings(max_examples=1500, deadline=None)
@given(_VALUES)
def test_the_quick_check_agrees_with_the_walk_on_every_value(value: Any) -> None:
    assert limits._numbers_fine(value) == (limits._first_problem(value) is None)
    assert number_problem(value) == limits._first_problem(value)


def _nested(levels: int, leaf: Any, container: str) -> Any:
    value = leaf
    for _ in range(levels):
        value = {"a": value} if container == "dict" else [value]
    return value


@pytest.mark.parametrize("container", ["dict", "list"])
@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1])
@pytest.mark.parametrize("leaf", ["text", 1, INT_MAX + 1, INT_MIN - 1, math.inf, math.nan, 1.5, {}, []])
def test_the_depth_limit_and_the_numbers_below_it_agree(container: str, levels: int, leaf: Any) -> None:
    value = _nested(levels, leaf, container)
    assert limits._numbers_fine(value) == (limits._first_problem(value) is None)
    assert number_problem(value) == limits._first_problem(value)


@pytest.mark.parametrize("value", [INT_MAX + 1, INT_MIN - 1, math.inf, -math.inf, math.nan])
def test_a_bad_number_at_the_root_or_beside_good_ones_is_found(value: Any) -> None:
    for wrapped in (value, {"ok": 1, "s": "x", "bad": value}, [1, "x", [2, value]], {"a": {"b": [value]}}):
        assert not limits._numbers_fine(wrapped)
        assert number_problem(wrapped) is not None


def test_the_validators_are_each_models_own() -> None:
    assert validate_append_command.__self__ is AppendCommand.__pydantic_validator__  # type: ignore[attr-defined]
    assert validate_other_event.__self__ is OtherEvent.__pydantic_validator__  # type: ignore[attr-defined]
    assert set(EVENT_VALIDATORS) == set(PAYLOAD_MODELS)
    for event_type, validate in EVENT_VALIDATORS.items():
        assert validate.__self__ is TYPED_EVENTS[event_type].__pydantic_validator__  # type: ignore[attr-defined]


_COMMANDS = [
    b'{"streamPath":"/a/b","type":"' + CONTEXT_ADDED.encode() + b'","payload":{"role":"user","content":"hi"}}',
    b'{"streamPath":"/a/b","type":"x/y","payload":{"n":1},"appendId":"id-1","idempotencyKey":"k"}',
    b'{"streamPath":"a","type":"x","payload":{}}',
    b'{"streamPath":"/a","type":"x","payload":{"n":18446744073709551616}}',
    b'{"streamPath":"/a","type":"","payload":[]}',
    b"not json",
]


@pytest.mark.parametrize("value", _COMMANDS)
def test_an_append_command_validates_as_with_model_validate_json(value: bytes) -> None:
    try:
        expected: Any = AppendCommand.model_validate_json(value)
    except ValidationError as error:
        expected = describe_validation_error(error)
    try:
        got: Any = validate_append_command(value)
    except ValidationError as error:
        got = describe_validation_error(error)
    assert got == expected


_ENVELOPE = {"streamPath": "/a/b", "offset": 1, "createdAt": "2026-01-01T00:00:00.000Z"}


@pytest.mark.parametrize(
    ("event_type", "payload"),
    [
        (CONTEXT_ADDED, {"role": "user", "content": "hi", "actor": {"type": "user", "origin": "cli"}}),
        (CONTEXT_ADDED, {"role": "robot", "content": "hi"}),
        ("x/other", {"n": 1}),
        ("x/other", {"n": float("nan")}),
    ],
)
def test_an_event_validates_as_with_model_validate(event_type: str, payload: dict[str, Any]) -> None:
    envelope = {**_ENVELOPE, "type": event_type, "payload": payload}
    model = TYPED_EVENTS.get(event_type, OtherEvent)
    validate = EVENT_VALIDATORS.get(event_type, validate_other_event)
    try:
        expected: Any = model.model_validate(envelope)
    except ValidationError as error:
        expected = describe_validation_error(error)
    try:
        got: Any = validate(envelope)
    except ValidationError as error:
        got = describe_validation_error(error)
    assert got == expected
