"""Upgrading a store written by an older row format in place (docs/operations.md, "Row format").

tests/data/rows_format1*.jsonl hold one partition's rows and journal as the version of row format 1
wrote them (tests/data/README.md). A worker of this version opens those rows as they are: it reads
them through the upcasts, rewrites in this format only the rows its events touch, marks the
partition with this format at its first checkpoint, and decides exactly what a worker deciding from
rows built fresh from the same journal decides.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from pipeline.journal.decisions import CommandRecord
from pipeline.journal.engine import PartitionEngine
from pipeline.journal.recovery import Recovery
from pipeline.journal.replay_verify import BOOKKEEPING, compare
from processors import row_codec, rows
from processors.reducer import fold
from processors.state import AgentState
from schemas.capabilities import SCRIPT_RUN_SETTLED, SCRIPT_RUN_STARTED
from schemas.events import CONTEXT_ADDED, LLM_REQUEST_SETTLED, decode_event
from tests.support.engine_harness import committer
from tests.support.journal_fakes import DictStore, FakeTransactions
from tests.support.row_store import (
    ALPHA,
    APPEND_ID_WINDOW,
    BETA,
    CLOCK_MS,
    GAMMA,
    JournalRecord,
    format_1_journal,
    format_1_rows,
    state_view,
)
from topics.names import topic_names

NAMES = topic_names("t-")  # tests/support/engine_harness.py's, which wrote the fixture
LATER = CLOCK_MS + 60_000  # the upgraded worker starts a minute later
NEXT_OFFSETS = {False: 20, True: 15}  # the command offsets after the fixture's


def compared_rows(table: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """The rows `replay --verify` compares: all but bookkeeping."""
    return {key: value for key, value in table.items() if not key.startswith(BOOKKEEPING)}


class Worker:
    """One partition's engine of this version over `table`, recovered as the worker does."""

    def __init__(self, table: DictStore, journal: list[JournalRecord]) -> None:
        self.table = table
        self.kafka = FakeTransactions()
        self.kafka.offsets[NAMES.journal] = len(journal)  # the journal goes on where the fixture's ends
        self.fatal: list[BaseException] = []
        self.engine = PartitionEngine(
            0,
            table,
            NAMES,
            committer(self.kafka, self.fatal.append),
            max_cached_streams=100,
            append_id_window=APPEND_ID_WINDOW,
            fatal=self.fatal.append,
            clock_ms=lambda: LATER,
        )
        self.offsets = dict(NEXT_OFFSETS)

    async def recover(self, journal_tail: list[JournalRecord]) -> list[Any]:
        """Recovery's steps on the stored rows (a tail to re-fold only for a fresh store)."""
        recovery = Recovery(self.engine)
        recovery.refold(journal_tail)
        await self.engine.checkpoints.flush()
        recovery.wake_streams_with_work()
        runs = recovery.unsettled_script_runs()
        work = recovery.open_work()
        await self.engine.checkpoints.flush()
        return [runs, work, self.engine.open_requests, self.engine.paused_agents, sorted(self.engine.wakeups)]

    def command(self, path: str, body: dict[str, Any], *, internal: bool = False) -> CommandRecord:
        offset = self.offsets[internal]
        self.offsets[internal] += 1
        value = orjson.dumps({"streamPath": path, **body})
        return CommandRecord(partition=0, offset=offset, key=path.encode(), value=value, headers={}, internal=internal)

    async def carry_on(self) -> None:
        """New commands of every stream, each meeting rows of the fixture, and scheduler runs."""

        def user(path: str, text: str, **extra: Any) -> CommandRecord:
            return self.command(path, {"type": CONTEXT_ADDED, "payload": {"role": "user", "content": text}, **extra})

        def internal(path: str, event_type: str, payload: dict[str, Any]) -> CommandRecord:
            return self.command(path, {"type": event_type, "payload": payload}, internal=True)

        cancelled = {"status": "cancelled", "reason": "interrupted-by-user-input", "partialText": "Once"}
        await self.engine.handle_batch(
            [
                # alpha: its interrupted request settles, a retried append is a duplicate (a format-1
                # `a` row), new appends take format-1 window slots, a keyed item is replaced.
                internal(ALPHA, LLM_REQUEST_SETTLED, {"requestOffset": 17, "result": cancelled}),
                user(ALPHA, "stop, shorter", appendId="alpha-4"),
                user(ALPHA, "and in French", appendId="alpha-5"),
                self.command(
                    ALPHA, {"type": CONTEXT_ADDED, "payload": {"role": "developer", "content": "v3", "key": "notes"}}
                ),
                # beta: idempotency keys of format-1 `k` rows, the same payload and another one.
                user(BETA, "beta message 2", appendId="beta-2-again", idempotencyKey="web/beta/2"),
                user(BETA, "not message 3", idempotencyKey="web/beta/3"),
                *(user(BETA, f"beta message {n}", appendId=f"beta-{n}") for n in range(6, 9)),
                # gamma: its runs go on, and a system prompt lets the paused agent resume.
                internal(
                    GAMMA,
                    SCRIPT_RUN_SETTLED,
                    {"executionId": "agent-output:1", "settlement": {"status": "succeeded", "result": 2}},
                ),
                internal(GAMMA, SCRIPT_RUN_STARTED, {"executionId": "agent-output:2"}),
                self.command(
                    GAMMA,
                    {
                        "type": CONTEXT_ADDED,
                        "payload": {"role": "system", "content": "be kind", "key": "agent/system-prompt"},
                    },
                ),
            ]
        )
        for _ in range(3):  # resume, then a turn per stream with a trigger
            self.engine.schedule(LATER + 1_000)
            await self.engine.checkpoints.flush()
        assert not self.fatal, self.fatal

    def published(self) -> list[tuple[str, bytes | None, bytes, dict[str, bytes]]]:
        """Every record committed, the rows' changelog but for the format row (written once)."""
        format_key = rows.format_key(0)
        return [
            (r.topic, r.key, r.value, r.headers)
            for r in self.kafka.committed
            if not (r.topic == DictStore.changelog_topic and r.key == format_key)
        ]


def upgraded_and_fresh() -> tuple[Worker, Worker, list[Any], list[Any]]:
    journal = format_1_journal()
    old = DictStore()
    old.stored.update(format_1_rows())
    upgraded, fresh = Worker(old, journal), Worker(DictStore(), journal)

    async def scenario() -> tuple[list[Any], list[Any]]:
        position = row_codec.decode_offset(old.stored[rows.position_key(0)])  # a format-1 row too
        recovered = await upgraded.recover(journal[position + 1 :]), await fresh.recover(journal)
        for worker in (upgraded, fresh):
            worker.kafka.committed.clear()  # what recovery stored and published is compared above
            await worker.carry_on()
        return recovered

    upgraded_recovery, fresh_recovery = asyncio.run(scenario())
    return upgraded, fresh, upgraded_recovery, fresh_recovery


def test_the_format_1_fixture_is_format_1_and_loads_as_the_fold_of_its_journal() -> None:
    """Every fixture row is unmarked (format 1), its format row says 1, and each stream's rows load
    through the upcasts as the fold of the stream's events."""
    table = format_1_rows()
    assert table[rows.format_key(0)] == b"1"
    assert {row_codec.row_version(value) for value in table.values()} == {1}
    folded: dict[str, AgentState] = {}
    for _, value, _ in format_1_journal():
        event = decode_event(value)
        fold(folded.setdefault(event.streamPath, AgentState(stream_path=event.streamPath)), event)
    assert sorted(folded) == [ALPHA, BETA, GAMMA]
    for path, state in folded.items():
        items = sorted((k, v) for k, v in table.items() if k.startswith(rows.items_prefix(path)))
        loaded, _ = row_codec.load_state(table[rows.meta_key(path)], items)
        assert state_view(loaded) == state_view(state)


def test_a_format_1_store_upgraded_in_place_decides_as_a_store_built_fresh_from_the_same_journal() -> None:
    """docs/operations.md, "Row format": the worker opens the format-1 rows as they are, recovers
    from them what a fresh store's worker recovers, journals, answers and publishes the same
    records for the same commands, and ends with rows that read the same."""
    upgraded, fresh, upgraded_recovery, fresh_recovery = upgraded_and_fresh()
    assert upgraded_recovery == fresh_recovery
    runs, work, open_requests, paused, wakeups = upgraded_recovery
    assert [run.executionId for _, run, _ in runs] == ["agent-output:1", "agent-output:2"]
    assert [orjson.loads(value)["kind"] for _, _, value in work] == ["call", "cancel", "compact"]
    assert (open_requests, paused, len(wakeups)) == (1, 1, 2)

    assert upgraded.published() == fresh.published()  # journal, results, follow-ups, changed rows
    journal = [orjson.loads(r.value) for r in upgraded.kafka.on(NAMES.journal)]
    (conflict,) = upgraded.kafka.on(NAMES.dlq)  # a format-1 `k` row names another body
    assert b"'web/beta/3' already names a different event at @6" in conflict.headers["reason"]
    results = upgraded.kafka.outcomes(NAMES.results)
    outcomes = {r["appendId"]: (r["status"], r["offset"]) for r in results}
    assert outcomes["alpha-4"] == ("duplicate", 18)  # a format-1 `a` row
    assert outcomes["beta-2-again"] == ("duplicate", 5)  # a format-1 `k` row
    assert any(e["type"].endswith("/resumed") and e["streamPath"] == GAMMA for e in journal)
    assert sum(e["type"].endswith("/llm-request-requested") for e in journal) == 3  # a turn each

    old, new = compared_rows(upgraded.table.stored), compared_rows(fresh.table.stored)
    assert sorted(old) == sorted(new)
    assert {key: compare(key, old[key], new[key]) for key in old} == dict.fromkeys(old)  # all read the same
    for path in (ALPHA, BETA, GAMMA):
        assert state_view(upgraded.engine.streams.get(path).state) == state_view(fresh.engine.streams.get(path).state)


def test_an_upgraded_store_is_marked_format_2_and_rewrites_only_the_rows_it_touches() -> None:
    """The format row records the newest format written, with the first checkpoint; rows no event
    touched stay format 1 (read through the upcasts), every row written since is format 2, byte for
    byte what a fresh store holds."""
    upgraded, fresh, _, _ = upgraded_and_fresh()
    table, before = upgraded.table.stored, format_1_rows()
    assert table[rows.format_key(0)] == b"2" == fresh.table.stored[rows.format_key(0)]
    kept = {key for key, value in table.items() if before.get(key) == value}
    rewritten = set(table) - kept
    assert {row_codec.row_version(table[key]) for key in kept - {rows.format_key(0)}} == {1}
    assert {row_codec.row_version(table[key]) for key in rewritten - {rows.format_key(0)}} == {2}
    assert all(table[key] == fresh.table.stored[key] for key in rewritten if not key.startswith(BOOKKEEPING))
    untouched = rows.idempotency_key(BETA, "web/beta/0")
    assert untouched in kept and rows.meta_key(ALPHA) in rewritten
    forgotten = rows.append_id_key(BETA, "beta-2")  # its format-1 window slot was taken by a new append id
    assert forgotten in before and forgotten not in table
