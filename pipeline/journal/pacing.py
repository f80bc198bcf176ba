"""When the worker's open checkpoints commit: at once, or a little later so that more commands
share its Kafka transaction (docs/architecture.md, "Commit pacing"). Pure: times are passed in.

A transaction costs the same whatever it holds: measured on the local broker, about 1.5 ms of the
worker's CPU and 2 ms of the broker's. Committing whenever the last commit is done keeps latency
lowest, but at a few hundred commands per second a worker then commits one or two commands per
transaction, and the transactions cost far more than the commands. So once the worker receives
commands (over all its partitions) faster than `MIN_EXPECTED` per interval, its commits start at
most once per interval. Below that rate waiting would only add latency, and each commit starts as
soon as the last one is done.

A commit that another process of the platform waits on never waits: one holding a command
from `agent-internal-appends` (a request's settlement, a script run's start or end) or a
record that follows an event (an LLM request, a script run). Those are steps of request/response
chains, where every wait would add up along the chain.
"""

from __future__ import annotations

from dataclasses import dataclass

# Waiting pays only if the recent rate promises at least this many commands within the interval.
MIN_EXPECTED = 2.0
# Weight of the newest checkpoint in the rate estimate (an exponentially weighted average).
SMOOTHING = 0.3
# The shortest span a checkpoint's rate is measured over: two commits a few microseconds apart
# (a flush right after a commit) must not make the rate look unbounded.
MIN_SPAN_S = 0.001


@dataclass(slots=True)
class CommitPacing:
    """The worker's commit rhythm: when its last transaction started committing, and how fast
    commands have been arriving (commands per second over recent transactions)."""

    interval_s: float
    rate: float = 0.0
    last_start: float | None = None

    def delay(self, now: float, awaited: bool = False) -> float:
        """Seconds to wait before the open checkpoint starts committing (0: commit now);
        `awaited`: another process of the platform waits on what it holds."""
        if awaited or self.interval_s <= 0 or self.last_start is None:
            return 0.0
        due = self.last_start + self.interval_s
        if now >= due or self.rate * self.interval_s < MIN_EXPECTED:
            return 0.0
        return due - now

    def started(self, now: float, commands: int) -> None:
        """A checkpoint holding `commands` commands starts committing at `now`: they arrived
        since the previous one started."""
        if self.last_start is not None:
            observed = commands / max(now - self.last_start, MIN_SPAN_S)
            self.rate = SMOOTHING * observed + (1 - SMOOTHING) * self.rate
        self.last_start = now
