"""The caller reads a streamed answer as the openai client does (`pipeline/caller/provider.py`,
docs/architecture.md, "LLM caller"): its server-sent events decoder and its JSON decoding are held
to the SDK's own, on any bytes cut anywhere, without a server."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder

from pipeline.caller.provider import SseEvents, _json

# Lines built from the pieces that matter to a decoder: field names, the colon and its space,
# every line end, comments, [DONE], JSON and text that is neither.
PIECES = st.sampled_from(
    [
        b"data",
        b"data:",
        b"data: ",
        b"event: ",
        b"event:",
        b"thread.run",
        b"id: 7",
        b"id:\x00",
        b"retry: 5",
        b"retry: x",
        b":",
        b": comment",
        b"\n",
        b"\r",
        b"\r\n",
        b"\n\n",
        b'{"choices": []}',
        b"[DONE]",
        b" ",
        b"x",
        "é".encode(),
    ]
)
STREAMS = st.lists(PIECES, max_size=40).map(b"".join)


def sdk_events(body: bytes, cuts: list[int]) -> list[tuple[str | None, str]]:
    decoder = SSEDecoder()
    return [(sse.event, sse.data) for sse in decoder.iter_bytes(iter(split(body, cuts)))]


def our_events(body: bytes, cuts: list[int]) -> list[tuple[str | None, str]]:
    events = SseEvents()
    found = [event for chunk in split(body, cuts) for event in events.feed(chunk)]
    return found + list(events.finish())


def split(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(body)) for c in cuts})
    return [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]


@settings(max_examples=400, deadline=None)
@given(STREAMS, st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_events_are_the_sdks_however_the_bytes_arrive(body: bytes, cuts: list[int]) -> None:
    assert our_events(body, cuts) == sdk_events(body, cuts)


def test_a_typical_stream_and_crlf_split_across_chunks() -> None:
    body = b'data: {"a": 1}\r\n\r\nevent: x\r\ndata: 2\r\ndata: 3\r\n\r\ndata: [DONE]\r\n\r\n'
    for cut in range(len(body) + 1):
        assert our_events(body, [cut]) == [(None, '{"a": 1}'), ("x", "2\n3"), (None, "[DONE]")]


def test_an_event_is_not_complete_before_its_blank_line() -> None:
    assert our_events(b"data: 1\n", []) == []
    assert our_events(b"data: 1\n\r", []) == [(None, "1")]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)
JSON_TEXTS = JSON_VALUES.map(json.dumps) | st.text(max_size=30) | st.sampled_from(['"\\ud800"', "\ufeff{}", "1e999"])


def outcome(decode: Any, text: str | bytes) -> tuple[str, Any]:
    try:
        value = decode(text)
    except ValueError as error:  # json.JSONDecodeError, UnicodeDecodeError
        return "refused", str(error)
    return "value", json.dumps(value, sort_keys=True) if not _nan_in(value) else repr(value)


def _nan_in(value: Any) -> bool:
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, list):
        return any(_nan_in(v) for v in value)
    if isinstance(value, dict):
        return any(_nan_in(v) for v in value.values())
    return False


@settings(max_examples=500, deadline=None)
@given(JSON_TEXTS)
def test_json_decodes_and_refuses_as_the_standard_library(text: str) -> None:
    """The SDK decodes with `json`; orjson goes first only where it agrees, errors are `json`'s."""
    assert outcome(_json, text) == outcome(json.loads, text)
    assert outcome(_json, text.encode("utf-8", "surrogatepass")) == outcome(
        json.loads, text.encode("utf-8", "surrogatepass")
    )


@pytest.mark.parametrize("text", ["", "non-json", "{", "[1,]", "NaN", "Infinity", "18446744073709551616"])
def test_json_edge_cases(text: str) -> None:
    assert outcome(_json, text) == outcome(json.loads, text)
