"""The journal writer's commit protocol without a broker (docs/architecture.md, "Commit protocol").

A `PartitionEngine` is driven with a dict-backed row store and an in-memory transactional producer
(`tests/support/journal_fakes.py`) that can fail or be fenced at any step, so each step's order
and each failure mode is checked exactly: nothing of a checkpoint is visible before its commit,
the rows are stored only after it, a fenced partition is dropped without writing anything more,
any other failure is fatal with the store untouched, and nothing a command holds stops the
partition.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import orjson
import pytest

from pipeline import metrics
from pipeline.journal import records
from pipeline.journal.checkpoint import CommandPositions, Status, Transaction, changelog_groups
from pipeline.journal.decisions import CommandRecord
from pipeline.journal.engine import PartitionEngine
from pipeline.journal.recovery import Recovery
from pipeline.kafka.producer import Fenced
from processors import row_codec, rows
from schemas.capabilities import SCRIPT_RUN_REQUESTED, SCRIPT_RUN_SETTLED
from schemas.events import (
    AGENT_CREATED,
    CONTEXT_ADDED,
    LLM_REQUEST_REQUESTED,
    LLM_REQUEST_SETTLED,
    STREAM_ERROR_OCCURRED,
    TOKEN_USAGE_REPORTED,
)
from tests.support.engine_harness import NAMES, PATH, SYSTEM, EngineHarness, committer, user
from tests.support.journal_fakes import DictStore, FakeTransactions
from topics.headers import H_REASON, H_SOURCE_OFFSET, H_SOURCE_TOPIC, SCHEDULER

POSITIONS = (rows.POSITION + rows.SEP, rows.COMMAND_POSITIONS + rows.SEP)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_5_2_nothing_of_a_checkpoint_is_visible_or_stored_before_its_commit() -> None:
    async def scenario() -> None:
        h = EngineHarness()
        h.engine.checkpoints.open.put(b"x", b"y")  # the test decides when the committer runs: nothing is pending
        await h.engine.checkpoints.flush()
        commit = asyncio.Event()
        real_commit = h.kafka.commit

        async def held(*args: Any) -> None:
            await commit.wait()
            await real_commit(*args)

        h.kafka.commit = held  # type: ignore[method-assign]
        await h.handle(h.command(user("hi", appendId="x1")))
        for _ in range(5):
            await asyncio.sleep(0)
        assert h.kafka.committed[-1].topic == DictStore.changelog_topic  # only the first checkpoint
        assert h.kafka.on(NAMES.journal) == [] and h.kafka.on(NAMES.results) == []
        assert rows.meta_key(PATH) not in h.table.stored  # not before the transaction commits
        assert h.engine.streams.read(rows.meta_key(PATH)) is not None  # but reads see the rows being committed
        commit.set()
        await h.settle()
        assert rows.meta_key(PATH) in h.table.stored
        assert len(h.kafka.on(NAMES.journal)) == 1
        (result,) = h.kafka.outcomes(NAMES.results)
        assert result == {"appendId": "x1", "streamPath": PATH, "status": "journaled", "offset": 1}
        assert h.table.changelog_offset == h.kafka.on(DictStore.changelog_topic)[-1].offset

    run(scenario())


def test_5_2_a_checkpoint_is_one_transaction_journal_first_then_follow_ups_then_rows_positions_last() -> None:
    async def scenario() -> None:
        h = EngineHarness()
        await h.handle(h.command(user("one", appendId="x1")), h.command(user("two", appendId="x2")))
        await h.settle()
        assert h.kafka.transactions == 1
        topics = [record.topic for record in h.kafka.committed]
        journal_at = [i for i, t in enumerate(topics) if t == NAMES.journal]
        results_at = [i for i, t in enumerate(topics) if t == NAMES.results]
        changelog_at = [i for i, t in enumerate(topics) if t == DictStore.changelog_topic]
        assert max(journal_at) < min(results_at) and max(results_at) < min(changelog_at)
        assert h.kafka.steps[:4] == ["begin", "send", "send", "barrier"]  # both journal records, then wait
        keys = [record.key for record in h.kafka.on(DictStore.changelog_topic)]
        assert keys[-1] == rows.command_positions_key(0)  # the positions claim everything before them
        assert keys.index(rows.meta_key(PATH)) > max(
            i for i, key in enumerate(keys) if key.startswith(rows.items_prefix(PATH))
        )

    run(scenario())


def test_5_2_the_command_positions_are_committed_with_the_commands_rows() -> None:
    async def scenario() -> None:
        h = EngineHarness()
        await h.handle(h.command(user("one")), h.command(user("two")), h.command(user("in"), internal=True))
        await h.settle()
        assert h.engine.checkpoints.positions.done == {False: 1, True: 0}
        stored = CommandPositions.decode(h.table.stored[rows.command_positions_key(0)])
        assert stored.done == {False: 1, True: 0}
        await h.handle(h.command(user("three")))
        await h.settle()
        stored = CommandPositions.decode(h.table.stored[rows.command_positions_key(0)])
        assert stored.done == {False: 2, True: 0}  # a topic the checkpoint did not read keeps its position

    run(scenario())


def test_5_2_the_journal_position_stored_never_passes_the_rows_it_covers() -> None:
    """`p` is a journal offset whose rows are stored: the last one acknowledged before the rows."""

    async def scenario() -> None:
        h = EngineHarness()
        for text in ("one", "two", "three"):
            await h.handle(h.command(user(text)))
            await h.settle()
            position = h.table.stored.get(rows.position_key(0))
            if position is not None:
                cursor = row_codec.decode_meta_row(h.table.stored[rows.meta_key(PATH)]).cursor
                assert row_codec.decode_offset(position) <= cursor - 1  # journal offsets count from 0
        assert row_codec.decode_offset(h.table.stored[rows.position_key(0)]) == 1

    run(scenario())


@pytest.mark.parametrize("step", ["begin", "send", "barrier", "commit"])
def test_5_2_a_fenced_partition_is_dropped_at_once_and_writes_nothing(step: str) -> None:
    async def scenario() -> None:
        h = EngineHarness()
        await h.handle(h.command(user("zero")))
        await h.settle()
        stored = dict(h.table.stored)
        committed = len(h.kafka.committed)
        fenced_before = metrics.FENCED._value.get()
        h.kafka.fail_next[step] = Fenced("producer fenced by a newer epoch")
        await h.handle(h.command(user("one", appendId="x1")))
        await h.settle()
        assert h.dropped == [0] and not h.fatal  # the worker keeps its other partitions
        assert h.engine.checkpoints.fenced is not None and not h.engine.active
        assert metrics.FENCED._value.get() == fenced_before + 1
        assert len(h.kafka.committed) == committed and h.table.stored == stored
        await h.handle(h.command(user("late")))  # read before the reader let go: decided no more
        await h.settle()
        assert len(h.kafka.committed) == committed and h.kafka.steps.count("begin") == 2

    run(scenario())


@pytest.mark.parametrize("step", ["begin", "send", "barrier", "commit"])
def test_5_2_any_other_failure_is_fatal_and_leaves_the_store_and_positions_untouched(step: str) -> None:
    async def scenario() -> None:
        h = EngineHarness()
        await h.handle(h.command(user("zero")))
        await h.settle()
        stored = dict(h.table.stored)
        h.kafka.fail_next[step] = RuntimeError("broker unreachable")
        await h.handle(h.command(user("one", appendId="x1")))
        for _ in range(5):
            await asyncio.sleep(0)
        assert h.fatal and "broker unreachable" in str(h.fatal[0])
        assert h.table.stored == stored and h.engine.checkpoints.positions.done[False] == 0
        assert h.kafka.on(NAMES.results) == [] and len(h.kafka.on(NAMES.journal)) == 1

    run(scenario())


def test_a_checkpoint_is_used_once() -> None:
    async def scenario() -> None:
        kafka = FakeTransactions()
        commits = committer(kafka)
        handle = commits.join(0, DictStore(), on_fenced=lambda _error: None)
        checkpoint = handle.open
        checkpoint.put(b"k", b"v")
        await commits.commit()
        assert checkpoint.status is Status.COMMITTED and handle.open is not checkpoint
        with pytest.raises(RuntimeError, match="committed, not open"):
            checkpoint.put(b"k", b"w")
        with pytest.raises(RuntimeError, match="committed, not open"):
            await Transaction([(handle, checkpoint)]).commit(
                kafka, NAMES.journal, NAMES.results, (NAMES.appends, NAMES.internal_appends), None
            )

    run(scenario())


def test_the_next_batch_is_decided_while_a_checkpoint_commits() -> None:
    async def scenario() -> None:
        h = EngineHarness()
        release = asyncio.Event()
        real_commit = h.kafka.commit

        async def slow(*args: Any) -> None:
            await release.wait()
            await real_commit(*args)

        h.kafka.commit = slow  # type: ignore[method-assign]
        await h.handle(h.command(user("one")))
        for _ in range(5):
            await asyncio.sleep(0)
        assert h.engine.checkpoints.committing is not None
        await h.handle(h.command(user("two")))  # decided on top of the rows being committed
        release.set()
        await h.settle()
        assert [orjson.loads(r.value)["offset"] for r in h.kafka.on(NAMES.journal)] == [1, 2]
        assert h.kafka.transactions == 2

    run(scenario())


def test_a_revoked_partition_decides_nothing_more() -> None:
    async def scenario() -> None:
        h = EngineHarness()
        h.engine.active = False
        await h.handle(h.command(user("late")))
        await h.settle()
        assert h.kafka.on(NAMES.journal) == []

    run(scenario())


def test_a_redelivered_command_publishes_its_outcome_again_and_is_not_journaled_twice() -> None:
    async def scenario() -> None:
        h = EngineHarness()
        first = h.command(user("one", appendId="x1"))
        await h.handle(first)
        await h.settle()
        await h.handle(first)  # the same record again (a restart before it was done)
        await h.settle()
        assert len(h.kafka.on(NAMES.journal)) == 1
        results = h.kafka.outcomes(NAMES.results)
        assert [r["offset"] for r in results] == [1, 1] and {r["status"] for r in results} == {"journaled"}

    run(scenario())


class Exploding(PartitionEngine):
    """Fails on the follow-ups of a "boom" item: after the fold has changed the stream's state."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        follow_ups = self.follow_ups.after

        def after(entry: Any, event: Any) -> Any:
            if getattr(event.payload, "content", "") == "boom":
                raise RuntimeError("boom")
            return follow_ups(entry, event)

        self.follow_ups.after = after  # type: ignore[method-assign]


def test_nothing_a_command_holds_stops_the_partition() -> None:
    """An exception while deciding (here: after the fold had changed the state) dead-letters the
    command as internal_error, the stream's state reloads from its rows, and the next command
    continues the stream's offsets as if the failed one had never been."""

    async def scenario() -> None:
        h = EngineHarness(Exploding)
        await h.handle(h.command(user("ok1")), h.command(user("boom", appendId="x2")), h.command(user("ok2")))
        await h.settle()
        journal = [orjson.loads(r.value) for r in h.kafka.on(NAMES.journal)]
        assert [(e["offset"], e["payload"]["content"]) for e in journal] == [(1, "ok1"), (2, "ok2")]
        (dead,) = h.kafka.on(NAMES.dlq)
        assert dead.headers[H_REASON] == b"internal_error: RuntimeError: boom" and dead.headers[H_SOURCE_OFFSET] == b"1"
        assert orjson.loads(dead.value)["payload"]["content"] == "boom"
        (result,) = h.kafka.outcomes(NAMES.results)
        assert result["status"] == "rejected" and result["reason"].startswith("internal_error")
        assert not h.fatal
        assert h.engine.checkpoints.positions.done[False] == 2

    run(scenario())


def test_5_1_4_a_failure_after_earlier_events_of_the_stream_in_the_same_checkpoint_keeps_them_exactly() -> None:
    """A stream's item and metadata rows are written once per checkpoint (at its seal). A command
    that fails after other events of its stream were folded into the same open checkpoint must
    leave the stream as those events made it: the next event continues the offsets, and the rows
    stored equal what re-folding the journal writes."""

    async def scenario() -> None:
        h = EngineHarness(Exploding)
        await h.handle(h.command(SYSTEM), h.command(user("hello")))
        await h.settle()
        # One checkpoint: two good events, the failure, another good one.
        await h.handle(
            h.command(user("one", idempotencyKey="k1")),
            h.command(user("two", appendId="a2")),
            h.command(user("boom")),
            h.command(user("three")),
        )
        await h.settle()
        journal = [orjson.loads(r.value) for r in h.kafka.on(NAMES.journal)]
        assert [(e["offset"], e["payload"]["content"]) for e in journal][-3:] == [(3, "one"), (4, "two"), (5, "three")]
        live = {k: v for k, v in h.table.stored.items() if not k.startswith(POSITIONS)}
        records = [(offset, r.value, r.headers) for offset, r in enumerate(h.kafka.on(NAMES.journal))]
        fresh = DictStore()
        engine = PartitionEngine(0, fresh, NAMES, committer(h.kafka, h.fatal.append), max_cached_streams=100)
        Recovery(engine).refold(records, [])
        await engine.checkpoints.flush()
        again = {k: v for k, v in fresh.stored.items() if not k.startswith(POSITIONS)}
        assert again == live, sorted(set(again) ^ set(live))[:5]
        state = h.engine.streams.get(PATH).state
        assert state.cursor == 5 and [c.item.content for c in state.history.cells][-3:] == ["one", "two", "three"]

    run(scenario())


def test_worker_only_events_are_refused_on_the_public_topic_and_taken_from_the_internal_one() -> None:
    async def scenario() -> None:
        h = EngineHarness()
        settled = {
            "type": LLM_REQUEST_SETTLED,
            "payload": {"requestOffset": 1, "result": {"status": "failed", "errorMessage": "x"}},
        }
        await h.handle(h.command(settled), h.command(settled, internal=True))
        await h.settle()
        (dead,) = h.kafka.on(NAMES.dlq)
        assert dead.headers[H_REASON].startswith(b"forbidden: ")
        (journaled,) = [orjson.loads(r.value) for r in h.kafka.on(NAMES.journal)]
        assert journaled["type"] == LLM_REQUEST_SETTLED
        assert h.engine.checkpoints.positions.done == {False: 0, True: 0}

    run(scenario())


def test_source_offsets_are_per_command_topic() -> None:
    """Offset 0 of the internal topic is not offset 0 of agent-appends: both are journaled."""

    async def scenario() -> None:
        h = EngineHarness()
        await h.handle(h.command(user("public"), offset=0), h.command(user("internal"), internal=True, offset=0))
        await h.settle()
        assert [orjson.loads(r.value)["offset"] for r in h.kafka.on(NAMES.journal)] == [1, 2]

    run(scenario())


def restarted(h: EngineHarness) -> PartitionEngine:
    """A new engine on the same stored rows: what a restarted worker holds (nothing in memory)."""
    return PartitionEngine(
        0, h.table, NAMES, committer(h.kafka, h.fatal.append), max_cached_streams=100, fatal=h.fatal.append
    )


def llm_requests(h: EngineHarness) -> list[dict[str, Any]]:
    return [orjson.loads(r.value) for r in h.kafka.on(NAMES.llm_requests)]


def request(idempotency_key: str, model: str = "m") -> dict[str, Any]:
    payload = {"model": model, "expiresAt": 2**40}
    return {"type": LLM_REQUEST_REQUESTED, "payload": payload, "idempotencyKey": idempotency_key}


def test_recovery_publishes_an_open_requests_call_record_again_exactly() -> None:
    """The worker may die between journaling a request and publishing its call record: after the
    restart the open request's record goes out again, rendered as the request saw it (items
    journaled after it left out), byte for byte, from the stored rows alone."""

    async def scenario() -> None:
        h = EngineHarness()
        await h.handle(h.command(SYSTEM), h.command(user("hello")))
        await h.handle(h.command(request("r/2"), internal=True))
        await h.settle()
        (first,) = llm_requests(h)
        notes = {"role": "developer", "content": "after the request", "key": "notes"}
        await h.handle(h.command({"type": CONTEXT_ADDED, "payload": notes}), h.command(user("more")))
        await h.settle()
        engine = restarted(h)
        Recovery(engine).wake_streams_with_work()
        again = Recovery(engine).open_work()
        assert [(topic, key) for topic, key, _ in again] == [(NAMES.llm_requests, PATH.encode())]
        assert orjson.loads(again[0][2]) == first
        assert b"after the request" not in again[0][2]
        assert engine.wakeups and engine.wakeups[0][1] == PATH  # the scheduler looks at it again too

    run(scenario())


def test_a_journaled_settlement_notifies_the_caller_and_recovery_publishes_nothing_more() -> None:
    async def scenario() -> None:
        h = EngineHarness()
        await h.handle(h.command(SYSTEM), h.command(user("hello")))
        await h.handle(h.command(request("r/2"), internal=True))
        settled = {"requestOffset": 3, "result": {"status": "succeeded", "text": "hi"}}
        await h.handle(h.command({"type": LLM_REQUEST_SETTLED, "payload": settled}, internal=True))
        await h.settle()
        # Once the settlement is journaled the caller is told, so a re-read call record is dropped.
        assert llm_requests(h)[1] == {"kind": "settled", "streamPath": PATH, "requestOffset": 3}
        assert Recovery(restarted(h)).open_work() == []

    run(scenario())


def test_recovery_publishes_the_cancel_of_an_interrupted_open_request_after_its_call_record() -> None:
    """An interrupt journaled while R is open: its cancel may be lost with the worker. After the
    restart R's call record and then the cancel go out (same partition, in that order), so a caller
    that never ran R settles it cancelled at once, and one that runs it aborts it."""

    async def scenario() -> None:
        h = EngineHarness()
        await h.handle(h.command(SYSTEM), h.command(user("hello")))
        await h.handle(h.command(request("r/2"), internal=True))
        interrupt = user("stop", llmRequestPolicy={"behaviour": "interrupt-current-request"})
        interrupt["payload"]["llmRequestPolicy"] = interrupt.pop("llmRequestPolicy")
        await h.handle(h.command(interrupt))
        await h.settle()
        assert [r["kind"] for r in llm_requests(h)] == ["call", "cancel"]
        again = [orjson.loads(value) for _, _, value in Recovery(restarted(h)).open_work()]
        assert [r["kind"] for r in again] == ["call", "cancel"]
        assert again[1] == {
            "kind": "cancel",
            "streamPath": PATH,
            "requestOffset": 3,
            "reason": "interrupted-by-user-input",
        }

    run(scenario())


def test_recovery_publishes_a_pending_compaction_with_the_messages_of_its_request() -> None:
    """A usage report over the threshold asks for a compaction of R with R's messages, byte for
    byte. After a restart those messages are no longer in memory: they are rendered again from the
    rows, and the compaction goes out (formerly it was skipped with a warning)."""

    async def scenario() -> None:
        h = EngineHarness()
        await h.handle(h.command(SYSTEM), h.command(user("hello")))
        await h.handle(h.command(request("r/3"), internal=True))
        await h.settle()
        (call,) = llm_requests(h)
        answer = {"role": "assistant", "content": "hi", "llmRequestOffset": 3}
        settled = {"requestOffset": 3, "result": {"status": "succeeded", "text": "hi"}}
        usage = {"llmRequestOffset": 3, "model": "m", "maxContextTokens": 100, "inputTokens": 90, "outputTokens": 5}
        await h.handle(
            h.command({"type": CONTEXT_ADDED, "payload": answer}, internal=True),
            h.command({"type": LLM_REQUEST_SETTLED, "payload": settled}, internal=True),
            h.command({"type": TOKEN_USAGE_REPORTED, "payload": usage}, internal=True),
        )
        await h.settle()
        live = [r for r in llm_requests(h) if r["kind"] == "compact"]
        assert len(live) == 1 and live[0]["messages"] == call["messages"]
        again = [orjson.loads(value) for _, _, value in Recovery(restarted(h)).open_work()]
        assert again == live  # the same record, rendered from the rows

    run(scenario())


def test_an_item_larger_than_the_models_window_renders_cut_with_a_notice() -> None:
    """The item cap follows the request's model (its context window), so one huge item cannot
    keep every request, and every summary of it, over the window."""
    from pipeline.settings import Settings

    settings = Settings.from_env({}, llm_context_tokens={"small": 1500, "tiny": 10})
    assert settings.render_budget_for("small").history_cap == 6000
    assert settings.render_budget_for("tiny").history_cap == 4096
    assert settings.render_budget_for("other").history_cap == 4 * settings.llm_default_context_tokens

    async def scenario() -> None:
        h = EngineHarness()
        h.engine.follow_ups.render_budget = settings.render_budget_for
        system = {"role": "system", "content": "be brief", "key": "agent/system-prompt"}
        await h.handle(h.command({"type": CONTEXT_ADDED, "payload": system}), h.command(user("x" * 50_000)))
        request = {"type": LLM_REQUEST_REQUESTED, "payload": {"model": "small", "expiresAt": 2**40}}
        await h.handle(h.command(request, internal=True))
        await h.settle()
        (record,) = [orjson.loads(r.value) for r in h.kafka.on(NAMES.llm_requests)]
        (item,) = [m for m in record["messages"] if m["role"] == "user"]
        assert len(item["content"].encode()) <= 6000
        assert "Item @2 was cut to fit the request" in item["content"]

    run(scenario())


class BurstRows(DictStore):
    """Keeps every checkpoint's rows in their changelog groups, so a test can restore what a worker
    without transactions (`AGENTSTREAM_TRANSACTIONS=false`) killed mid-checkpoint leaves: the
    stored rows before it, the whole groups before one, and part of that one in any order."""

    def __init__(self) -> None:
        super().__init__()
        self.bursts: list[tuple[dict[bytes, bytes], tuple[list[tuple[bytes, bytes | None]], ...]]] = []

    def write(self, rows: dict[bytes, bytes | None], changelog_offset: int) -> None:
        self.bursts.append((dict(self.stored), changelog_groups(rows)))
        super().write(rows, changelog_offset)


def parts_of(group: list[tuple[bytes, bytes | None]], seed: int) -> list[list[tuple[bytes, bytes | None]]]:
    """What a cut-off group may have reached the changelog: a group goes out in one `send_rows`
    call, whose rows may land in any order. Each prefix and suffix of it, and random subsets."""
    rng = random.Random(seed)
    parts = [group[:n] for n in range(len(group) + 1)] + [group[n:] for n in range(1, len(group))]
    parts += [[row for row in group if rng.random() < 0.5] for _ in range(12)]
    return parts


def test_5_2_recovery_from_any_part_of_a_changelog_burst_equals_the_full_fold() -> None:
    """A worker killed mid-burst leaves part of the burst in the changelog, and the table's
    restore applies it: the groups before the one it was cut in, and any part of that one.
    Whatever the part, catch-up must rebuild exactly the rows of the whole burst: before the burst
    order put each stream's metadata row last, a prefix holding a metadata row but not the item
    rows before it made catch-up skip those events for good (found by the SIGKILL storm of
    tests/resilience/test_kill.py: receipts and item rows lost)."""

    async def scenario() -> None:
        h = EngineHarness()
        h.table = table = BurstRows()
        h.engine = PartitionEngine(
            0, table, NAMES, committer(h.kafka, h.fatal.append), max_cached_streams=100, fatal=h.fatal.append
        )
        other = "/agents/b"

        def on(path: str, body: dict[str, Any]) -> CommandRecord:
            command = h.command(body)
            value = orjson.loads(command.value)
            value["streamPath"] = path
            return CommandRecord(0, command.offset, path.encode(), orjson.dumps(value), {})

        await h.handle(h.command(SYSTEM), h.command(user("first", appendId="a0")))
        await h.settle()
        # One burst: several commands of two streams, a keyed slot replaced, dedupe rows.
        note = {"role": "developer", "content": "v1", "key": "notes"}
        note2 = {"role": "developer", "content": "v2", "key": "notes"}
        await h.handle(
            h.command(user("one", appendId="a1")),
            on(other, user("b-one", appendId="b1")),
            h.command({"type": CONTEXT_ADDED, "payload": note, "idempotencyKey": "n1"}),
            h.command(user("two", appendId="a2")),
            on(other, user("b-two", appendId="b2")),
            h.command({"type": CONTEXT_ADDED, "payload": note2, "idempotencyKey": "n2"}),
            h.command(user("three", appendId="a3")),
        )
        await h.settle()
        assert not h.fatal
        # Positions differ by design: `c` is not derived from the journal, `p` is only a lower bound.
        full = {k: v for k, v in table.stored.items() if not k.startswith(POSITIONS)}
        journal = [(offset, r.value, r.headers) for offset, r in enumerate(h.kafka.on(NAMES.journal))]
        before, groups = next(b for b in reversed(table.bursts) if any(k.startswith(rows.ITEM) for k, _ in b[1][0]))
        assert all(groups), "items, metadata rows and positions: each group is exercised"
        for cut, group in enumerate(groups):
            for part in parts_of(group, seed=cut):
                restored = DictStore()
                restored.stored = dict(before)
                for key, value in [row for whole in groups[:cut] for row in whole] + part:
                    if value is None:
                        restored.stored.pop(key, None)
                    else:
                        restored.stored[key] = value
                engine = PartitionEngine(0, restored, NAMES, committer(h.kafka, h.fatal.append), max_cached_streams=100)
                position = engine.checkpoints.journal_position
                Recovery(engine).refold([record for record in journal if record[0] > position], [])
                await engine.checkpoints.flush()
                again = {k: v for k, v in restored.stored.items() if not k.startswith(POSITIONS)}
                where = f"group {cut}, {len(part)} of its {len(group)} rows"
                assert again == full, f"{where}: {sorted(set(again) ^ set(full))[:5]}"

    run(scenario())


# --- the scheduler's decisions --------------------------------------------------------------------


def test_4_2_a_due_request_is_journaled_at_once_and_its_call_record_follows() -> None:
    """§4.2: the scheduler's request is journaled in the tick that finds it due (no command-topic
    round trip), marked as the scheduler's, without touching the command positions or the
    stream's source offsets; the call record goes out once the journal acknowledges it."""

    async def scenario() -> None:
        h = EngineHarness()
        await h.handle(h.command(SYSTEM), h.command({"type": AGENT_CREATED, "payload": {}}))
        await h.handle(h.command(user("hello")))
        await h.settle()
        positions = dict(h.engine.checkpoints.positions.done)
        sources = h.engine.streams.get(PATH).sources
        assert h.engine.schedule(h.engine.clock_ms() + 10**6) == []  # nothing goes to the command topic
        assert llm_requests(h) == [] and h.kafka.open == []  # staged, not produced before the commit
        await h.settle()
        (requested,) = [r for r in h.kafka.on(NAMES.journal) if orjson.loads(r.value)["type"] == LLM_REQUEST_REQUESTED]
        assert requested.headers == {H_SOURCE_TOPIC: SCHEDULER}
        (call,) = llm_requests(h)  # in the same transaction
        assert call["kind"] == "call" and call["requestOffset"] == orjson.loads(requested.value)["offset"]
        assert h.engine.checkpoints.positions.done == positions and h.engine.streams.get(PATH).sources == sources
        assert not h.fatal

    run(scenario())


def test_4_3_an_expiry_goes_behind_the_commands_already_produced() -> None:
    """§4.3: an expired request's settlement is not journaled by the tick: it goes out as commands
    to the internal topic (with the next checkpoint), so a settlement the caller produced before it
    wins."""

    async def scenario() -> None:
        h = EngineHarness()
        await h.handle(h.command(SYSTEM), h.command({"type": AGENT_CREATED, "payload": {}}), h.command(user("hi")))
        await h.handle(h.command(request("r/1"), internal=True))
        await h.settle()
        journaled = len(h.kafka.on(NAMES.journal))
        commands = h.engine.schedule(2**41)  # past the request's expiresAt
        assert [c["type"] for _, c in commands] == [LLM_REQUEST_SETTLED, STREAM_ERROR_OCCURRED]
        assert len(h.kafka.on(NAMES.journal)) == journaled
        assert h.engine.schedule(2**41) == []  # sent: not again before RESEND_AFTER_MS
        await h.settle()
        assert [orjson.loads(r.value) for r in h.kafka.on(NAMES.internal_appends)] == [c for _, c in commands]

    run(scenario())


def test_recovery_refolds_scheduled_events_to_the_live_rows() -> None:
    """Catch-up (and replay) re-fold the scheduler's journaled events to the rows live wrote:
    no source offset is advanced by them."""

    async def scenario() -> None:
        h = EngineHarness()
        await h.handle(h.command(SYSTEM), h.command({"type": AGENT_CREATED, "payload": {}}))
        await h.handle(h.command(user("hello")))
        await h.settle()
        h.engine.schedule(h.engine.clock_ms() + 10**6)
        await h.settle()
        live = {k: v for k, v in h.table.stored.items() if not k.startswith(POSITIONS)}
        journal = [(offset, r.value, r.headers) for offset, r in enumerate(h.kafka.on(NAMES.journal))]
        fresh = DictStore()
        engine = PartitionEngine(0, fresh, NAMES, committer(h.kafka, h.fatal.append), max_cached_streams=100)
        Recovery(engine).refold(journal, [])
        await engine.checkpoints.flush()
        again = {k: v for k, v in fresh.stored.items() if not k.startswith(POSITIONS)}
        assert again == live, sorted(set(again) ^ set(live))[:5]

    run(scenario())


# --- agent-run code across a crash (docs/architecture.md, "Recovering") ----------------------------


def answer(request_offset: int, content: str) -> dict[str, Any]:
    """The LLM caller's answer item to request R (what `llm_outcomes.succeeded` appends first)."""
    payload = {"role": "assistant", "content": content, "llmRequestOffset": request_offset}
    return {"type": CONTEXT_ADDED, "payload": payload, "idempotencyKey": f"llm/answer@{request_offset}"}


def script_settled(execution: str) -> dict[str, Any]:
    settlement = {"status": "succeeded", "result": 2, "stdout": "two\n"}
    payload = {"executionId": execution, "settlement": settlement}
    return {"type": SCRIPT_RUN_SETTLED, "payload": payload, "idempotencyKey": f"host/settled@{execution}"}


async def run_a_script(h: EngineHarness) -> None:
    """§6: R answered with one python block -> run requested -> run settled -> result item."""
    await h.handle(h.command(SYSTEM), h.command(user("hello")))
    await h.handle(h.command(request("r/2"), internal=True))
    await h.handle(
        h.command(answer(3, "Let me check.\n```python\nprint('two')\n1 + 1\n```"), internal=True),
        h.command(
            {
                "type": LLM_REQUEST_SETTLED,
                "payload": {"requestOffset": 3, "result": {"status": "succeeded", "text": "-"}},
            },
            internal=True,
        ),
    )
    await h.settle()  # the run request is journaled right behind the answer (no command to wait for)


def worker_journaled(h: EngineHarness) -> list[dict[str, Any]]:
    """The events the worker journaled itself, read from no command topic (`source-topic: scheduler`)."""
    return [orjson.loads(r.value) for r in h.kafka.on(NAMES.journal) if r.headers.get(H_SOURCE_TOPIC) == SCHEDULER]


def test_6_script_follow_ups_are_journaled_right_behind_the_event_that_calls_for_them() -> None:
    """The run request of a qualifying answer, a settled run's result and the too-many-blocks
    feedback go into the journal in the same checkpoint as the event that calls for them, straight
    behind it, and advance no command position: none is sent through the internal command topic."""

    async def scenario() -> None:
        h = EngineHarness()
        await run_a_script(h)
        await h.handle(h.command(script_settled("agent-output:4"), internal=True))
        await h.settle()
        journal = [orjson.loads(r.value) for r in h.kafka.on(NAMES.journal)]
        assert [(e["offset"], e["type"], e.get("idempotencyKey")) for e in journal[3:]] == [
            (4, CONTEXT_ADDED, "llm/answer@3"),
            (5, SCRIPT_RUN_REQUESTED, "agent/script-run-requested@4"),
            (6, LLM_REQUEST_SETTLED, None),
            (7, SCRIPT_RUN_SETTLED, "host/settled@agent-output:4"),
            (8, CONTEXT_ADDED, "agent/script-result@agent-output:4"),
        ]
        assert journal[4]["payload"]["executionId"] == "agent-output:4"
        assert [e["offset"] for e in worker_journaled(h)] == [5, 8]
        assert h.kafka.on(NAMES.internal_appends) == []
        assert [orjson.loads(r.value)["executionId"] for r in h.kafka.on(NAMES.script_runs)] == ["agent-output:4"]

    run(scenario())


def test_6_catch_up_publishes_again_the_script_commands_of_the_events_it_refolds() -> None:
    """A worker without transactions may die after the journal acknowledged an event but before its
    rows were stored and its script follow-ups journaled. Catch-up re-folds the event from the
    journal and sends its follow-ups as commands (the run request of a qualifying answer, the
    too-many-blocks feedback, a settled run's result), the very appends the live worker journaled:
    repeats are duplicates by idempotency key, and none is lost."""

    async def scenario() -> None:
        h = EngineHarness()
        await run_a_script(h)
        await h.handle(h.command(script_settled("agent-output:4"), internal=True))
        await h.handle(h.command(user("and now?")))
        await h.handle(h.command(request("r/10"), internal=True))
        two_blocks = "```python\n1\n```\nand\n```py\n2\n```"
        await h.handle(h.command(answer(10, two_blocks), internal=True))
        await h.settle()
        live = [(e["type"], e["payload"], e["idempotencyKey"]) for e in worker_journaled(h)]
        assert [key for _, _, key in live] == [
            "agent/script-run-requested@4",
            "agent/script-result@agent-output:4",
            "agent/script-feedback@11",
        ]
        journal = [(offset, r.value, r.headers) for offset, r in enumerate(h.kafka.on(NAMES.journal))]
        engine = PartitionEngine(
            0, DictStore(), NAMES, committer(h.kafka, h.fatal.append), max_cached_streams=100
        )  # nothing stored
        outcomes: list[tuple[str, bytes, bytes]] = []
        Recovery(engine).refold(journal, outcomes)
        again = [orjson.loads(value) for topic, key, value in outcomes if topic == NAMES.internal_appends]
        assert [(c["type"], c["payload"], c["idempotencyKey"]) for c in again] == live
        assert {key for topic, key, _ in outcomes if topic == NAMES.internal_appends} == {PATH.encode()}
        # Events a stream's rows already hold are not re-folded: a second catch-up publishes nothing.
        await engine.checkpoints.flush()
        repeat: list[tuple[str, bytes, bytes]] = []
        Recovery(engine).refold(journal, repeat)
        assert repeat == []

    run(scenario())


def test_6_an_unsettled_script_run_is_listed_for_its_record_to_go_out_again() -> None:
    """After recovery every requested, unsettled run is handed to the worker (with the agent's script
    timeout) so its `script-runs` record goes out again; a settled run is not."""

    async def scenario() -> None:
        h = EngineHarness()
        await run_a_script(h)
        (record,) = [orjson.loads(r.value) for r in h.kafka.on(NAMES.script_runs)]
        runs = Recovery(restarted(h)).unsettled_script_runs()
        assert [
            (path, run.executionId, run.offset, run.expiresAt, config.scriptTimeoutMs) for path, run, config in runs
        ] == [(PATH, "agent-output:4", record["offset"], record["expiresAt"], record["timeoutMs"])]
        first = h.kafka.on(NAMES.journal)[record["offset"] - 1]
        event = orjson.loads(first.value)
        assert (
            records.script_run_record(
                PATH,
                event["offset"],
                event["createdAt"],
                event["payload"]["code"],
                "agent-output:4",
                event["payload"]["expiresAt"],
                runs[0][2],
            )
            == h.kafka.on(NAMES.script_runs)[0].value
        )
        await h.handle(h.command(script_settled("agent-output:4"), internal=True))
        await h.settle()
        assert Recovery(restarted(h)).unsettled_script_runs() == []

    run(scenario())
