"""Journal events (docs/behaviour.md §1, §1.1): payloads, the journaled envelope and the append command.

One typed envelope class exists per consumed event type, generated from its payload model, so the
whole event validates in one pass from JSON bytes. Types the agent does not consume validate as
`OtherEvent` (any object payload): they are journaled and ignored by the reducer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, Union

from pydantic import Field, TypeAdapter, ValidationError, create_model

from schemas.capabilities import (
    SCRIPT_RUN_REQUESTED,
    SCRIPT_RUN_SETTLED,
    SCRIPT_RUN_STARTED,
    ScriptRunRequestedPayload,
    ScriptRunSettledPayload,
    ScriptRunStartedPayload,
)
from schemas.config import ConfigPatch
from schemas.context import ContextItem, NonEmpty, PositiveInt, Wire
from schemas.limits import AppendId, JsonObject, StreamPath
from schemas.routing import AGENT_SUBSCRIBED, AGENT_UNSUBSCRIBED, SubscribedPayload, UnsubscribedPayload

# --- event type names --------------------------------------------------------------------------

CONTEXT_ADDED = "events.iterate.com/agents/context-added"
AGENT_CREATED = "events.iterate.com/agent/created"
AGENT_CONFIGURED = "events.iterate.com/agent/configured"
LLM_REQUEST_REQUESTED = "events.iterate.com/agent/llm-request-requested"
LLM_REQUEST_SETTLED = "events.iterate.com/agent/llm-request-settled"
TOKEN_USAGE_REPORTED = "events.iterate.com/agent/token-usage-reported"
AGENT_PAUSED = "events.iterate.com/agent/paused"
AGENT_RESUMED = "events.iterate.com/agent/resumed"
STREAM_ERROR_OCCURRED = "events.iterate.com/stream/error-occurred"

# Journal coordinates and times.
CreatedAt = Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")]
EpochMs = Annotated[int, Field(ge=0, strict=True)]
TokenCount = Annotated[int, Field(ge=0, strict=True)]


# --- payloads ----------------------------------------------------------------------------------


class ConfiguredPayload(Wire):
    config: ConfigPatch


class LlmRequestRequestedPayload(Wire):
    model: NonEmpty
    expiresAt: EpochMs


class SucceededResult(Wire):
    status: Literal["succeeded"]
    text: str
    usage: JsonObject | None = None


class FailedResult(Wire):
    status: Literal["failed"]
    errorMessage: str


class CancelledResult(Wire):
    status: Literal["cancelled"]
    reason: Literal["interrupted-by-user-input", "expired"]
    partialText: str | None = None


SettlementResult = Annotated[SucceededResult | FailedResult | CancelledResult, Field(discriminator="status")]


class LlmRequestSettledPayload(Wire):
    requestOffset: PositiveInt
    durationMs: Annotated[int, Field(ge=0, strict=True)] | None = None
    result: SettlementResult


class TokenUsageReportedPayload(Wire):
    llmRequestOffset: PositiveInt
    model: NonEmpty
    maxContextTokens: PositiveInt
    inputTokens: TokenCount
    outputTokens: TokenCount
    cachedInputTokens: TokenCount | None = None
    reasoningOutputTokens: TokenCount | None = None


class PausedPayload(Wire):
    reason: str | None = None
    triggerOffset: PositiveInt | None = None


class ResumedPayload(Wire):
    reason: str | None = None


class ErrorOccurredPayload(Wire):
    message: str


# `agent/created` carries any object (provenance).
CreatedPayload = JsonObject

PAYLOAD_MODELS: dict[str, Any] = {
    CONTEXT_ADDED: ContextItem,
    AGENT_CREATED: CreatedPayload,
    AGENT_CONFIGURED: ConfiguredPayload,
    LLM_REQUEST_REQUESTED: LlmRequestRequestedPayload,
    LLM_REQUEST_SETTLED: LlmRequestSettledPayload,
    TOKEN_USAGE_REPORTED: TokenUsageReportedPayload,
    AGENT_PAUSED: PausedPayload,
    AGENT_RESUMED: ResumedPayload,
    STREAM_ERROR_OCCURRED: ErrorOccurredPayload,
    AGENT_SUBSCRIBED: SubscribedPayload,
    AGENT_UNSUBSCRIBED: UnsubscribedPayload,
    SCRIPT_RUN_REQUESTED: ScriptRunRequestedPayload,
    SCRIPT_RUN_STARTED: ScriptRunStartedPayload,
    SCRIPT_RUN_SETTLED: ScriptRunSettledPayload,
}
CONSUMED_TYPES = frozenset(PAYLOAD_MODELS)

IdempotencyKey = Annotated[str, Field(min_length=1, max_length=512)]

# --- who may write what (docs/behaviour.md §5.1) ----------------------------------------------------------

WORKER_ONLY_TYPES = frozenset({LLM_REQUEST_REQUESTED, LLM_REQUEST_SETTLED, TOKEN_USAGE_REPORTED})
CAPABILITY_HOST_PREFIX = "events.iterate.com/capability-host/"


def worker_only_reason(event_type: str, payload: Any) -> str | None:
    """Why only the workers may append this command (None: anyone may).

    Request bookkeeping, the caller's genuine answers (assistant items naming a request),
    compaction summaries and capability-host events decide what the model sees and what runs;
    they are accepted only from the internal command topic, which Kafka ACLs can restrict.
    """
    if event_type in WORKER_ONLY_TYPES or event_type.startswith(CAPABILITY_HOST_PREFIX):
        return f"forbidden: {event_type} is written by the workers"
    if event_type == CONTEXT_ADDED and isinstance(payload, dict):
        if payload.get("role") == "assistant" and payload.get("llmRequestOffset") is not None:
            return f"forbidden: {event_type} with llmRequestOffset (a model answer) is written by the workers"
        if payload.get("compaction") is not None:
            return f"forbidden: {event_type} with compaction (a summary) is written by the workers"
    return None


# --- envelopes ---------------------------------------------------------------------------------


class JournalEventBase(Wire):
    """Fields the journal assigns or carries on every event."""

    streamPath: StreamPath
    offset: PositiveInt
    idempotencyKey: IdempotencyKey | None = None
    createdAt: CreatedAt


class OtherEvent(JournalEventBase):
    """An event type the agent does not consume: journaled, ignored by the reducer."""

    type: Annotated[str, Field(min_length=1)]
    payload: JsonObject


class InputBase(Wire):
    """What a producer supplies for one event: type, payload and optional idempotency key."""

    idempotencyKey: IdempotencyKey | None = None


def _typed(base: type[Wire], event_type: str, payload: Any, suffix: str) -> type[Wire]:
    short = event_type.rsplit("/", 1)[-1].title().replace("-", "")
    return create_model(  # type: ignore[call-overload,no-any-return]
        f"{short}{suffix}",
        __base__=base,
        type=(Literal[event_type], ...),  # type: ignore[valid-type]
        payload=(payload, ...),
    )


TYPED_EVENTS: dict[str, type[Wire]] = {t: _typed(JournalEventBase, t, p, "Event") for t, p in PAYLOAD_MODELS.items()}
TYPED_INPUTS: dict[str, type[Wire]] = {t: _typed(InputBase, t, p, "Input") for t, p in PAYLOAD_MODELS.items()}

ContextAddedEvent = TYPED_EVENTS[CONTEXT_ADDED]

JournalEvent = Any  # one of TYPED_EVENTS' classes, or OtherEvent
ConsumedInput = Any  # one of TYPED_INPUTS' classes

_typed_events: TypeAdapter[Any] = TypeAdapter(
    Annotated[Union[tuple(TYPED_EVENTS.values())], Field(discriminator="type")]  # noqa: UP007
)
_typed_inputs: TypeAdapter[Any] = TypeAdapter(
    Annotated[Union[tuple(TYPED_INPUTS.values())], Field(discriminator="type")]  # noqa: UP007
)
_other_event = TypeAdapter(OtherEvent)


class AppendCommand(Wire):
    """What producers write to `agent-appends`; the journal assigns offset and createdAt."""

    streamPath: StreamPath
    type: Annotated[str, Field(min_length=1)]
    payload: JsonObject
    idempotencyKey: IdempotencyKey | None = None
    # Unique per logical append: a retried send of the same command is journaled once.
    appendId: AppendId | None = None


# The models' own validators, called without `model_validate`'s keyword handling (a visible share
# of the journal worker's CPU per command; the same validation and the same instances).
validate_append_command: Callable[[bytes | str], AppendCommand] = AppendCommand.__pydantic_validator__.validate_json
EVENT_VALIDATORS: dict[str, Callable[[Any], Any]] = {
    t: model.__pydantic_validator__.validate_python for t, model in TYPED_EVENTS.items()
}
validate_other_event: Callable[[Any], OtherEvent] = OtherEvent.__pydantic_validator__.validate_python


class EnvelopeError(ValueError):
    """The bytes are not a journal event envelope at all."""


class InvalidPayloadEvent:
    """A well-formed envelope whose payload breaks its type's contract; the reducer skips it."""

    __slots__ = ("envelope", "reason")

    def __init__(self, envelope: OtherEvent, reason: str) -> None:
        self.envelope = envelope
        self.reason = reason

    # The envelope's fields, so journal bookkeeping treats every event alike.
    @property
    def streamPath(self) -> str:
        return self.envelope.streamPath

    @property
    def offset(self) -> int:
        return self.envelope.offset

    @property
    def type(self) -> str:
        return self.envelope.type

    @property
    def idempotencyKey(self) -> str | None:
        return self.envelope.idempotencyKey

    @property
    def createdAt(self) -> str:
        return self.envelope.createdAt


def decode_event(raw: bytes | str | dict[str, Any]) -> JournalEvent | InvalidPayloadEvent:
    """Validate one journaled event from its JSON (or from a record already parsed into a dict),
    in a single pass on the common path."""
    from_json = not isinstance(raw, dict)
    try:
        return _typed_events.validate_json(raw) if from_json else _typed_events.validate_python(raw)
    except ValidationError as typed_error:
        try:
            envelope = _other_event.validate_json(raw) if from_json else _other_event.validate_python(raw)
        except ValidationError as envelope_error:
            raise EnvelopeError(describe_validation_error(envelope_error)) from None
        if envelope.type not in CONSUMED_TYPES:
            return envelope
        return InvalidPayloadEvent(envelope, describe_validation_error(typed_error, envelope.type))


def parse_consumed_input(value: Any) -> ConsumedInput:
    """Validate one of the agent's consumed inputs (`{type, payload, idempotencyKey?}`).

    Raises `ValueError` with a message naming each offending field.
    """
    try:
        if isinstance(value, (bytes, str)):
            return _typed_inputs.validate_json(value)
        return _typed_inputs.validate_python(value)
    except ValidationError as error:
        raise ValueError(describe_validation_error(error)) from None


# --- errors a person can act on ----------------------------------------------------------------


def _location(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif part in CONSUMED_TYPES:
            continue  # the union tag adds the type name; it is noise to a reader
        elif part in _UNION_NOISE or str(part).endswith(("Event", "Input")) or "[" in str(part):
            continue
        else:
            parts.append(("." if parts else "") + str(part))
    return "".join(parts) or "(event)"


_UNION_NOISE = frozenset(
    {
        "user",
        "agent",
        "script",
        "integration",
        "slack",
        "telegram",
        "email",
        "github",
        "event",
        "file",
        "git-commit",
        "succeeded",
        "failed",
        "cancelled",
        "function-after",
    }
)


def describe_validation_error(error: ValidationError, event_type: str | None = None) -> str:
    """One line per problem: `<field path>: <what is wrong> (<what was given>)`."""
    lines: list[str] = []
    for problem in error.errors(include_url=False):
        where = _location(tuple(problem["loc"]))
        kind = problem["type"]
        if kind == "extra_forbidden":
            what = "unknown field; remove it (this payload is strict)"
        elif kind == "missing":
            what = "required field is missing"
        elif kind == "union_tag_invalid" and "type" in problem.get("ctx", {}).get("discriminator", ""):
            given = problem["input"].get("type")
            what = f"unknown type {given!r}; expected one of {problem['ctx']['expected_tags']}"
        else:
            what = problem["msg"]
            if kind != "value_error" and "input" in problem and not isinstance(problem["input"], dict):
                what += f" (got {problem['input']!r})"
            what = what.removeprefix("Value error, ")
        lines.append(f"{where}: {what}")
    prefix = f"invalid {event_type} event: " if event_type else ""
    return prefix + "; ".join(lines)
