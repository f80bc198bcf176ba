"""Replay's fold (`pipeline.journal.replay_fold`) against the live path and the engine's catch-up, no broker.

The journal here is written the way the journal worker writes it: every command goes through
`processors.journal.journal_command` (validation, dedupe, offsets, the rows the live path stores),
and its record carries the worker's headers. Then:

- the payload digest replay computes is byte-identical to the digest the live path stored for the
  same command, and to the engine's catch-up digest, over hand-picked payloads (coercing fields,
  unicode, extreme numbers) and generated ones, on both of replay's decoding routes;
- replay decodes every record exactly as `decode_event` does;
- the rows replay writes, batch by batch, equal the rows `PartitionEngine.catch_up` stores and the
  rows the live path stored.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.journal.engine import PartitionEngine
from pipeline.journal.recovery import Recovery
from pipeline.journal.replay_fold import PartitionFold, Record, decode_record, journal_headers
from processors import row_codec, rows
from processors.journal import Journaled, journal_command, payload_hash
from processors.state import AgentState, SourceOffsets
from schemas.events import (
    AGENT_CONFIGURED,
    AGENT_CREATED,
    AGENT_PAUSED,
    AGENT_RESUMED,
    CONTEXT_ADDED,
    LLM_REQUEST_REQUESTED,
    LLM_REQUEST_SETTLED,
    STREAM_ERROR_OCCURRED,
    TOKEN_USAGE_REPORTED,
    AppendCommand,
    EnvelopeError,
    decode_event,
)
from schemas.limits import INT_MAX, INT_MIN
from schemas.routing import AGENT_SUBSCRIBED
from tests.support.engine_harness import committer
from tests.support.journal_fakes import DictStore
from topics.headers import H_APPEND_ID, H_SOURCE_OFFSET, H_SOURCE_TOPIC, INTERNAL
from topics.names import topic_names

WEBHOOK = "events.iterate.com/github/webhook-received"  # a type the agent does not consume
START_MS = 1_796_000_000_000


class LiveJournal:
    """The live path of one partition without Kafka: commands in, journal records and rows out."""

    def __init__(self) -> None:
        self.states: dict[str, tuple[AgentState, SourceOffsets]] = {}
        self.rows: dict[bytes, bytes | None] = {}  # what the worker stored, in order
        self.records: list[Record] = []
        self.digests: dict[tuple[str, str], str] = {}  # (path, idempotency key) -> digest stored live
        self.source_offset = 0
        self.now_ms = START_MS

    def append(
        self,
        path: str,
        event_type: str,
        payload: dict[str, Any],
        *,
        key: str | None = None,
        append_id: str | None = None,
        internal: bool = False,
    ) -> int:
        """Journal one command as the worker does; its journal offset."""
        command: dict[str, Any] = {"streamPath": path, "type": event_type, "payload": payload}
        if key is not None:
            command["idempotencyKey"] = key
        if append_id is not None:
            command["appendId"] = append_id
        append = AppendCommand.model_validate_json(orjson.dumps(command))  # as the worker reads agent-appends
        state, sources = self.states.setdefault(path, (AgentState(stream_path=path), SourceOffsets()))
        self.source_offset += 1
        sources = sources.advanced(internal, self.source_offset)
        self.now_ms += 1000
        outcome = journal_command(state, append, now_ms=self.now_ms, sources=sources, read=self.rows.get)
        assert isinstance(outcome, Journaled), outcome
        self.states[path] = (state, sources)
        self.rows.update(outcome.rows)
        headers = [(H_SOURCE_OFFSET, str(self.source_offset).encode())]
        if internal:
            headers.append((H_SOURCE_TOPIC, INTERNAL))
        if append_id is not None:
            headers.append((H_APPEND_ID, append_id.encode()))
        self.raw(outcome.record, headers)
        if key is not None:
            self.digests[(path, key)] = row_codec.decode_idempotency(self.rows[rows.idempotency_key(path, key)])[2]
        return outcome.event.offset

    def raw(self, value: bytes, headers: list[tuple[str, bytes]] | None = None) -> None:
        """A record as it stands in agent-journal (also ones the worker never writes)."""
        self.records.append((len(self.records), value, headers))

    def stored(self) -> dict[bytes, bytes]:
        return {key: value for key, value in self.rows.items() if value is not None}


# --- payloads the digest must survive -----------------------------------------------------------

STRANGE_TEXT = ['é🙂 "quoted" \\ back', "\u2028\u2029 line separators", "nul \u0000 and tab \t", "日本語", ""]
NUMBERS = [0, -0.0, 0.1, 1e-7, 1.5e300, 5e-324, 1.7976931348623157e308, 2**53 + 1, INT_MAX, INT_MIN, -1]


def mixed_journal() -> LiveJournal:
    """Several streams interleaved on one partition: every consumed event type, idempotency keys on
    most of them, append ids, internal commands, compactions, requests and their answers."""
    live = LiveJournal()
    paths = ["/agents/a", "/agents/b", "/integrations/github/main"]
    a, b, github = paths
    live.append(a, AGENT_CREATED, {"by": {"z": 1, "a": [1.0, 2, "é"]}}, key="agent/created")
    live.append(b, AGENT_CREATED, {}, append_id="b-created")
    # A float field given an integer: validation makes it 1.0, the journal keeps 1.
    live.append(a, AGENT_CONFIGURED, {"config": {"compactionTriggerFraction": 1, "llm": {"model": "m"}}}, key="cfg/1")
    live.append(b, AGENT_CONFIGURED, {"config": {"llmRequestDebounceMs": 0}}, key="cfg/b")
    live.append(a, CONTEXT_ADDED, {"role": "system", "content": "policy", "key": "agent/system-prompt"}, key="sp@1")
    for n, text in enumerate(STRANGE_TEXT):
        for path in (a, b):
            payload: dict[str, Any] = {"role": "user", "content": text, "actor": {"type": "user", "origin": "web"}}
            if n % 2:
                payload["key"] = f"slot/{n % 3}"
            if n % 3 == 0:
                payload["refs"] = [{"type": "event", "streamPath": github, "offset": n + 1, "eventType": WEBHOOK}]
            live.append(path, CONTEXT_ADDED, payload, key=f"web/{path}/{n}" if n % 2 == 0 else None, append_id=f"{n}")
        webhook = {"n": n, "numbers": NUMBERS, "text": text, "nested": {"b": {"d": 1, "c": 2}}}
        live.append(github, WEBHOOK, webhook, key=f"delivery/{n}" if n % 2 else None)
    live.append(a, AGENT_SUBSCRIBED, {"source": github, "eventTypes": [WEBHOOK]}, key="sub/1")
    request = live.append(a, LLM_REQUEST_REQUESTED, {"model": "m", "expiresAt": 10**13}, key="req", internal=True)
    live.append(
        a,
        CONTEXT_ADDED,
        {"role": "assistant", "content": "answer 🙂", "llmRequestOffset": request},
        key=f"answer/{request}",
        internal=True,
    )
    live.append(
        a,
        LLM_REQUEST_SETTLED,
        {
            "requestOffset": request,
            "durationMs": 12,
            "result": {"status": "succeeded", "text": "answer", "usage": {"prompt_tokens": 7, "ratio": 0.25}},
        },
        key=f"settled/{request}",
        internal=True,
    )
    live.append(
        a,
        TOKEN_USAGE_REPORTED,
        {
            "llmRequestOffset": request,
            "model": "m",
            "maxContextTokens": 100,
            "inputTokens": 90,
            "outputTokens": 5,
            "cachedInputTokens": 0,
        },
        key=f"usage/{request}",
        internal=True,
    )
    # A compaction whose usage holds 1.0 for an int: validated to 1, journaled as 1.0.
    live.append(
        a,
        CONTEXT_ADDED,
        {
            "role": "developer",
            "content": "summary",
            "compaction": {"replacesHistoryThrough": request - 2, "usage": {"inputTokens": 1.0}},
            "llmRequestPolicy": {"behaviour": "dont-trigger-request"},
        },
        key=f"compaction/{request}",
        internal=True,
    )
    failed = live.append(b, LLM_REQUEST_REQUESTED, {"model": "m", "expiresAt": 1}, key="req-b", internal=True)
    live.append(
        b,
        LLM_REQUEST_SETTLED,
        {"requestOffset": failed, "result": {"status": "failed", "errorMessage": "boom"}},
        key=f"failed/{failed}",
        internal=True,
    )
    live.append(b, STREAM_ERROR_OCCURRED, {"message": "it failed"}, key="error/1", internal=True)
    live.append(b, AGENT_PAUSED, {"reason": "breaker", "triggerOffset": failed}, key="pause/1", internal=True)
    live.append(b, AGENT_RESUMED, {}, key="resume/1")
    return live


def with_unusual_records(live: LiveJournal) -> LiveJournal:
    """Records the worker does not write today but replay must treat as the engine does."""
    first = live.records[0]
    live.raw(first[1], first[2])  # journaled twice (a zombie writer): already folded, skipped
    live.raw(b"not json at all")
    live.raw(b'{"idempotencyKey": "k"}')  # an object with a key but no envelope
    state, _ = live.states["/agents/a"]
    invalid = {
        "streamPath": "/agents/a",
        "offset": state.cursor + 1,
        "type": CONTEXT_ADDED,
        "payload": {"role": "boss", "content": "x"},  # breaks its type's contract: skipped, counted
        "idempotencyKey": "invalid/1",
        "createdAt": "2026-12-02T10:00:00.000Z",
    }
    live.raw(orjson.dumps(invalid), [(H_SOURCE_OFFSET, b"999")])
    # A valid event in another spelling: escaped slashes in its type, fields in another order.
    escaped = {**invalid, "offset": state.cursor + 2, "payload": {"role": "user", "content": "spelt otherwise"}}
    escaped["idempotencyKey"] = "escaped/1"
    spelt = orjson.dumps(dict(reversed(escaped.items()))).replace(b"/", b"\\/")
    assert orjson.loads(spelt) == escaped
    live.raw(spelt, [(H_SOURCE_OFFSET, b"1000")])
    return live


def replayed(records: list[Record], batch: int) -> tuple[dict[bytes, bytes], int]:
    fold = PartitionFold(0)
    stored: dict[bytes, bytes | None] = {}
    for start in range(0, len(records), batch):
        fold.fold(records[start : start + batch])
        stored.update(fold.take())
    return {key: value for key, value in stored.items() if value is not None}, fold.folded


def caught_up(records: list[Record]) -> tuple[dict[bytes, bytes], int]:
    async def run() -> tuple[dict[bytes, bytes], int]:
        store = DictStore()
        engine = PartitionEngine(
            0, store, topic_names(""), committer(names=topic_names("")), max_cached_streams=1 << 30
        )
        folded = Recovery(engine).refold((offset, value, dict(headers or ())) for offset, value, headers in records)
        await engine.checkpoints.flush()  # what catch-up staged, stored as one checkpoint
        return store.stored, folded

    return asyncio.run(run())


# --- the digest -------------------------------------------------------------------------------


def test_digest_equals_the_live_digest_and_the_engines() -> None:
    live = mixed_journal()
    assert len(live.digests) >= 20
    checked = 0
    for _, value, _ in live.records:
        event, digest = decode_record(value)
        if event.idempotencyKey is None:
            assert digest is None
            continue
        assert digest == live.digests[(event.streamPath, event.idempotencyKey)]  # the live path's
        assert digest == payload_hash(event.type, orjson.loads(value)["payload"])  # catch-up's reparse
        checked += 1
    assert checked == len(live.digests)


def test_hashing_the_validated_model_would_break_dedupe() -> None:
    """Why replay hashes the parsed payload, not the validated model dumped again: validation
    coerces, so the model's canonical form is not the one the live path hashed."""
    live = LiveJournal()
    live.append("/agents/a", AGENT_CONFIGURED, {"config": {"compactionTriggerFraction": 1}}, key="cfg")
    event = decode_event(live.records[0][1])
    dumped = event.payload.model_dump(mode="json", exclude_unset=True)
    assert dumped == {"config": {"compactionTriggerFraction": 1.0}}
    assert payload_hash(event.type, dumped) != live.digests[("/agents/a", "cfg")]
    assert decode_record(live.records[0][1])[1] == live.digests[("/agents/a", "cfg")]


JSON_KEYS = st.text(st.characters(exclude_categories=("Cs",)), max_size=8)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(INT_MIN, INT_MAX)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=("Cs",)), max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(JSON_KEYS, children, max_size=4),
    max_leaves=20,
)
JSON_OBJECTS = st.dictionaries(JSON_KEYS, JSON_VALUES, max_size=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=JSON_OBJECTS, event_type=st.sampled_from([WEBHOOK, AGENT_CREATED]), key=JSON_KEYS.filter(bool))
# A webhook (a type the agent does not consume) is parsed once; agent/created is validated from its bytes.
def test_digest_of_any_payload_equals_the_live_digest(payload: dict[str, Any], event_type: str, key: str) -> None:
    live = LiveJournal()
    live.append("/agents/p", event_type, payload, key=key)
    value = live.records[0][1]
    assert decode_record(value)[1] == live.digests[("/agents/p", key)]
    assert decode_record(value)[1] == payload_hash(event_type, orjson.loads(value)["payload"])


# --- decoding and rows ---------------------------------------------------------------------------


def test_decode_record_decodes_as_decode_event() -> None:
    live = with_unusual_records(mixed_journal())
    for _, value, _ in live.records:
        try:
            expected = decode_event(value)
        except EnvelopeError:
            with pytest.raises(EnvelopeError):
                decode_record(value)
            continue
        event, _ = decode_record(value)
        assert type(event) is type(expected)
        if hasattr(expected, "envelope"):  # InvalidPayloadEvent: same envelope, same verdict
            assert (event.envelope, event.reason) == (expected.envelope, expected.reason)
        else:
            assert event == expected


@pytest.mark.parametrize("batch", [1, 3, 10_000])
def test_fold_rows_equal_catch_up_rows_and_live_rows(batch: int) -> None:
    live = mixed_journal()
    rows_replayed, folded = replayed(live.records, batch)
    rows_caught_up, refolded = caught_up(live.records)
    assert rows_replayed == rows_caught_up
    assert folded == refolded == len(live.records)
    # The live path stored the same rows; its journal position row is the journal's own offset.
    position = rows.position_key(0)
    assert row_codec.decode_offset(rows_replayed.pop(position)) == len(live.records) - 1
    assert rows_replayed.pop(rows.format_key(0)) == row_codec.encode_format()  # written on open, not per event
    assert rows_replayed == live.stored()


@pytest.mark.parametrize("batch", [1, 4, 10_000])
def test_fold_treats_unusual_records_as_catch_up_does(batch: int) -> None:
    live = with_unusual_records(mixed_journal())
    rows_replayed, folded = replayed(live.records, batch)
    rows_caught_up, refolded = caught_up(live.records)
    assert rows_replayed == rows_caught_up
    assert folded == refolded == len(live.records) - 3  # the duplicate and the two non-events
    assert rows.idempotency_key("/agents/a", "invalid/1") in rows_replayed
    assert rows.idempotency_key("/agents/a", "escaped/1") in rows_replayed


def test_take_returns_each_changed_row_once_with_its_latest_value() -> None:
    live = LiveJournal()
    for n in range(5):
        live.append("/agents/slot", CONTEXT_ADDED, {"role": "user", "content": f"v{n}", "key": "status"})
    fold = PartitionFold(0)
    fold.fold(live.records)
    batch = fold.take()
    meta = row_codec.decode_meta(batch[rows.meta_key("/agents/slot")])[0]
    assert meta.cursor == 5
    items = [value for key, value in batch.items() if key.startswith(rows.items_prefix("/agents/slot"))]
    assert len(items) == 1 and row_codec.decode_cell(items[0]).item.content == "v4"
    assert fold.take() == {}  # nothing changed since


def test_an_append_id_that_is_not_utf8_is_refused_as_the_live_path_refuses_it() -> None:
    # The fold keeps the id's bytes for its rows, but checks them as the live path's decoding does.
    with pytest.raises(UnicodeDecodeError):
        journal_headers([(H_SOURCE_OFFSET, b"3"), (H_APPEND_ID, b"\xff")])
    assert journal_headers([(H_APPEND_ID, "ü".encode()), (H_SOURCE_TOPIC, INTERNAL)]) == (True, -1, "ü".encode())
