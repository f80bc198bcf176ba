"""What the MCP tools do, for both transports (docs/behaviour.md §9).

Appends go exactly as the HTTP API's: `prepare_command` (shape, the append gate, size), then the
gateway's `deliver` and `outcome`, so a refusal names the gate's rule and produces nothing. Reads
come from the journal mirror the console keeps (`pipeline.gateway.console.mirror`): every stream
folded by the reducer itself, so an agent's status and its next request are what the journal worker
decides from, and `read_context` renders with the worker's own function and budget.

A `DoorError` is a refusal or failure the model reads as a tool error (the tool answers nothing
else); an unknown or revoked token is the transport's business (`tools.Authority`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from pipeline.client import birth_commands, new_agent_path
from pipeline.client.prepare import new_append_id
from pipeline.gateway.commands import Problem, Ready, prepare_command
from pipeline.gateway.console.mirror import JournalMirror, MirroredStream
from pipeline.gateway.console.views import AgentRow, agent_row, filter_rows, slice_page
from pipeline.gateway.mcp.turns import (
    TurnWatch,
    as_envelope,
    event_window,
    sent_message,
    user_message,
    within_bytes,
)
from pipeline.gateway.service import ApiError
from processors.gate import Claims, in_scope
from processors.render import render_messages
from schemas.gateway import Journaled
from schemas.mcp import (
    AgentList,
    AgentSummary,
    ContextMessage,
    CreatedAgent,
    EventRange,
    RenderedContext,
    SentMessage,
)
from schemas.requests import Transport

if TYPE_CHECKING:
    from pipeline.gateway.service import Gateway
    from pipeline.settings import Settings

# A door that has just started (an `agentstream mcp` process) connects to Kafka and reads the journal
# within moments: a call that arrives meanwhile waits that long rather than failing.
KAFKA_READY_WAIT_S = 5.0
CATCH_UP_WAIT_S = 10.0
PROGRESS_INTERVAL_S = 2.0
# One answer of read_events stays this small however large the events (one event can be ~900 KiB):
# nextOffset says where to read on.
READ_EVENTS_MAX_BYTES = 4 * 1024 * 1024

# progress(elapsed seconds, total seconds, message): MCP progress notifications of the call.
Progress = Callable[[float, float | None, str], Awaitable[None]]


class DoorError(Exception):
    """A refusal or failure, in words the model can act on."""


def problem_text(problem: Problem) -> str:
    """A gateway problem in the HTTP API's own words (a refusal names the gate's rule)."""
    rule = f", rule {problem.rule}" if problem.rule else ""
    return f"{problem.error} ({problem.status}{rule}): {problem.detail}"


class Door:
    def __init__(self, gateway: Gateway, mirror: JournalMirror) -> None:
        self.gateway = gateway
        self.mirror = mirror

    @property
    def settings(self) -> Settings:
        return self.gateway.settings

    # --- the tools -------------------------------------------------------------------------------

    async def list_agents(self, claims: Claims, query: str, limit: int) -> AgentList:
        """Streams inside the token's scope that are agents (their `agent/created` is journaled)."""
        mirror = await self._caught_up()

        def row(entry: MirroredStream) -> AgentRow | None:
            return agent_row(entry.path, entry.state) if entry.state.created else None

        rows = [r for r in mirror.read_all(row, lambda path: in_scope(path, claims.scope)) if r is not None]
        shown, more = slice_page(filter_rows(rows, query), 0, limit)  # most recently active first
        agents = [
            AgentSummary(
                path=r.path,
                status=r.status,  # type: ignore[arg-type]  # AgentState.status: one of AgentStatus
                lastActivity=r.last_activity,
                events=r.events,
                openRequest=r.open_request,
            )
            for r in shown
        ]
        return AgentList(agents=agents, more=more)

    async def create_agent(self, claims: Claims, path: str | None) -> CreatedAgent:
        """The two events `agents.create()` appends, through the gate: only a platform token passes."""
        path = path or new_agent_path()
        readies = [self._prepare(claims, {**command, "streamPath": path}) for command in birth_commands()]
        created, prompt = await self._journal(readies)
        return CreatedAgent(
            path=path,
            createdOffset=created.offset,
            systemPromptOffset=prompt.offset,
            alreadyExisted=created.duplicate,
        )

    async def send_message(
        self, claims: Claims, path: str, text: str, interrupt: bool, wait_s: float, progress: Progress
    ) -> SentMessage:
        ready = self._prepare(claims, user_message(claims, path, text, interrupt))
        if wait_s <= 0:
            (journaled,) = await self._journal([ready])
            return sent_message(path, journaled.offset, None, 0)
        mirror = self._started()  # catching up while the append travels
        (journaled,) = await self._journal([ready])
        watch = await self._await_turn(mirror, path, TurnWatch(journaled.offset), wait_s, progress)
        return sent_message(path, journaled.offset, watch, wait_s)

    async def read_context(self, claims: Claims, path: str, transport: Transport | None) -> RenderedContext:
        """The next request's messages: the worker's render of the projection as folded now, within
        the budget of the model that request will go to (without the timestamp the request adds)."""
        mirror = await self._caught_up()
        settings = self.settings
        chosen = transport or settings.transport

        def view(entry: MirroredStream) -> RenderedContext:
            state = entry.state
            model = state.config.llm.model or settings.default_model
            messages = render_messages(state, chosen, None, settings.render_budget_for(model))
            return RenderedContext(
                streamPath=path,
                status=state.status,
                model=model,
                transport=chosen,
                publishedThrough=state.published_through,
                messages=[ContextMessage.model_validate(message) for message in messages],
            )

        found = mirror.read(path, view) if in_scope(path, claims.scope) else None
        if found is None:
            raise self._not_found(path)
        return found

    async def read_events(self, claims: Claims, path: str, from_offset: int | None, limit: int) -> EventRange:
        mirror = await self._caught_up()
        last = mirror.read(path, lambda entry: entry.state.cursor) if in_scope(path, claims.scope) else None
        if last is None:
            raise self._not_found(path)
        events = await mirror.events(path, list(event_window(last, from_offset, limit)))
        shown = within_bytes([as_envelope(event) for event in events], READ_EVENTS_MAX_BYTES)
        after = shown[-1].offset if shown else (from_offset or 1) - 1
        return EventRange(
            streamPath=path, lastOffset=last, events=shown, nextOffset=after + 1 if after < last else None
        )

    # --- appends ---------------------------------------------------------------------------------

    def _prepare(self, claims: Claims, raw: dict[str, object]) -> Ready:
        gateway = self.gateway
        ready = prepare_command(claims, raw, new_append_id(), gateway.topics, gateway.limits, origin="mcp")
        if isinstance(ready, Problem):
            raise DoorError(f"{problem_text(ready)}. Nothing was appended.")
        return ready

    async def _journal(self, readies: list[Ready]) -> list[Journaled]:
        """Produce the commands in order and wait until each is journaled (or raise its problem)."""
        await self._kafka_ready()
        gateway = self.gateway
        outcomes = [gateway.results.expect(ready.append_id) for ready in readies]
        try:
            for ready in readies:  # one producer and one partition: journaled in this order
                await gateway.deliver(ready)
            return [await gateway.outcome(ready, outcome) for ready, outcome in zip(readies, outcomes, strict=True)]
        except ApiError as error:
            raise DoorError(problem_text(error.problem)) from None
        finally:
            for ready in readies:
                gateway.results.forget(ready.append_id)

    async def _kafka_ready(self) -> None:
        gateway = self.gateway
        loop = asyncio.get_running_loop()
        deadline = loop.time() + KAFKA_READY_WAIT_S
        while not (gateway.producer.reachable and gateway.results.assigned) and loop.time() < deadline:
            await asyncio.sleep(0.1)
        try:
            gateway.require_kafka(waiting=True)
        except ApiError as error:
            raise DoorError(problem_text(error.problem)) from None

    # --- reading the journal ---------------------------------------------------------------------

    def _started(self) -> JournalMirror:
        """The mirror, following the journal (it starts at the first call: a gateway never asked pays
        nothing)."""
        self.mirror.ensure_started(asyncio.get_running_loop())
        return self.mirror

    async def _caught_up(self) -> JournalMirror:
        """The mirror once it has read the journal up to its end as of its start."""
        mirror = self._started()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CATCH_UP_WAIT_S
        while not mirror.caught_up and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if mirror.caught_up:
            return mirror
        if mirror.problem:
            raise DoorError(f"cannot read the journal: {mirror.problem}")
        raise DoorError("the door is still reading the journal (a long one takes a while); retry in a few seconds")

    @staticmethod
    def _not_found(path: str) -> DoorError:
        # The same answer whether the stream is outside the scope or does not exist: a token cannot
        # learn that a stream it may not read exists.
        return DoorError(f"no stream at {path} in this token's scope (or it has no events yet)")

    async def _await_turn(
        self, mirror: JournalMirror, path: str, watch: TurnWatch, wait_s: float, progress: Progress
    ) -> TurnWatch:
        """Follow the stream until the turn answering the message settles or `wait_s` pass, sending a
        progress notification at least every `PROGRESS_INTERVAL_S` and whenever the stream changes."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        subscriber = mirror.subscribe(lambda changed: changed == path)
        try:
            while True:
                subscriber.wake.clear()  # before reading: a change from now on wakes the wait below
                cursor = mirror.read(path, lambda entry: entry.state.cursor) or 0
                if cursor > watch.seen_through:
                    for event in await mirror.events(path, list(range(watch.seen_through + 1, cursor + 1))):
                        watch.see(event)
                if watch.settled:
                    return watch
                elapsed = loop.time() - started
                if elapsed >= wait_s:
                    return watch
                await progress(elapsed, wait_s, watch.progress_note())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(subscriber.wake.wait(), min(PROGRESS_INTERVAL_S, wait_s - elapsed))
        finally:
            mirror.unsubscribe(subscriber)
