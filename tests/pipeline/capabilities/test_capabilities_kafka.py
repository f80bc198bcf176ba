"""Agents run code, end to end on the real broker: the journal worker, the LLM caller and the capability
host run as real processes (`agentstream worker journal|caller|capabilities`), the scripted
OpenAI-compatible server plays the model, and the assertions are on the journal and on what the
model was sent.

One stack and one scripted server serve the module; each test has its own agents and tag, and the
server answers each request with the next response queued for the first tag it finds in it (else a
plain `ok`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from pipeline.client import Agent, AppendRejected
from pipeline.kafka.read import watermarks
from processors.reducer import epoch_ms, fold_all
from processors.render import render_cell, turn_json
from processors.scheduler import breaker_reason
from processors.scripts import feedback_text, transcribe
from processors.state import AgentState
from schemas.capabilities import SCRIPT_RUN_REQUESTED, SCRIPT_RUN_SETTLED, SCRIPT_RUN_STARTED
from schemas.events import (
    AGENT_CONFIGURED,
    AGENT_PAUSED,
    CONTEXT_ADDED,
    LLM_REQUEST_REQUESTED,
    LLM_REQUEST_SETTLED,
)
from tests.kafka_stack import Stack, wait_until
from tests.support.scripted_llm import Reply, ScriptedLLM, SlowStream
from tests.support.tagged_model import SMALL_USAGE, TaggedReplies, received, request_text, script

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

MODEL = "scripted"
WAIT = 45.0
API_KEY = "sk-proj-Capabilities0123456789abcdefXYZ"  # must never be visible to a script


ROUTER = TaggedReplies()


# --- journal helpers ---------------------------------------------------------------------------------


def new_tag() -> str:
    return f"tag-{uuid.uuid4().hex[:10]}"


def user(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": CONTEXT_ADDED,
        "payload": {"role": "user", "content": text, "actor": {"type": "user", "origin": "cli"}, **extra},
    }


def configured(**config: Any) -> dict[str, Any]:
    return {"type": AGENT_CONFIGURED, "payload": {"config": config}}


def of(events: list[Any], *types: str) -> list[Any]:
    return [e for e in events if e.type in types]


def script_items(events: list[Any]) -> list[Any]:
    return [
        e
        for e in of(events, CONTEXT_ADDED)
        if e.payload.actor is not None and e.payload.actor.type == "script" and e.payload.key is None
    ]


def journal_until(agent: Agent, predicate: Callable[[list[Any]], Any], what: str, timeout: float = WAIT) -> list[Any]:
    def ready() -> list[Any] | None:
        events = agent.stream.events()
        return events if predicate(events) else None

    return wait_until(ready, timeout, what, interval=0.2)


def settled_runs(n: int) -> Callable[[list[Any]], bool]:
    return lambda events: len(of(events, SCRIPT_RUN_SETTLED)) >= n


def transcribed(n: int) -> Callable[[list[Any]], bool]:
    """n runs settled and their results journaled back into the context."""
    return lambda events: len(of(events, SCRIPT_RUN_SETTLED)) >= n and len(script_items(events)) >= n


def idle_after(events: list[Any]) -> bool:
    """Folded through its last event, the agent has nothing to do: no request opens any more."""
    state = fold_all(AgentState(), events)
    return state.status == "idle" and state.pending is None


def new_agent(stack: Stack, tag: str, *events: dict[str, Any]) -> tuple[Agent, list[int]]:
    agent = stack.client.agents.create()
    offsets = [agent.append(event).wait(timeout=60) for event in events]
    return agent, offsets


# --- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM(model=MODEL, default=ROUTER) as server:
        yield server


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, llm: ScriptedLLM) -> Iterator[Stack]:
    stack = Stack(
        tmp_path_factory.mktemp("capabilities"),
        openai_base_url=llm.base_url,
        openai_api_key=API_KEY,
        llm_transport="openai-compatible",
        llm_model=MODEL,
        session_timeout_s=6,  # a SIGKILLed host's partitions move after 6 s (the broker's minimum)
    )
    try:
        stack.start_worker()
        stack.start_caller()
        stack.start_capabilities(concurrency=4, max_memory_mb=64)
        tag = new_tag()
        ROUTER.on(tag, script("'warm'"))
        agent, _ = new_agent(stack, tag, user(f"{tag} warm up"))
        journal_until(agent, settled_runs(1), "the warm-up run", timeout=120)
        yield stack
    finally:
        stack.stop_capabilities()
        stack.stop_caller()
        stack.close()


@pytest.fixture
def kit(stack: Stack, llm: ScriptedLLM) -> Iterator[tuple[Stack, ScriptedLLM]]:
    yield stack, llm
    host = stack.capabilities
    assert host is not None and host.poll() is None, "the capability host died"
    assert stack.worker is not None and stack.worker.poll() is None, "the journal worker died"


# --- running code and results back into context ----------------------------------------------------


def test_agents_run_code_read_event_result_comes_back_as_user_text_and_the_agent_loop_continues(
    kit: tuple[Stack, ScriptedLLM],
) -> None:
    """Who may run code: the live request's answer with exactly one python block runs (run requested
    with executionId agent-output:<answer offset> and expiresAt = answer createdAt + llmRequestExpiryMs,
    started, settled). Results back into context: the result is transcribed into a developer item
    (actor script, after-current-request) that the next request shows as provider user, and it is an
    agent-loop trigger: the agent's next turn runs."""
    stack, llm = kit
    tag = new_tag()
    agent = stack.client.agents.create()
    ref = f"{agent.path}@3"  # the user message below
    code = f"event = read_event({ref!r})\n{{'type': event['type'], 'said': event['payload']['content']}}"
    ROUTER.on(tag, script(code), Reply("The event says hello.", usage=SMALL_USAGE))
    (message,) = [agent.append(user(f"{tag} hello")).wait(timeout=60)]
    assert message == 3
    events = journal_until(
        agent, lambda es: len(of(es, LLM_REQUEST_SETTLED)) >= 2 and idle_after(es), "the script and the next turn"
    )

    answer = next(e for e in of(events, CONTEXT_ADDED) if e.payload.role == "assistant")
    (requested,) = of(events, SCRIPT_RUN_REQUESTED)
    (started,) = of(events, SCRIPT_RUN_STARTED)
    (settled,) = of(events, SCRIPT_RUN_SETTLED)
    execution = f"agent-output:{answer.offset}"
    assert requested.idempotencyKey == f"agent/script-run-requested@{answer.offset}"
    assert requested.payload.executionId == execution and requested.payload.code == code
    assert requested.payload.expiresAt == epoch_ms(answer.createdAt) + 600_000
    assert started.idempotencyKey == f"capability-host/script-run-started@{execution}"
    assert settled.idempotencyKey == f"capability-host/script-run-settled@{execution}"
    assert requested.offset < started.offset < settled.offset
    assert settled.payload.settlement.model_dump(exclude_none=True) == {
        "status": "succeeded",
        "result": {"type": CONTEXT_ADDED, "said": f"{tag} hello"},
    }
    assert settled.payload.durationMs is not None

    (result,) = script_items(events)
    assert result.idempotencyKey == f"agent/script-result@{execution}"
    assert result.payload.role == "developer" and result.payload.actor.executionId == execution
    assert result.payload.llmRequestPolicy.behaviour == "after-current-request"
    assert result.payload.content == transcribe(settled.payload.settlement, 30_000)
    assert result.payload.content.startswith('Your script returned:\n```json\n{\n  "type"')

    _, second = received(llm, tag)
    shown = [m for m in second.body["messages"] if "Your script returned:" in m["content"]]
    assert shown == [
        {"role": "user", "content": f'@{result.offset} actor=script:"{execution}"\n{result.payload.content}'}
    ]
    _, r2 = of(events, LLM_REQUEST_REQUESTED)
    assert r2.idempotencyKey == f"agent/request/{result.offset}" and r2.offset > result.offset
    assert fold_all(AgentState(), [e for e in events if e.offset <= r2.offset]).autonomous_turn_count == 1
    assert "Let me check." in request_text(second.body) and "```python" in request_text(second.body)


def test_results_back_into_context_a_script_that_returns_nothing_ends_the_turn(kit: tuple[Stack, ScriptedLLM]) -> None:
    """Results back into context: succeeded, no result, no output: nothing is appended and the turn
    ends (the agent is idle with no trigger pending)."""
    stack, _ = kit
    tag = new_tag()
    ROUTER.on(tag, script("x = 40 + 2"), script("'next'"))
    agent, _ = new_agent(stack, tag, user(f"{tag} compute quietly"))
    events = journal_until(agent, settled_runs(1), "the settlement")
    (settled,) = of(events, SCRIPT_RUN_SETTLED)
    assert settled.payload.settlement.model_dump(exclude_none=True) == {"status": "succeeded"}
    assert idle_after(events)
    assert len(of(events, LLM_REQUEST_REQUESTED)) == 1
    # A later run is the sync point: a result item of the quiet run would be journaled before it.
    agent.append(user(f"{tag} next")).wait(timeout=60)
    events = journal_until(agent, lambda es: script_items(es), "the later run's result")
    (result,) = script_items(events)
    assert result.payload.actor.executionId != settled.payload.executionId


# --- who may run code --------------------------------------------------------------------------------


def test_who_may_run_an_interrupted_partial_never_runs(kit: tuple[Stack, ScriptedLLM]) -> None:
    """Who may run code: the interrupted call's partial output (no llmRequestOffset) holds a complete
    python block, and it never runs."""
    stack, llm = kit
    tag = new_tag()
    partial = "Running it:\n```python\nset_context('ran', 'yes')\n```\nand then "
    words = tuple(partial.split(" "))
    chunks = (*(w + " " for w in words[:-1]), words[-1], *(f" more{i}" for i in range(200)))
    ROUTER.on(tag, SlowStream("".join(chunks), chunk_delay=0.05, chunks=chunks, usage=SMALL_USAGE))
    agent, _ = new_agent(stack, tag, user(f"{tag} go"))
    llm.wait_for(lambda rs: [r for r in rs if tag in request_text(r.body) and r.chunks_sent > len(words) + 5], WAIT)
    agent.append(user(f"{tag} stop", llmRequestPolicy={"behaviour": "interrupt-current-request"})).wait(timeout=60)
    events = journal_until(agent, lambda es: len(of(es, LLM_REQUEST_SETTLED)) >= 2 and idle_after(es), "the next turn")
    (cut,) = [
        e for e in of(events, CONTEXT_ADDED) if e.payload.role == "assistant" and e.payload.llmRequestOffset is None
    ]
    assert "```python\nset_context('ran', 'yes')\n```" in cut.payload.content
    assert of(events, SCRIPT_RUN_REQUESTED) == []


def test_who_may_run_an_answer_to_an_older_request_never_runs(kit: tuple[Stack, ScriptedLLM]) -> None:
    """Who may run code: an assistant item naming a closed request, even from the workers' topic,
    is not the live request's output and never runs; on the public topic such an item is refused."""
    stack, _ = kit
    tag = new_tag()
    agent, _ = new_agent(stack, tag, user(f"{tag} hi"))
    events = journal_until(agent, lambda es: of(es, LLM_REQUEST_SETTLED) and idle_after(es), "the first turn")
    (old,) = of(events, LLM_REQUEST_REQUESTED)
    stale = {
        "role": "assistant",
        "content": "```python\nset_context('ran', 'yes')\n```",
        "llmRequestOffset": old.offset,
    }
    with pytest.raises(AppendRejected, match="written by the workers"):
        agent.append({"type": CONTEXT_ADDED, "payload": stale})
    late = stack.internal_client.streams.get(agent.path).append({"type": CONTEXT_ADDED, "payload": stale}).wait(60)
    # A later genuine run is the sync point: a follow-up of the stale answer would be journaled first.
    ROUTER.on(tag, script("'later'"))
    agent.append(user(f"{tag} again")).wait(timeout=60)
    events = journal_until(agent, settled_runs(1), "the later run")
    (requested,) = of(events, SCRIPT_RUN_REQUESTED)
    assert requested.offset > late
    assert requested.payload.code == "'later'"
    assert not [e for e in of(events, CONTEXT_ADDED) if e.payload.key == "ran"]


def test_extraction_two_python_blocks_nothing_runs_and_the_agent_is_told(kit: tuple[Stack, ScriptedLLM]) -> None:
    """Extraction: two python blocks: nothing runs; the worker appends the feedback item (no actor,
    after-current-request, key agent/script-feedback@<answer>), which takes the agent's next turn."""
    stack, llm = kit
    tag = new_tag()
    two = "First:\n```python\nset_context('a', '1')\n```\nThen:\n```py\nset_context('b', '2')\n```"
    ROUTER.on(tag, Reply(two, usage=SMALL_USAGE), Reply("Understood.", usage=SMALL_USAGE))
    agent, _ = new_agent(stack, tag, user(f"{tag} do two things"))
    events = journal_until(agent, lambda es: len(of(es, LLM_REQUEST_SETTLED)) >= 2 and idle_after(es), "the retry")
    answer = next(e for e in of(events, CONTEXT_ADDED) if e.payload.role == "assistant")
    (feedback,) = [e for e in of(events, CONTEXT_ADDED) if e.idempotencyKey == f"agent/script-feedback@{answer.offset}"]
    assert feedback.payload.model_dump(exclude_none=True) == {
        "role": "developer",
        "content": feedback_text(2),
        "llmRequestPolicy": {"behaviour": "after-current-request"},
    }
    assert of(events, SCRIPT_RUN_REQUESTED) == []
    assert feedback_text(2) in request_text(received(llm, tag)[1].body)


# --- the sandbox -------------------------------------------------------------------------------------

SANDBOX_CASES: dict[str, tuple[str, str, str]] = {
    # name: (code, failureKind, text the error must contain)
    "endless loop": ("while True:\n    pass", "timeout", "TimeoutError"),
    "gigabytes": ("blob = [0] * (10 ** 9)\nlen(blob)", "limit", "MemoryError"),
    "a file": ("open('/etc/passwd').read()", "runtime", "PermissionError"),
    "the environment": ("import os\nos.environ['AGENTSTREAM_OPENAI_API_KEY']", "runtime", "not supported"),
    "one variable": ("import os\nos.getenv('OPENAI_API_KEY')", "runtime", "not supported"),
    "a socket": ("import socket\nsocket.create_connection(('127.0.0.1', 19092))", "runtime", "ModuleNotFoundError"),
    "os.system": ("import os\nos.system('id')", "runtime", "has no attribute 'system'"),
    "subprocess": ("import subprocess\nsubprocess.run(['id'])", "runtime", "No module named 'subprocess'"),
    "a syntax error": ("x = (", "syntax", "SyntaxError"),
}


def test_sandbox_refuses_escapes_and_stops_runaways_and_the_host_keeps_serving(kit: tuple[Stack, ScriptedLLM]) -> None:
    """The sandbox: an endless loop stops at scriptTimeoutMs (failed/timeout); allocating gigabytes
    fails (failed/limit); files, the environment (no API key visible), sockets, os and subprocess
    fail as runtime errors that say what the sandbox lacks; a syntax error fails in parse and did not
    execute. The host survives all of them and keeps serving."""
    stack, _ = kit
    agents: dict[str, Agent] = {}
    for name, (code, _, _) in SANDBOX_CASES.items():
        tag = new_tag()
        ROUTER.on(tag, script(code))
        agents[name], _ = new_agent(stack, tag, configured(scriptTimeoutMs=1500), user(f"{tag} try {name}"))
    for name, agent in agents.items():
        events = journal_until(agent, transcribed(1), f"the settlement of {name}")
        (settled,) = of(events, SCRIPT_RUN_SETTLED)
        outcome = settled.payload.settlement
        code, kind, says = SANDBOX_CASES[name]
        assert outcome.status == "failed" and outcome.failureKind == kind, (name, outcome)
        assert says in outcome.error, (name, outcome.error)
        assert API_KEY not in outcome.error
        if kind == "syntax":
            assert (outcome.phase, outcome.executionMayHaveOccurred) == ("parse", False)
        else:
            assert (outcome.phase, outcome.executionMayHaveOccurred) == ("run", True)
        if kind == "runtime":
            assert "The sandbox has no filesystem, network, environment variables" in outcome.error
        (result,) = script_items(events)
        assert result.payload.content.startswith(f"Your script failed during {outcome.phase} ({kind}):\n```\n")

    tag = new_tag()
    ROUTER.on(tag, script("print('still here')\nnow()"))
    agent, _ = new_agent(stack, tag, user(f"{tag} are you alive?"))
    events = journal_until(agent, settled_runs(1), "a run after the escapes")
    (settled,) = of(events, SCRIPT_RUN_SETTLED)
    assert settled.payload.settlement.status == "succeeded"
    assert settled.payload.settlement.stdout == "still here\n"
    assert settled.payload.settlement.result.endswith("Z")


# --- granted functions -------------------------------------------------------------------------------


def test_send_to_agent_makes_another_agent_answer_and_set_context_updates_a_keyed_slot(
    kit: tuple[Stack, ScriptedLLM],
) -> None:
    """Granted functions: `set_context(key, content)` appends a keyed developer item (actor the
    script, dont-trigger-request) to the agent's own stream: the slot holds the newest; and
    `send_to_agent(path, content)` appends a developer item (actor this agent, after-current-request)
    to the other agent, which takes a turn and sees how to reply."""
    stack, llm = kit
    tag, other_tag = new_tag(), new_tag()
    other, _ = new_agent(stack, other_tag, configured(llmRequestDebounceMs=50))
    code = (
        "set_context('notes', 'draft 1')\n"
        "set_context('notes', 'draft 2')\n"
        f"send_to_agent({other.path!r}, {f'{other_tag} hello from a script'!r})\n"
        "'sent'"
    )
    ROUTER.on(tag, script(code))
    agent, _ = new_agent(stack, tag, user(f"{tag} write notes and tell the other agent"))
    events = journal_until(agent, settled_runs(1), "the run")
    (settled,) = of(events, SCRIPT_RUN_SETTLED)
    assert settled.payload.settlement.status == "succeeded", settled.payload.settlement
    execution = settled.payload.executionId
    notes = [e for e in of(events, CONTEXT_ADDED) if e.payload.key == "notes"]
    assert [n.payload.content for n in notes] == ["draft 1", "draft 2"]
    for note in notes:
        assert note.payload.role == "developer"
        assert note.payload.actor.model_dump() == {"type": "script", "executionId": execution}
        assert note.payload.llmRequestPolicy.behaviour == "dont-trigger-request"
    assert [n.idempotencyKey for n in notes] == [
        f"capability-host/{execution}/call-1",
        f"capability-host/{execution}/call-2",
    ]
    state = fold_all(AgentState(), events)
    assert state.history.by_key["notes"].item.content == "draft 2"

    theirs = journal_until(other, lambda es: of(es, LLM_REQUEST_SETTLED), "the other agent's turn")
    (message,) = [
        e for e in of(theirs, CONTEXT_ADDED) if e.payload.actor is not None and e.payload.actor.type == "agent"
    ]
    assert message.payload.actor.path == agent.path
    assert message.payload.content == f"{other_tag} hello from a script"
    assert message.payload.llmRequestPolicy.behaviour == "after-current-request"
    assert message.idempotencyKey == f"capability-host/from{agent.path}/{execution}/call-3"
    # The other agent's request; the first agent's next turn quotes the script, other_tag included.
    (request,) = [r for r in received(llm, other_tag) if tag not in request_text(r.body)]
    cell = next(c for c in fold_all(AgentState(), theirs).history.cells if c.offset == message.offset)
    role, content = render_cell(cell)
    assert role == "developer"  # another agent is trusted context, not demoted
    assert content.splitlines()[1] == (
        f"To reply to {agent.path} (which cannot see this conversation), "
        "send it a message with send_to_agent(path, content)."
    )
    assert {"role": "system", "content": content} in request.body["messages"]  # openai-compatible


# --- crash safety ------------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    """Direct child processes of `pid` (the host's sandbox workers)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def test_crash_safety_a_host_killed_mid_run_settles_once_as_crashed_and_never_runs_twice(
    kit: tuple[Stack, ScriptedLLM],
) -> None:
    """A started execution whose host died settles failed/crashed with executionMayHaveOccurred true,
    exactly once, and is never run again (its one side effect is journaled once)."""
    stack, _ = kit
    tag = new_tag()
    ROUTER.on(tag, script("set_context('progress', 'started the long job')\nwhile True:\n    pass"))
    agent, _ = new_agent(stack, tag, configured(scriptTimeoutMs=20_000), user(f"{tag} run the long job"))
    journal_until(agent, lambda es: [e for e in of(es, CONTEXT_ADDED) if e.payload.key == "progress"], "the run")
    host = stack.capabilities
    sandboxes = _children(host.pid)
    stack.stop_capabilities(signal.SIGKILL)
    for pid in sandboxes:  # the killed host's sandbox workers (spinning in the script) go with it
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    stack.start_capabilities(concurrency=4, max_memory_mb=64)
    events = journal_until(agent, transcribed(1), "the crashed settlement", timeout=90)

    assert len(of(events, SCRIPT_RUN_STARTED)) == 1
    (settled,) = of(events, SCRIPT_RUN_SETTLED)
    assert settled.payload.settlement.model_dump(exclude_none=True) == {
        "status": "failed",
        "error": "the capability host stopped while the script was running; it is not run again",
        "failureKind": "crashed",
        "phase": "run",
        "executionMayHaveOccurred": True,
    }
    (result,) = script_items(events)
    assert result.payload.content.endswith("The script may have partially executed; inspect state before retrying.")
    # A later run of the same agent is the sync point: the crashed run never ran again before it.
    ROUTER.on(tag, script("'after the crash'"))
    agent.append(user(f"{tag} next")).wait(timeout=60)
    events = journal_until(agent, settled_runs(2), "a run after the restart")
    assert len(of(events, SCRIPT_RUN_STARTED)) == 2 and len(of(events, SCRIPT_RUN_SETTLED)) == 2
    assert len([e for e in of(events, CONTEXT_ADDED) if e.payload.key == "progress"]) == 1


def test_crash_safety_a_run_whose_script_runs_record_was_lost_runs_after_the_journal_worker_restarts(
    kit: tuple[Stack, ScriptedLLM],
) -> None:
    """The journal worker may die between journaling a run request and publishing its `script-runs`
    record, the host's only notice of the run. After a restart the worker publishes the record of
    every unsettled run again (code read back from the journal): the run executes once, its result
    comes back, and the agent is not left running a script forever."""
    stack, _ = kit
    tag = new_tag()
    ROUTER.on(tag, script("print('ran after the restart')\n41 + 1"))
    stack.stop_capabilities()  # nobody takes the record before it is lost
    try:
        agent, _ = new_agent(stack, tag, user(f"{tag} run it"))
        journal_until(agent, lambda es: of(es, SCRIPT_RUN_REQUESTED), "the run request")
        # Lose the record as a worker killed before publishing it would: the hosts' group skips it.
        topic = stack.client.topics.script_runs
        group = {**stack.settings.kafka_client_config(), "group.id": f"{stack.settings.app_id}-capabilities"}
        consumer = Consumer(group)
        try:
            partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            ends = [TopicPartition(topic, p, watermarks(consumer, TopicPartition(topic, p))[1]) for p in partitions]
            consumer.commit(offsets=ends, asynchronous=False)
        finally:
            consumer.close()
        stack.stop_worker()
        stack.start_worker()
    finally:
        stack.start_capabilities(concurrency=4, max_memory_mb=64)
    events = journal_until(agent, transcribed(1), "the run and its result", timeout=90)

    (requested,) = of(events, SCRIPT_RUN_REQUESTED)
    assert len(of(events, SCRIPT_RUN_STARTED)) == 1
    (settled,) = of(events, SCRIPT_RUN_SETTLED)
    assert settled.payload.executionId == requested.payload.executionId
    assert settled.payload.settlement.model_dump(exclude_none=True) == {
        "status": "succeeded",
        "result": 42,
        "stdout": "ran after the restart\n",
    }
    (result,) = script_items(events)
    assert "ran after the restart" in result.payload.content
    assert fold_all(AgentState(), events).scripts == {}


# --- the breaker -------------------------------------------------------------------------------------


def test_results_back_into_context_a_script_loop_stops_at_max_autonomous_turns(kit: tuple[Stack, ScriptedLLM]) -> None:
    """Results back into context are agent-loop triggers: a model that answers every result with
    another script loops until maxAutonomousTurns, then the breaker appends agent/paused."""
    stack, _ = kit
    tag = new_tag()
    ROUTER.always(tag, script("print('again')"))
    agent, _ = new_agent(stack, tag, configured(maxAutonomousTurns=2, llmRequestDebounceMs=50), user(f"{tag} loop"))
    events = journal_until(agent, lambda es: of(es, AGENT_PAUSED) and settled_runs(3)(es), "the pause")
    (paused,) = of(events, AGENT_PAUSED)
    assert paused.payload.reason == breaker_reason(2)
    assert len(of(events, LLM_REQUEST_REQUESTED)) == 3  # one external turn, two autonomous
    results = script_items(events)
    assert len(results) == 3 and paused.payload.triggerOffset == results[-1].offset
    assert turn_json(fold_all(AgentState(), events))["status"] == "paused"
