"""At-least-once consumption with work finishing out of order: which offsets may be committed.

The LLM caller and the capability host both consume a topic, work on many records at once and
finish them in any order; a partition's commit point is the first consumed offset not yet finished.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

Partition = TypeVar("Partition")


class PartitionProgress:
    """Which consumed offsets of one partition are finished; the commit point is the first that is not."""

    def __init__(self) -> None:
        self.pending: dict[int, bool] = {}  # consumed offset -> finished (insertion = offset order)
        self.next: int | None = None  # last consumed offset + 1
        self.committed: int | None = None

    def consumed(self, offset: int) -> None:
        self.pending[offset] = False
        self.next = offset + 1

    def finished(self, offset: int) -> None:
        if offset in self.pending:
            self.pending[offset] = True

    def committable(self) -> int | None:
        while self.pending:
            first = next(iter(self.pending))
            if not self.pending[first]:
                return first
            del self.pending[first]
        return self.next


def commit_points(progress: Mapping[Partition, PartitionProgress]) -> dict[Partition, int]:
    """The partitions whose commit point moved since their last commit, with that point."""
    points: dict[Partition, int] = {}
    for partition, partition_progress in progress.items():
        point = partition_progress.committable()
        if point is not None and point != partition_progress.committed:
            points[partition] = point
    return points
