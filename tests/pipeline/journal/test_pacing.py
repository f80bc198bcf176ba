"""Commit pacing (docs/architecture.md, "Commit pacing"): when a partition's checkpoint commits.

The decision is pure (`pipeline.journal.pacing.CommitPacing`, times passed in); the engine tests
drive a `PartitionEngine` on the in-memory producer, where a transaction is counted per commit.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from pipeline.journal.checkpoint import Checkpoint
from pipeline.journal.pacing import MIN_EXPECTED, MIN_SPAN_S, SMOOTHING, CommitPacing
from processors.traceparent import TRACEPARENT
from schemas.events import CONTEXT_ADDED
from tests.support.engine_harness import NAMES, EngineHarness, user

TRACE = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

# --- the decision --------------------------------------------------------------------------------


def busy(interval_s: float = 0.02, last_start: float = 10.0) -> CommitPacing:
    """A partition whose recent rate promises exactly `MIN_EXPECTED` commands per interval."""
    return CommitPacing(interval_s, rate=MIN_EXPECTED / interval_s, last_start=last_start)


def test_without_an_interval_no_checkpoint_waits() -> None:
    pacing = CommitPacing(0.0, rate=1e6, last_start=10.0)
    assert pacing.delay(10.001) == 0.0


def test_a_partitions_first_checkpoint_commits_at_once() -> None:
    assert CommitPacing(0.02, rate=1e6).delay(10.0) == 0.0


def test_a_busy_partition_starts_a_commit_at_most_once_per_interval() -> None:
    pacing = busy()
    assert pacing.delay(10.005) == pytest.approx(0.015)
    assert pacing.delay(10.0) == pytest.approx(0.02)
    assert pacing.delay(10.02) == 0.0  # due now
    assert pacing.delay(10.5) == 0.0  # long after: nothing to wait for


def test_a_partition_slower_than_two_commands_per_interval_commits_at_once() -> None:
    pacing = busy()
    pacing.rate = MIN_EXPECTED / pacing.interval_s * 0.99
    assert pacing.delay(10.005) == 0.0


def test_work_another_process_waits_on_never_waits() -> None:
    assert busy().delay(10.005, awaited=True) == 0.0


def test_the_rate_is_an_average_of_recent_checkpoints() -> None:
    pacing = CommitPacing(0.02)
    pacing.started(1.0, 5)
    assert pacing.rate == 0.0 and pacing.last_start == 1.0  # nothing to measure over yet
    pacing.started(1.01, 4)  # 4 commands in 10 ms: 400/s
    assert pacing.rate == pytest.approx(SMOOTHING * 400)
    before = pacing.rate
    pacing.started(1.02, 2)  # 200/s
    assert pacing.rate == pytest.approx(SMOOTHING * 200 + (1 - SMOOTHING) * before)
    assert pacing.last_start == 1.02


def test_two_commits_at_the_same_instant_do_not_make_the_rate_unbounded() -> None:
    pacing = CommitPacing(0.02, last_start=1.0)
    pacing.started(1.0, 3)
    assert pacing.rate == pytest.approx(SMOOTHING * 3 / MIN_SPAN_S)


def test_a_quiet_spell_ends_the_waiting() -> None:
    pacing = busy(last_start=1.0)
    pacing.started(2.0, 1)  # one command in a second
    pacing.started(2.5, 1)
    assert pacing.rate * pacing.interval_s < MIN_EXPECTED
    assert pacing.delay(2.51) == 0.0


def test_what_a_checkpoint_holds_decides_whether_a_process_waits_on_it() -> None:
    checkpoint = Checkpoint(0)
    checkpoint.read[False] = 7  # client commands
    checkpoint.follow(NAMES.results, b"k", b"{}", TRACE, awaited=False)  # a traced client outcome
    assert not checkpoint.awaited
    checkpoint.follow(NAMES.llm_requests, b"k", b"{}")
    assert checkpoint.awaited
    internal = Checkpoint(0)
    internal.read[True] = 3  # a command of agent-internal-appends
    assert internal.awaited


# --- in the engine -------------------------------------------------------------------------------


async def _trickle(h: EngineHarness, count: int, *, gap_s: float) -> None:
    """`count` client commands, one at a time, `gap_s` apart: the committer may run between them."""
    for n in range(count):
        await h.handle(h.command(user(f"m{n}")))
        await asyncio.sleep(gap_s)


def test_a_busy_partition_shares_transactions_among_its_commands() -> None:
    async def transactions(interval_ms: int) -> int:
        h = EngineHarness(commit_interval_ms=interval_ms)
        await _trickle(h, 20, gap_s=0.005)
        await h.settle()
        assert len(h.kafka.on(NAMES.journal)) == 20  # every command journaled, paced or not
        return h.kafka.transactions

    unpaced, paced = asyncio.run(transactions(0)), asyncio.run(transactions(200))
    assert unpaced >= 15  # one transaction per command, or close to it
    assert paced <= 6  # the first two at once, then one per 200 ms


def test_an_internal_command_ends_a_pacing_wait() -> None:
    async def scenario() -> None:
        h = EngineHarness(commit_interval_ms=5_000)
        await _trickle(h, 2, gap_s=0.01)  # the first two commit at once; the rate is now known
        await h.handle(h.command(user("paced")))
        await asyncio.sleep(0.1)
        assert len(h.kafka.on(NAMES.journal)) == 2  # waiting for the interval
        await h.handle(h.command({"type": CONTEXT_ADDED, "payload": {"role": "user", "content": "x"}}, internal=True))
        await asyncio.sleep(0.1)
        assert len(h.kafka.on(NAMES.journal)) == 4  # both, long before the 5 s were up

    asyncio.run(scenario())


def test_a_traced_client_command_is_paced_like_any_other() -> None:
    async def scenario() -> None:
        h = EngineHarness(commit_interval_ms=5_000)
        await _trickle(h, 2, gap_s=0.01)
        traced = dataclasses.replace(h.command(user("traced", appendId="t1")), headers={TRACEPARENT: TRACE})
        await h.handle(traced)
        await asyncio.sleep(0.1)
        assert len(h.kafka.on(NAMES.journal)) == 2  # its outcome record waits with it
        await h.settle()
        assert len(h.kafka.on(NAMES.journal)) == 3

    asyncio.run(scenario())
