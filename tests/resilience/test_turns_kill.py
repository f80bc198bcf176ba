"""Kill test with turns: SIGKILLs of the journal worker and of the LLM caller, alternating, while
200 agents hold conversations with the scripted model (docs/behaviour.md §4, docs/architecture.md
"Commit protocol" and "Recovery").

Every agent gets a user message per round, a round every few seconds; meanwhile the journal worker
and the caller are SIGKILLed in turn (6 kills by default) and restarted after a short pause. The
scripted model answers each call after a short delay, so kills land on calls in flight, on call
records not yet published, on outcomes not yet journaled.

Asserted on the journal, the source of truth:
- every request settles exactly once, and succeeded (nothing expired: no call record was lost);
- no answer is journaled twice (at most one assistant item per request);
- every agent ends idle, its last user message answered (none stuck busy or queued);
- the dead-letter topic is empty (a repeated call's outcomes are duplicates, not conflicts);
- `replay` of the journal equals the live rows.

Knobs (environment): AGENTSTREAM_TURNS_KILL_AGENTS, AGENTSTREAM_TURNS_KILL_COUNT,
AGENTSTREAM_TURNS_KILL_SEED. Logs stay in <tmp>/data for diagnosis.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.journal.replay import replay
from pipeline.journal.replay_store import live_store_paths
from pipeline.journal.replay_verify import verify
from tests.kafka_stack import Stack, wait_until
from tests.support.scripted_llm import Reply, ScriptedLLM, last_user_text
from tests.support.turns import audit_turns, journals, unanswered, user

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(900)]

AGENTS = int(os.environ.get("AGENTSTREAM_TURNS_KILL_AGENTS", "200"))
KILLS = int(os.environ.get("AGENTSTREAM_TURNS_KILL_COUNT", "6"))
SEED = int(os.environ.get("AGENTSTREAM_TURNS_KILL_SEED", "4242"))
ROUND_EVERY_S = 3.0
ANSWER_DELAY_S = 0.2  # each call is in flight this long: kills land on running calls
MODEL = "scripted"


def answer(body: dict[str, Any]) -> Reply:
    # Deterministic in the request: a call repeated after a crash answers the same, so its outcomes
    # are duplicates of the first (an idempotency key with another payload would be a conflict).
    return Reply(f"ok: {last_user_text(body)}", usage=(20, 5), delay=ANSWER_DELAY_S)


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM(model=MODEL, default=answer, record=False) as server:
        yield server


@pytest.fixture
def stack(tmp_path: Path, llm: ScriptedLLM) -> Iterator[Stack]:
    stack = Stack(
        tmp_path / "data",
        log_level="INFO",
        openai_base_url=llm.base_url,
        openai_api_key="sk-test-turns-kill",
        llm_transport="openai-compatible",
        llm_model=MODEL,
        session_timeout_s=6,  # a SIGKILLed caller's partitions move after 6 s (the broker's minimum)
    )
    try:
        yield stack
    finally:
        for process in (stack.caller,):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGKILL)
        stack.close()


def test_4_3_sigkills_of_worker_and_caller_settle_every_request_exactly_once_and_never_answer_twice(
    stack: Stack, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    client = stack.client
    stack.start_worker()
    stack.start_caller()
    agents = [client.agents.create() for _ in range(AGENTS)]
    paths = [agent.path for agent in agents]
    first = agents[0].append(user("warm up"))
    first.wait(timeout=120)
    wait_until(lambda: not unanswered(journals(stack), paths[:1]), 120, "the warm-up turn", interval=0.5)

    stop_rounds = threading.Event()
    rounds: list[int] = []
    errors: list[BaseException] = []

    def converse() -> None:
        try:
            n = 0
            while not stop_rounds.is_set():
                n += 1
                receipts = [agent.append(user(f"round {n} for {agent.path}")) for agent in agents]
                rounds.append(len(receipts))
                stop_rounds.wait(ROUND_EVERY_S)
            client.flush(60)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    talker = threading.Thread(target=converse, name="conversations")
    talker.start()
    kills: list[str] = []
    started = time.monotonic()
    try:
        for n in range(KILLS):
            time.sleep(rng.uniform(1.5, 4.0))
            which = "worker" if n % 2 == 0 else "caller"
            process = stack.worker if which == "worker" else stack.caller
            assert process is not None and process.poll() is None, f"the {which} died on its own"
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)
            kills.append(f"{which} at {time.monotonic() - started:.1f}s")
            time.sleep(rng.uniform(0.1, 1.0))
            stack.start_worker() if which == "worker" else stack.start_caller()
        time.sleep(ROUND_EVERY_S)  # one more round after the last restart
    finally:
        stop_rounds.set()
        talker.join()
    assert not errors, f"sending failed: {errors[0]!r}"
    summary = f"seed {SEED}; {len(rounds)} rounds; kills: {', '.join(kills)}"

    # Every agent ends idle with its last message answered; a lost call record would leave one
    # busy until its expiry (10 minutes), far past this wait.
    settle_deadline = time.monotonic() + 240
    events = journals(stack)
    while (waiting := unanswered(events, paths)) and time.monotonic() < settle_deadline:
        time.sleep(2)
        events = journals(stack)
    assert not waiting, f"{len(waiting)} agents not done, e.g. {waiting[:5]}; {summary}"
    settled_s = time.monotonic() - started
    time.sleep(2)  # a late duplicate would show up now
    events = journals(stack)

    audit = audit_turns(events, paths)
    requests = audit.requests
    assert not audit.settled_twice, (
        f"{len(audit.settled_twice)} requests settled twice, e.g. {audit.settled_twice[:5]}; {summary}"
    )
    assert not audit.answered_twice, (
        f"{len(audit.answered_twice)} answers journaled twice, e.g. {audit.answered_twice[:5]}; {summary}"
    )
    assert not audit.unsettled, f"{len(audit.unsettled)} requests never settled, e.g. {audit.unsettled[:5]}; {summary}"
    assert not audit.not_succeeded, (
        f"{len(audit.not_succeeded)} requests did not succeed, e.g. {audit.not_succeeded[:3]}; {summary}"
    )
    dead = stack.read_topic(client.topics.dlq, timeout=5)
    reasons = [dict(m.headers() or ()).get("reason", b"").decode()[:200] for m in dead]
    assert not dead, f"{len(dead)} dead-lettered records, e.g. {reasons[:3]}; {summary}"

    stack.stop_worker(signal.SIGTERM, timeout=60)
    out = tmp_path / "replay"
    stats = replay(stack.settings, out, progress=False)
    differing = verify(out, live_store_paths(stack.settings))
    assert differing == [], f"{len(differing)} rows differ between replay and live: {differing[:5]}; {summary}"
    worker_log = stack.worker_log()
    print(
        f"\nturns kill test: {AGENTS} agents, {len(rounds)} rounds, {requests} requests, {stats.events} events; "
        f"{len(kills)} SIGKILLs ({', '.join(kills)}); all settled at {settled_s:.1f}s; "
        f"catch-ups logged: {worker_log.count('re-folded')}"
    )
