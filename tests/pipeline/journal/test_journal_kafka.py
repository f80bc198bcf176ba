"""Integration: the journal processor against the real local broker (docs/behaviour.md §1, §5; docs/architecture.md)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from pipeline import base_policy
from pipeline.client import AppendRejected
from pipeline.journal.replay import replay
from pipeline.journal.replay_store import live_store_paths
from pipeline.journal.replay_verify import verify
from schemas.events import AGENT_CREATED, CONTEXT_ADDED, LLM_REQUEST_REQUESTED, STREAM_ERROR_OCCURRED
from tests.kafka_stack import Stack, wait_until
from topics.headers import H_REASON

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(tmp_path / "data")
    stack.start_worker()
    try:
        yield stack
    finally:
        stack.close()


def user(text: str, **extra: object) -> dict[str, object]:
    return {
        "type": CONTEXT_ADDED,
        "payload": {"role": "user", "content": text, "actor": {"type": "user", "origin": "cli"}, **extra},
    }


def test_1_append_round_trip_assigns_gapless_offsets_and_created_at(stack: Stack) -> None:
    """§1: the journal assigns offset 1, 2, 3, … per stream and createdAt in UTC with milliseconds."""
    agent = stack.client.agents.create()
    receipts = [agent.append(user(f"message {i}")) for i in range(20)]
    offsets = [receipt.wait(timeout=120) for receipt in receipts]
    assert offsets == list(range(3, 23))  # 1: agent/created, 2: the base policy
    events = stack.client.streams.get(agent.path).events()
    # The agent is alive: the scheduler may already have appended its first llm-request-requested.
    assert [e.offset for e in events] == list(range(1, len(events) + 1))
    assert {e.type for e in events[22:]} <= {LLM_REQUEST_REQUESTED}
    events = events[:22]
    assert events[0].type == AGENT_CREATED
    assert events[1].payload.key == "agent/system-prompt" and events[1].idempotencyKey == base_policy.IDEMPOTENCY_KEY
    assert all(e.createdAt.endswith("Z") and len(e.createdAt) == 24 for e in events)
    assert [e.createdAt for e in events] == sorted(e.createdAt for e in events)
    assert [e.payload.content for e in events[2:]] == [f"message {i}" for i in range(20)]


def test_many_streams_across_partitions_each_gapless(stack: Stack) -> None:
    """One writer per partition; every stream's offsets are its own gapless sequence."""
    streams = [stack.client.streams.get(f"/agents/many-{i}") for i in range(24)]
    receipts = [(s, s.append(user(f"{s.path} #{n}"))) for n in range(5) for s in streams]
    for _, receipt in receipts:
        receipt.wait(timeout=120)
    partitions = set()
    for stream in streams:
        events = stream.events()
        assert [e.offset for e in events] == [1, 2, 3, 4, 5]
        assert [e.payload.content for e in events] == [f"{stream.path} #{n}" for n in range(5)]
        from pipeline.kafka.partitioner import partition_for

        partitions.add(partition_for(stream.path, stack.settings.partitions))
    assert len(partitions) == stack.settings.partitions


def test_1_idempotency_key_same_body_is_a_no_op_and_different_body_is_rejected(stack: Stack) -> None:
    """§1: same key + same type + deep-equal payload returns the existing event; a different body is
    rejected naming the key and the existing offset."""
    stream = stack.client.streams.get("/agents/idem")
    first = stream.append({**user("hello"), "idempotencyKey": "web/msg/1"}).wait(timeout=120)
    again = stream.append({**user("hello"), "idempotencyKey": "web/msg/1"}).result(timeout=60)
    assert (again.status, again.offset) == ("duplicate", first)
    with pytest.raises(AppendRejected, match=r"'web/msg/1'.*@1"):
        stream.append({**user("changed"), "idempotencyKey": "web/msg/1"}).wait(timeout=60)
    assert [e.offset for e in stream.events()] == [1]


def test_bad_input_goes_to_the_dlq_with_its_reason_and_the_partition_keeps_going(stack: Stack) -> None:
    """Each kind of bad input lands in agent-dlq with the original bytes and a reason; the next good
    command on the same partition is journaled."""
    path = "/agents/dlq"
    stream = stack.client.streams.get(path)
    stream.append(user("before")).wait(timeout=120)
    bad_values = [
        b"this is not json",
        orjson.dumps({"streamPath": path, "payload": {}}),  # no type
        orjson.dumps(
            {"streamPath": path, "type": CONTEXT_ADDED, "payload": {"role": "user", "content": "x", "order": 1}}
        ),
        orjson.dumps(
            {
                "streamPath": path,
                "type": CONTEXT_ADDED,
                "payload": {"role": "developer", "content": "s", "compaction": {"replacesHistoryThrough": 1}},
            }
        ),  # compaction without dont-trigger policy
        orjson.dumps({"streamPath": "relative/path", "type": "x/y", "payload": {}}),
    ]
    for value in bad_values:
        stack.produce_raw(value, key=path.encode())
    # A command keyed by another path: it would reach a partition that does not own its stream.
    misrouted = orjson.dumps({"streamPath": path, "type": CONTEXT_ADDED, "payload": {"role": "user", "content": "x"}})
    stack.produce_raw(misrouted, key=b"/agents/someone-else")
    assert stream.append(user("after")).wait(timeout=60) == 2
    # The misrouted command sits on another partition, whose writer commits on its own schedule.
    dlq = wait_until(
        lambda: (
            (records := stack.read_topic(stack.client.topics.dlq))
            and any(m.key() == b"/agents/someone-else" for m in records)
            and records
        ),
        60,
        "the misrouted command in agent-dlq",
    )  # one partition per key: in produce order
    misrouted_records = [m for m in dlq if m.key() == b"/agents/someone-else"]
    assert len(misrouted_records) == 1 and b"not the streamPath" in dict(misrouted_records[0].headers())[H_REASON]
    dlq = [m for m in dlq if m.key() != b"/agents/someone-else"]
    assert [m.value() for m in dlq] == bad_values
    reasons = [dict(m.headers())[H_REASON].decode() for m in dlq]
    assert "not an append command" in reasons[0]
    assert "type" in reasons[1] and "missing" in reasons[1]
    assert "payload.order: unknown field" in reasons[2]
    assert reasons[3].startswith("forbidden: ") and "compaction" in reasons[3]  # worker-only on agent-appends
    assert "streamPath" in reasons[4]
    assert [e.payload.content for e in stream.events()] == ["before", "after"]


def test_consumed_types_are_validated_at_append_time_but_other_types_pass(stack: Stack) -> None:
    """§1.1: any other type is journaled (and ignored by the reducer); consumed types are strict."""
    stream = stack.client.streams.get("/integrations/github/main")
    offset = stream.append({"type": "events.iterate.com/github/webhook-received", "payload": {"any": [1, 2]}}).wait(
        timeout=120
    )
    assert offset == 1
    with pytest.raises(AppendRejected, match="message"):
        stream.append({"type": STREAM_ERROR_OCCURRED, "payload": {}}).wait(timeout=60)


def test_agent_append_accepts_only_consumed_inputs(stack: Stack) -> None:
    """§5: agent.append is typed by the agent's consumed inputs, validated by the same schema."""
    agent = stack.client.agents.create()
    with pytest.raises(ValueError, match="unknown type"):
        agent.append({"type": "events.iterate.com/github/webhook-received", "payload": {}})
    with pytest.raises(ValueError, match=r"payload\.role"):
        agent.append({"type": CONTEXT_ADDED, "payload": {"role": "boss", "content": "x"}})


def test_worker_restart_resumes_with_identical_projections_and_replay_equals_live(stack: Stack, tmp_path: Path) -> None:
    """Rows survive a restart (and a SIGKILL); the journal rebuilds the same projection; replay == live."""
    agents = [stack.client.agents.create() for _ in range(6)]
    for n in range(10):
        for agent in agents:
            payload = user(f"n{n}")
            if n % 3 == 0:
                payload["payload"]["key"] = "status"  # type: ignore[index]
            agent.append(payload)
    last = [agent.append(user("last")) for agent in agents]
    for receipt in last:
        receipt.wait(timeout=120)
    # The agents are live: the scheduler may append a request at any moment, so compare journals.
    before = {a.path: [e.model_dump_json() for e in a.stream.events()] for a in agents}

    stack.stop_worker(signal.SIGKILL)
    stack.start_worker()
    more = [(agent, agent.append(user("after restart"))) for agent in agents]
    for agent, receipt in more:
        offset = receipt.wait(timeout=180)
        events = agent.stream.events()
        assert [e.offset for e in events] == list(range(1, len(events) + 1))
        journal = [e.model_dump_json() for e in events]
        assert journal[: len(before[agent.path])] == before[agent.path]  # nothing lost or rewritten
        restarted = [e for e in events if e.type == CONTEXT_ADDED and e.payload.content == "after restart"]
        assert [e.offset for e in restarted] == [offset]
    # The rows the worker kept across the SIGKILL equal a fold of the journal alone: replay --verify.

    stack.stop_worker()  # rows are flushed on a clean stop
    out = tmp_path / "replay"
    stats = replay(stack.settings, out, progress=False)
    assert stats.events == sum(len(a.stream.events()) for a in agents)
    assert verify(out, live_store_paths(stack.settings)) == []
