"""The context item (docs/behaviour.md §1.2): the payload of `context-added`.

Every model here is strict about unknown fields (`extra="forbid"`): an unexpected field such as
`order` makes the whole payload invalid rather than being silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.limits import StreamPath

Role = Literal["system", "developer", "user", "assistant"]
PositiveInt = Annotated[int, Field(gt=0, strict=True)]
NonEmpty = Annotated[str, Field(min_length=1)]


class Wire(BaseModel):
    """Base for every wire shape: unknown fields rejected, immutable after validation."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --- actors (who supplied an item, independent of its role) -------------------------------


class UserActor(Wire):
    type: Literal["user"]
    origin: Literal["web", "mcp", "cli"]
    userId: str | None = None


class AgentActor(Wire):
    type: Literal["agent"]
    path: StreamPath


class ScriptActor(Wire):
    type: Literal["script"]
    executionId: NonEmpty


class IntegrationActor(Wire):
    type: Literal["integration"]
    name: NonEmpty


class SlackActor(Wire):
    type: Literal["slack"]
    userId: str | None = None
    botName: str | None = None


class TelegramActor(Wire):
    type: Literal["telegram"]
    userId: str | None = None
    username: str | None = None


class EmailActor(Wire):
    type: Literal["email"]
    address: str | None = None
    name: str | None = None


class GithubActor(Wire):
    type: Literal["github"]
    login: str | None = None
    senderType: str | None = None


Actor = Annotated[
    UserActor | AgentActor | ScriptActor | IntegrationActor | SlackActor | TelegramActor | EmailActor | GithubActor,
    Field(discriminator="type"),
]


@dataclass(frozen=True, slots=True)
class ActorTrust:
    """What an actor type of an item means to the renderer, the reducer and the append gate."""

    third_party: bool  # its text is data, never instructions: a developer item renders as user (§3.1)
    external: bool  # a developer item from it is external input: a new turn budget (§4.1)
    integration: bool  # an integration-tier token may append items with it (§7.2)


# The one trust table (docs/behaviour.md §3.1, §4.1, §7.2). A script result is third-party text
# but agent-loop feedback: provider trust and turn budgeting are separate decisions.
ACTOR_TRUST: dict[str, ActorTrust] = {
    "user": ActorTrust(third_party=True, external=True, integration=False),
    "agent": ActorTrust(third_party=False, external=False, integration=False),
    "script": ActorTrust(third_party=True, external=False, integration=False),
    "integration": ActorTrust(third_party=True, external=True, integration=True),
    "slack": ActorTrust(third_party=True, external=True, integration=True),
    "telegram": ActorTrust(third_party=True, external=True, integration=True),
    "email": ActorTrust(third_party=True, external=True, integration=True),
    "github": ActorTrust(third_party=True, external=True, integration=True),
}
THIRD_PARTY_ACTOR_TYPES = frozenset(kind for kind, trust in ACTOR_TRUST.items() if trust.third_party)
EXTERNAL_INPUT_ACTOR_TYPES = frozenset(kind for kind, trust in ACTOR_TRUST.items() if trust.external)
INTEGRATION_ACTOR_TYPES = frozenset(kind for kind, trust in ACTOR_TRUST.items() if trust.integration)


# --- refs (coordinates of richer source material) ---------------------------------------------


class EventRef(Wire):
    type: Literal["event"]
    streamPath: StreamPath
    offset: PositiveInt
    eventType: str | None = None


class UserRef(Wire):
    type: Literal["user"]
    userId: NonEmpty


class FileRef(Wire):
    type: Literal["file"]
    path: NonEmpty


class GitCommitRef(Wire):
    type: Literal["git-commit"]
    repoPath: NonEmpty
    commitOid: NonEmpty


Ref = Annotated[EventRef | UserRef | FileRef | GitCommitRef, Field(discriminator="type")]


class FileAttachment(Wire):
    contentType: str
    filename: str
    path: str
    size: Annotated[int, Field(ge=0, strict=True)]
    url: str


class LlmRequestPolicy(Wire):
    behaviour: Literal["after-current-request", "interrupt-current-request", "dont-trigger-request"]


class Compaction(Wire):
    replacesHistoryThrough: PositiveInt
    # Normalized summarizer usage; recorded, never rendered.
    usage: dict[str, int] | None = None


class ContextItem(Wire):
    role: Role
    content: str
    key: NonEmpty | None = None
    actor: Actor | None = None
    refs: list[Ref] | None = None
    files: list[FileAttachment] | None = None
    llmRequestPolicy: LlmRequestPolicy | None = None
    llmRequestOffset: PositiveInt | None = None
    compaction: Compaction | None = None

    @model_validator(mode="after")
    def _compaction_rules(self) -> ContextItem:
        if self.compaction is not None:
            if self.role != "developer":
                raise ValueError(f"a compaction summary must have role 'developer', not {self.role!r}")
            if self.key is not None:
                raise ValueError("a compaction summary must not have a 'key' (summaries are not slots)")
            if self.llmRequestPolicy is None or self.llmRequestPolicy.behaviour != "dont-trigger-request":
                raise ValueError(
                    "a compaction summary must set llmRequestPolicy {'behaviour': 'dont-trigger-request'} explicitly"
                )
        return self
