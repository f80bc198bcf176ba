"""Exit codes of every agentstream command and worker (docs/usage.md's exit code table lists them)."""

from __future__ import annotations

OK = 0
DIFFERENT = 1  # a check found differences (`replay --verify`; the demo's turn did not succeed)
USAGE = 2  # bad input or settings, a refused --out
KAFKA = 3  # Kafka unreachable or misconfigured; a local stack part that would not start or stop
NOT_FOUND = 4  # no such stream or request
FATAL = 70  # a worker could not go on safely; a restart recovers from its rows and the journal
ROW_FORMAT = 78  # the rows are another version's format: a restart will not help (EX_CONFIG)
INTERRUPTED = 130  # Ctrl-C
TERMINATED = 143  # `replay` stopped by SIGTERM (128 + 15, what a shell reports for a process SIGTERM ended)

ALL = (OK, DIFFERENT, USAGE, KAFKA, NOT_FOUND, FATAL, ROW_FORMAT, INTERRUPTED, TERMINATED)
