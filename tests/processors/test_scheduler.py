"""Scheduler decisions (docs/behaviour.md §4.2, §4.3): pure functions of (state, now)."""

from __future__ import annotations

from processors import idempotency_keys as keys
from processors import rows
from processors.scheduler import backoff_ms, breaker_reason, decide, stale_expiry
from processors.state import AgentState
from schemas import events as ev
from schemas.events import AppendCommand
from tests.support.journal_builder import Journal

DEFAULT_MODEL = "default-model"


def born(j: Journal) -> None:
    j.created()
    j.system("policy", key="agent/system-prompt")


def only(state: AgentState, now_ms: int) -> tuple[str, dict, str]:
    decision = decide(state, now_ms, DEFAULT_MODEL)
    assert len(decision.appends) == 1, decision
    append = decision.appends[0]
    return append.type, append.payload, append.idempotencyKey


def test_4_2_request_waits_for_the_debounce_then_names_the_trigger() -> None:
    """§4.2: the request is appended once now >= trigger.atMs + debounce, keyed agent/request/<trigger>."""
    j = Journal()
    born(j)
    hi = j.user("hi")
    state = j.fold()
    at = j.at_ms(hi)
    early = decide(state, at + 249, DEFAULT_MODEL)
    assert early.appends == () and early.wake_at_ms == at + 250
    kind, payload, key = only(state, at + 250)
    assert kind == ev.LLM_REQUEST_REQUESTED
    assert key == f"agent/request/{hi}"
    assert payload == {"model": DEFAULT_MODEL, "expiresAt": at + 600_000}
    assert not decide(state, at + 250, DEFAULT_MODEL).after_commands  # journaled in the tick that finds it due


def test_4_2_debounce_counts_from_the_first_uncovered_trigger() -> None:
    """§4.2: continuous input cannot postpone a turn forever; the newest trigger names the request."""
    j = Journal(step_ms=100)
    born(j)
    first = j.user("a")
    for _ in range(5):
        newest = j.user("more")
    state = j.fold()
    _, _, key = only(state, j.at_ms(first) + 250)
    assert key == f"agent/request/{newest}"


def test_4_2_distributed_birth_holds_the_trigger_until_the_system_prompt() -> None:
    """§4.2: context before agent/created or before the prompt is reduced; the trigger is queued."""
    j = Journal()
    hi = j.user("early")
    state = j.fold()
    assert decide(state, j.at_ms(hi) + 10_000, DEFAULT_MODEL).appends == ()
    assert state.status == "queued"
    j.created()
    assert decide(j.fold(), j.at_ms(hi) + 10_000, DEFAULT_MODEL).appends == ()
    j.system("policy", key="agent/system-prompt")
    state = j.fold()
    _, _, key = only(state, j.at_ms(hi) + 10_000)
    assert key == f"agent/request/{hi}"  # the same trigger, scheduled once the prompt exists


def test_4_7_configured_model_and_debounce_are_used_and_pinned() -> None:
    """§4.7: the model comes from llm.model (pinned into the request); the debounce is configurable."""
    j = Journal()
    born(j)
    j.configured({"llm": {"model": "gpt-test"}, "llmRequestDebounceMs": 0, "llmRequestExpiryMs": 5000})
    hi = j.user("hi")
    _, payload, _ = only(j.fold(), j.at_ms(hi))
    assert payload == {"model": "gpt-test", "expiresAt": j.at_ms(hi) + 5000}


def test_4_2_one_open_request_at_a_time_and_expiry_cancels_it() -> None:
    """§4.2/§4.3: no request while one is open; past expiresAt it is settled cancelled/expired plus an error."""
    j = Journal()
    born(j)
    hi = j.user("hi")
    r = j.request(expires_at=j.at_ms(hi) + 1000)
    j.user("another")  # waits for the open request (after-current-request)
    state = j.fold()
    waiting = decide(state, j.at_ms(hi) + 999, DEFAULT_MODEL)
    assert waiting.appends == () and waiting.wake_at_ms == j.at_ms(hi) + 1000
    expiry = decide(state, j.at_ms(hi) + 1000, DEFAULT_MODEL)
    assert expiry.after_commands  # behind a settlement the caller may have produced already
    expired = expiry.appends
    assert [a.type for a in expired] == [ev.LLM_REQUEST_SETTLED, ev.STREAM_ERROR_OCCURRED]
    assert expired[0].payload == {"requestOffset": r, "result": {"status": "cancelled", "reason": "expired"}}
    assert f"@{r}" in expired[1].payload["message"]


def test_4_3_backoff_after_failures_is_added_to_the_debounce() -> None:
    """§4.3: backoff min(base·2^(failures-1), max) is added to the debounce of the retry trigger."""
    j = Journal()
    born(j)
    j.configured({"llmRequestRetryPolicy": {"maxAttempts": 5, "backoffBaseMs": 1000, "backoffMaxMs": 3000}})
    j.user("hi")
    expected = [1000, 2000, 3000, 3000]
    for failures, backoff in enumerate(expected, start=1):
        r = j.request()
        failed = j.settle(r, "failed")
        state = j.fold()
        assert state.consecutive_llm_failures == failures
        assert backoff_ms(state) == backoff
        assert state.pending is not None and state.pending.offset == failed
        due = state.pending.atMs + 250 + backoff
        assert decide(state, due - 1, DEFAULT_MODEL).wake_at_ms == due
        assert only(state, due)[2] == f"agent/request/{failed}"
    r = j.request()
    j.settle(r, "failed")
    state = j.fold()
    assert state.pending is None  # attempt 5 of 5 failed: give up, a new message starts fresh
    assert decide(state, 10**15, DEFAULT_MODEL).appends == ()


def test_4_3_breaker_pauses_before_turn_max_plus_one_without_external_input() -> None:
    """§4.3: an agent-loop trigger that would open turn maxAutonomousTurns+1 appends agent/paused."""
    j = Journal()
    born(j)
    j.configured({"maxAutonomousTurns": 2})
    j.user("go")
    r = j.request()
    j.settle(r)
    for _ in range(2):  # two agent-loop turns (actorless developer feedback)
        j.developer("tool result")
        r = j.request()
        j.settle(r)
    loop = j.developer("tool result")
    state = j.fold()
    assert state.autonomous_turn_count == 2
    kind, payload, key = only(state, 10**15)
    assert kind == ev.AGENT_PAUSED
    assert payload == {"reason": breaker_reason(2), "triggerOffset": loop}
    assert payload["reason"] == "autonomous turn limit reached (2 consecutive turns without external input)"
    assert key == f"agent/pause/{loop}"


def test_4_3_paused_agent_resumes_on_external_input_only() -> None:
    """§4.3: paused drops agent-loop triggers; an external trigger appends agent/resumed and runs."""
    j = Journal()
    born(j)
    j.user("go")
    j.settle(j.request())
    loop = j.developer("agent-loop feedback")
    j.paused(trigger_offset=loop, reason="limit")
    j.developer("more agent-loop feedback")
    state = j.fold()
    assert state.status == "paused" and state.pending is None
    assert decide(state, 10**15, DEFAULT_MODEL).appends == ()
    hi = j.user("hello again")
    state = j.fold()
    kind, _, key = only(state, 10**15)
    assert (kind, key) == (ev.AGENT_RESUMED, f"agent/resume/{hi}")
    j.resumed("external input")
    _, _, key = only(j.fold(), 10**15)
    assert key == f"agent/request/{hi}"


def test_4_3_an_expiry_is_stale_once_its_request_is_no_longer_open() -> None:
    """§4.3: an expiry journaled after the caller's settlement of R would report an expiry that did
    not happen: its settlement is stale once R is not open, its error event unless R was expired."""
    j = Journal()
    born(j)
    hi = j.user("hi")
    r = j.request(expires_at=j.at_ms(hi) + 1000)
    state = j.fold()
    path = state.stream_path
    assert path is not None
    expiry, error = (
        AppendCommand.model_validate(a.command(path)) for a in decide(state, j.at_ms(hi) + 1000, DEFAULT_MODEL).appends
    )
    nothing: dict[bytes, bytes] = {}
    assert stale_expiry(state, expiry, nothing.get) is None  # R is open: it expires
    assert stale_expiry(state, error, nothing.get) is not None  # not before its settlement
    expired_row = {rows.idempotency_key(path, keys.expired_key(r)): b"journaled"}
    assert stale_expiry(state, error, expired_row.get) is None
    j.settle(r)
    answered = j.fold()
    assert "no longer open" in (stale_expiry(answered, expiry, nothing.get) or "")
    other = AppendCommand.model_validate({"streamPath": path, "type": ev.CONTEXT_ADDED, "payload": {}})
    assert stale_expiry(answered, other, nothing.get) is None  # only expiries are judged


def test_4_3_an_expiry_of_a_request_settled_while_a_newer_one_is_open_is_stale() -> None:
    """§4.3: "A settlement the caller appended before the scheduler decided the expiry is journaled
    first, so R's outcome is the caller's, and the expiry then journals nothing", also when the
    next request R2 is open by the time the expiry of R arrives."""
    j = Journal()
    born(j)
    hi = j.user("hi")
    r = j.request(expires_at=j.at_ms(hi) + 1000)
    state = j.fold()
    path = state.stream_path
    assert path is not None
    expiry, _ = (
        AppendCommand.model_validate(a.command(path)) for a in decide(state, j.at_ms(hi) + 1000, DEFAULT_MODEL).appends
    )
    j.settle(r)
    j.user("next")
    r2 = j.request()
    newer_open = j.fold()
    assert newer_open.open is not None and newer_open.open.offset == r2
    assert stale_expiry(newer_open, expiry, {}.get) == f"request @{r} is no longer open (settled before it expired)"


def test_4_2_the_request_is_due_exactly_at_the_debounce_and_expires_exactly_at_expires_at() -> None:
    """§4.2: appended "once `now >= atMs + llmRequestDebounceMs + backoff`"; §4.3: "An open request
    past its `expiresAt`" is settled by the scheduler, from `expiresAt` on."""
    j = Journal()
    born(j)
    hi = j.user("hi")
    at = j.at_ms(hi)
    assert decide(j.fold(), at + 249, DEFAULT_MODEL).appends == ()
    assert only(j.fold(), at + 250)[0] == ev.LLM_REQUEST_REQUESTED
    j.request(expires_at=at + 600_000)
    state = j.fold()
    assert decide(state, at + 599_999, DEFAULT_MODEL).appends == ()
    assert [a.type for a in decide(state, at + 600_000, DEFAULT_MODEL).appends] == [
        ev.LLM_REQUEST_SETTLED,
        ev.STREAM_ERROR_OCCURRED,
    ]


def test_4_3_max_autonomous_turns_0_pauses_the_first_agent_loop_turn() -> None:
    """§4.7 allows `maxAutonomousTurns` 0: an agent-loop trigger would open turn 1 > 0."""
    j = Journal()
    born(j)
    j.configured({"maxAutonomousTurns": 0})
    j.user("go")
    j.settle(j.request())
    loop = j.developer("tool result")
    kind, payload, key = only(j.fold(), 10**15)
    assert (kind, key) == (ev.AGENT_PAUSED, f"agent/pause/{loop}")
    assert payload["reason"] == "autonomous turn limit reached (0 consecutive turns without external input)"


def test_4_2_no_turn_before_agent_created_even_with_the_system_prompt() -> None:
    """§4.2: the scheduler requests a turn only when "the agent is created (`agent/created` folded)"
    and a system prompt is in the system lane, among the rest; until then the trigger is queued."""
    j = Journal()
    j.system("policy", key="agent/system-prompt")
    hi = j.user("early")
    state = j.fold()
    waiting = decide(state, j.at_ms(hi) + 10_000, DEFAULT_MODEL)
    assert waiting.appends == () and waiting.wake_at_ms is None
    assert state.status == "queued"
    j.created()
    _, _, key = only(j.fold(), j.at_ms(hi) + 10_000)
    assert key == f"agent/request/{hi}"
