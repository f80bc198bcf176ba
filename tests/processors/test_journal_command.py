"""Journaling one command (docs/behaviour.md §1), the pure decision without a broker: offsets,
`createdAt`, idempotency keys and append ids, and the limits of a command's fields.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from processors import row_codec, rows
from processors.journal import Duplicate, Journaled, Rejected, format_created_at, next_created_at, payload_hash
from schemas.events import AGENT_PAUSED, CONTEXT_ADDED, AppendCommand
from tests.support.journal_stream import PATH, JournaledStream

USER_ITEM = {"role": "user", "content": "hi", "actor": {"type": "user", "origin": "web", "userId": "u-1"}}
# The same JSON value, every object's keys in another order.
USER_ITEM_REORDERED = {"actor": {"userId": "u-1", "origin": "web", "type": "user"}, "content": "hi", "role": "user"}


def epoch_ms(created_at: str) -> int:
    return int(datetime.fromisoformat(created_at).timestamp() * 1000)


def journaled(outcome: object) -> Journaled:
    assert isinstance(outcome, Journaled), outcome
    return outcome


# --- offsets and createdAt ------------------------------------------------------------------------


def test_1_offsets_are_gapless_from_1_and_created_at_is_utc_milliseconds_z() -> None:
    """§1: `offset` is a positive integer, gapless per stream, starting at 1; `createdAt` is
    `YYYY-MM-DDTHH:MM:SS.mmmZ`, the commit time."""
    stream = JournaledStream()
    stream.now_ms = epoch_ms("2026-12-02T10:13:51.007+00:00")
    events = [journaled(stream.append(CONTEXT_ADDED, {"role": "user", "content": str(n)})).event for n in range(3)]
    assert [event.offset for event in events] == [1, 2, 3]
    assert [event.createdAt for event in events] == ["2026-12-02T10:13:51.007Z"] * 3


@pytest.mark.parametrize(
    ("epoch_ms_value", "created_at"),
    [
        (0, "1970-01-01T00:00:00.000Z"),
        (7, "1970-01-01T00:00:00.007Z"),
        (1_796_000_000_040, "2026-11-30T00:53:20.040Z"),
        (1_796_000_000_999, "2026-11-30T00:53:20.999Z"),
        (1_796_000_001_000, "2026-11-30T00:53:21.000Z"),
    ],
)
def test_1_created_at_always_has_three_millisecond_digits(epoch_ms_value: int, created_at: str) -> None:
    assert format_created_at(epoch_ms_value) == created_at


def test_1_created_at_never_goes_backwards_when_the_wall_clock_does() -> None:
    """§1 *Implementation*: "if the clock does, the previous event's `createdAt` is reused"."""
    stream = JournaledStream()
    at = epoch_ms("2026-12-02T10:13:51.123+00:00")
    first = journaled(stream.append(CONTEXT_ADDED, {"role": "user", "content": "a"}, now_ms=at)).event
    stepped_back = journaled(stream.append(CONTEXT_ADDED, {"role": "user", "content": "b"}, now_ms=at - 5_000)).event
    assert first.createdAt == stepped_back.createdAt == "2026-12-02T10:13:51.123Z"
    # Any event counts, not only requests; and time moves on as soon as the clock passes it again.
    paused = journaled(stream.append(AGENT_PAUSED, {}, now_ms=at - 1)).event
    assert paused.createdAt == "2026-12-02T10:13:51.123Z"
    later = journaled(stream.append(CONTEXT_ADDED, {"role": "user", "content": "c"}, now_ms=at + 1)).event
    assert later.createdAt == "2026-12-02T10:13:51.124Z"


@settings(deadline=None)
@given(steps=st.lists(st.integers(min_value=-10_000, max_value=10_000), min_size=1, max_size=20))
def test_1_created_at_is_monotone_whatever_the_clock_does(steps: list[int]) -> None:
    stream = JournaledStream()
    now = stream.now_ms
    created: list[str] = []
    for step in steps:
        now += step
        created.append(
            journaled(stream.append(CONTEXT_ADDED, {"role": "user", "content": "x"}, now_ms=now)).event.createdAt
        )
    assert created == sorted(created)


# --- idempotency keys ------------------------------------------------------------------------------


def test_1_the_same_key_with_an_equal_payload_in_another_key_order_is_a_duplicate() -> None:
    """§1: "the same `type` and an equal `payload` (equal as JSON values: key order does not matter)
    journals nothing and answers with the existing event's offset"."""
    stream = JournaledStream()
    first = journaled(stream.append(CONTEXT_ADDED, USER_ITEM, key="web/msg/91f3"))
    stream.send("something else")
    again = stream.append(CONTEXT_ADDED, USER_ITEM_REORDERED, key="web/msg/91f3")
    assert isinstance(again, Duplicate) and again.offset == first.event.offset == 1
    assert stream.state.cursor == 2  # nothing journaled
    assert payload_hash(CONTEXT_ADDED, USER_ITEM) == payload_hash(CONTEXT_ADDED, USER_ITEM_REORDERED)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=12,
)


def reordered(value: Any) -> Any:
    """The same JSON value with every object's keys in reverse order."""
    if isinstance(value, dict):
        return {key: reordered(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(item) for item in value]
    return value


@settings(deadline=None)
@given(payload=st.dictionaries(st.text(max_size=4), json_values, max_size=5))
def test_1_the_payload_hash_is_the_same_for_equal_json_values_whatever_the_key_order(payload: dict[str, Any]) -> None:
    assert payload_hash("t", reordered(payload)) == payload_hash("t", payload)
    assert payload_hash("t", {**payload, "\x00extra": 1}) != payload_hash("t", payload)
    assert payload_hash("u", payload) != payload_hash("t", payload)


@pytest.mark.parametrize(
    ("event_type", "payload"),
    [
        (CONTEXT_ADDED, {**USER_ITEM, "content": "hi!"}),  # another value
        (CONTEXT_ADDED, {**USER_ITEM, "key": "slot"}),  # one more field
        ("events.iterate.com/test/other", USER_ITEM),  # the same payload under another type
    ],
)
def test_1_the_same_key_with_a_different_body_is_rejected_naming_the_key_and_the_existing_offset(
    event_type: str, payload: dict[str, object]
) -> None:
    """§1: "The same key with a different body is rejected with a reason naming the key and the
    existing offset"."""
    stream = JournaledStream()
    stream.send("before")
    journaled(stream.append(CONTEXT_ADDED, USER_ITEM, key="web/msg/91f3"))
    conflict = stream.append(event_type, payload, key="web/msg/91f3")
    assert conflict == Rejected(
        "idempotency key 'web/msg/91f3' already names a different event at @2; an idempotency key names "
        "one exact event forever: use a new key for a new body",
        key_conflict=True,
    )
    assert stream.state.cursor == 2


def test_1_an_append_id_already_journaled_is_a_duplicate_whatever_the_body_and_before_the_key() -> None:
    """§1: "A command whose append id is already journaled in the stream is a `duplicate` of that
    event, whatever its body. The append id is checked before the idempotency key."""
    stream = JournaledStream()
    journaled(stream.append(CONTEXT_ADDED, USER_ITEM, key="web/msg/1", append_id="send-1"))
    journaled(stream.append(CONTEXT_ADDED, USER_ITEM, key="web/msg/2"))
    again = stream.append(CONTEXT_ADDED, {**USER_ITEM, "content": "changed"}, key="web/msg/2", append_id="send-1")
    assert isinstance(again, Duplicate) and again.offset == 1


def test_the_idempotency_row_holds_the_first_32_hex_digits_of_sha256_over_canonical_json() -> None:
    """docs/architecture.md, "Rows": `k\\0<path>\\0<idempotencyKey>` holds `{"offset", "type", "hash"}`;
    `hash` is the first 32 hex digits of SHA-256 over the canonical JSON of `[type, payload]`."""
    stream = JournaledStream()
    journaled(stream.append(CONTEXT_ADDED, {**USER_ITEM, "content": "ünï ✓"}, key="web/msg/1"))
    canonical = json.dumps(
        [CONTEXT_ADDED, {**USER_ITEM_REORDERED, "content": "ünï ✓"}],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()
    stored = orjson.loads(stream.rows[rows.idempotency_key(PATH, "web/msg/1")][2:])  # after the format marker
    assert stored == {"offset": 1, "type": CONTEXT_ADDED, "hash": hashlib.sha256(canonical).hexdigest()[:32]}
    assert row_codec.decode_idempotency(stream.rows[rows.idempotency_key(PATH, "web/msg/1")])[2] == stored["hash"]


# --- the limits of a command's fields -----------------------------------------------------------------


def command(**fields: object) -> dict[str, object]:
    return {"streamPath": PATH, "type": CONTEXT_ADDED, "payload": {"role": "user", "content": "x"}, **fields}


def test_1_an_idempotency_key_is_1_to_512_characters() -> None:
    """§1: "optional `idempotencyKey` (1-512 characters)"."""
    stream = JournaledStream()
    longest = "k" * 512
    assert AppendCommand.model_validate(command(idempotencyKey=longest)).idempotencyKey == longest
    assert journaled(stream.append(CONTEXT_ADDED, {"role": "user", "content": "x"}, key=longest)).event.offset == 1
    for bad in ("", "k" * 513):
        with pytest.raises(ValidationError, match="idempotencyKey"):
            AppendCommand.model_validate(command(idempotencyKey=bad))


def test_1_an_append_id_is_1_to_128_characters() -> None:
    """§1: "optional `appendId` (1-128 characters)"."""
    longest = "a" * 128
    assert AppendCommand.model_validate(command(appendId=longest)).appendId == longest
    for bad in ("", "a" * 129):
        with pytest.raises(ValidationError, match="appendId"):
            AppendCommand.model_validate(command(appendId=bad))


def test_1_unknown_command_fields_and_an_empty_type_make_the_command_invalid() -> None:
    with pytest.raises(ValidationError, match="order"):
        AppendCommand.model_validate(command(order=1))
    with pytest.raises(ValidationError, match="type"):
        AppendCommand.model_validate(command(type=""))


def test_1_created_at_never_goes_back_even_after_a_last_stamp_of_another_width() -> None:
    """§1 createdAt: compared as strings when both are the journal's own fixed-width stamps, and as
    instants otherwise (a stamp with an offset instead of `Z`)."""
    assert next_created_at(1_000, "1970-01-01T00:00:02.000Z") == "1970-01-01T00:00:02.000Z"
    assert next_created_at(3_000, "1970-01-01T00:00:02.000Z") == "1970-01-01T00:00:03.000Z"
    assert next_created_at(1_000, "1970-01-01T00:00:02.000+00:00") == "1970-01-01T00:00:02.000Z"
    assert next_created_at(3_000, "1970-01-01T00:00:02.000+00:00") == "1970-01-01T00:00:03.000Z"
    assert next_created_at(5, None) == "1970-01-01T00:00:00.005Z"


def test_1_created_at_after_a_last_stamp_without_milliseconds_is_in_the_journals_format() -> None:
    """§1 createdAt: `YYYY-MM-DDTHH:MM:SS.mmmZ`, never going backwards, also after a shorter last
    stamp (no milliseconds), which is compared as an instant and never copied as it is."""
    assert next_created_at(1_000, "1970-01-01T00:00:02Z") == "1970-01-01T00:00:02.000Z"
    assert next_created_at(3_000, "1970-01-01T00:00:02Z") == "1970-01-01T00:00:03.000Z"
