"""Replay's output databases opened ahead on a thread (`Outputs.open_ahead`): each partition gets
its own database, and closing releases every one, taken or not (a stopped replay). No broker."""

from __future__ import annotations

from pathlib import Path

import pytest
from rocksdict import Rdict

from pipeline.journal import replay_store
from pipeline.journal.replay_store import Outputs, open_output, open_rows, write_rows


def test_opened_ahead_each_partition_writes_its_own_database(tmp_path: Path) -> None:
    outputs = Outputs(tmp_path)
    outputs.open_ahead([2, 0, 1])
    for partition in (2, 0, 1):
        write_rows(outputs.create(partition), {b"p": str(partition).encode()})
    write_rows(outputs.create(3), {b"p": b"3"})  # not opened ahead: opened here
    outputs.close()
    for partition in range(4):
        db = open_rows(tmp_path / f"rows-{partition}.db", read_only=True)
        assert bytes(db[b"p"]) == str(partition).encode()
        db.close()


def test_close_releases_databases_opened_ahead_but_never_taken(tmp_path: Path) -> None:
    outputs = Outputs(tmp_path)
    outputs.open_ahead([0, 1, 2])
    outputs.create(0)
    outputs.close()  # as when replay is interrupted after the first partition
    again = Outputs(tmp_path)  # RocksDB's lock on each is released: they open again
    for partition in range(3):
        again.create(partition)
    again.close()


def test_a_partition_opening_already_is_opened_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[Path] = []

    def counted(path: Path) -> Rdict:
        opened.append(path)
        return open_output(path)

    monkeypatch.setattr(replay_store, "open_output", counted)
    outputs = Outputs(tmp_path)
    outputs.open_ahead([0, 1])
    outputs.open_ahead([1])  # as replay --jobs 1 asks again for each partition it takes
    outputs.create(1)
    outputs.close()
    assert sorted(opened) == [tmp_path / "rows-0.db", tmp_path / "rows-1.db"]
