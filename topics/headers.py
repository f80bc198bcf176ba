"""The Kafka record headers the journal worker writes on journal and dead-letter records, which
recovery, replay and tests read back (docs/architecture.md, "Recovering")."""

from __future__ import annotations

H_APPEND_ID = "append-id"
H_SOURCE_OFFSET = "source-offset"
# On journal records: "internal" for agent-internal-appends, "scheduler" for the scheduler's
# decisions journaled at once (no command topic, no source offset), absent for agent-appends.
H_SOURCE_TOPIC = "source-topic"
INTERNAL = b"internal"
SCHEDULER = b"scheduler"
H_REASON = "reason"
