"""Agents run the Python they write: the pure decisions (no Kafka, no sandbox).

- Extraction: which part of an assistant answer is a script. A fenced block opens with three or
  more backticks at the start of a line and closes with a line of at least as many backticks (and
  nothing else). Only blocks tagged `python` or `py` are scripts; every other block is text. A
  block that never closes is text too: a cut-off answer must not run half a program.
- Who may run code: only the live request's answer, i.e. an assistant item whose llmRequestOffset
  is the open request's offset when the item is reduced. At most one script per item.
- Transcription: a settlement back into the agent's context as one developer item.
- `script_follow_ups`: what the journal worker appends after reducing an event.

Every follow-up carries an idempotency key derived from the offset or the execution id, so a
repeated decision is journaled once.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass
from typing import Any

import orjson

from processors import idempotency_keys as keys
from processors.appends import Append
from processors.reducer import epoch_ms
from processors.state import AgentState
from schemas.capabilities import (
    AGENT_OUTPUT_PREFIX,
    SCRIPT_RUN_REQUESTED,
    SCRIPT_RUN_SETTLED,
    FailedSettlement,
    FailureKind,
    Phase,
    SucceededSettlement,
)
from schemas.events import CONTEXT_ADDED, InvalidPayloadEvent
from schemas.limits import INT_MAX, INT_MIN

SCRIPT_TAGS = frozenset({"python", "py"})
# Bounds (UTF-8 bytes) of what one settlement carries, so that it always fits one journal event
# (maxEventBytes, 900 KiB by default): the transcript shows at most `scriptResultHistoryLimit`
# characters of it anyway.
MAX_STDOUT_BYTES = 100_000
MAX_RESULT_JSON_BYTES = 400_000
MAX_ERROR_BYTES = 20_000
MAX_RESULT_DEPTH = 64

# --- execution ids -------------------------------------------------------------------------------


def execution_id(assistant_offset: int) -> str:
    return f"{AGENT_OUTPUT_PREFIX}{assistant_offset}"


# --- extraction ------------------------------------------------------------------------------------

_OPENING = re.compile(r"(`{3,})([^`]*)")
_CLOSING = re.compile(r"(`{3,})[ \t]*")


@dataclass(frozen=True, slots=True)
class Block:
    tag: str  # the first word of the info string, lower-cased ("" when untagged)
    code: str


def fenced_blocks(text: str) -> list[Block]:
    """Every closed fenced block of `text`, in order (CommonMark's backtick fences, unindented)."""
    blocks: list[Block] = []
    lines = text.split("\n")
    index = 0
    while index < len(lines):
        opening = _OPENING.fullmatch(lines[index].removesuffix("\r"))
        index += 1
        if opening is None:
            continue
        width = len(opening[1])
        words = opening[2].split()
        tag = words[0].lower() if words else ""
        for end in range(index, len(lines)):
            closing = _CLOSING.fullmatch(lines[end].removesuffix("\r"))
            if closing is not None and len(closing[1]) >= width:
                body = [line.removesuffix("\r") for line in lines[index:end]]
                blocks.append(Block(tag, "\n".join(body)))
                index = end + 1
                break
        else:
            break  # never closed: the rest is text
    return blocks


def python_blocks(text: str) -> list[str]:
    return [block.code for block in fenced_blocks(text) if block.tag in SCRIPT_TAGS]


def feedback_text(count: int) -> str:
    return (
        f"Your response contained {count} python code blocks, so NOTHING was executed. "
        "Send one step at a time as a single ```python block."
    )


def qualifies(state: AgentState, event: Any) -> bool:
    """Whether the event is the live request's answer (state: folded through the event).

    Reducing an assistant item never opens or settles a request, so the open request after the
    fold is the one that was open when the item was reduced."""
    if event.type != CONTEXT_ADDED or isinstance(event, InvalidPayloadEvent):
        return False
    item = event.payload
    return (
        item.role == "assistant"
        and item.compaction is None
        and item.llmRequestOffset is not None
        and state.open is not None
        and state.open.offset == item.llmRequestOffset
    )


# --- transcription ---------------------------------------------------------------------------------

DID_NOT_EXECUTE = "The script did not execute."
MAY_HAVE_EXECUTED = "The script may have partially executed; inspect state before retrying."


def fence(text: str, tag: str = "") -> str:
    """`text` in a ``` fence (longer when a line of `text` starts with as many backticks)."""
    marker = "```"
    while re.search(rf"^{marker}", text, re.MULTILINE):
        marker += "`"
    return f"{marker}{tag}\n{text}\n{marker}"


def _trimmed(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text


def transcribe(settlement: SucceededSettlement | FailedSettlement, limit: int) -> str | None:
    """The developer item's content for a settlement; None when there is nothing to say."""
    parts: list[str] = []
    if settlement.stdout:
        parts.append("Your script printed:\n" + fence(_trimmed(settlement.stdout)))
    if isinstance(settlement, SucceededSettlement):
        result = settlement.result
        if isinstance(result, str):
            parts.append("Your script returned:\n" + fence(result))
        elif result is not None:
            text = orjson.dumps(result, option=orjson.OPT_INDENT_2).decode()
            parts.append("Your script returned:\n" + fence(text, "json"))
    else:
        outcome = MAY_HAVE_EXECUTED if settlement.executionMayHaveOccurred else DID_NOT_EXECUTE
        parts.append(
            f"Your script failed during {settlement.phase} ({settlement.failureKind}):\n"
            f"{fence(settlement.error)}\n{outcome}"
        )
    if not parts:
        return None
    return truncate("\n\n".join(parts), limit)


def truncate(content: str, limit: int) -> str:
    if len(content) <= limit:
        return content
    return content[:limit] + truncation_notice(len(content))


def truncation_notice(total: int) -> str:
    return f"\n… truncated ({total} chars total — return less: slice lists, pick fields)"


# --- settlements (what the host journals) ----------------------------------------------------------


def _cut(text: str, limit: int) -> str:
    """`text` within `limit` UTF-8 bytes (plus a short notice)."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[:limit].decode(errors="ignore") + f"\n… cut ({len(raw)} bytes total)"


def json_value(value: Any, depth: int = 0) -> Any:
    """A sandbox value as JSON the journal accepts: tuples and sets become lists, bytes and dates
    text, numbers outside the interoperable range text; anything else its repr."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if INT_MIN <= value <= INT_MAX else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth >= MAX_RESULT_DEPTH:
        return "… (nested too deep)"
    if isinstance(value, dict):
        return {k if isinstance(k, str) else repr(k): json_value(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(item, depth + 1) for item in value]
    if isinstance(value, (set, frozenset)):
        items = [json_value(item, depth + 1) for item in value]
        return sorted(items, key=repr)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    return repr(value)


def succeeded(result: Any, stdout: str) -> dict[str, Any]:
    settlement: dict[str, Any] = {"status": "succeeded"}
    value = json_value(result)
    if value is not None:
        if len(orjson.dumps(value)) > MAX_RESULT_JSON_BYTES:  # too big to journal: keep its start as text
            value = _cut(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode(), MAX_RESULT_JSON_BYTES)
        settlement["result"] = value
    if stdout:
        settlement["stdout"] = _cut(stdout, MAX_STDOUT_BYTES)
    return settlement


def failed(kind: FailureKind, phase: Phase, error: str, may_have_occurred: bool, stdout: str = "") -> dict[str, Any]:
    settlement: dict[str, Any] = {
        "status": "failed",
        "error": _cut(error, MAX_ERROR_BYTES),
        "failureKind": kind,
        "phase": phase,
        "executionMayHaveOccurred": may_have_occurred,
    }
    if stdout:
        settlement["stdout"] = _cut(stdout, MAX_STDOUT_BYTES)
    return settlement


def expired(expires_at_ms: int) -> dict[str, Any]:
    when = dt.datetime.fromtimestamp(expires_at_ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    return failed(
        "expired",
        "run",
        f"the run request expired at {when.replace('+00:00', 'Z')} before the script started",
        False,
    )


def crashed() -> dict[str, Any]:
    return failed(
        "crashed",
        "run",
        "the capability host stopped while the script was running; it is not run again",
        True,
    )


def settled_payload(execution: str, settlement: dict[str, Any], duration_ms: int | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {"executionId": execution, "settlement": settlement}
    if duration_ms is not None:
        payload["durationMs"] = max(0, int(duration_ms))
    return payload


# --- the journal worker's follow-ups ---------------------------------------------------------------


def script_follow_ups(state: AgentState, event: Any) -> list[Append]:
    """What the journal worker appends to the stream after reducing `event` (`state`: folded
    through it): a run request or the too-many-blocks feedback for the live request's answer; the
    transcribed result for a settled run of an agent's output."""
    if isinstance(event, InvalidPayloadEvent):
        return []
    if event.type == CONTEXT_ADDED:
        if not qualifies(state, event):
            return []
        scripts = python_blocks(event.payload.content)
        if not scripts:
            return []
        offset = event.offset
        if len(scripts) > 1:
            return [
                Append(
                    CONTEXT_ADDED,
                    {
                        "role": "developer",
                        "content": feedback_text(len(scripts)),
                        "llmRequestPolicy": {"behaviour": "after-current-request"},
                    },
                    keys.script_feedback_key(offset),
                )
            ]
        expires_at = epoch_ms(event.createdAt) + state.config.llmRequestExpiryMs
        return [
            Append(
                SCRIPT_RUN_REQUESTED,
                {"code": scripts[0], "executionId": execution_id(offset), "expiresAt": expires_at},
                keys.script_run_requested_key(offset),
            )
        ]
    if event.type == SCRIPT_RUN_SETTLED:
        execution = event.payload.executionId
        if not execution.startswith(AGENT_OUTPUT_PREFIX):
            return []
        content = transcribe(event.payload.settlement, state.config.scriptResultHistoryLimit)
        if content is None:
            return []  # nothing printed, nothing returned: the turn ends
        return [
            Append(
                CONTEXT_ADDED,
                {
                    "role": "developer",
                    "content": content,
                    "actor": {"type": "script", "executionId": execution},
                    "llmRequestPolicy": {"behaviour": "after-current-request"},
                },
                keys.script_result_key(execution),
            )
        ]
    return []
