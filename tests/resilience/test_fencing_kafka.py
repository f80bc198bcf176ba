"""Fencing on the real broker (behaviour §5.2): a worker that lost its partitions while it was
paused writes nothing more to them once it wakes, and the committed journal holds every event once.

Each test runs two workers of one kind in one group (session timeout 6 s), pauses one with SIGSTOP
while work flows until the other has taken every partition (at least the given pause), wakes it
with SIGCONT while work still flows, and audits the committed journal (isolation.level=
read_committed, read to each partition's end by position: transaction markers take offsets):

- journal workers: ~175 appends/s to 40 streams from an at-least-once client (it resends an
  unanswered append, same append id, until it has an outcome). Per stream no offset appears twice,
  offsets are gapless 1..n, every acknowledged append is journaled exactly once, and `replay
  --verify` equals the live rows of the surviving owner;
- LLM callers, turns in flight: every request settles once, no answer is journaled twice, no
  agent is left busy;
- capability hosts, script runs in flight: every run starts and settles once, and the turns settle
  as above.

Knobs (environment): AGENTSTREAM_FENCING_RATE (appends/s), AGENTSTREAM_FENCING_PAUSE_S (the
journal worker's pause). Logs stay in the test's tmp directory.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.journal.replay import replay
from pipeline.journal.replay_store import live_store_paths
from pipeline.journal.replay_verify import verify
from schemas.capabilities import SCRIPT_RUN_REQUESTED, SCRIPT_RUN_SETTLED, SCRIPT_RUN_STARTED
from schemas.events import CONTEXT_ADDED
from tests.kafka_stack import Stack, Worker, read_committed, wait_until
from tests.support.appender import RetryingAppender
from tests.support.scripted_llm import Reply, ScriptedLLM, last_user_text
from tests.support.turns import audit_turns, journals, unanswered, user
from topics.headers import H_APPEND_ID

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(150)]

PARTITIONS = 4
SESSION_TIMEOUT_S = 6  # the broker's minimum: a paused worker's partitions move after 6 s
STREAMS = 40
RATE = float(os.environ.get("AGENTSTREAM_FENCING_RATE", "175"))
PAUSE_S = float(os.environ.get("AGENTSTREAM_FENCING_PAUSE_S", "18"))
MODEL = "scripted"
ANSWER_DELAY_S = 1.0  # each call is in flight this long: the pause lands on running calls
SCRIPT = "import time\ntime.sleep(2)\nset_context('progress', 'woke up')\n'slept'"  # in flight 2 s


def pause_until_taken_over(
    zombie: Worker, survivor: Worker | list[Worker], at_least_s: float, then_s: float = 2.0
) -> float:
    """SIGSTOP `zombie` for at least `at_least_s` and until the survivors have taken every
    partition between them, plus `then_s` of work on them; the seconds paused."""
    survivors = survivor if isinstance(survivor, list) else [survivor]
    seen = [worker.log_size() for worker in survivors]
    zombie.pause()
    paused = time.monotonic()
    time.sleep(at_least_s)
    wait_until(
        lambda: (
            set().union(*(w.owned(since=at) for w, at in zip(survivors, seen, strict=True))) == set(range(PARTITIONS))
        ),
        60,
        f"the {survivors[0].kind} survivors to take every partition from the paused one",
        interval=0.2,
    )
    time.sleep(then_s)
    zombie.resume()
    return time.monotonic() - paused


@pytest.fixture
def spawned() -> Iterator[list[Worker]]:
    """The test's extra workers, stopped (woken first) before the stack closes."""
    workers: list[Worker] = []
    try:
        yield workers
    finally:
        for worker in workers:
            worker.stop(signal.SIGTERM)


# --- journal workers ---------------------------------------------------------------------------------


@pytest.fixture
def journal_stack(tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(tmp_path / "w0", partitions=PARTITIONS, log_level="INFO", session_timeout_s=SESSION_TIMEOUT_S)
    try:
        yield stack
    finally:
        stack.close()


@pytest.mark.parametrize(
    ("workers", "pause_s"),
    [
        # Paused past the transaction timeout as well: the broker aborts its open transaction and
        # fences its producer; it wakes to a fenced producer.
        (2, PAUSE_S),
        # Paused past the session timeout only: it wakes with a producer that still works, and the
        # group coordinator refuses its transaction's offsets (the group moved on).
        (3, 8.0),
    ],
    ids=["group-of-2", "group-of-3-short-pause"],
)
def test_5_2_a_journal_worker_paused_past_its_session_journals_nothing_twice(
    journal_stack: Stack, spawned: list[Worker], tmp_path: Path, workers: int, pause_s: float
) -> None:
    """behaviour §5.2, fencing: a journal worker paused (SIGSTOP) past its session timeout, its
    partitions moved to the other workers, wakes under load with commands fetched and records
    prepared; it writes nothing more to the partitions it lost. The committed journal holds per
    stream offsets 1..n each exactly once and every acknowledged append exactly once, and replay
    --verify equals the live rows."""
    stack = journal_stack
    client = stack.client
    appender = RetryingAppender(client)
    paths = [f"/fence/s{i:02d}" for i in range(STREAMS)]
    spawned += [Worker(stack, index, tmp_path) for index in range(workers)]
    *survivors, zombie = spawned
    started = time.monotonic()
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            begun = time.monotonic()
            n = 0
            while not stop.is_set():
                delay = begun + n / RATE - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                path = paths[n % STREAMS]
                appender.append(path, user(f"{path}#{n}"))
                n += 1
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    producer = threading.Thread(target=produce, name="fencing-producer")
    try:
        wait_until(lambda: all(w.owned() for w in spawned), 90, "every journal worker to own partitions")
        producer.start()
        time.sleep(5)  # all journal under load
        paused_s = pause_until_taken_over(zombie, survivors, pause_s)
        time.sleep(6)  # appends go on while the woken worker holds its stale backlog
        stop.set()
        producer.join()
        assert not errors, f"sending failed: {errors[0]!r}"
        results = appender.settle(timeout=90)
        time.sleep(2)  # a late write of the woken worker would show up now
        records = read_committed(client.topics.journal, timeout=60)
    finally:
        stop.set()
        appender.close()
        if producer.is_alive():
            producer.join()

    journal: dict[str, list[tuple[int, str | None, str]]] = defaultdict(list)
    append_ids: Counter[str] = Counter()
    offset_of: dict[str, int] = {}
    for message in records:
        event = orjson.loads(message.value())
        header = dict(message.headers() or ()).get(H_APPEND_ID)
        append_id = header.decode() if header is not None else None
        journal[event["streamPath"]].append((event["offset"], append_id, f"{message.partition()}:{message.offset()}"))
        if append_id is not None:
            append_ids[append_id] += 1
            offset_of[append_id] = event["offset"]
    duplicates: dict[str, list[int]] = {}  # stream -> offsets journaled more than once
    for path, events in journal.items():
        if twice_here := sorted(o for o, n in Counter(o for o, _, _ in events).items() if n > 1):
            duplicates[path] = twice_here
    not_gapless = [
        path for path, events in journal.items() if [o for o, _, _ in events] != list(range(1, len(events) + 1))
    ]
    acknowledged = {a for a, r in results.items() if r.status in ("journaled", "duplicate")}
    rejected = {a: r.reason for a, r in results.items() if r.status == "rejected"}
    twice = {a: n for a, n in append_ids.items() if n > 1}
    missing = sorted(acknowledged - set(append_ids))
    unknown = sorted(set(append_ids) - set(appender.paths))
    misreported = [a for a in acknowledged if a in offset_of and a not in twice and results[a].offset != offset_of[a]]
    fenced_logged = zombie.log().count("fenced")
    twice_in = sorted({int(at.split(":")[0]) for p, o in duplicates.items() for n, _, at in journal[p] if n in o})
    print(
        f"\nfencing, journal workers: {len(appender.paths)} appends ({appender.resends} resends), "
        f"{len(acknowledged)} acknowledged, {len(records)} committed journal records; one worker paused "
        f"{paused_s:.1f}s; duplicate (stream, offset) pairs: {sum(len(o) for o in duplicates.values())} in "
        f"{len(duplicates)} streams (journal partitions {twice_in}); streams not gapless 1..n: "
        f"{len(not_gapless)}; append ids journaled more than once: {len(twice)} ({sum(twice.values())} records); "
        f"acknowledged but not journaled: {len(missing)}; woken worker logged 'fenced' {fenced_logged} times; "
        f"{time.monotonic() - started:.1f}s so far"
    )
    example = next(iter(duplicates.items()), None)
    assert not duplicates, (
        f"{sum(len(o) for o in duplicates.values())} offsets journaled twice in {len(duplicates)} streams, e.g. "
        f"{example[0] if example else ''}: "
        f"{[(o, at) for o, _, at in journal[example[0]] if o in example[1][:3]] if example else ''}"
    )
    assert not not_gapless, f"{len(not_gapless)} streams' offsets are not 1..n in journal order: {not_gapless[:5]}"
    assert not twice, f"{len(twice)} append ids journaled more than once, e.g. {list(twice.items())[:5]}"
    assert not missing, f"{len(missing)} acknowledged appends not in the committed journal, e.g. {missing[:5]}"
    assert not rejected, f"{len(rejected)} appends rejected, e.g. {list(rejected.values())[:3]}"
    assert not unknown, f"the journal holds append ids never sent: {unknown[:5]}"
    assert not misreported, f"{len(misreported)} outcomes name another offset than the journal's: {misreported[:5]}"
    assert set(journal) == set(paths)
    for worker in spawned:
        assert worker.process.poll() is None, f"a journal worker died:\n{worker.log()[-4000:]}"

    # The woken worker and all survivors but one leave; that one takes every partition and its rows
    # equal a replay.
    survivor = survivors[0]
    seen = survivor.log_size()
    for worker in (zombie, *survivors[1:]):
        worker.stop(signal.SIGTERM)
    wait_until(lambda: survivor.owned(since=seen) == set(range(PARTITIONS)), 60, "the survivor to own everything")
    time.sleep(2)
    survivor.stop(signal.SIGTERM)
    settings = stack.settings.model_copy(update={"data_dir": survivor.data_dir})
    out = tmp_path / "replay"
    stats = replay(settings, out, progress=False)
    assert stats.events == len(records)
    differences = verify(out, live_store_paths(settings))
    assert differences == [], [str(d) for d in differences[:10]]
    print(f"replay --verify: {stats.events} events, no difference; {time.monotonic() - started:.1f}s")


# --- LLM callers and capability hosts ----------------------------------------------------------------


def respond(body: dict[str, Any]) -> Reply:
    """Deterministic in the request (a call repeated elsewhere answers the same, so its outcomes are
    duplicates): a script for a "script round" message, a plain acknowledgement of a script's result,
    else `ok: <message>` after ANSWER_DELAY_S."""
    last = last_user_text(body)
    if "Your script" in last:
        return Reply("noted.", usage=(20, 5))
    if "script round" in last:
        return Reply(f"Let me run it.\n```python\n{SCRIPT}\n```", usage=(20, 5))
    return Reply(f"ok: {last}", usage=(20, 5), delay=ANSWER_DELAY_S)


@pytest.fixture(scope="module")
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM(model=MODEL, default=respond, record=False) as server:
        yield server


@pytest.fixture
def turns_stack(tmp_path: Path, llm: ScriptedLLM) -> Iterator[Stack]:
    stack = Stack(
        tmp_path / "data",
        partitions=PARTITIONS,
        log_level="INFO",
        openai_base_url=llm.base_url,
        openai_api_key="sk-test-fencing",
        llm_transport="openai-compatible",
        llm_model=MODEL,
        session_timeout_s=SESSION_TIMEOUT_S,
    )
    try:
        yield stack
    finally:
        stack.close()


def converse(
    stack: Stack, agents: list[Any], text: str, every_s: float, pause: Callable[[], float]
) -> tuple[int, float]:
    """A round (one message to every agent) every `every_s` from before to after `pause()`; the
    rounds sent and the seconds paused."""
    stop = threading.Event()
    rounds: list[int] = []
    errors: list[BaseException] = []

    def talk() -> None:
        try:
            while not stop.is_set():
                n = len(rounds) + 1
                for agent in agents:
                    agent.append(user(f"{text} {n} for {agent.path}"))
                rounds.append(n)
                stop.wait(every_s)
            stack.client.flush(60)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    talker = threading.Thread(target=talk, name="conversations")
    talker.start()
    try:
        time.sleep(every_s)  # work in flight
        paused_s = pause()
        time.sleep(every_s + 1)  # and a round or two after the wake-up
    finally:
        stop.set()
        talker.join()
    assert not errors, f"sending failed: {errors[0]!r}"
    return len(rounds), paused_s


def settle_turns(stack: Stack, paths: list[str], timeout: float) -> dict[str, list[Any]]:
    deadline = time.monotonic() + timeout
    events = journals(stack)
    while (waiting := unanswered(events, paths)) and time.monotonic() < deadline:
        time.sleep(1)
        events = journals(stack)
    assert not waiting, f"{len(waiting)} agents still busy or unanswered, e.g. {waiting[:5]}"
    time.sleep(2)  # a late duplicate of the woken worker would show up now
    return journals(stack)


def assert_turns_settled_once(events: dict[str, list[Any]], paths: list[str], summary: str) -> int:
    audit = audit_turns(events, paths)
    assert not audit.settled_twice, f"{len(audit.settled_twice)} requests settled twice: {audit.settled_twice[:5]}"
    assert not audit.answered_twice, f"{len(audit.answered_twice)} answers twice: {audit.answered_twice[:5]}"
    assert not audit.unsettled, f"{len(audit.unsettled)} requests never settled: {audit.unsettled[:5]}; {summary}"
    assert not audit.not_succeeded, f"{len(audit.not_succeeded)} failed: {audit.not_succeeded[:3]}; {summary}"
    assert not unanswered(events, paths)
    return audit.requests


def dead_letters(stack: Stack) -> list[str]:
    return [
        dict(m.headers() or ()).get("reason", b"").decode()[:160]
        for m in read_committed(stack.client.topics.dlq, timeout=30)
    ]


def start_agents(stack: Stack, n: int) -> list[Any]:
    agents = [stack.client.agents.create() for _ in range(n)]
    agents[0].append(user("warm up")).wait(timeout=120)
    wait_until(lambda: not unanswered(journals(stack), [agents[0].path]), 120, "the warm-up turn", interval=0.5)
    return agents


def test_5_2_an_llm_caller_paused_past_its_session_settles_every_request_once(
    turns_stack: Stack, spawned: list[Worker], tmp_path: Path
) -> None:
    """behaviour §5.2, fencing, turns: two LLM callers in one group; one is paused (SIGSTOP) past
    its session timeout with calls in flight and wakes while agents keep taking turns. Every
    request settles once, no answer is journaled twice, no agent is left busy."""
    stack = turns_stack
    started = time.monotonic()
    stack.start_worker()
    spawned += [Worker(stack, i, tmp_path, kind="caller") for i in range(2)]
    survivor, zombie = spawned
    wait_until(lambda: survivor.owned() and zombie.owned(), 90, "both callers to own partitions")
    agents = start_agents(stack, 40)
    paths = [agent.path for agent in agents]
    rounds, paused_s = converse(
        stack, agents, "round", 3.0, lambda: pause_until_taken_over(zombie, survivor, SESSION_TIMEOUT_S + 2)
    )
    events = settle_turns(stack, paths, timeout=90)
    for caller in spawned:
        assert caller.process.poll() is None, f"a caller died:\n{caller.log()[-4000:]}"
    summary = f"{len(agents)} agents, {rounds} rounds, caller paused {paused_s:.1f}s"
    requests = assert_turns_settled_once(events, paths, summary)
    dead = dead_letters(stack)  # not part of the rule: a woken caller's repeated outcome may conflict
    took = time.monotonic() - started
    print(
        f"\nfencing, LLM callers: {summary}; {requests} requests, each settled once; dead-lettered: {len(dead)} "
        f"{dead[:1]}; {took:.1f}s"
    )


def test_5_2_a_capability_host_paused_past_its_session_settles_every_run_once(
    turns_stack: Stack, spawned: list[Worker], tmp_path: Path
) -> None:
    """behaviour §5.2, fencing, script runs: two capability hosts in one group; one is paused
    (SIGSTOP) past its session timeout with scripts running and wakes while agents keep running
    scripts. Every run starts and settles exactly once, every request settles once, no answer is
    journaled twice, no agent is left busy."""
    stack = turns_stack
    started = time.monotonic()
    stack.start_worker()
    stack.start_caller()
    env = stack.capabilities_env(concurrency=4, max_memory_mb=64, shutdown_timeout_s=5)
    spawned += [Worker(stack, i, tmp_path, kind="capabilities", env=env) for i in range(2)]
    survivor, zombie = spawned
    wait_until(lambda: survivor.owned() and zombie.owned(), 90, "both hosts to own partitions")
    agents = start_agents(stack, 16)
    paths = [agent.path for agent in agents]
    rounds, paused_s = converse(
        stack, agents, "script round", 5.0, lambda: pause_until_taken_over(zombie, survivor, SESSION_TIMEOUT_S + 2)
    )
    events = settle_turns(stack, paths, timeout=90)
    for host in spawned:
        assert host.process.poll() is None, f"a capability host died:\n{host.log()[-4000:]}"
    summary = f"{len(agents)} agents, {rounds} rounds, host paused {paused_s:.1f}s"

    runs: dict[str, Counter[str]] = defaultdict(Counter)  # path@execution id -> event type -> count
    settlements: Counter[str] = Counter()
    after_settled = 0  # the script's own appends journaled after its run settled
    for path in paths:
        settled_at: dict[str, int] = {}
        for event in events[path]:
            if event.type in (SCRIPT_RUN_REQUESTED, SCRIPT_RUN_STARTED, SCRIPT_RUN_SETTLED):
                runs[f"{path}@{event.payload.executionId}"][event.type] += 1
            if event.type == SCRIPT_RUN_SETTLED:
                settled_at[event.payload.executionId] = event.offset
                outcome = event.payload.settlement
                settlements[outcome.status if outcome.status == "succeeded" else outcome.failureKind] += 1
            actor = getattr(event.payload, "actor", None) if event.type == CONTEXT_ADDED else None
            if actor is not None and actor.type == "script" and event.payload.key == "progress":
                after_settled += actor.executionId in settled_at
    unsettled = [e for e, n in runs.items() if n[SCRIPT_RUN_SETTLED] == 0]
    twice = [e for e, n in runs.items() if n[SCRIPT_RUN_SETTLED] > 1 or n[SCRIPT_RUN_STARTED] > 1]
    dead = dead_letters(stack)
    print(
        f"\nfencing, capability hosts: {summary}; {len(runs)} script runs, settled {dict(settlements)}; "
        f"side effects journaled after their run settled: {after_settled}; dead-lettered: {len(dead)} "
        f"{dead[:2]}; {time.monotonic() - started:.1f}s"
    )
    assert not twice, f"{len(twice)} runs started or settled twice, e.g. {[(e, runs[e]) for e in twice[:3]]}"
    assert not unsettled, f"{len(unsettled)} runs never settled, e.g. {unsettled[:3]}"
    assert all(n[SCRIPT_RUN_REQUESTED] == 1 for n in runs.values())
    # A script's calls end with its run: the woken host's set_context after the survivor settled
    # the run as crashed is refused by the journal, never journaled after the settlement.
    assert after_settled == 0, f"{after_settled} set_context appends journaled after their run settled"
    requests = assert_turns_settled_once(events, paths, summary)
    print(f"{requests} requests, each settled once")
