"""The records the journal worker publishes after an event: `llm-requests` (call, cancel, compact,
settled) and `script-runs`, each built and checked through its `schemas` model."""

from __future__ import annotations

from typing import Any

from processors.grants import script_grants
from processors.state import AgentState
from schemas.capabilities import ScriptRunRecord
from schemas.config import AgentConfig
from schemas.requests import CallRequest, CancelRequest, CompactRequest, SettledNotice, Transport


def script_run_record(
    path: str, offset: int, created_at: str, code: str, execution_id: str, expires_at: int, config: AgentConfig
) -> bytes:
    """The `script-runs` record of the run requested at `path@offset`: the event's fields, and the
    agent's script timeout and grants from its configuration."""
    record = ScriptRunRecord(
        streamPath=path,
        offset=offset,
        createdAt=created_at,
        code=code,
        executionId=execution_id,
        expiresAt=expires_at,
        timeoutMs=config.scriptTimeoutMs,
        grants=script_grants(path, config.grants),
    )
    return record.model_dump_json().encode()


def cancel_record(path: str, request_offset: int) -> bytes:
    record = CancelRequest(
        kind="cancel", streamPath=path, requestOffset=request_offset, reason="interrupted-by-user-input"
    )
    return record_bytes(record)


def record_bytes(record: CallRequest | CancelRequest | CompactRequest | SettledNotice) -> bytes:
    """An `llm-requests` record, built and checked through its `schemas.requests` model."""
    return record.model_dump_json(exclude_none=True).encode()


def request_created_at(state: AgentState, request_offset: int) -> str | None:
    """createdAt of request R (its trailing timestamp message), while the state still knows it:
    R is open, or R is the newest request event (every request event seals the projection)."""
    if state.open is not None and state.open.offset == request_offset:
        return state.open.createdAt
    if state.published_through == request_offset:
        return state.last_request_created_at
    return None


def call_record(state: AgentState, messages: list[dict[str, Any]], transport: Transport) -> bytes:
    """The `call` record of the stream's open request, with the messages it is sent."""
    request = state.open
    assert request is not None
    record = CallRequest.model_validate(
        {
            "kind": "call",
            "streamPath": state.stream_path,
            "requestOffset": request.offset,
            "model": request.model,
            "transport": transport,
            "expiresAt": request.expiresAt,
            "attempt": state.consecutive_llm_failures + 1,
            "maxAttempts": state.config.llmRequestRetryPolicy.maxAttempts,
            "messages": messages,
        }
    )
    return record_bytes(record)
