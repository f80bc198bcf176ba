"""The row stores replay reads and writes: the live store's databases (read-only, for verify),
and replay's own output directory, which it may clear only when it created it.

The output is written without RocksDB's write-ahead log: it is rebuilt from scratch, never resumed.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from rocksdict import AccessType, Options, Rdict, WriteBatch, WriteOptions

from pipeline.settings import Settings

MARKER = ".agentstream-replay"  # in every directory replay created: only those may be overwritten
FAUST_OFFSET_KEY = b"__faust\0offset__"  # Faust's own row in the live store (its changelog offset)


class ReplayRefused(ValueError):
    """The output directory is not replay's to write (the CLI exits 2)."""


class RdictRows:
    """`RowTable` over a plain rocksdict database."""

    def __init__(self, db: Rdict) -> None:
        self.db = db

    def get(self, key: bytes) -> bytes | None:
        value = self.db.get(key)
        return None if value is None else bytes(value)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        for key, value in self.db.items(from_key=prefix):
            if not key.startswith(prefix):
                return
            yield bytes(key), bytes(value)

    def put(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            del self.db[key]
        else:
            self.db[key] = value

    async def flush(self) -> None:
        """Writes are already in the database."""


def open_rows(path: Path, read_only: bool = False) -> Rdict:
    options = Options(raw_mode=True)
    options.set_write_buffer_size(8 << 20)
    if read_only:
        return Rdict(str(path), options=options, access_type=AccessType.read_only())
    options.create_if_missing(True)
    return Rdict(str(path), options=options)


def default_out_dir(settings: Settings) -> Path:
    """Beside the live data directory, never inside it."""
    return settings.data_dir.parent / f"{settings.data_dir.name}-replay"


def prepare_out_dir(out_dir: Path, data_dir: Path) -> None:
    """Make `out_dir` an empty replay output, or raise `ReplayRefused` without touching anything.

    Only a directory replay created (it holds `MARKER`) is cleared, and only of the databases
    replay writes; the live data directory, anything inside it and anything containing it are
    refused whatever they hold.
    """
    out, live = out_dir.resolve(), data_dir.resolve()
    if out == live or out.is_relative_to(live) or live.is_relative_to(out):
        where = "is" if out == live else "is inside" if out.is_relative_to(live) else "contains"
        raise ReplayRefused(
            f"--out {out_dir} {where} the live data directory {live} (AGENTSTREAM_DATA_DIR); "
            "choose a directory outside it"
        )
    if out.exists() and not out.is_dir():
        raise ReplayRefused(f"--out {out_dir} is a file, not a directory; choose a new or empty directory")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise ReplayRefused(
                f"--out {out_dir} is not empty and was not created by agentstream replay; "
                "choose a new or empty directory (replay deletes nothing it did not write)"
            )
        for database in out.glob("rows-*.db"):
            if database.is_dir() and not database.is_symlink():
                shutil.rmtree(database)
            else:
                database.unlink()
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by `agentstream replay`; a later replay may replace the rows-*.db here\n")


def open_output(path: Path) -> Rdict:
    """A replay output database, written without the write-ahead log (see the module docstring).

    Only write options differ from the live store's: RocksDB persists column-family options (an
    unsorted "vector" memtable would take rows faster, but every later read-write open of the
    database with ordinary options would then fail).
    """
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_write_buffer_size(16 << 20)  # full memtables are flushed in the background while folding
    db = Rdict(str(path), options=options)
    write_options = WriteOptions()
    write_options.disable_wal = True
    db.set_write_options(write_options)
    return db


class Outputs:
    """The output databases one process writes, closed together at its end: the last memtable of
    each is flushed by RocksDB's background threads while the next partition is folded."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.databases: list[Rdict] = []
        self._opening: dict[int, Future[Rdict]] = {}

    def open_ahead(self, partitions: list[int]) -> None:
        """Open these partitions' databases on a thread, in this order, for `create` to take
        (a partition opening already is left to it).

        Creating a database takes 10-50 ms, mostly without the GIL: opened ahead, that time passes
        while the journal's ends are read, records fetched and partitions folded.
        """
        opener = ThreadPoolExecutor(1, thread_name_prefix="agentstream-replay-open")
        for partition in partitions:
            if partition not in self._opening:
                self._opening[partition] = opener.submit(open_output, self._path(partition))
        opener.shutdown(wait=False)  # its thread ends once the last one is open

    def create(self, partition: int) -> Rdict:
        opening = self._opening.pop(partition, None)
        db = open_output(self._path(partition)) if opening is None else opening.result()
        self.databases.append(db)
        return db

    def _path(self, partition: int) -> Path:
        return self.out_dir / f"rows-{partition}.db"

    def close(self) -> None:
        # Opened ahead but never taken (replay stopped early): closed too, once opened.
        for opening in self._opening.values():
            opening.cancel()
        while self._opening:
            opening = self._opening.popitem()[1]
            if not opening.cancelled() and opening.exception() is None:
                self.databases.append(opening.result())
        while self.databases:
            self.databases.pop().close()  # waits for its flush: nothing is lost without the log


def write_rows(db: Rdict, staged: dict[bytes, bytes | None]) -> None:
    """One batch's rows in one atomic write."""
    batch = WriteBatch(raw_mode=True)
    put, delete = batch.put, batch.delete  # bound once: called once per row
    for key, value in staged.items():
        if value is None:
            delete(key)
        else:
            put(key, value)
    db.write(batch)


def live_store_paths(settings: Settings) -> dict[int, Path]:
    """Where the journal worker keeps each partition's rows (Faust's table layout)."""
    from pipeline.journal.worker import ROWS_TABLE, build_app

    app = build_app(settings)
    store = app.tables[ROWS_TABLE].data
    return {p: Path(store.partition_path(p)) for p in range(settings.partitions)}
