"""The journal worker's scheduler timer (`pipeline/journal/due_timer.py`): it runs the scheduler at
the earliest reported wakeup, never before it, and only as often as wakeups come due."""

from __future__ import annotations

import asyncio
import time

from pipeline.journal.due_timer import DueTimer


def now_ms() -> int:
    return int(time.time() * 1000)


def test_it_fires_at_the_earliest_wakeup_not_before_and_not_on_a_tick() -> None:
    async def scenario() -> None:
        runs: list[int] = []
        timer = DueTimer(lambda at: runs.append(at) or None)
        due = now_ms() + 60
        timer.at(due + 200)
        timer.at(due)  # sooner: replaces the armed one
        timer.at(due + 100)  # later than armed: changes nothing
        await asyncio.sleep(0.03)
        assert runs == []  # nothing polls in between
        await asyncio.sleep(0.1)
        assert len(runs) == 1 and runs[0] >= due
        await asyncio.sleep(0.25)
        assert len(runs) == 1  # the later wakeups were the scheduler's to report again

    asyncio.run(scenario())


def test_the_earliest_wakeup_left_is_armed_again() -> None:
    async def scenario() -> None:
        runs: list[int] = []
        start = now_ms()
        left = [start + 40, None]

        def run_due(at: int) -> int | None:
            runs.append(at)
            return left[len(runs) - 1]

        timer = DueTimer(run_due)
        timer.at(0)  # due already: runs on the next loop iteration
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert len(runs) == 1
        await asyncio.sleep(0.15)
        assert len(runs) == 2 and runs[1] >= start + 40

    asyncio.run(scenario())


def test_a_wakeup_reported_while_it_runs_runs_it_again_soon() -> None:
    """Journaling a decision wakes its stream again (at 0): the scheduler looks once more."""

    async def scenario() -> None:
        runs: list[int] = []
        timer: DueTimer

        def run_due(at: int) -> int | None:
            runs.append(at)
            if len(runs) == 1:
                timer.at(0)
            return None

        timer = DueTimer(run_due)
        timer.at(0)
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(runs) == 2

    asyncio.run(scenario())
