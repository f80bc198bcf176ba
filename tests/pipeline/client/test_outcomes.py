"""The client's waits for append outcomes (docs/behaviour.md §5): blocking, or awaited on an event
loop and woken by the thread that reads them, with no polling."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from pipeline.client import AppendTimeout, Outcomes
from schemas.outcomes import AppendOutcome


def outcome(append_id: str, offset: int = 7) -> AppendOutcome:
    return AppendOutcome(appendId=append_id, streamPath="/agents/a", status="journaled", offset=offset)


def test_5_an_expected_outcome_is_handed_to_its_waiter_once() -> None:
    outcomes = Outcomes()
    outcomes.expect("a")
    outcomes.record([outcome("a", 3), outcome("nobody-expects-this")])
    result = outcomes.wait("a", 1)
    assert (result.append_id, result.status, result.offset) == ("a", "journaled", 3)
    with pytest.raises(AppendTimeout, match="no outcome arrived within 0s"):
        outcomes.wait("a", 0)  # claimed already
    with pytest.raises(AppendTimeout):
        outcomes.wait("nobody-expects-this", 0)  # others' outcomes are not kept


def test_5_an_awaited_outcome_wakes_its_coroutine_the_moment_another_thread_records_it() -> None:
    outcomes = Outcomes()
    outcomes.expect("a")

    async def scenario() -> tuple[float, int | None]:
        started = time.monotonic()
        threading.Timer(0.05, outcomes.record, [[outcome("a", 9)]]).start()
        result = await outcomes.wait_async("a", 10)
        return time.monotonic() - started, result.offset

    waited, offset = asyncio.run(scenario())
    assert offset == 9
    assert waited < 5  # woken, not left to the 10 s timeout


def test_5_an_outcome_recorded_before_the_await_is_returned_at_once() -> None:
    outcomes = Outcomes()
    outcomes.expect("a")
    outcomes.record([outcome("a")])
    assert asyncio.run(outcomes.wait_async("a", 0)).offset == 7


def test_5_an_awaited_outcome_that_never_comes_times_out_like_a_blocking_wait() -> None:
    outcomes = Outcomes()
    outcomes.expect("a")
    with pytest.raises(AppendTimeout, match=r"append a was sent but no outcome arrived within 0\.05s"):
        asyncio.run(outcomes.wait_async("a", 0.05))
    outcomes.record([outcome("a")])  # too late for the waiter that gave up: nothing breaks
    assert outcomes.wait("a", 0).offset == 7


def test_5_unclaimed_outcomes_are_bounded_oldest_first() -> None:
    outcomes = Outcomes(max_unclaimed=2)
    for append_id in ("a", "b", "c"):
        outcomes.expect(append_id)
    outcomes.record([outcome("a"), outcome("b"), outcome("c")])
    with pytest.raises(AppendTimeout):
        outcomes.wait("a", 0)
    assert outcomes.wait("b", 0).append_id == "b" and outcomes.wait("c", 0).append_id == "c"


def test_5_an_outcome_for_a_waiter_whose_event_loop_is_closed_does_not_stop_the_reader() -> None:
    outcomes = Outcomes()
    outcomes.expect("a")
    loop = asyncio.new_event_loop()
    outcomes._futures["a"] = loop.create_future()  # a waiter caught between its last look and leaving
    loop.close()
    outcomes.record([outcome("a")])  # on the reading thread: must not raise
    assert outcomes.wait("a", 0).offset == 7
