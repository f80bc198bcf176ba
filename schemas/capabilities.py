"""Capability-host events: an agent's script run is requested, started and settled.

The journal worker appends `script-run-requested` when it reduces the live request's answer that
holds exactly one python block; the capability host appends `script-run-started` before it runs the
script and exactly one `script-run-settled` per execution. All three are worker-only (they arrive
only through the internal command topic) and are keyed so that a repeat is a duplicate.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from schemas.context import NonEmpty, Wire
from schemas.limits import StreamPath

SCRIPT_RUN_REQUESTED = "events.iterate.com/capability-host/script-run-requested"
SCRIPT_RUN_STARTED = "events.iterate.com/capability-host/script-run-started"
SCRIPT_RUN_SETTLED = "events.iterate.com/capability-host/script-run-settled"

# Executions of an agent's own output: `agent-output:<assistant offset>`.
AGENT_OUTPUT_PREFIX = "agent-output:"

EpochMs = Annotated[int, Field(ge=0, strict=True)]
FailureKind = Literal["syntax", "runtime", "limit", "timeout", "expired", "crashed"]
Phase = Literal["parse", "run"]


class ScriptRunRequestedPayload(Wire):
    code: str
    executionId: NonEmpty
    expiresAt: EpochMs  # epoch ms; not started by then: it settles failed/expired


class ScriptRunStartedPayload(Wire):
    executionId: NonEmpty


class SucceededSettlement(Wire):
    status: Literal["succeeded"]
    result: Any = None  # the value of the script's last expression, as JSON
    stdout: str | None = None


class FailedSettlement(Wire):
    status: Literal["failed"]
    error: str
    failureKind: FailureKind
    phase: Phase
    executionMayHaveOccurred: Annotated[bool, Field(strict=True)]
    stdout: str | None = None


Settlement = Annotated[SucceededSettlement | FailedSettlement, Field(discriminator="status")]


class ScriptRunSettledPayload(Wire):
    executionId: NonEmpty
    durationMs: Annotated[int, Field(ge=0, strict=True)] | None = None
    settlement: Settlement


class ScriptGrants(Wire):
    """The grants a run acts with (docs/behaviour.md §6.6), resolved from the agent's configuration."""

    read: list[str]
    readReferenced: bool  # events the agent's own items reference are readable too
    send: list[str]


class ScriptRunRecord(Wire):
    """One record of the `script-runs` topic: a journaled `script-run-requested`, with what the
    host needs that the event does not say (the agent's script timeout and grants at the time)."""

    streamPath: StreamPath
    offset: Annotated[int, Field(gt=0, strict=True)]  # of the script-run-requested event
    createdAt: str
    code: str
    executionId: NonEmpty
    expiresAt: EpochMs
    timeoutMs: Annotated[int, Field(ge=1, strict=True)]
    # Absent only in records written before grants existed: the host then applies the defaults.
    grants: ScriptGrants | None = None
