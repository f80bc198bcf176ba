"""Commit points when work finishes out of order (pipeline/kafka/offset_progress.py): the caller and
the capability host commit the first consumed offset not yet finished, never past it."""

from __future__ import annotations

from pipeline.kafka.offset_progress import PartitionProgress, commit_points


def test_the_commit_point_is_the_first_unfinished_offset() -> None:
    progress = PartitionProgress()
    assert progress.committable() is None  # nothing consumed: nothing to commit
    for offset in (10, 11, 12):
        progress.consumed(offset)
    assert progress.committable() == 10
    progress.finished(11)  # out of order: 10 still holds the point
    assert progress.committable() == 10
    progress.finished(10)
    assert progress.committable() == 12
    progress.finished(12)
    assert progress.committable() == 13  # all finished: after the last consumed


def test_a_finish_of_an_offset_never_consumed_changes_nothing() -> None:
    progress = PartitionProgress()
    progress.consumed(5)
    progress.finished(4)
    assert progress.committable() == 5


def test_commit_points_lists_only_partitions_whose_point_moved() -> None:
    a, b, c = PartitionProgress(), PartitionProgress(), PartitionProgress()
    a.consumed(0)
    a.finished(0)
    b.consumed(7)
    b.finished(7)
    b.committed = 8  # already committed there
    c.consumed(3)  # unfinished: its point is 3, never committed yet
    assert commit_points({"a": a, "b": b, "c": c}) == {"a": 1, "c": 3}
