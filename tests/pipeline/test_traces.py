"""Traces without a broker (docs/behaviour.md §8): the traceparent helpers, when tracing is on, and
how the journal worker passes a command's traceparent on to everything written on its behalf (the
journal record, the scheduler's request, the call record) with tracing off, and builds the span tree
(append → journal → schedule → journal) with it on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pipeline import tracing
from pipeline.gateway.trace_context import TraceParentMiddleware
from processors.traceparent import (
    TRACEPARENT,
    TraceParent,
    carried,
    encode,
    from_headers,
    parse,
    trace_id_hex,
    with_traceparent,
)
from schemas.events import AGENT_CREATED, CONTEXT_ADDED, LLM_REQUEST_REQUESTED
from schemas.outcomes import decode_outcomes
from tests.support.engine_harness import NAMES, PATH, EngineHarness

PARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
LATER = b"01" + PARENT[2:]  # the same fields under a later version
# What a probe sent: a version-01 header with a 60 KB tail, copied onto every record it caused.
HUGE = LATER + b"-" + b"x" * 60_000
SYSTEM = {
    "type": CONTEXT_ADDED,
    "payload": {"role": "system", "content": "policy", "key": "agent/system-prompt"},
}


# --- the helpers ---------------------------------------------------------------------------------


def test_8_a_traceparent_parses_and_encodes_back_the_same() -> None:
    found = parse(PARENT)
    assert found == TraceParent(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1)
    assert found.sampled and found.encode() == PARENT == encode(found.trace_id, found.span_id, 1)
    assert parse(PARENT.decode()) == found
    assert trace_id_hex(PARENT) == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").sampled is False  # type: ignore[union-attr]


def test_8_trace_flags_other_than_sampled_are_kept_and_only_the_sampled_bit_samples() -> None:
    """§8: a process "passes a record's traceparent on unchanged": every flag bit survives, and only
    bit 01 (sampled) makes the trace sampled."""
    unsampled = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-02"
    found = parse(unsampled)
    assert found is not None and found.flags == 0x02 and not found.sampled
    both = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03"
    assert parse(both).encode() == both and parse(both).sampled  # type: ignore[union-attr]


def test_8_a_trace_id_with_leading_zeros_keeps_its_32_hex_digits() -> None:
    """§8: the trace a traceparent names is its 32 hex digits, leading zeros included."""
    parent = b"00-00000000000000000000000000000abc-0000000000000def-01"
    assert trace_id_hex(parent) == "00000000000000000000000000000abc"
    assert parse(parent).encode() == parent  # type: ignore[union-attr]


def test_8_a_later_versions_traceparent_is_read_by_its_first_four_fields() -> None:
    """§8: a W3C traceparent of a later version may carry more fields after the flags: it is still
    valid and read by its first four (version 00 has exactly four, version ff is invalid)."""
    later = b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more"
    assert parse(later) == TraceParent(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1)


def test_8_a_traceparent_is_carried_as_its_parsed_fields_in_55_bytes_never_as_sent() -> None:
    """§8 "a traceparent is parsed, never copied": a later version is read by its first 55
    characters when a dash follows them (what follows is never looked at) and carried as version 00;
    version 00 is carried as it is."""
    assert carried(PARENT) == PARENT
    assert carried(LATER) == PARENT
    assert carried(HUGE) == PARENT and len(carried(HUGE) or b"") == 55
    assert carried(HUGE.decode()) == PARENT
    assert carried(LATER + b"-\xff\x00 not ascii, never decoded") == PARENT
    assert carried(b"fe" + PARENT[2:-2] + b"09-x") == PARENT[:-2] + b"09"  # the flags are kept
    assert carried(LATER + b"x" * 60_000) is None  # a later version's further fields follow a dash
    assert carried(PARENT + b"-x") is None  # version 00 is exactly 55 characters
    assert carried(b"garbage") is None and carried(None) is None


@pytest.mark.parametrize(
    "bad",
    [
        None,
        LATER[:54],  # too short for any version
        LATER + b"0",  # no dash after the 55 characters of a later version
        b"0g" + PARENT[2:],  # the version is hex
        PARENT[:35] + b"_" + PARENT[36:],  # the separators are dashes
        PARENT[:-1] + b"\xff",  # not ASCII
        b" " + PARENT,  # nothing around it
        b"",
        b"garbage",
        b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01",  # zero trace id
        b"00-4bf92f3577b34da6a3ce929d0e0e4736-" + b"0" * 16 + b"-01",  # zero span id
        b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # the forbidden version
        b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  # version 00 has 4 parts
        b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short trace id
    ],
)
def test_8_a_malformed_traceparent_is_ignored_never_an_error(bad: bytes | None) -> None:
    assert parse(bad) is None


def test_8_the_header_is_read_from_pairs_or_a_dict_and_set_once() -> None:
    pairs = [("source-offset", b"7"), (TRACEPARENT, PARENT)]
    assert from_headers(pairs) == PARENT == from_headers(dict(pairs))
    assert from_headers(None) is None and from_headers([("source-offset", b"7")]) is None
    assert from_headers([(TRACEPARENT, None)]) is None  # aiokafka may hand a header without value
    # §8: what a record's reader carries on is the parsed header, never the record's bytes.
    assert from_headers([(TRACEPARENT, HUGE)]) == PARENT == from_headers({TRACEPARENT: HUGE})
    assert from_headers([(TRACEPARENT, b"not one")]) is None
    other = b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"
    assert with_traceparent(pairs, other) == [("source-offset", b"7"), (TRACEPARENT, other)]
    assert with_traceparent(pairs, None) == [("source-offset", b"7")]


def test_8_tracing_is_off_unless_the_standard_variables_ask_for_it() -> None:
    assert not tracing.wanted({})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "console"})
    assert not tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"})
    assert not tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"})
    assert tracing.configure("test", {}) is False and tracing.ON is False


def test_8_an_http_requests_traceparent_is_continued_by_its_appends() -> None:
    seen: list[bytes | None] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(tracing.PARENT.get())

    async def call(headers: list[tuple[bytes, bytes]]) -> None:
        await TraceParentMiddleware(app)({"type": "http", "headers": headers}, None, None)  # type: ignore[arg-type]

    asyncio.run(call([(b"traceparent", PARENT)]))
    asyncio.run(call([(b"traceparent", b"not one")]))
    asyncio.run(call([]))
    assert seen == [PARENT, None, None]
    assert tracing.PARENT.get() is None  # reset after the request


def test_8_finding_3_an_http_requests_long_traceparent_is_continued_as_55_bytes() -> None:
    """§8 "a traceparent is parsed, never copied": a version-01 header with a 60 KB tail used to be
    set as the parent of every append of the request, and so copied onto every record of a batch."""
    seen: list[bytes | None] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(tracing.PARENT.get())
        seen.append(tracing.append_header("/agents/a", CONTEXT_ADDED, "gateway"))

    middleware = TraceParentMiddleware(app)
    asyncio.run(middleware({"type": "http", "headers": [(b"traceparent", HUGE)]}, None, None))  # type: ignore[arg-type]
    assert seen == [PARENT, PARENT]


def test_8_an_append_carries_55_bytes_whoever_set_its_parent() -> None:
    """§8: a client whose caller set the parent to a long header still writes the parsed one."""
    assert not tracing.ON
    token = tracing.PARENT.set(HUGE)
    try:
        assert tracing.append_header("/agents/a", CONTEXT_ADDED, "client") == PARENT
    finally:
        tracing.PARENT.reset(token)


# --- the journal worker --------------------------------------------------------------------------


def journal_records(h: EngineHarness) -> list[tuple[str, dict[str, bytes]]]:
    return [(orjson.loads(r.value)["type"], r.headers) for r in h.kafka.on(NAMES.journal)]


def a_turn(h: EngineHarness, parent: bytes | None) -> None:
    async def scenario() -> None:
        await h.handle(h.command(SYSTEM), h.command({"type": AGENT_CREATED, "payload": {}}))
        message = h.command({"type": CONTEXT_ADDED, "payload": {"role": "user", "content": "hello"}})
        if parent is not None:
            message.headers[TRACEPARENT] = parent
        await h.handle(message)
        await h.settle()
        h.engine.schedule(h.engine.clock_ms() + 10**6)
        await h.settle()

    asyncio.run(scenario())


def test_8_tracing_off_the_worker_passes_the_commands_traceparent_on_to_the_turn() -> None:
    """With tracing off nothing is created, but a trace started by a client that traces survives
    the journal worker: the user message's journal record, the scheduler's request and its call
    record all carry the command's traceparent."""
    assert not tracing.ON
    h = EngineHarness()
    a_turn(h, PARENT)
    records = journal_records(h)
    assert [headers.get(TRACEPARENT) for _, headers in records] == [None, None, PARENT, PARENT]
    assert records[3][0] == LLM_REQUEST_REQUESTED
    (call,) = h.kafka.on(NAMES.llm_requests)
    assert call.headers == {TRACEPARENT: PARENT}
    assert h.engine.trigger_traces == {}  # used by the request it started
    assert not h.fatal


def test_8_finding_3_tracing_off_the_worker_carries_a_producers_long_traceparent_as_55_bytes() -> None:
    """§8 "a traceparent is parsed, never copied", at the door anyone with Kafka access can write:
    the journal worker passes on the parsed header, never the 60 KB it was given, to the journal
    record, the outcome, the scheduler's request, the call record and its own memory."""
    h = EngineHarness()

    async def scenario() -> None:
        await h.handle(h.command(SYSTEM), h.command({"type": AGENT_CREATED, "payload": {}}))
        message = h.command({"type": CONTEXT_ADDED, "payload": {"role": "user", "content": "hi"}, "appendId": "m"})
        message.headers[TRACEPARENT] = HUGE
        await h.handle(message)
        await h.settle()
        assert h.engine.trigger_traces == {PATH: PARENT}  # held until the turn is decided
        h.engine.schedule(h.engine.clock_ms() + 10**6)
        await h.settle()

    asyncio.run(scenario())
    records = journal_records(h)
    assert [headers.get(TRACEPARENT) for _, headers in records] == [None, None, PARENT, PARENT]
    (call,) = h.kafka.on(NAMES.llm_requests)
    assert call.headers == {TRACEPARENT: PARENT}
    (outcome,) = [r for r in h.kafka.on(NAMES.results) if TRACEPARENT in r.headers]
    assert outcome.headers[TRACEPARENT] == PARENT
    assert not h.fatal


def test_8_tracing_off_a_malformed_traceparent_is_not_passed_on() -> None:
    h = EngineHarness()
    a_turn(h, LATER + b"0")
    records = h.kafka.on(NAMES.journal) + h.kafka.on(NAMES.llm_requests)
    assert records and all(TRACEPARENT not in r.headers for r in records)


def test_8_tracing_off_commands_without_a_traceparent_get_no_header() -> None:
    h = EngineHarness()
    a_turn(h, None)
    records = h.kafka.on(NAMES.journal) + h.kafka.on(NAMES.llm_requests)
    assert records and all(TRACEPARENT not in r.headers for r in records)


def test_8_tracing_off_an_outcome_carries_its_commands_traceparent_in_a_record_of_its_own() -> None:
    """Outcomes of commands without a trace share results records (docs/behaviour.md §1); the
    outcome of a command with one is a record of its own, which carries it."""
    h = EngineHarness()

    async def scenario() -> None:
        a, traced, c = (
            h.command({"type": CONTEXT_ADDED, "payload": {"role": "user", "content": n}, "appendId": n}) for n in "abc"
        )
        traced.headers[TRACEPARENT] = PARENT
        await h.handle(a, traced, c)
        await h.settle()

    asyncio.run(scenario())
    records = h.kafka.on(NAMES.results)
    assert [(r.headers.get(TRACEPARENT), r.key) for r in records] == [(PARENT, PATH.encode()), (None, None)]
    assert [o.appendId for o in decode_outcomes(records[0].value)] == ["b"]
    assert [o.appendId for o in decode_outcomes(records[1].value)] == ["a", "c"]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, into memory, for one test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    saved = tracing.ON, tracing._tracer
    tracing.ON, tracing._tracer = True, provider.get_tracer("test")
    try:
        yield exporter
    finally:
        tracing.ON, tracing._tracer = saved


def test_8_tracing_on_one_turn_is_one_trace_through_the_worker(spans: InMemorySpanExporter) -> None:
    """append (the client's span, PARENT) → agentstream.journal (the message) →
    agentstream.schedule (the turn decided, with its reason) → agentstream.journal (the request);
    the request's journal record and its call record carry the request's journal span."""
    h = EngineHarness()
    a_turn(h, PARENT)
    finished = spans.get_finished_spans()
    assert {s.context.trace_id for s in finished if s.parent is not None} == {parse(PARENT).trace_id}  # type: ignore[union-attr]
    by_offset = {s.attributes.get("agentstream.journal.offset"): s for s in finished if s.name == "agentstream.journal"}
    message, request = by_offset[3], by_offset[4]
    (schedule,) = [s for s in finished if s.name == "agentstream.schedule"]
    assert message.parent.span_id == parse(PARENT).span_id  # type: ignore[union-attr]
    assert schedule.parent.span_id == message.context.span_id  # type: ignore[union-attr]
    assert request.parent.span_id == schedule.context.span_id  # type: ignore[union-attr]
    assert dict(message.attributes) == {
        "agentstream.outcome": "journaled",
        "agentstream.stream.path": PATH,
        "agentstream.journal.offset": 3,
        "agentstream.event.type": CONTEXT_ADDED,
    }
    assert schedule.attributes["agentstream.schedule.reason"] == "llm-request-requested: external trigger"
    assert schedule.attributes["agentstream.trigger.offset"] == 3
    (call,) = h.kafka.on(NAMES.llm_requests)
    expected = encode(request.context.trace_id, request.context.span_id, 1)
    assert call.headers == {TRACEPARENT: expected} == {TRACEPARENT: journal_records(h)[3][1][TRACEPARENT]}
    # Commands without a traceparent start traces of their own: each its own root.
    roots = [s for s in finished if s.parent is None]
    assert [s.attributes["agentstream.journal.offset"] for s in roots] == [1, 2]
