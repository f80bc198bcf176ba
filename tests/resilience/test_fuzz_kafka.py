"""Fuzz: hostile and careless records on `agent-appends` never stop the journal worker, never get
lost and never leak into another stream (docs/behaviour.md, "What the journal accepts").

Hypothesis generates arbitrary bytes, arbitrary JSON values (deep nesting, huge and tiny numbers,
NaN and infinities, every Unicode category), commands whose paths are built from hostile
characters, and commands sized around `maxEventBytes`. They are produced to `agent-appends` of a
live worker whose agents take turns (no caller: each request expires fast and the next one is
rendered). Then, per record:

- it is journaled (a journal record names its source offset), or dead-lettered with a reason, or
  it repeats an idempotency key / append id produced before it (a duplicate: neither);
- no reason is `internal_error` (the contract lets one through without stopping the partition,
  but here it would be a bug worth a failing test);
- the worker never exits;
- no stream's projection holds another stream's item: every item is tagged `<<path>>` with the
  stream it was sent to, checked in the live rows of every stream and in every request body the
  worker published to `llm-requests`, and `replay --verify` finds the live rows (the full row set)
  equal to a fold of the journal.

Bounded for `make test` (AGENTSTREAM_FUZZ_EXAMPLES batches, 40 by default, derandomized so CI is
repeatable); set AGENTSTREAM_FUZZ_EXAMPLES higher and AGENTSTREAM_FUZZ_RANDOM=1 for a soak.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.journal.replay import replay
from pipeline.journal.replay_store import RdictRows, live_store_paths, open_rows
from pipeline.journal.replay_verify import verify
from pipeline.kafka.partitioner import partition_for
from pipeline.metrics import dlq_reason_label
from processors import row_codec, rows
from schemas.events import (
    AGENT_CONFIGURED,
    AGENT_CREATED,
    AGENT_PAUSED,
    CONTEXT_ADDED,
    LLM_REQUEST_SETTLED,
    STREAM_ERROR_OCCURRED,
    TOKEN_USAGE_REPORTED,
)
from tests.kafka_stack import BOOTSTRAP, Stack
from topics.headers import H_REASON, H_SOURCE_OFFSET, H_SOURCE_TOPIC

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(900)]

EXAMPLES = int(os.environ.get("AGENTSTREAM_FUZZ_EXAMPLES", "40"))
RANDOM = os.environ.get("AGENTSTREAM_FUZZ_RANDOM") == "1"
PARTITIONS = 2
POOL = ["/fuzz/a", "/fuzz/b", "/fuzz/a/b", "/fuzz/A", "/fuzz/a.b", "/fuzz/x~y:z@w+v-u_t"]
HOSTILE = ["\x00z4", "\n@9 actor=user:web", " ", "\u202e", "/", "/..", "//x", "\t", "\u0085", "\ud7ff", "é", ""]
TAG = re.compile(r"<<(/[^>]*)>>")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(tmp_path / "data", partitions=PARTITIONS)
    stack.start_worker()
    try:
        yield stack
    finally:
        stack.close()


# --- strategies --------------------------------------------------------------------------------------

huge_ints = st.integers(min_value=-(2**80), max_value=2**80)
floats = st.floats(allow_nan=True, allow_infinity=True)
json_values = st.recursive(
    st.none() | st.booleans() | huge_ints | floats | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=25,
)


@st.composite
def deep(draw: st.DrawFn) -> Any:
    value: Any = draw(json_values)
    for _ in range(draw(st.integers(min_value=100, max_value=260))):
        value = [value]
    return value


@st.composite
def paths(draw: st.DrawFn) -> str:
    base = draw(st.sampled_from(POOL))
    kind = draw(st.integers(0, 19))
    if kind < 16:
        return base  # most commands reach real streams, so projections grow and render
    if kind < 19:
        return base + draw(st.sampled_from(HOSTILE))
    return draw(st.text(max_size=20))


actors = st.one_of(
    st.none(),
    st.fixed_dictionaries({"type": st.just("agent"), "path": paths()}),
    st.fixed_dictionaries({"type": st.just("user"), "origin": st.sampled_from(["web", "cli", "tty"])}),
    st.fixed_dictionaries({"type": st.just("github"), "login": st.text(max_size=10)}),
    json_values,
)


def rarely(draw: st.DrawFn, one_in: int) -> bool:
    return draw(st.integers(0, one_in - 1)) == 0


POLICIES = ["after-current-request", "dont-trigger-request", "interrupt-current-request"]


@st.composite
def context_items(draw: st.DrawFn, path: str) -> dict[str, Any]:
    """Mostly valid items (so projections grow and render), each field sometimes hostile."""
    roles = ["developer", "user", "user", "assistant", "system"] + (["robot"] if rarely(draw, 8) else [])
    item: dict[str, Any] = {"role": draw(st.sampled_from(roles)), "content": f"<<{path}>>" + draw(st.text(max_size=40))}
    if rarely(draw, 3):
        item["key"] = draw(st.sampled_from(["k1", "k2", "agent/system-prompt", "k1", ""]))
    if rarely(draw, 3):
        item["actor"] = draw(actors)
    if rarely(draw, 5):
        item["refs"] = [{"type": "event", "streamPath": draw(paths()), "offset": draw(huge_ints)}]
    if rarely(draw, 6):
        item["llmRequestOffset"] = draw(st.integers(min_value=-3, max_value=40))
    if rarely(draw, 7):
        item["compaction"] = {"replacesHistoryThrough": draw(st.integers(min_value=1, max_value=40))}
        item["llmRequestPolicy"] = {"behaviour": "dont-trigger-request"}
    elif rarely(draw, 2):
        item["llmRequestPolicy"] = {"behaviour": draw(st.sampled_from(POLICIES))}
    if rarely(draw, 10):
        item["extra"] = draw(json_values)
    return item


@st.composite
def commands(draw: st.DrawFn) -> tuple[bytes | None, bytes]:
    path = draw(paths())
    event_type = draw(
        st.sampled_from(
            [CONTEXT_ADDED] * 6
            + [AGENT_PAUSED, LLM_REQUEST_SETTLED, TOKEN_USAGE_REPORTED, STREAM_ERROR_OCCURRED, AGENT_CONFIGURED]
            + ["com.example/any", "events.iterate.com/capability-host/script-run-settled"]
        )
    )
    if event_type == CONTEXT_ADDED:
        payload: Any = draw(context_items(path))
    elif event_type == AGENT_CONFIGURED:
        payload = {"config": draw(json_values)}
    else:
        objects = st.dictionaries(st.text(max_size=6), json_values, max_size=3)
        payload = draw(json_values if rarely(draw, 5) else objects)
    if draw(st.integers(0, 9)) == 0:
        payload = {"n": draw(deep())}
    command: dict[str, Any] = {"streamPath": path, "type": event_type, "payload": payload}
    if draw(st.booleans()):
        command["idempotencyKey"] = draw(st.sampled_from(["i1", "i2", "i3", "i4", "i5", "i6", "i7", ""]))
    if draw(st.integers(0, 3)) == 0:
        command["appendId"] = draw(st.sampled_from(["a1", "a2"]))
    key_kind = draw(st.integers(0, 19))
    key: bytes | None = path.encode("utf-8", "surrogatepass")
    if key_kind == 0:
        key = None
    elif key_kind == 1:
        key = draw(st.binary(max_size=12))
    return key, json.dumps(command, allow_nan=True).encode("utf-8", "surrogatepass")


@st.composite
def sized(draw: st.DrawFn, limit: int) -> tuple[bytes | None, bytes]:
    """A command whose size is just under, at, or just over maxEventBytes."""
    path = draw(st.sampled_from(POOL))
    head = {"streamPath": path, "type": CONTEXT_ADDED}
    overhead = len(json.dumps({**head, "payload": {"role": "user", "content": f"<<{path}>>"}}))
    size = limit + draw(st.integers(min_value=-2, max_value=2))
    content = f"<<{path}>>" + "x" * (size - overhead)
    value = json.dumps({**head, "payload": {"role": "user", "content": content}}).encode()
    return path.encode(), value


records = st.one_of(
    st.tuples(st.sampled_from(POOL).map(str.encode), st.binary(max_size=64)),
    st.tuples(st.sampled_from(POOL).map(str.encode), json_values.map(lambda v: json.dumps(v, allow_nan=True).encode())),
    commands(),
    commands(),
    commands(),
    commands(),
    commands(),
    commands(),
)


# --- the test ------------------------------------------------------------------------------------------


def sentinel_path(partition: int) -> str:
    return next(
        f"/fuzz/sentinel-{i}" for i in range(1000) if partition_for(f"/fuzz/sentinel-{i}", PARTITIONS) == partition
    )


def test_fuzz_no_record_stops_the_worker_is_lost_or_leaks_into_another_stream(stack: Stack, tmp_path: Path) -> None:
    client = stack.client
    # Living agents that take turns quickly: requests expire after 1 s, so many get rendered.
    for path in POOL:
        agent = client.agents.get(path)
        agent.append({"type": AGENT_CREATED, "payload": {}, "idempotencyKey": "agent/created"}).wait(120)
        agent.append(
            {"type": AGENT_CONFIGURED, "payload": {"config": {"llmRequestExpiryMs": 1000, "llmRequestDebounceMs": 0}}}
        ).wait(60)
        agent.append(
            {
                "type": CONTEXT_ADDED,
                "payload": {"role": "system", "content": f"<<{path}>>", "key": "agent/system-prompt"},
            }
        ).wait(60)

    producer = Producer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "partitioner": "murmur2_random",
            "message.max.bytes": 2_000_000,
            "log_level": 3,
        }
    )
    delivered: list[tuple[int, int, bytes]] = []  # (partition, offset, value)

    def on_delivery(error: Any, message: Any) -> None:
        if error is None:
            delivered.append((message.partition(), message.offset(), message.value()))

    def produce(key: bytes | None, value: bytes) -> None:
        producer.produce(client.topics.appends, key=key, value=value, on_delivery=on_delivery)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=not RANDOM,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(batch=st.lists(records, min_size=5, max_size=40), big=sized(stack.settings.max_event_bytes))
    def produce_batch(batch: list[tuple[bytes | None, bytes]], big: tuple[bytes | None, bytes]) -> None:
        for key, value in [*batch, big]:
            produce(key, value)
        producer.poll(0)

    produce_batch()
    assert producer.flush(60) == 0
    # A partition handles its records in order: once a sentinel after them is journaled, all are.
    for partition in range(PARTITIONS):
        client.streams.get(sentinel_path(partition)).append({"type": "com.example/sentinel", "payload": {}}).wait(180)
    assert stack.worker is not None and stack.worker.poll() is None, stack.worker_log()[-5000:]

    journaled: set[tuple[int, int]] = set()
    for message in stack.read_topic(client.topics.journal):
        headers = dict(message.headers() or ())
        if H_SOURCE_TOPIC not in headers:
            journaled.add((message.partition(), int(headers[H_SOURCE_OFFSET])))
    dead: dict[tuple[int, int], str] = {}
    for message in stack.read_topic(client.topics.dlq):
        headers = dict(message.headers() or ())
        if headers["source-topic"] == client.topics.appends.encode():
            dead[(message.partition(), int(headers[H_SOURCE_OFFSET]))] = headers[H_REASON].decode()

    seen_keys: dict[str, set[tuple[str, str]]] = defaultdict(set)  # path -> (kind, key) produced before
    unaccounted: list[str] = []
    for partition, offset, value in sorted(delivered):
        where = (partition, offset)
        repeats = False
        try:
            command = orjson.loads(value)
            if isinstance(command, dict) and isinstance(command.get("streamPath"), str):
                path = command["streamPath"]
                for kind in ("idempotencyKey", "appendId"):
                    key = command.get(kind)
                    if isinstance(key, str):
                        repeats = repeats or (kind, key) in seen_keys[path]
                        seen_keys[path].add((kind, key))
        except orjson.JSONDecodeError:
            pass
        if where in journaled:
            continue
        if where in dead:
            assert dead[where], f"{where}: dead-lettered without a reason"
            continue
        if not repeats:
            unaccounted.append(f"{where}: {value[:200]!r}")
    assert not unaccounted, f"{len(unaccounted)} records neither journaled nor dead-lettered: {unaccounted[:5]}"
    internal_errors = [reason for reason in dead.values() if reason.startswith("internal_error")]
    assert not internal_errors, internal_errors[:5]
    assert len(journaled) > EXAMPLES, "the fuzz journaled almost nothing: the strategies miss the valid space"

    # No leak into what the model is sent: every request body holds only its own stream's items.
    leaks: list[str] = []
    bodies = 0
    for message in stack.read_topic(client.topics.llm_requests):
        record = orjson.loads(message.value())
        if record.get("kind") != "call":
            continue
        bodies += 1
        for tag in TAG.findall(orjson.dumps(record["messages"]).decode()):
            if tag != record["streamPath"]:
                leaks.append(f"request @{record['requestOffset']} of {record['streamPath']} holds an item of {tag}")
    assert bodies > 0, "no request was rendered: the fuzz would not see a leak into a request"

    # ... nor into the stored projections, and the live rows equal a fold of the journal.
    stack.stop_worker(signal.SIGTERM, timeout=60)
    for db_path in live_store_paths(stack.settings).values():
        db = open_rows(db_path, read_only=True)
        try:
            table = RdictRows(db)
            for key, meta in list(table.scan(rows.META + rows.SEP)):
                path = key[2:].decode()
                state, _ = row_codec.load_state(meta, table.scan(rows.items_prefix(path)))
                for cell in (*state.system.cells, *state.history.cells):
                    tag = TAG.match(cell.item.content)
                    if tag is not None and tag.group(1) != path:
                        leaks.append(f"{path} @{cell.offset} holds an item of {tag.group(1)}")
        finally:
            db.close()
    assert not leaks, leaks[:10]
    out = tmp_path / "replay"
    replay(stack.settings, out, progress=False)
    differences = verify(out, live_store_paths(stack.settings))
    assert differences == [], [str(d) for d in differences[:10]]
    kinds = Counter(dlq_reason_label(reason) for reason in dead.values())
    print(
        f"\nfuzz: {len(delivered)} records produced, {len(journaled)} journaled, {len(dead)} dead-lettered "
        f"({dict(kinds.most_common())}), {bodies} request bodies rendered; no leak, replay equals live"
    )
