"""What the command-line tests check of `agentstream`'s output."""

from __future__ import annotations


def one_line(stderr: str) -> bool:
    """An error said in one line, no traceback and no librdkafka noise around it."""
    return stderr.strip() != "" and stderr.strip().count("\n") == 0
