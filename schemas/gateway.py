"""Wire shapes of the HTTP gateway: request bodies, responses, errors and the tokens file.

The append command itself is `schemas.events.AppendCommand`; these are the HTTP envelopes around
it. The tokens file holds only sha256 hashes of bearer tokens (a leaked file grants nothing), and
the webhook secrets, which must stay readable because signatures are HMACs keyed by them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from schemas.context import NonEmpty, Wire
from schemas.events import IdempotencyKey

# The integration events the gateway's webhooks append (payloads: any object).
GITHUB_WEBHOOK_RECEIVED = "events.iterate.com/github/webhook-received"  # {event, delivery, payload}
SLACK_WEBHOOK_RECEIVED = "events.iterate.com/slack/webhook-received"  # {payload}

Tier = Literal["user", "integration", "agent", "platform"]
TIERS: tuple[Tier, ...] = ("user", "integration", "agent", "platform")


# --- requests ----------------------------------------------------------------------------------


class EventSubmission(Wire):
    """`POST /v1/streams/{path}/events`: one append command; the stream comes from the URL."""

    type: Annotated[str, Field(min_length=1)]
    payload: dict[str, Any]
    idempotencyKey: IdempotencyKey | None = None


class BatchLine(EventSubmission):
    """One line of `POST /v1/streams/-/events:batch` (NDJSON): a submission naming its stream."""

    streamPath: Annotated[str, Field(min_length=1)]


# --- responses ---------------------------------------------------------------------------------


class Accepted(Wire):
    """202: the command is durably in Kafka; its outcome follows on agent-append-results."""

    streamPath: str
    appendId: str


class Journaled(Wire):
    """200 with `?wait=true`: the command is journaled (or was already, `duplicate`)."""

    streamPath: str
    offset: int
    duplicate: bool


class ErrorBody(Wire):
    """Every error: a stable machine-readable `error` and a `detail` a person can act on."""

    error: str
    detail: str
    rule: str | None = None  # 403: the append-gate rule that refused the command


class BatchLineAccepted(Accepted):
    line: int


class BatchLineJournaled(Journaled):
    line: int


class BatchLineError(ErrorBody):
    line: int
    status: int  # the HTTP status this line alone would have had


class BatchResults(Wire):
    """One result per NDJSON line, in line order; a bad line fails alone."""

    accepted: int
    failed: int
    results: list[BatchLineJournaled | BatchLineAccepted | BatchLineError]


class Challenge(Wire):
    """Slack's `url_verification` answer."""

    challenge: str


class Health(Wire):
    status: Literal["ok", "unavailable"]
    detail: str | None = None


# --- the tokens file ---------------------------------------------------------------------------

Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
ScopeGlob = Annotated[str, Field(pattern=r"^/\S*$")]


# The tokens file holds secrets: its validation errors never print the values they refused.
SECRET_INPUT = ConfigDict(hide_input_in_errors=True)


class TokenEntry(Wire):
    """One bearer token, by the sha256 of its text (the token itself is never stored)."""

    model_config = SECRET_INPUT

    sha256: Sha256Hex
    tier: Tier
    scope: Annotated[list[ScopeGlob], Field(min_length=1)]
    name: str | None = None  # a label for people and logs (never the token)
    agentPath: NonEmpty | None = None  # `agent` tier: the actor the gateway stamps
    userId: NonEmpty | None = None  # `user` tier: stamped into the user actor

    @model_validator(mode="after")
    def _tier_fields(self) -> TokenEntry:
        if self.tier == "agent" and self.agentPath is None:
            raise ValueError("an agent-tier token needs agentPath (the actor the gateway stamps on its items)")
        if self.tier != "agent" and self.agentPath is not None:
            raise ValueError(f"agentPath is only for agent-tier tokens, not {self.tier!r}")
        if self.tier != "user" and self.userId is not None:
            raise ValueError(f"userId is only for user-tier tokens, not {self.tier!r}")
        return self


class WebhookSecrets(Wire):
    """Signing secrets: GitHub per installation, Slack per workspace."""

    model_config = SECRET_INPUT

    github: dict[str, NonEmpty] = {}
    slack: dict[str, NonEmpty] = {}


class TokensFile(Wire):
    model_config = SECRET_INPUT

    tokens: list[TokenEntry] = []
    webhooks: WebhookSecrets = WebhookSecrets()

    @field_validator("tokens")
    @classmethod
    def _unique(cls, tokens: list[TokenEntry]) -> list[TokenEntry]:
        seen: set[str] = set()
        for entry in tokens:
            if entry.sha256 in seen:
                raise ValueError(f"token sha256 {entry.sha256[:12]}… is listed twice")
            seen.add(entry.sha256)
        return tokens
