"""Turn scheduling decisions (docs/behaviour.md §4.2, §4.3): pure functions of (state, now).

`decide` says which events the scheduler should append now, if any, and when to look again. The
journal processor journals a decision's appends like any command, so the journal stays the only
record of what happened: at once, or, for a decision that must not overtake commands other workers
already produced (`after_commands`), behind them through the internal command topic.
"""

from __future__ import annotations

from dataclasses import dataclass

from processors import idempotency_keys as keys
from processors import rows
from processors.appends import Append
from processors.dedupe import RowReader
from processors.state import AgentState
from schemas.events import (
    AGENT_PAUSED,
    AGENT_RESUMED,
    LLM_REQUEST_REQUESTED,
    LLM_REQUEST_SETTLED,
    STREAM_ERROR_OCCURRED,
    AppendCommand,
)


@dataclass(frozen=True, slots=True)
class Decision:
    appends: tuple[Append, ...] = ()
    wake_at_ms: int | None = None  # look again at this time (a debounce or an expiry is due)
    # Journal the appends only after every command already produced: an expiry must not overtake
    # a settlement the LLM caller produced just before it (docs/behaviour.md §4.3).
    after_commands: bool = False


IDLE = Decision()


def stale_expiry(state: AgentState, command: AppendCommand, read: RowReader) -> str | None:
    """Why the scheduler's expiry command must not be journaled, if it must not (§4.3).

    Expiries queue behind the commands already produced, so the caller's settlement of R may be
    journaled first: then R is no longer open, the expiry is stale, and so is its error event
    (journaled only after its own settlement), which would report an expiry that did not happen.
    """
    expiry = keys.expiry_of(command.idempotencyKey)
    if expiry is None:
        return None
    request, is_error = expiry
    if is_error:
        if read(rows.idempotency_key(command.streamPath, keys.expired_key(request))) is None:
            return f"request @{request} was not settled as expired"
        return None
    if state.open is None or state.open.offset != request:
        return f"request @{request} is no longer open (settled before it expired)"
    return None


def backoff_ms(state: AgentState) -> int:
    """§4.3: min(base · 2^(failures-1), max) after a failure, 0 otherwise."""
    failures = state.consecutive_llm_failures
    if failures == 0:
        return 0
    policy = state.config.llmRequestRetryPolicy
    return min(policy.backoffBaseMs * 2 ** (failures - 1), policy.backoffMaxMs)


def breaker_reason(turns: int) -> str:
    return f"autonomous turn limit reached ({turns} consecutive turns without external input)"


def decide(state: AgentState, now_ms: int, default_model: str) -> Decision:
    """What the scheduler appends now for this stream (at most one step; the next fold re-decides)."""
    open_request = state.open
    if open_request is not None:
        if now_ms >= open_request.expiresAt:
            r = open_request.offset
            return Decision(
                (
                    Append(
                        LLM_REQUEST_SETTLED,
                        {"requestOffset": r, "result": {"status": "cancelled", "reason": "expired"}},
                        keys.expired_key(r),
                    ),
                    Append(
                        STREAM_ERROR_OCCURRED,
                        {"message": f"LLM request @{r} expired before it was answered; it was cancelled."},
                        keys.expiry_error_key(r),
                    ),
                ),
                after_commands=True,
            )
        return Decision(wake_at_ms=open_request.expiresAt)
    pending = state.pending
    if pending is None or not state.created or not state.has_system_prompt:
        return IDLE  # distributed birth: the trigger waits (queued) until the prompt arrives
    if state.paused:
        if pending.source == "external":
            return Decision((Append(AGENT_RESUMED, {"reason": "external input"}, keys.resume_key(pending.offset)),))
        return IDLE
    if pending.source == "agent-loop" and state.autonomous_turn_count >= state.config.maxAutonomousTurns:
        return Decision(
            (
                Append(
                    AGENT_PAUSED,
                    {"reason": breaker_reason(state.autonomous_turn_count), "triggerOffset": pending.offset},
                    keys.pause_key(pending.offset),
                ),
            )
        )
    due = pending.atMs + state.config.llmRequestDebounceMs + backoff_ms(state)
    if now_ms < due:
        return Decision(wake_at_ms=due)
    model = state.config.llm.model or default_model
    expires_at = pending.atMs + state.config.llmRequestExpiryMs
    return Decision(
        (
            Append(
                LLM_REQUEST_REQUESTED,
                {"model": model, "expiresAt": expires_at},
                keys.request_key(pending.offset),
            ),
        )
    )
