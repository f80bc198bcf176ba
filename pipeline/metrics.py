"""Prometheus metrics of the workers (prometheus-client), served on `/metrics`.

Names follow Prometheus conventions: `agentstream_` prefix, base units (seconds), `_total` for
counters. Label values are bounded sets (event type names of the contract, reason kinds, statuses),
never stream paths. The metrics table of docs/reference.md lists each one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from schemas.events import CONSUMED_TYPES, CONTEXT_ADDED, LLM_REQUEST_SETTLED, TOKEN_USAGE_REPORTED

_FAST = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
_PROVIDER = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

EVENTS_JOURNALED = Counter(
    "agentstream_events_journaled_total", "Events written to agent-journal, by event type.", ["type"]
)
DUPLICATES = Counter("agentstream_duplicate_appends_total", "Appends recognised as already journaled (no-ops).")
REPEATS_REJECTED = Counter(
    "agentstream_repeated_work_rejected_total",
    "Repeats by a platform writer (caller, capability host, router) whose idempotency key already names "
    "a different journaled event: answered as rejected, the first outcome kept, not dead-lettered.",
)
FENCED = Counter(
    "agentstream_fenced_total",
    "Partitions this journal worker dropped because a newer owner fenced its transactional producer.",
)
CHECKPOINT_SECONDS = Histogram(
    "agentstream_checkpoint_commit_seconds",
    "Time to commit one partition's checkpoint: its transaction, from begin to the local write.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
CHECKPOINT_COMMANDS = Histogram(
    "agentstream_checkpoint_commands",
    "Commands decided into one committed checkpoint (a busy partition commits larger ones).",
    buckets=(1, 10, 100, 1_000, 5_000, 10_000, 20_000),
)
DLQ_RECORDS = Counter("agentstream_dlq_records_total", "Commands sent to agent-dlq, by reason kind.", ["reason"])
FOLD_SECONDS = Histogram(
    "agentstream_fold_seconds",
    "Time to validate, journal and fold one command into its projection (one command in 16 is timed).",
    buckets=_FAST,
)
RENDER_SECONDS = Histogram(
    "agentstream_render_seconds", "Time to render one request body from the projection.", buckets=_FAST
)
REQUESTS_OPENED = Counter("agentstream_llm_requests_opened_total", "LLM requests opened (turns started).")
REQUESTS_SETTLED = Counter(
    "agentstream_llm_requests_settled_total", "Open LLM requests settled, by status.", ["status"]
)
TOKENS = Counter("agentstream_tokens_total", "Tokens reported by providers, by kind.", ["kind"])
COMPACTIONS = Counter("agentstream_compactions_total", "Compaction summaries applied to projections.")
OPEN_REQUESTS = Gauge("agentstream_open_requests", "Agents with an LLM request open (this worker's partitions).")
PAUSED_AGENTS = Gauge("agentstream_paused_agents", "Agents paused by the autonomous-turn breaker (this worker).")


class TurnCounts(Protocol):
    open_requests: int
    paused_agents: int


def count_turns(owned: Mapping[int, TurnCounts]) -> None:
    """Report OPEN_REQUESTS and PAUSED_AGENTS as sums over the partitions in `owned` when scraped:
    a partition counts while the worker owns it, and drops out when it is revoked."""
    OPEN_REQUESTS.set_function(lambda: sum(p.open_requests for p in list(owned.values())))
    PAUSED_AGENTS.set_function(lambda: sum(p.paused_agents for p in list(owned.values())))


CONSUMER_LAG = Gauge(
    "agentstream_consumer_lag",
    "Records of a consumed topic not yet handled, per consumer group and partition: agent-appends "
    "(journal worker), llm-requests (LLM caller), script-runs (capability host).",
    ["group", "topic", "partition"],
)
PROVIDER_SECONDS = Histogram(
    "agentstream_provider_request_seconds", "LLM provider call time, by outcome.", ["outcome"], buckets=_PROVIDER
)


_JOURNALED: dict[str, Any] = {}


def journaled(event_type: str) -> Any:
    """The journaled-events counter child of a type (label lookups cached: one per event)."""
    child = _JOURNALED.get(event_type)
    if child is None:
        if len(_JOURNALED) > 1000:  # producers choose types freely: keep the cache bounded
            _JOURNALED.clear()
        child = _JOURNALED[event_type] = EVENTS_JOURNALED.labels(event_type_label(event_type))
    return child


def event_type_label(event_type: str) -> str:
    """The short name of a contract event type; every other type is `other` (bounded labels)."""
    return event_type.rsplit("/", 1)[-1] if event_type in CONSUMED_TYPES else "other"


# Reasons that name their kind first (`too_large: the command is ...`): the kind is the label.
_KIND_PREFIXES = ("too_large", "forbidden", "internal_error")
DLQ_REASON_LABELS = (
    "not_a_command",
    "idempotency_conflict",
    "misrouted",
    *_KIND_PREFIXES,
    "invalid_payload",
)


def dlq_reason_label(reason: str) -> str:
    """The bounded kind of a DLQ reason, one of `DLQ_REASON_LABELS` (docs/reference.md lists each)."""
    if reason.startswith("not an append command"):
        return "not_a_command"
    if reason.startswith("idempotency key"):
        return "idempotency_conflict"
    if reason.startswith("record key") or " belongs to partition " in reason:
        return "misrouted"
    for kind in _KIND_PREFIXES:
        if reason.startswith(kind + ":"):
            return kind
    return "invalid_payload"


def serve(port: int, host: str) -> None:
    """Serve /metrics on host:port in a background thread (port 0: no server). `host` is
    `AGENTSTREAM_METRICS_HOST`: loopback unless set, since the metrics carry no authentication."""
    if port:
        start_http_server(port, addr=host)


# --- the capability host (`agentstream worker capabilities`) -----------------------------------
_SCRIPT = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
SCRIPT_RUNS = Counter(
    "agentstream_script_runs_total",
    "Script runs settled, by outcome: succeeded, or the failure kind (syntax, runtime, limit, timeout, expired, "
    "crashed).",
    ["outcome"],
)
SCRIPT_RUN_SECONDS = Histogram(
    "agentstream_script_run_seconds", "Wall time of one script run in the sandbox.", buckets=_SCRIPT
)
SCRIPT_POOL_SIZE = Gauge("agentstream_script_pool_size", "Scripts the host runs at once (sandbox workers).")
SCRIPT_POOL_BUSY = Gauge("agentstream_script_pool_busy", "Sandbox slots in use (saturation: busy / size).")
SCRIPT_QUEUED = Gauge("agentstream_script_runs_queued", "Run requests received and not yet settled (this host).")


def observe_journaled(event: Any, state: Any, was_open: Any) -> None:
    """Counters of one journaled event (the state is already folded; events by type are counted
    per batch, `PartitionEngine._count_journaled`)."""
    if state.open is not None and state.open is not was_open:
        REQUESTS_OPENED.inc()
    if was_open is not None and state.open is None and event.type == LLM_REQUEST_SETTLED:
        REQUESTS_SETTLED.labels(event.payload.result.status).inc()
    if event.type == TOKEN_USAGE_REPORTED:
        report = event.payload
        TOKENS.labels("input").inc(report.inputTokens)
        TOKENS.labels("output").inc(report.outputTokens)
        TOKENS.labels("cached").inc(report.cachedInputTokens or 0)
    elif (
        event.type == CONTEXT_ADDED
        and event.payload.compaction is not None
        and state.compacted_through >= (event.payload.compaction.replacesHistoryThrough)
    ):
        COMPACTIONS.inc()
