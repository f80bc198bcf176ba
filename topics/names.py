"""The topic set: names, partition counts and configs.

Everything is keyed by stream path, and agent-appends, agent-journal, llm-requests (and the rest)
share one partition count: a stream lives on the same partition number in every topic, which is
what lets one writer per partition own a stream's offsets and rows (Faust table state is per
partition). The journal is the source of truth: never deleted, never compacted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.requests import MAX_RECORD_BYTES

DAY_MS = 24 * 60 * 60 * 1000
# Records of llm-requests: the largest request the render budget allows, plus the envelope.
LLM_REQUESTS_MAX_MESSAGE_BYTES = MAX_RECORD_BYTES


@dataclass(frozen=True, slots=True)
class TopicNames:
    appends: str
    internal_appends: str  # commands only the workers write (docs/behaviour.md §5.1); ACLs can restrict it
    journal: str
    llm_requests: str
    dlq: str
    results: str
    script_runs: str  # run requests for the capability host (journaled script-run-requested events)
    journal_owners: str  # which journal worker owns which partition (Faust's assignment); ticks only


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    configs: dict[str, str] = field(default_factory=dict)


def topic_names(prefix: str = "") -> TopicNames:
    return TopicNames(
        appends=f"{prefix}agent-appends",
        internal_appends=f"{prefix}agent-internal-appends",
        journal=f"{prefix}agent-journal",
        llm_requests=f"{prefix}llm-requests",
        dlq=f"{prefix}agent-dlq",
        results=f"{prefix}agent-append-results",
        script_runs=f"{prefix}script-runs",
        journal_owners=f"{prefix}agent-journal-owners",
    )


def topic_specs(prefix: str = "", partitions: int = 8, replication_factor: int = 1) -> list[TopicSpec]:
    names = topic_names(prefix)
    # Commands only need to live until the journal worker has journaled them; a week covers any
    # outage worth surviving. Results are read within seconds; a day is plenty.
    transient = {"cleanup.policy": "delete", "retention.ms": str(7 * DAY_MS)}
    return [
        TopicSpec(names.appends, partitions, replication_factor, transient),
        # Co-partitioned with agent-appends: the same journal writer consumes both.
        TopicSpec(names.internal_appends, partitions, replication_factor, transient),
        # The source of truth: infinite retention, no compaction (every event is kept).
        TopicSpec(
            names.journal,
            partitions,
            replication_factor,
            {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"},
        ),
        # A request body may be several MB (the renderer's budget, schemas.requests): the broker's
        # default of ~1 MB would refuse it and stop the journal worker.
        TopicSpec(
            names.llm_requests,
            partitions,
            replication_factor,
            {**transient, "max.message.bytes": str(LLM_REQUESTS_MAX_MESSAGE_BYTES)},
        ),
        # Bad input is kept long enough for a person to look at it.
        TopicSpec(
            names.dlq, partitions, replication_factor, {"cleanup.policy": "delete", "retention.ms": str(30 * DAY_MS)}
        ),
        TopicSpec(
            names.results, partitions, replication_factor, {"cleanup.policy": "delete", "retention.ms": str(DAY_MS)}
        ),
        # Co-partitioned like llm-requests: one record per journaled script-run-requested event.
        TopicSpec(names.script_runs, partitions, replication_factor, transient),
        # Faust assigns its partitions (and the rows table's, co-partitioned) to journal workers; the
        # owner of partition p reads partition p of the command topics. Holds only assignment ticks.
        TopicSpec(
            names.journal_owners,
            partitions,
            replication_factor,
            {"cleanup.policy": "delete", "retention.ms": str(DAY_MS)},
        ),
    ]


def journal_worker_topic_specs(app_id: str, partitions: int = 8, replication_factor: int = 1) -> list[TopicSpec]:
    """The topics Faust declares for the journal worker `app_id`, created here first so that
    `topics ensure` creates and checks them with the set's replication factor too (Faust would
    create them with the same settings on the worker's first start)."""
    return [
        # The rows table's changelog: compacted, co-partitioned with the topic set.
        TopicSpec(f"{app_id}-rows-changelog", partitions, replication_factor, {"cleanup.policy": "compact"}),
        TopicSpec(f"{app_id}-__assignor-__leader", 1, replication_factor),
    ]
