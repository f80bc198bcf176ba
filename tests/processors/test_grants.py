"""What an agent may reach (docs/behaviour.md §6.6), broker-free.

The pure grants (`processors.grants`), the journal's subscription check, and the capability host's
granted functions (`pipeline.capabilities.grants.Grants`) over an in-memory journal: a refused
`read_event` reads nothing and a refused `send_to_agent` appends nothing.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.capabilities.grants import Grants
from pipeline.capabilities.references import ReferencedEvents
from pipeline.client import AppendResult
from processors import grants
from processors.grants import effective_grants, project_of, script_grants, subscription_refusal
from processors.journal import Journaled, Rejected, journal_command
from processors.state import SourceOffsets
from schemas.capabilities import ScriptGrants
from schemas.config import AgentConfig, AgentGrants, ConfigPatch, merge_config
from schemas.events import CONTEXT_ADDED, AppendCommand
from schemas.routing import AGENT_SUBSCRIBED
from tests.support.journal_builder import Journal

# --- an in-memory journal behind the host's reader and client ----------------------------------------


class MemoryJournal:
    """Events by stream: the reader side (`event`, `events_from`) and a count of every read."""

    def __init__(self) -> None:
        self.streams: dict[str, list[dict[str, Any]]] = {}
        self.reads: list[tuple[str, int]] = []

    def add(self, path: str, event_type: str, payload: dict[str, Any]) -> int:
        events = self.streams.setdefault(path, [])
        offset = len(events) + 1
        events.append({"streamPath": path, "offset": offset, "type": event_type, "payload": payload, "createdAt": "t"})
        return offset

    def event(self, path: str, offset: int) -> dict[str, Any] | None:
        self.reads.append((path, offset))
        events = self.streams.get(path, [])
        return events[offset - 1] if 0 < offset <= len(events) else None

    def events_from(self, path: str, offset: int) -> list[dict[str, Any]]:
        self.reads.append((path, offset))
        return self.streams.get(path, [])[max(offset - 1, 0) :]


class _Receipt:
    def __init__(self, offset: int) -> None:
        self.offset = offset

    def result(self, timeout: float | None = None) -> AppendResult:
        return AppendResult("a", "journaled", self.offset, None)

    async def outcome(self, timeout: float | None = None) -> AppendResult:
        return self.result(timeout)


class MemoryClient:
    """The client door: each append lands in the journal at once and is remembered."""

    def __init__(self, journal: MemoryJournal) -> None:
        self.journal = journal
        self.appends: list[tuple[str, dict[str, Any]]] = []
        self.streams = self

    def get(self, path: str) -> Any:
        client = self

        class _Stream:
            def append(self, command: dict[str, Any]) -> _Receipt:
                client.appends.append((path, command))
                return _Receipt(client.journal.add(path, command["type"], command["payload"]))

        return _Stream()


async def _inline(function: Callable[..., Any], *args: Any) -> Any:
    return function(*args)


def host_grants(journal: MemoryJournal, agent: str, granted: ScriptGrants | None) -> tuple[Grants, MemoryClient]:
    client = MemoryClient(journal)
    functions = Grants(
        path=agent,
        execution="agent-output:2",
        client=client,  # type: ignore[arg-type]
        reader=journal,  # type: ignore[arg-type]
        blocking=_inline,
        references=ReferencedEvents(journal),  # type: ignore[arg-type]
        granted=granted,
        requested_at=1,
    )
    return functions, client


# --- defaults --------------------------------------------------------------------------------------


def test_6_6_an_agents_project_is_its_path_without_the_last_segment() -> None:
    assert project_of("/agents/acme/a1") == "/agents/acme"
    assert project_of("/agents/a1") == "/agents"
    assert project_of("/a1") == ""


def test_6_6_default_grants_are_the_own_stream_the_project_and_integrations() -> None:
    granted = effective_grants("/agents/acme/a1", AgentGrants())
    assert granted.read == ("/agents/acme/a1",) and granted.read_referenced
    assert grants.may_read(granted, "/agents/acme/a1")
    assert not grants.may_read(granted, "/agents/acme/a2")  # a project peer's journal is not readable
    assert not grants.may_read(granted, "/agents/acme/a1/sub")
    assert grants.may_send(granted, "/agents/acme/a2")
    assert not grants.may_send(granted, "/agents/acme/team/a3")  # agents of the project, one level
    assert not grants.may_send(granted, "/agents/bob/a1")
    assert not grants.may_send(granted, "/integrations/github/42")
    assert grants.may_subscribe(granted, "/agents/acme/a2")
    assert grants.may_subscribe(granted, "/agents/acme/team/a3")
    assert grants.may_subscribe(granted, "/integrations/github/42")
    assert not grants.may_subscribe(granted, "/agents/bob/a1")
    assert not grants.may_subscribe(granted, "/agents/acme")  # the project path is not one of its streams


def test_6_6_a_configured_list_replaces_its_default_and_leaves_the_others() -> None:
    config = merge_config(
        merge_config(AgentConfig(), ConfigPatch.model_validate({"grants": {"read": ["/shared/**"]}})),
        ConfigPatch.model_validate({"grants": {"send": ["/agents/ops/*"]}}),
    )
    granted = effective_grants("/agents/acme/a1", config.grants)
    assert granted.read == ("/shared/**",) and not granted.read_referenced
    assert granted.send == ("/agents/ops/*",)
    assert granted.subscribe == ("/agents/acme/**", "/integrations/**")
    record = script_grants("/agents/acme/a1", config.grants)
    assert record == ScriptGrants(read=["/shared/**"], readReferenced=False, send=["/agents/ops/*"])


@pytest.mark.parametrize("glob", ["agents/x", "/agents/ x", "/agents/\u202ex", ""])
def test_6_6_a_grant_glob_must_look_like_a_path_glob(glob: str) -> None:
    with pytest.raises(ValueError, match="grants"):
        ConfigPatch.model_validate({"grants": {"send": [glob]}})


# --- the journal's subscription check ----------------------------------------------------------------


def _subscribe(agent: str, source: str) -> AppendCommand:
    return AppendCommand(streamPath=agent, type=AGENT_SUBSCRIBED, payload={"source": source})


def _routed(agent: str, source: str) -> AppendCommand:
    item = {
        "role": "developer",
        "content": "x",
        "actor": {"type": "integration", "name": "x"},
        "refs": [{"type": "event", "streamPath": source, "offset": 3}],
    }
    return AppendCommand(streamPath=agent, type=CONTEXT_ADDED, payload=item, idempotencyKey=f"route/{source}@3")


def test_6_6_a_subscription_outside_the_subscribe_grants_is_refused_by_the_journal() -> None:
    agent = "/agents/acme/a1"
    assert subscription_refusal(agent, True, AgentGrants(), _subscribe(agent, "/integrations/github/1")) is None
    assert subscription_refusal(agent, True, AgentGrants(), _subscribe(agent, "/agents/acme/b")) is None
    refusal = subscription_refusal(agent, True, AgentGrants(), _subscribe(agent, "/agents/bob/a1"))
    assert refusal is not None and refusal.startswith("forbidden: subscribe: /agents/bob/a1 is outside")
    narrowed = AgentGrants(subscribe=["/integrations/github/**"])
    assert subscription_refusal(agent, True, narrowed, _subscribe(agent, "/integrations/slack/1")) is not None


def test_6_6_only_an_agent_subscribes_or_receives_routed_items() -> None:
    path = "/agents/acme/not-yet"
    refusal = subscription_refusal(path, False, AgentGrants(), _subscribe(path, "/integrations/github/1"))
    assert refusal is not None and "not an agent" in refusal
    assert subscription_refusal(path, False, AgentGrants(), _routed(path, "/integrations/github/1")) is not None


def test_6_6_a_routed_item_is_checked_again_against_the_grants_as_they_are_now() -> None:
    agent = "/agents/acme/a1"
    assert subscription_refusal(agent, True, AgentGrants(), _routed(agent, "/integrations/github/1")) is None
    narrowed = AgentGrants(subscribe=["/agents/acme/**"])
    refusal = subscription_refusal(agent, True, narrowed, _routed(agent, "/integrations/github/1"))
    assert refusal is not None and refusal.startswith("forbidden: subscribe:")
    # An ordinary item is no subscription matter, even from outside.
    plain = AppendCommand(streamPath=agent, type=CONTEXT_ADDED, payload={"role": "user", "content": "hi"})
    assert subscription_refusal(agent, True, narrowed, plain) is None


# --- the host's granted functions -----------------------------------------------------------------------


def test_6_6_read_event_outside_the_grants_raises_permission_error_and_reads_nothing() -> None:
    journal = MemoryJournal()
    journal.add("/agents/bob/a1", CONTEXT_ADDED, {"role": "user", "content": "bob's private text"})
    functions, _ = host_grants(journal, "/agents/alice/a1", None)
    for ref in ("/agents/bob/a1@1", "/agents/bob/a1@99"):  # present or not: the same answer
        with pytest.raises(PermissionError, match=r"^/agents/bob/a1 is outside this agent's read grants$"):
            asyncio.run(functions.read_event(ref))
    assert not any(path == "/agents/bob/a1" for path, _ in journal.reads)


def test_6_6_read_event_reads_what_the_agents_own_items_reference_and_nothing_beside() -> None:
    journal = MemoryJournal()
    webhook = journal.add("/integrations/github/42", "x/webhook", {"secret": "s"})
    journal.add("/integrations/github/42", "x/webhook", {"other": 1})
    agent = "/agents/alice/a1"
    journal.add(agent, CONTEXT_ADDED, {"role": "user", "content": "hi"})
    functions, _ = host_grants(journal, agent, None)
    with pytest.raises(PermissionError):
        asyncio.run(functions.read_event(f"/integrations/github/42@{webhook}"))
    ref = {"type": "event", "streamPath": "/integrations/github/42", "offset": webhook}
    journal.add(agent, CONTEXT_ADDED, {"role": "developer", "content": "routed", "refs": [ref]})
    assert asyncio.run(functions.read_event(ref))["payload"] == {"secret": "s"}
    with pytest.raises(PermissionError):  # the next event of the same stream is not referenced
        asyncio.run(functions.read_event("/integrations/github/42@2"))
    assert asyncio.run(functions.read_event(f"{agent}@1"))["payload"]["content"] == "hi"


def test_6_6_send_to_agent_outside_the_grants_raises_permission_error_and_appends_nothing() -> None:
    journal = MemoryJournal()
    functions, client = host_grants(journal, "/agents/alice/a1", None)
    for target in ("/agents/bob/a1", "/integrations/github/42"):
        with pytest.raises(PermissionError, match="outside this agent's send grants"):
            asyncio.run(functions.send_to_agent(target, "forged"))
    assert client.appends == []
    assert asyncio.run(functions.send_to_agent("/agents/alice/a2", "hello")) == 1
    assert [path for path, _ in client.appends] == ["/agents/alice/a2"]


# --- the property: a call succeeds exactly when its target lies inside the grants -----------------


def _oracle_match(glob: str, path: str) -> bool:
    """Glob semantics, written independently: split into segments; `**` spans any characters."""
    pattern = ""
    for piece in re.split(r"(\*\*|\*|\?)", glob):
        pattern += {"**": ".*", "*": "[^/]*", "?": "[^/]"}.get(piece, re.escape(piece))
    return re.fullmatch(pattern, path) is not None


SEGMENTS = st.sampled_from(["agents", "integrations", "acme", "bob", "a1", "a2", "gh"])
PATHS = st.lists(SEGMENTS, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))
GLOBS = st.lists(st.sampled_from(["agents", "acme", "bob", "a1", "*", "**", "a?"]), min_size=1, max_size=4).map(
    lambda parts: "/" + "/".join(parts)
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    agent=PATHS,
    read=st.none() | st.lists(GLOBS, max_size=3),
    send=st.none() | st.lists(GLOBS, max_size=3),
    target=PATHS,
    referenced=st.booleans(),
)
def test_6_6_property_read_and_send_succeed_exactly_inside_the_grants(
    agent: str, read: list[str] | None, send: list[str] | None, target: str, referenced: bool
) -> None:
    journal = MemoryJournal()
    offset = journal.add(target, "x/thing", {"n": 1})
    if referenced and target != agent:
        ref = {"type": "event", "streamPath": target, "offset": offset}
        journal.add(agent, CONTEXT_ADDED, {"role": "developer", "content": "see", "refs": [ref]})
    configured = AgentGrants(read=read, send=send)
    functions, client = host_grants(journal, agent, script_grants(agent, configured))

    project = agent.rpartition("/")[0]
    if read is None:
        may_read = target == agent or (referenced and target != agent)
    else:
        may_read = any(_oracle_match(glob, target) for glob in read)
    if send is None:
        may_send = target.rpartition("/")[0] == project and target != project
    else:
        may_send = any(_oracle_match(glob, target) for glob in send)

    try:
        shown = asyncio.run(functions.read_event(f"{target}@{offset}"))
        assert may_read and shown["streamPath"] == target
    except PermissionError:
        assert not may_read
    appended_before = len(client.appends)
    try:
        asyncio.run(functions.send_to_agent(target, "hello"))
        assert may_send and client.appends[-1][0] == target
    except PermissionError:
        assert not may_send and len(client.appends) == appended_before


# --- through the journal's decision ---------------------------------------------------------------------


def _journal(state: Any, command: AppendCommand) -> Any:
    return journal_command(state, command, now_ms=1_796_000_000_000, sources=SourceOffsets(), read={}.get)


def test_6_6_the_journal_refuses_a_subscription_outside_the_grants_and_journals_one_inside() -> None:
    agent = Journal("/agents/acme/a1")
    agent.created()
    state = agent.fold()
    outside = _journal(state, _subscribe("/agents/acme/a1", "/agents/bob/a1"))
    assert isinstance(outside, Rejected) and outside.reason.startswith("forbidden: subscribe:")
    inside = _journal(state, _subscribe("/agents/acme/a1", "/integrations/github/42"))
    assert isinstance(inside, Journaled) and inside.event.offset == 2
    routed = _journal(state, _routed("/agents/acme/a1", "/agents/bob/a1"))
    assert isinstance(routed, Rejected) and routed.reason.startswith("forbidden: subscribe:")


def test_6_6_the_journal_refuses_a_subscription_into_a_stream_that_is_no_agent() -> None:
    state = Journal("/integrations/evil").fold()
    outcome = _journal(state, _subscribe("/integrations/evil", "/integrations/github/42"))
    assert isinstance(outcome, Rejected) and "not an agent" in outcome.reason
