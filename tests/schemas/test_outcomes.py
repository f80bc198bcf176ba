"""Append outcomes on agent-append-results: many to a record (docs/behaviour.md §1, "Outcomes")."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas.outcomes import AppendOutcome, decode_outcomes, outcome_records


def encoded(n: int, reason: str = "") -> bytes:
    if reason:
        return AppendOutcome.encode_trusted(f"id-{n}", "/agents/a", "rejected", None, reason)
    return AppendOutcome.encode_trusted(f"id-{n}", "/agents/a", "journaled", n + 1)


def test_1_outcomes_a_record_holds_an_array_of_outcomes_or_one_outcome_object() -> None:
    one = encoded(0)
    assert decode_outcomes(one) == [AppendOutcome.model_validate_json(one)]
    (record,) = outcome_records([encoded(0), encoded(1)])
    assert [o.appendId for o in decode_outcomes(record)] == ["id-0", "id-1"]
    assert decode_outcomes(b"[]") == []


@pytest.mark.parametrize("garbage", [b"", b"{}", b"[{}]", b"not json", b'[{"appendId": "a"}]', b"42"])
def test_1_outcomes_anything_else_on_the_topic_is_a_validation_error(garbage: bytes) -> None:
    with pytest.raises(ValidationError):
        decode_outcomes(garbage)


def test_1_outcomes_a_record_of_exactly_the_limit_holds_them_all_one_byte_less_splits_it() -> None:
    outcomes = [encoded(n) for n in range(5)]
    whole = b"[" + b",".join(outcomes) + b"]"
    assert list(outcome_records(outcomes, max_bytes=len(whole))) == [whole]
    split = list(outcome_records(outcomes, max_bytes=len(whole) - 1))
    assert len(split) == 2 and all(len(record) <= len(whole) - 1 for record in split)


def test_1_outcomes_an_outcome_over_the_limit_gets_a_record_of_its_own() -> None:
    big = encoded(1, reason="x" * 500)
    records = list(outcome_records([encoded(0), big, encoded(2)], max_bytes=100))
    assert records == [b"[" + encoded(0) + b"]", b"[" + big + b"]", b"[" + encoded(2) + b"]"]


def test_1_outcomes_no_outcome_no_record() -> None:
    assert list(outcome_records([])) == []


@given(
    reasons=st.lists(st.text(max_size=80), max_size=40),
    max_bytes=st.integers(min_value=1, max_value=600),
)
def test_1_outcomes_records_hold_every_outcome_once_in_order_and_within_the_limit(
    reasons: list[str], max_bytes: int
) -> None:
    outcomes = [encoded(n, reason) for n, reason in enumerate(reasons)]
    records = list(outcome_records(outcomes, max_bytes=max_bytes))
    decoded = [o for record in records for o in decode_outcomes(record)]
    assert decoded == [AppendOutcome.model_validate_json(o) for o in outcomes]
    for record in records:
        assert len(record) <= max_bytes or len(orjson.loads(record)) == 1  # only a lone outcome exceeds it
