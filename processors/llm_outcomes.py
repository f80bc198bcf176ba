"""What the LLM caller appends for each outcome of a call (CONTRACT §4.3, §4.4, §4.5): pure decisions.

No Kafka, no HTTP: given a request and what the provider did, return the append commands in the
order they must be journaled. Every command carries an idempotency key derived from the request
offset R (or, for a compaction summary, from the usage report's offset), so a caller that repeats a
call after a restart cannot double-append: the journal answers a repeated key with "duplicate"
(same body) or keeps the first body (different body, e.g. a different text from a repeated call).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schemas.events import CONTEXT_ADDED, LLM_REQUEST_SETTLED, STREAM_ERROR_OCCURRED, TOKEN_USAGE_REPORTED
from schemas.requests import COMPACTION_INSTRUCTION, Message, Transport

INTERRUPTED_PREFIX = "[Response interrupted by the next message; partial output follows]\n"
ERROR_MAX_CHARS = 300


@dataclass(frozen=True, slots=True)
class Append:
    """One command for the stream: `{type, payload, idempotencyKey}`."""

    type: str
    payload: dict[str, Any]
    idempotencyKey: str

    def event(self) -> dict[str, Any]:
        return {"type": self.type, "payload": self.payload, "idempotencyKey": self.idempotencyKey}


# --- idempotency keys (CONTRACT §4.3: derived from the request offset) -----------------------------


def assistant_key(request_offset: int) -> str:
    return f"agent/request/{request_offset}/assistant"


def settled_key(request_offset: int) -> str:
    return f"agent/request/{request_offset}/settled"


def usage_key(request_offset: int) -> str:
    return f"agent/request/{request_offset}/usage"


def error_key(request_offset: int) -> str:
    return f"agent/request/{request_offset}/error"


def partial_key(request_offset: int) -> str:
    return f"agent/request/{request_offset}/partial"


def compaction_key(report_offset: int) -> str:
    return f"agent/compact-context@{report_offset}"


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


def _file_hint(file: Mapping[str, Any]) -> str:
    name = file.get("filename") or file.get("path") or "file"
    kind = file.get("contentType") or "unknown type"
    size = file.get("size")
    url = file.get("url") or file.get("path") or ""
    size_text = f", {size} bytes" if isinstance(size, int) and not isinstance(size, bool) else ""
    return f"[attached file: {name} ({kind}{size_text}) {url}]".rstrip()


def provider_messages(messages: list[Message]) -> list[dict[str, str]]:
    """The request's messages as sent: role and content as given (the processor already mapped
    roles for the transport, CONTRACT §3.2), plus one hint line per attached file (the chat API has
    no `files` field)."""
    out: list[dict[str, str]] = []
    for message in messages:
        content = message.content
        if message.files:
            content = "\n".join([content, *(_file_hint(f) for f in message.files)])
        out.append({"role": message.role, "content": content})
    return out


def compaction_messages(messages: list[Message], transport: Transport) -> list[dict[str, str]]:
    """Request R's messages exactly, plus the trailing summary instruction (CONTRACT §4.5), whose
    `developer` role becomes `system` on an openai-compatible transport (§3.2)."""
    role = "developer" if transport == "openai" else "system"
    return [*provider_messages(messages), {"role": role, "content": COMPACTION_INSTRUCTION}]


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
    which the journal answers as duplicates."""
    error = one_line(error).rstrip(".") or "unknown error"
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
    """An interrupted call (CONTRACT §4.4): the partial output (if any) as an assistant item that
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


def compacted(
    request_offset: int,
    report_offset: int,
    tokens: int,
    threshold: int,
    summary: str,
    usage: dict[str, int] | None,
) -> list[Append]:
    """The compaction summary item (CONTRACT §4.5)."""
    compaction: dict[str, Any] = {"replacesHistoryThrough": request_offset}
    if usage is not None:
        compaction["usage"] = dict(usage)
    content = (
        f"[Earlier conversation history was compacted through @{request_offset} "
        f"(~{tokens} tokens > {threshold}). Summary:]\n\n{summary}"
    )
    return [
        Append(
            CONTEXT_ADDED,
            {
                "role": "developer",
                "content": content,
                "compaction": compaction,
                "llmRequestPolicy": {"behaviour": "dont-trigger-request"},
            },
            compaction_key(report_offset),
        )
    ]
