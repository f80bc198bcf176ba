"""Agent configuration (docs/behaviour.md §4.7) and the strict partial patch that `agent/configured` carries."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from schemas.context import Wire

NonNegativeMs = Annotated[int, Field(ge=0, strict=True)]
PositiveCount = Annotated[int, Field(ge=1, strict=True)]


class LlmConfig(Wire):
    model: Annotated[str, Field(min_length=1)] | None = None


class RetryPolicy(Wire):
    maxAttempts: PositiveCount = 3
    backoffBaseMs: NonNegativeMs = 10_000
    backoffMaxMs: NonNegativeMs = 60_000


# A stream path glob, as in token scopes: path characters plus `*` (one segment), `**` (any
# depth) and `?` (one character).
PathGlob = Annotated[str, Field(pattern=r"^/[A-Za-z0-9._~:@+\-*?/]*$", max_length=512)]
GlobList = Annotated[list[PathGlob], Field(max_length=256)]


class AgentGrants(Wire):
    """What the agent's scripts may read and send to, and what it may subscribe to (docs/behaviour.md
    §6.6). An absent list means the default for it; a configured list replaces that default."""

    read: GlobList | None = None
    send: GlobList | None = None
    subscribe: GlobList | None = None


class AgentConfig(Wire):
    """The effective configuration; every field has the contract's default."""

    llm: LlmConfig = LlmConfig()
    llmRequestDebounceMs: NonNegativeMs = 250
    llmRequestExpiryMs: Annotated[int, Field(ge=1, strict=True)] = 600_000
    llmRequestRetryPolicy: RetryPolicy = RetryPolicy()
    maxAutonomousTurns: Annotated[int, Field(ge=0, strict=True)] = 100
    compactionTriggerFraction: Annotated[float, Field(gt=0, le=1)] = 0.5
    scriptResultHistoryLimit: Annotated[int, Field(ge=0, strict=True)] = 30_000
    # Wall time of one script run (the request's expiry may cut it shorter).
    scriptTimeoutMs: Annotated[int, Field(ge=1, strict=True)] = 30_000
    grants: AgentGrants = AgentGrants()


# The patch mirrors AgentConfig with every field optional; only the fields a producer sets are
# merged, so "absent" and "default" stay distinct.
class _Patch(Wire):
    """A partial patch: a field is either absent or a value; `null` is not a value."""

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            nulls = [name for name, value in data.items() if value is None]
            if nulls:
                raise ValueError(f"{', '.join(nulls)} must not be null: omit a field to leave it unchanged")
        return data


class LlmPatch(_Patch):
    model: Annotated[str, Field(min_length=1)] | None = None


class RetryPolicyPatch(_Patch):
    maxAttempts: PositiveCount | None = None
    backoffBaseMs: NonNegativeMs | None = None
    backoffMaxMs: NonNegativeMs | None = None


class GrantsPatch(_Patch):
    read: GlobList | None = None
    send: GlobList | None = None
    subscribe: GlobList | None = None


class ConfigPatch(_Patch):
    llm: LlmPatch | None = None
    llmRequestDebounceMs: NonNegativeMs | None = None
    llmRequestExpiryMs: Annotated[int, Field(ge=1, strict=True)] | None = None
    llmRequestRetryPolicy: RetryPolicyPatch | None = None
    maxAutonomousTurns: Annotated[int, Field(ge=0, strict=True)] | None = None
    compactionTriggerFraction: Annotated[float, Field(gt=0, le=1)] | None = None
    scriptResultHistoryLimit: Annotated[int, Field(ge=0, strict=True)] | None = None
    scriptTimeoutMs: Annotated[int, Field(ge=1, strict=True)] | None = None
    grants: GrantsPatch | None = None


def _deep_merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for name, value in patch.items():
        if isinstance(value, dict) and isinstance(merged.get(name), dict):
            merged[name] = _deep_merge(merged[name], value)
        else:  # scalars and arrays replace
            merged[name] = value
    return merged


def merge_config(config: AgentConfig, patch: ConfigPatch) -> AgentConfig:
    """Deep-merge a patch: objects recurse, scalars and arrays replace."""
    return AgentConfig.model_validate(_deep_merge(config.model_dump(), patch.model_dump(exclude_unset=True)))
