"""What a journaled event sets in motion, as records published in the same transaction as the
event (docs/architecture.md, "Commit protocol"): the LLM caller's work (a request's body, a cancel,
a settled notice, a compaction) and the capability host's (script commands, `script-runs`). The
script commands are addressed to this very worker: the engine journals them at once, right behind
the event, instead of sending them (`PartitionEngine._carry_out`).

Recovery asks the same questions of the streams it re-folds (`pipeline.journal.recovery`), so a
new owner publishes again exactly what the last one would have.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson

from pipeline import metrics
from pipeline.journal import records
from pipeline.journal.streams import StreamEntry
from processors.render import RenderBudget, as_of_request, render_messages
from processors.scripts import script_follow_ups
from processors.state import AgentState
from schemas.capabilities import SCRIPT_RUN_REQUESTED
from schemas.events import (
    CONTEXT_ADDED,
    LLM_REQUEST_REQUESTED,
    LLM_REQUEST_SETTLED,
    TOKEN_USAGE_REPORTED,
    InvalidPayloadEvent,
)
from schemas.requests import CompactRequest, SettledNotice, Transport

log = logging.getLogger("agentstream.journal")

Record = tuple[str, bytes, bytes]  # (topic, key, value)


class FollowUps:
    def __init__(self, topics: Any, transport: Transport, render_budget: Callable[[str], RenderBudget]) -> None:
        self.topics = topics
        self.transport = transport
        self.render_budget = render_budget  # per model: items are cut to fit its context window

    def request_messages(self, entry: StreamEntry, request_offset: int, model: str) -> list[dict[str, Any]] | None:
        """The messages request R was sent with: from memory, else rendered again exactly as R saw
        them (`as_of_request`). None when a compaction since R makes that impossible."""
        if entry.last_request is not None and entry.last_request[0] == request_offset:
            return entry.last_request[1]
        state = entry.state
        created_at = records.request_created_at(state, request_offset)
        view = as_of_request(state, request_offset)
        if view is None or created_at is None:
            return None
        messages = render_messages(view, self.transport, created_at, self.render_budget(model))
        entry.last_request = (request_offset, messages)
        return messages

    def after(self, entry: StreamEntry, event: Any) -> list[Record]:
        """Everything a journaled event sets in motion (`entry`: its stream, folded through it)."""
        if entry.state.open is None and event.type == CONTEXT_ADDED:
            # Most of what streams in: an item with no request open sets nothing in motion (each
            # branch below needs an open request or another event type). Asking every branch
            # cost about 5 % of the worker's instructions per command (bench/engine.py).
            return []
        return self._requests(entry, event) + self._scripts(entry, event)

    def _requests(self, entry: StreamEntry, event: Any) -> list[Record]:
        """A request body, a cancel, a settled notice or a compaction for the LLM caller."""
        state = entry.state
        path = event.streamPath
        records_out: list[Record] = []
        open_request = state.open
        if event.type == LLM_REQUEST_REQUESTED and open_request is not None and open_request.offset == event.offset:
            # The record must fit llm-requests whatever the projection holds: render within budget.
            with metrics.RENDER_SECONDS.time():
                messages = render_messages(
                    state, self.transport, event.createdAt, self.render_budget(open_request.model)
                )
            entry.last_request = (event.offset, messages)
            records_out.append(
                (self.topics.llm_requests, path.encode(), records.call_record(state, messages, self.transport))
            )
        elif open_request is not None and open_request.interruptedBy == event.offset:
            records_out.append(
                (self.topics.llm_requests, path.encode(), records.cancel_record(path, open_request.offset))
            )
        elif event.type == LLM_REQUEST_SETTLED and not isinstance(event, InvalidPayloadEvent):
            notice = SettledNotice(kind="settled", streamPath=path, requestOffset=event.payload.requestOffset)
            records_out.append((self.topics.llm_requests, path.encode(), records.record_bytes(notice)))
        elif event.type == TOKEN_USAGE_REPORTED:
            compact = self.compaction_record(entry, event.offset)
            if compact is not None:
                records_out.append((self.topics.llm_requests, path.encode(), compact))
        return records_out

    def _scripts(self, entry: StreamEntry, event: Any) -> list[Record]:
        """Agents run code: the run request, feedback or script result the event calls for (commands
        to the internal topic), and each journaled run request for the capability host (script-runs)."""
        records_out = self.script_commands(entry.state, event)
        if event.type == SCRIPT_RUN_REQUESTED and not isinstance(event, InvalidPayloadEvent):
            payload = event.payload
            record = records.script_run_record(
                event.streamPath,
                event.offset,
                event.createdAt,
                payload.code,
                payload.executionId,
                payload.expiresAt,
                entry.state.config,
            )
            records_out.append((self.topics.script_runs, event.streamPath.encode(), record))
        return records_out

    def script_commands(self, state: AgentState, event: Any) -> list[Record]:
        """The commands agent-run code calls for after `event` (`state`: folded through it). Live,
        the engine journals them at once; recovery sends them for the events it re-folds."""
        path = event.streamPath
        key = path.encode()
        return [
            (self.topics.internal_appends, key, orjson.dumps(append.command(path)))
            for append in script_follow_ups(state, event)
        ]

    def compaction_record(self, entry: StreamEntry, report_offset: int) -> bytes | None:
        """§4.5: summarize request R when its usage crossed the threshold (newest report only)."""
        report = entry.state.over_threshold
        if report is None or report.offset != report_offset or len(entry.state.history) == 0:
            return None
        messages = self.request_messages(entry, report.llmRequestOffset, report.model)
        if messages is None:
            log.warning(
                "%s: usage of @%d crossed the compaction threshold but the request cannot be rendered again "
                "(compacted since); compaction waits for the next report",
                entry.state.stream_path,
                report.llmRequestOffset,
            )
            return None
        record = CompactRequest.model_validate(
            {
                "kind": "compact",
                "streamPath": entry.state.stream_path,
                "requestOffset": report.llmRequestOffset,
                "reportOffset": report.offset,
                "model": report.model,
                "transport": self.transport,
                "tokens": report.tokens,
                "threshold": report.threshold,
                "messages": messages,
            }
        )
        return records.record_bytes(record)
