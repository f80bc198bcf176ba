"""What the LLM caller appends for each outcome of a call (docs/behaviour.md §4.3, §4.4, §4.5): pure decisions.

No Kafka, no HTTP: given a request and what the provider did, return the append commands in the
order they must be journaled. Every command carries an idempotency key derived from the request
offset R (or, for a compaction summary, from the usage report's offset), so a caller that repeats a
call after a restart cannot double-append: the journal answers a repeated key with "duplicate"
(same body) or keeps the first body (different body, e.g. a different text from a repeated call).

Secrets never reach the journal: provider error text is scrubbed (`scrub`) of the configured API
key, authorization header values and key-shaped tokens before it is appended or logged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from processors.appends import Append  # the caller types its appends as llm_outcomes.Append
from processors.files import hint_line
from processors.idempotency_keys import (
    assistant_key,
    compaction_key,
    error_key,
    overflow_compaction_key,
    partial_key,
    settled_key,
    usage_key,
)
from processors.render import provider_role
from schemas.events import CONTEXT_ADDED, LLM_REQUEST_SETTLED, STREAM_ERROR_OCCURRED, TOKEN_USAGE_REPORTED
from schemas.requests import COMPACTION_INSTRUCTION, Message, Transport

INTERRUPTED_PREFIX = "[Response interrupted by the next message; partial output follows]\n"
ERROR_MAX_CHARS = 300


# --- secrets -------------------------------------------------------------------------------------

REDACTED = "[redacted]"
# A configured key shorter than this is a placeholder (the embedded model's "local"): replacing it
# everywhere would garble the text. Sent as a header it is still caught by the header patterns.
MIN_SECRET_CHARS = 8

_SECRETS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Header values, quoted or not, with their scheme: `Authorization: Bearer x`, `"api-key": "x"`
    # (the scheme is possessive and a redacted value is left alone, so scrubbing twice is harmless).
    (
        re.compile(
            r"(?i)\b((?:proxy-)?authorization|x-api-key|api[-_]key)([\"']?\s*[:=]\s*[\"']?)"
            r"(?:(?:bearer|basic|token)\s+)?+(?!\[redacted\])[^\s\"',;)}\]]+"
        ),
        rf"\1\2{REDACTED}",
    ),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=*-]{4,}"), rf"\1 {REDACTED}"),
    # OpenAI-style keys (sk-..., sk-proj-..., also a provider's masked echo of one).
    (re.compile(r"\bsk-[A-Za-z0-9_*-]{6,}"), REDACTED),
    # Credentials in URLs: user:password@host, ?key=... / ?api_key=...
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@"), rf"\1{REDACTED}@"),
    (re.compile(r"(?i)([?&](?:api[-_]?)?key=)[^&\s\"']+"), rf"\1{REDACTED}"),
)


def scrub(text: str, secrets: Sequence[str | None] = ()) -> str:
    """`text` without the given secrets (e.g. the configured API key) and without anything shaped
    like a credential: authorization header values, bearer tokens, `sk-` keys, URL credentials."""
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET_CHARS:
            text = text.replace(secret, REDACTED)
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


# --- usage -------------------------------------------------------------------------------------


def _count(value: Any) -> int | None:
    """A token count: a non-negative int (bools and floats with a fraction are not counts)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value >= 0 else None


def _first_count(usage: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        count = _count(usage.get(name))
        if count is not None:
            return count
    return None


def _detail(usage: Mapping[str, Any], containers: tuple[str, ...], name: str) -> int | None:
    for container in containers:
        details = usage.get(container)
        if isinstance(details, Mapping):
            count = _count(details.get(name))
            if count is not None:
                return count
    return None


def normalize_usage(raw: Any) -> dict[str, int] | None:
    """Provider usage in the chat shape (`prompt_tokens`, `completion_tokens`, `*_details`) or the
    responses shape (`input_tokens`, `output_tokens`, `*_details`) → `{inputTokens, outputTokens,
    cachedInputTokens?, reasoningOutputTokens?}`; None unless both main counts are present."""
    if not isinstance(raw, Mapping):
        return None
    inputs = _first_count(raw, "prompt_tokens", "input_tokens")
    outputs = _first_count(raw, "completion_tokens", "output_tokens")
    if inputs is None or outputs is None:
        return None
    usage = {"inputTokens": inputs, "outputTokens": outputs}
    cached = _detail(raw, ("prompt_tokens_details", "input_tokens_details"), "cached_tokens")
    if cached is not None:
        usage["cachedInputTokens"] = cached
    reasoning = _detail(raw, ("completion_tokens_details", "output_tokens_details"), "reasoning_tokens")
    if reasoning is not None:
        usage["reasoningOutputTokens"] = reasoning
    return usage


# --- messages sent to the provider -----------------------------------------------------------------


def provider_messages(messages: list[Message]) -> list[dict[str, str]]:
    """The request's messages as sent: role and content as given (the processor already mapped
    roles for the transport, docs/behaviour.md §3.2), plus one hint line per attached file (the chat API has
    no `files` field). A call's messages go through `processors.files.render_files` instead (§3.3),
    which sends the files themselves where the model takes them."""
    out: list[dict[str, str]] = []
    for message in messages:
        content = message.content
        if message.files:
            content = "\n".join([content, *(hint_line(f) for f in message.files)])
        out.append({"role": message.role, "content": content})
    return out


def compaction_messages(messages: list[Message], transport: Transport) -> list[dict[str, str]]:
    """Request R's messages exactly, plus the trailing summary instruction (docs/behaviour.md §4.5), whose
    `developer` role becomes `system` on an openai-compatible transport (§3.2)."""
    role = provider_role("developer", transport)
    return [*provider_messages(messages), {"role": role, "content": COMPACTION_INSTRUCTION}]


# --- context overflow ------------------------------------------------------------------------------

# Error codes/types of a request larger than the model's context window: OpenAI and
# llama-cpp-python (`context_length_exceeded`), llama.cpp's server (`exceed_context_size_error`).
_OVERFLOW_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error", "context_window_exceeded"})
_OVERFLOW_TEXT = re.compile(
    r"(?i)maximum context length|context[ _](?:length|window)[ _]exceeded|exceeds? the available context size"
    r"|exceeds? (?:the )?(?:model's )?context (?:window|length|size)|context window of \d+|\bn_ctx\b"
    r"|prompt is too long|reduce the length of the messages"
)
# (limit, requested) in the providers' words.
_OVERFLOW_NUMBERS = (
    re.compile(r"(?i)maximum context length is (?P<limit>\d+) tokens.*?(?:requested|resulted in) (?P<asked>\d+)"),
    re.compile(r"(?i)\((?P<asked>\d+) tokens\) exceeds? the available context size \((?P<limit>\d+) tokens\)"),
    re.compile(r"(?i)prompt is too long: (?P<asked>\d+) tokens > (?P<limit>\d+)"),
)


def _error_fields(body: Any) -> list[Mapping[str, Any]]:
    """The provider's error object(s): the SDK hands over `error` itself, or the whole body."""
    if not isinstance(body, Mapping):
        return []
    inner = body.get("error")
    return [body, inner] if isinstance(inner, Mapping) else [body]


def is_context_overflow(status: int | None, body: Any, text: str) -> bool:
    """Whether the provider refused the request for exceeding the model's context window: HTTP
    400 (or 413) with an overflow code, or a message that says so (`text`: the error's text)."""
    if status not in (400, 413):
        return False
    for fields in _error_fields(body):
        if fields.get("code") in _OVERFLOW_CODES or fields.get("type") in _OVERFLOW_CODES:
            return True
    return bool(_OVERFLOW_TEXT.search(text))


def overflow_ratio(body: Any, text: str) -> float | None:
    """The context window over the tokens the refused request needed, when the provider said both."""
    for fields in _error_fields(body):
        limit, asked = _count(fields.get("n_ctx")), _count(fields.get("n_prompt_tokens"))
        if limit and asked:
            return limit / asked
    for pattern in _OVERFLOW_NUMBERS:
        match = pattern.search(text)
        if match is not None and int(match["asked"]) > 0:
            return int(match["limit"]) / int(match["asked"])
    return None


KEEP_LAST_MESSAGES = 2  # a summary call always keeps the newest item and the timestamp
MAX_SUMMARY_CALLS = 5  # the last one leaves out all the history it may
_SAFETY = 0.8  # aim below the window: the instruction and the summary's own tokens need room too


@dataclass(frozen=True, slots=True)
class SummaryCall:
    """Messages for one summary attempt: request R's, the oldest history possibly left out."""

    messages: list[dict[str, str]]  # as sent, the trailing instruction included
    dropped: int = 0  # oldest history messages left out
    dropped_from: int | None = None  # their offsets (from their headers), when they have any
    dropped_to: int | None = None


_HEADER_OFFSET = re.compile(r"@(\d+)")


def _offset(message: Message) -> int | None:
    match = _HEADER_OFFSET.match(message.content)
    return int(match[1]) if match is not None else None


def summary_calls(messages: list[Message], transport: Transport, ratio: float | None) -> list[SummaryCall]:
    """The summary attempts after a context overflow, each leaving out more of the oldest history.

    Never left out: the leading system messages (the protocol and the system lane) and the last
    KEEP_LAST_MESSAGES. The first attempt aims at `ratio` of the request's size (the window over
    what the request needed, when the provider said so; else a half), each next one at half of
    that; the last (at most the MAX_SUMMARY_CALLS-th) leaves out all the history it may. The
    left-out part is replaced by one line saying so, so that the summary can name what it lacks.
    """
    lead = 0
    while lead < len(messages) and messages[lead].role == "system":
        lead += 1
    end = max(lead, len(messages) - KEEP_LAST_MESSAGES)
    sizes = [len(m.content) for m in messages]
    fixed = sum(sizes) - sum(sizes[lead:end])
    target = sum(sizes) * (min(0.9, _SAFETY * ratio) if ratio else 0.5)
    calls: list[SummaryCall] = []
    previous = -1
    while True:
        dropped, kept = 0, sum(sizes[lead:end])
        while lead + dropped < end and (fixed + kept > target or len(calls) == MAX_SUMMARY_CALLS - 1):
            kept -= sizes[lead + dropped]
            dropped += 1
        if dropped > previous:
            calls.append(_summary_call(messages, transport, lead, dropped))
            previous = dropped
        if lead + dropped >= end:
            return calls
        target /= 2


def _summary_call(messages: list[Message], transport: Transport, lead: int, dropped: int) -> SummaryCall:
    if dropped == 0:
        return SummaryCall(compaction_messages(messages, transport))
    gone = messages[lead : lead + dropped]
    offsets = [o for o in map(_offset, gone) if o is not None]
    low, high = (min(offsets), max(offsets)) if offsets else (None, None)
    where = f" (@{low} to @{high})" if offsets else ""
    notice = Message(
        role=provider_role("developer", transport),
        content=f"[{dropped} older messages{where} are left out here: with them the request exceeds the "
        "model's context window.]",
    )
    kept = [*messages[:lead], notice, *messages[lead + dropped :]]
    return SummaryCall(compaction_messages(kept, transport), dropped, low, high)


# --- outcomes ----------------------------------------------------------------------------------


def one_line(text: str, limit: int = ERROR_MAX_CHARS) -> str:
    """Collapse whitespace to single spaces and cut to `limit` characters."""
    line = re.sub(r"\s+", " ", text).strip()
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def succeeded(
    request_offset: int,
    model: str,
    text: str,
    usage: dict[str, int] | None,
    duration_ms: int,
    max_context_tokens: int,
) -> list[Append]:
    """Assistant item, settlement, then the usage report when the provider reported usage."""
    result: dict[str, Any] = {"status": "succeeded", "text": text}
    if usage is not None:
        result["usage"] = dict(usage)
    appends = [
        Append(
            CONTEXT_ADDED,
            {"role": "assistant", "content": text, "llmRequestOffset": request_offset},
            assistant_key(request_offset),
        ),
        Append(
            LLM_REQUEST_SETTLED,
            {"requestOffset": request_offset, "durationMs": max(0, int(duration_ms)), "result": result},
            settled_key(request_offset),
        ),
    ]
    if usage is not None:
        appends.append(
            Append(
                TOKEN_USAGE_REPORTED,
                {"llmRequestOffset": request_offset, "model": model, "maxContextTokens": max_context_tokens, **usage},
                usage_key(request_offset),
            )
        )
    return appends


def failure_message(request_offset: int, attempt: int, max_attempts: int, error: str) -> str:
    head = f"LLM request @{request_offset} failed (attempt {attempt} of {max_attempts}): {error}."
    if attempt < max_attempts:
        return f"{head} Retrying."
    return f"{head} Giving up; a new message starts fresh."


def failed(request_offset: int, attempt: int, max_attempts: int, error: str) -> list[Append]:
    """Failed settlement, then the stream error that says whether the agent retries.

    No `durationMs`: a repeated failing call (after a restart) then yields the very same commands,
    which the journal answers as duplicates. The error text is scrubbed of credentials here too
    (the caller already scrubs it of its key): it is journaled and rendered into later requests."""
    error = one_line(scrub(error)).rstrip(".") or "unknown error"
    return [
        Append(
            LLM_REQUEST_SETTLED,
            {"requestOffset": request_offset, "result": {"status": "failed", "errorMessage": error}},
            settled_key(request_offset),
        ),
        Append(
            STREAM_ERROR_OCCURRED,
            {"message": failure_message(request_offset, attempt, max_attempts, error)},
            error_key(request_offset),
        ),
    ]


def cancelled(request_offset: int, partial: str) -> list[Append]:
    """An interrupted call (docs/behaviour.md §4.4): the partial output (if any) as an assistant item that
    answers no request, then the cancelled settlement."""
    appends: list[Append] = []
    result: dict[str, Any] = {"status": "cancelled", "reason": "interrupted-by-user-input"}
    if partial:
        appends.append(
            Append(
                CONTEXT_ADDED,
                {"role": "assistant", "content": INTERRUPTED_PREFIX + partial},
                partial_key(request_offset),
            )
        )
        result["partialText"] = partial
    appends.append(
        Append(LLM_REQUEST_SETTLED, {"requestOffset": request_offset, "result": result}, settled_key(request_offset))
    )
    return appends


def _left_out(call: SummaryCall) -> str:
    if not call.dropped:
        return ""
    where = f", @{call.dropped_from} to @{call.dropped_to}" if call.dropped_from is not None else ""
    return f"; the {call.dropped} oldest messages{where}, did not fit in the summary call and are not summarized"


def compacted(
    request_offset: int,
    report_offset: int,
    tokens: int,
    threshold: int,
    summary: str,
    usage: dict[str, int] | None,
    call: SummaryCall | None = None,
) -> list[Append]:
    """The compaction summary item (docs/behaviour.md §4.5); `call`: the summary call, if it left history out."""
    left_out = _left_out(call) if call is not None else ""
    content = (
        f"[Earlier conversation history was compacted through @{request_offset} "
        f"(~{tokens} tokens > {threshold}{left_out}). Summary:]\n\n{summary}"
    )
    return [_summary_item(request_offset, content, usage, compaction_key(report_offset))]


def overflow_compacted(
    request_offset: int,
    attempt: int,
    max_attempts: int,
    error: str,
    summary: str,
    usage: dict[str, int] | None,
    call: SummaryCall,
) -> list[Append]:
    """Request R exceeded the model's context window and its history was summarized: the summary
    item (replacing history through R), then R's failed settlement, whose agent-loop trigger makes
    the retry answer from the compacted context."""
    content = (
        f"[Earlier conversation history was compacted through @{request_offset} because request "
        f"@{request_offset} exceeded the model's context window{_left_out(call)}. Summary:]\n\n{summary}"
    )
    retried = " and the request will be retried" if attempt < max_attempts else ""
    why = (
        f"the request exceeded the model's context window, so the context was compacted through "
        f"@{request_offset}{retried} ({error})"
    )
    return [
        _summary_item(request_offset, content, usage, overflow_compaction_key(request_offset)),
        *failed(request_offset, attempt, max_attempts, why),
    ]


def overflow_not_compacted(
    request_offset: int, attempt: int, max_attempts: int, error: str, summary_error: str
) -> list[Append]:
    """Request R exceeded the context window and summarizing it failed too: only the failed settlement."""
    why = (
        "the request exceeded the model's context window and compacting the context failed "
        f"({summary_error}); the request's error: {error}"
    )
    return failed(request_offset, attempt, max_attempts, why)


def _summary_item(request_offset: int, content: str, usage: dict[str, int] | None, key: str) -> Append:
    compaction: dict[str, Any] = {"replacesHistoryThrough": request_offset}
    if usage is not None:
        compaction["usage"] = dict(usage)
    return Append(
        CONTEXT_ADDED,
        {
            "role": "developer",
            "content": content,
            "compaction": compaction,
            "llmRequestPolicy": {"behaviour": "dont-trigger-request"},
        },
        key,
    )
