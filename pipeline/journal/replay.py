"""`agentstream replay`: rebuild projections from agent-journal alone, and verify the live store.

The journal is the source of truth. Replay reads every partition of agent-journal from its start to
the end it had when replay began, folds each stream with the reducer and row encodings the worker
uses (`pipeline.journal.replay_fold`: the rows `PartitionEngine.catch_up` would store, encoded once per
batch), and writes the rows into a fresh RocksDB directory (one database per partition, the layout
of the live store). Records are consumed in batches and each batch's rows are written in one
`WriteBatch`. `--jobs N` replays partitions in N processes at once (a partition is folded by one
process, start to end). `--verify` then compares every row of the two stores, partition by
partition (each stream's metadata, item, idempotency and append-id rows, the partition's journal
position and any row no stream owns), and prints every row that exists on one side only or differs.

The output is written without RocksDB's write-ahead log: it is rebuilt from scratch, never
resumed. An interrupted replay (Ctrl-C, a crash, a lost machine) may leave partial databases; the
next replay into the same directory deletes them and starts over.

The output directory is replay's own: it must be new, empty or a previous replay output (marked by
a `.agentstream-replay` file), and outside the live data directory; anything else is refused, never
deleted."""

from __future__ import annotations

import argparse
import contextlib
import gc
import multiprocessing
import os
import pickle
import queue
import shutil
import signal
import struct
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from rocksdict import AccessType, Options, Rdict, WriteBatch, WriteOptions
from tqdm import tqdm

from pipeline import exit_codes
from pipeline.cli.agent_command import check_path
from pipeline.journal.replay_fold import PartitionFold, Record
from pipeline.kafka.partitioner import partition_for
from pipeline.kafka.read import read_ranges, watermarks
from pipeline.settings import Settings
from processors import dedupe, rows
from topics.admin import KafkaSetupError, quiet_librdkafka, require_topics
from topics.names import topic_names

MARKER = ".agentstream-replay"  # in every directory replay created: only those may be overwritten
FAUST_OFFSET_KEY = b"__faust\0offset__"  # Faust's own row in the live store (its changelog offset)
BATCH = 10_000  # records per consume call, and at most per write batch
BOOKKEEPING = (rows.COMMAND_POSITIONS + rows.SEP, rows.POSITION + rows.SEP)  # rows verify does not compare


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


@dataclass
class ReplayStats:
    events: int = 0
    streams: set[str] = field(default_factory=set)
    seconds: float = 0.0


def _journal_partitions(consumer: Consumer, topic: str) -> list[int]:
    metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if metadata is None or metadata.error is not None:
        raise KafkaSetupError(
            f"topic {topic} not found; run `agentstream topics ensure` (or check AGENTSTREAM_TOPIC_PREFIX)"
        )
    return sorted(metadata.partitions)


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


def _consumer(client_config: dict[str, Any]) -> Consumer:
    return Consumer(
        quiet_librdkafka(
            {
                **client_config,
                "group.id": "agentstream-replay",
                "enable.auto.commit": False,
                "enable.partition.eof": False,
                "fetch.max.bytes": 64 << 20,
                "max.partition.fetch.bytes": 16 << 20,  # one partition at a time: let one fetch be large
                "fetch.wait.max.ms": 10,  # partitions are read one after another: do not idle at each switch
            }
        )
    )


def _open_output(path: Path) -> Rdict:
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


class _Outputs:
    """The output databases one process writes, closed together at its end: the last memtable of
    each is flushed by RocksDB's background threads while the next partition is folded."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.databases: list[Rdict] = []

    def create(self, partition: int) -> Rdict:
        db = _open_output(self.out_dir / f"rows-{partition}.db")
        self.databases.append(db)
        return db

    def close(self) -> None:
        while self.databases:
            self.databases.pop().close()  # waits for its flush: nothing is lost without the log


def _write(db: Rdict, staged: dict[bytes, bytes | None]) -> None:
    """One batch's rows in one atomic write."""
    batch = WriteBatch(raw_mode=True)
    for key, value in staged.items():
        if value is None:
            batch.delete(key)
        else:
            batch.put(key, value)
    db.write(batch)


@contextlib.contextmanager
def _folding_gc() -> Iterator[None]:
    """Replay's garbage-collector policy: no collections while folding.

    The projections hold no reference cycles (`pipeline.journal.heap`), so CPython's collections would
    only scan them, again and again as they grow (the worker freezes them instead; a batch job
    need not scan them at all). The rare cycle (an invalid record's exception) is collected once
    replay is done.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True, slots=True)
class PartitionTask:
    """One partition's journal, from `low` to the end it had when replay began (`high`)."""

    partition: int
    low: int
    high: int


def replay_partition(
    consumer: Consumer,
    topic: str,
    task: PartitionTask,
    db: Rdict,
    only_path: str | None,
    report: Callable[[int], None],
    append_id_window: int = dedupe.DEFAULT_APPEND_ID_WINDOW,
) -> tuple[int, list[str]]:
    """Fold one partition's journal into its output database: (events folded, streams seen).

    Records are consumed in batches; each batch's rows are written in one `WriteBatch`.
    `report(n)` is told how many records each batch consumed (progress).
    """
    rows_written = RdictRows(db)
    fold = PartitionFold(task.partition, append_id_window=append_id_window, read=rows_written.get)
    only_key = None if only_path is None else only_path.encode()
    ranges = {task.partition: (task.low, task.high)}  # up to the end replay began with: later records are not ours
    for messages in read_ranges(consumer, topic, ranges, max_messages=BATCH, poll_s=1.0):
        if only_key is not None:
            records: list[Record] = [
                (message.offset(), message.value(), message.headers())
                for message in messages
                if message.key() == only_key
            ]
        else:
            records = [(message.offset(), message.value(), message.headers()) for message in messages]
        fold.fold(records)
        staged = fold.take()
        if staged:
            _write(db, staged)
        report(len(messages))
    staged = fold.take()  # the format row of a partition with nothing to replay
    if staged:
        _write(db, staged)
    db.flush(wait=False)
    return fold.folded, list(fold.streams)


def replay(
    settings: Settings,
    out_dir: Path,
    only_path: str | None = None,
    progress: bool = True,
    jobs: int = 1,
) -> ReplayStats:
    """Fold agent-journal (every stream, or one) into fresh rows under `out_dir`.

    With `jobs` > 1, `jobs - 1` helper processes replay partitions beside this one (each
    partition's rows are their own database; one process folds a partition from start to end).
    They are started with multiprocessing's "spawn" method, so a script calling this with
    jobs > 1 needs the usual `if __name__ == "__main__":` guard.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    names = topic_names(settings.topic_prefix)
    prepare_out_dir(out_dir, settings.data_dir)
    stats = ReplayStats()
    started = time.monotonic()
    consumer = _consumer(settings.kafka_consumer_config())
    helpers: _Helpers | None = None
    outputs = _Outputs(out_dir)
    try:
        partitions = _journal_partitions(consumer, names.journal)
        if only_path is not None:
            partitions = [partition_for(only_path, len(partitions))]
        if min(jobs, len(partitions)) > 1:
            # Started first: their interpreters start up while the journal's ends are read, and
            # this process, which is up already, takes the largest partition.
            helpers = _Helpers(
                min(jobs, len(partitions)) - 1,
                settings.kafka_consumer_config(),
                names.journal,
                out_dir,
                only_path,
                settings.append_id_window,
            )
        tasks = [PartitionTask(p, *watermarks(consumer, TopicPartition(names.journal, p))) for p in partitions]
        total = sum(task.high - task.low for task in tasks)
        with tqdm(total=total, unit="ev", desc="replay", disable=not progress, file=sys.stderr, mininterval=0.5) as bar:

            def report(consumed: int) -> None:
                bar.update(consumed)
                if helpers is not None:
                    helpers.poll(bar.update)  # their progress (and failures) between two of our batches

            if helpers is not None:
                helpers.hand_out(tasks)
            with _folding_gc():
                for task in iter(helpers.take, None) if helpers is not None else tasks:
                    db = outputs.create(task.partition)
                    events, streams = replay_partition(
                        consumer, names.journal, task, db, only_path, report, settings.append_id_window
                    )
                    stats.events += events
                    stats.streams.update(streams)
                outputs.close()
            if helpers is not None:
                for events, streams in helpers.wait(bar.update):
                    stats.events += events
                    stats.streams.update(streams)
            bar.total = bar.n  # the ends' sum was an upper bound: transaction markers take offsets too
    finally:
        outputs.close()
        consumer.close()
        if helpers is not None:
            helpers.close()
    stats.seconds = time.monotonic() - started
    return stats


class _Helpers:
    """Processes that replay partitions beside this one.

    Partitions are handed out through a shared queue, largest first, to the helpers and to this
    process alike; helpers report progress, results and failures on another queue.
    """

    def __init__(
        self,
        count: int,
        client_config: dict[str, Any],
        topic: str,
        out_dir: Path,
        only_path: str | None,
        append_id_window: int = dedupe.DEFAULT_APPEND_ID_WINDOW,
    ):
        context = multiprocessing.get_context("spawn")  # never fork a process that holds librdkafka threads
        self.tasks: multiprocessing.Queue[PartitionTask | None] = context.Queue()
        self.reports: multiprocessing.Queue[tuple[Any, ...]] = context.Queue()
        self.processes = [
            context.Process(
                target=_replay_worker,
                args=(
                    client_config,
                    topic,
                    out_dir,
                    only_path,
                    append_id_window,
                    self.tasks,
                    self.reports,
                    os.getpid(),
                ),
                name=f"agentstream-replay-{number}",
                daemon=True,
            )
            for number in range(count)
        ]
        for process in self.processes:
            process.start()
        self.results: list[tuple[int, list[str]]] = []
        self.expected = 0  # partitions the helpers took

    def hand_out(self, tasks: list[PartitionTask]) -> None:
        """Queue `tasks`, largest first, for the helpers and this process (`take`)."""
        for task in sorted(tasks, key=lambda task: task.high - task.low, reverse=True):
            self.tasks.put(task)
        for _ in range(len(self.processes) + 1):
            self.tasks.put(None)  # one end marker for every taker, this process included
        self.expected = len(tasks)

    def take(self) -> PartitionTask | None:
        """This process's next partition to replay; None once all are taken."""
        while True:
            try:
                task = self.tasks.get(timeout=0.5)
            except queue.Empty:
                self._check()  # a helper that died holding the queue's lock would block us forever
                continue
            if task is not None:
                self.expected -= 1
            return task

    def poll(self, report: Callable[[int], None], timeout: float | None = None) -> None:
        """Take what the helpers reported so far (waiting up to `timeout` for a first report)."""
        while True:
            try:
                message = self.reports.get(timeout=timeout) if timeout is not None else self.reports.get_nowait()
            except queue.Empty:
                return
            timeout = None
            kind = message[0]
            if kind == "progress":
                report(message[1])
            elif kind == "done":
                self.results.append((message[1], message[2]))
            else:
                raise pickle.loads(message[1])

    def wait(self, report: Callable[[int], None]) -> list[tuple[int, list[str]]]:
        """The helpers' results, once every partition they took is replayed."""
        while len(self.results) < self.expected:
            self.poll(report, timeout=0.5)
            if len(self.results) < self.expected:
                self._check()
        return self.results

    def _check(self) -> None:
        for process in self.processes:
            if process.exitcode not in (None, 0):
                self.poll(lambda _: None)  # its own report of what went wrong, if it sent one
                raise RuntimeError(f"replay worker {process.name} exited with code {process.exitcode}")

    def close(self) -> None:
        # Finished: every partition's rows are on disk, so a helper still alive has nothing left to
        # do (it may still be starting up). Interrupted or failed: stop them now; their half-written
        # databases are rebuilt from scratch by the next replay into this directory.
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()
        self.tasks.close()
        self.reports.close()


def _replay_worker(
    client_config: dict[str, Any],
    topic: str,
    out_dir: Path,
    only_path: str | None,
    append_id_window: int,
    tasks: multiprocessing.Queue[PartitionTask | None],
    reports: multiprocessing.Queue[tuple[Any, ...]],
    parent: int,
) -> None:
    """One replay process: partitions from `tasks` until a None, everything it learns to `reports`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops us

    def report(consumed: int) -> None:
        if os.getppid() != parent:
            os._exit(1)  # orphaned (the parent was killed): stop writing into a directory nobody owns
        reports.put(("progress", consumed))

    consumer = None
    outputs = _Outputs(out_dir)
    results = []
    try:
        consumer = _consumer(client_config)
        with _folding_gc():
            while (task := _next_task(tasks, parent)) is not None:
                db = outputs.create(task.partition)
                results.append(replay_partition(consumer, topic, task, db, only_path, report, append_id_window))
            outputs.close()  # reported done only once the rows are on disk
        for events, streams in results:
            reports.put(("done", events, streams))
    except BaseException as error:  # the parent re-raises it, so the CLI maps it to its exit code
        reports.put(("failed", _portable(error)))
    finally:
        outputs.close()
        if consumer is not None:
            consumer.close()


def _next_task(tasks: multiprocessing.Queue[PartitionTask | None], parent: int) -> PartitionTask | None:
    while True:
        try:
            return tasks.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:
                return None  # orphaned before the parent handed out the work


def _portable(error: BaseException) -> bytes:
    """The pickled error, or a stand-in of the same kind for the CLI where it does not pickle."""
    try:
        pickled = pickle.dumps(error)
        pickle.loads(pickled)
        return pickled
    except Exception:
        if isinstance(error, KafkaException):
            stand_in: BaseException = KafkaSetupError(f"Kafka error: {error.args[0].str() if error.args else error}")
        else:
            stand_in = RuntimeError(f"{type(error).__name__}: {error}")
        return pickle.dumps(stand_in)


@dataclass(frozen=True, slots=True)
class RowDifference:
    """One row that the live store and the replayed store do not agree on."""

    partition: int
    key: bytes
    live: bytes | None
    replayed: bytes | None

    @property
    def stream(self) -> str | None:
        return _owner(self.key)

    @property
    def kind(self) -> str:
        if self.replayed is None:
            return "live only"
        return "replay only" if self.live is None else "values differ"

    def __str__(self) -> str:
        return f"partition {self.partition}: {describe_key(self.key)}: {self.kind}"


def _owner(key: bytes) -> str | None:
    """The stream a row belongs to; None for partition rows and rows no stream can own."""
    try:
        return rows.stream_of_key(key)
    except ValueError:  # not UTF-8: garbage, no stream's row
        return None


def _text(raw: bytes) -> str:
    text = raw.decode(errors="backslashreplace")
    return text if text.isprintable() else repr(text)  # one line whatever the row holds


def describe_key(key: bytes) -> str:
    """A row key for people: which stream, which kind of row."""
    kind, _, rest = key.partition(rows.SEP)
    path, _, tail = rest.partition(rows.SEP)
    if kind == rows.META and _owner(key) is not None:
        return f"{_text(rest)} metadata row"
    if kind == rows.ITEM and len(tail) == 9 and _owner(key) is not None:
        lane = {b"s": "system", b"h": "history"}.get(tail[:1], _text(tail[:1]))
        seq = struct.unpack(">Q", tail[1:])[0] - (1 << 63)
        return f"{_text(path)} item row ({lane} lane, seq {seq})"
    if kind == rows.IDEMPOTENCY and _owner(key) is not None:
        return f"{_text(path)} idempotency row (key {_text(tail)})"
    if kind == rows.APPEND_ID and _owner(key) is not None:
        return f"{_text(path)} append-id row ({_text(tail)})"
    if kind == rows.APPEND_SLOT and len(tail) == 8 and _owner(key) is not None:
        return f"{_text(path)} append-id window row (slot {struct.unpack('>Q', tail)[0]})"
    if kind == rows.POSITION:
        return f"journal position row ({_text(rest)})"
    if kind == rows.FORMAT:
        return f"row format row ({_text(rest)})"
    return f"row {key!r} (no stream owns it)"


def _rows_at(path: Path) -> Iterator[tuple[bytes, bytes]]:
    """Every row of one partition's store in key order, but bookkeeping the journal cannot
    rebuild: Faust's changelog offset, the command topics' read positions, and the journal
    position `p`, which the live worker records one checkpoint late (a lower bound for recovery;
    docs/architecture.md, "Commit protocol")."""
    if not path.exists():
        return
    db = open_rows(path, read_only=True)
    try:
        for key, value in db.items():
            if key != FAUST_OFFSET_KEY and not key.startswith(BOOKKEEPING):
                yield bytes(key), bytes(value)
    finally:
        db.close()


def _merged(
    live: Iterator[tuple[bytes, bytes]], replayed: Iterator[tuple[bytes, bytes]]
) -> Iterator[tuple[bytes, bytes | None, bytes | None]]:
    """(key, live value, replayed value) over both stores, walked side by side in key order.

    Both iterate sorted (RocksDB's bytewise order), so a store of any size is compared in
    constant memory.
    """
    left, right = next(live, None), next(replayed, None)
    while left is not None or right is not None:
        if right is None or (left is not None and left[0] < right[0]):
            assert left is not None
            yield left[0], left[1], None
            left = next(live, None)
        elif left is None or right[0] < left[0]:
            yield right[0], None, right[1]
            right = next(replayed, None)
        else:
            yield left[0], left[1], right[1]
            left, right = next(live, None), next(replayed, None)


def verify(replayed_dir: Path, live_paths: dict[int, Path], only_path: str | None = None) -> list[RowDifference]:
    """Every row that differs between the live and the replayed store (missing on either side too).

    All rows are compared, not only those a stream's state is loaded from: a stray row (a stream's
    row in another partition, an item no event made, a key no stream owns) is a difference. With
    `only_path` only that stream's rows are compared.
    """
    differences: list[RowDifference] = []
    for partition, live_path in sorted(live_paths.items()):
        replayed = _rows_at(replayed_dir / f"rows-{partition}.db")
        for key, live, again in _merged(_rows_at(live_path), replayed):
            if only_path is not None and _owner(key) != only_path:
                continue
            if live != again:
                differences.append(RowDifference(partition, key, live, again))
    return differences


def live_store_paths(settings: Settings) -> dict[int, Path]:
    """Where the journal worker keeps each partition's rows (Faust's table layout)."""
    from pipeline.journal.worker import ROWS_TABLE, build_app

    app = build_app(settings)
    store = app.tables[ROWS_TABLE].data
    return {p: Path(store.partition_path(p)) for p in range(settings.partitions)}


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "replay",
        help="rebuild projections from agent-journal into a fresh store (and verify the live one)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--path", help="replay one stream only (default: all streams)")
    parser.add_argument(
        "--out",
        type=Path,
        help="directory for the rebuilt rows: new, empty or an earlier replay's output, outside the live data "
        "directory (default: <data dir>-replay beside it)",
    )
    parser.add_argument(
        "--verify", action="store_true", help="compare every row with the live store; exit 1 if any differ"
    )
    parser.add_argument(
        "--jobs",
        type=_positive,
        default=1,
        metavar="N",
        help="replay partitions in N processes at once (default 1; more than the partition count is no faster)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of processes, at least 1 (got {text!r})")
    return value


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if args.path is not None:
        check_path(args.path)
    out_dir = args.out or default_out_dir(settings)
    prepare_out_dir(out_dir, settings.data_dir)  # refuse before reading the journal
    names = topic_names(settings.topic_prefix)
    require_topics(
        settings.bootstrap_servers, [names.journal], settings.partitions, client_config=settings.kafka_client_config()
    )
    stats = replay(settings, out_dir, args.path, progress=not args.quiet, jobs=args.jobs)
    if args.path is not None and args.path not in stats.streams:
        raise LookupError(
            f"no events of {args.path} in {names.journal}: check the path (agentstream agent create prints it)"
        )
    rate = stats.events / stats.seconds if stats.seconds else 0.0
    print(
        f"replayed {stats.events} events of {len(stats.streams)} streams in {stats.seconds:.2f}s "
        f"({rate:,.0f} events/s) into {out_dir}"
    )
    if not args.verify:
        return 0
    differences = verify(out_dir, live_store_paths(settings), args.path)
    if differences:
        streams = {d.stream for d in differences if d.stream is not None}
        print(f"{len(differences)} row(s) differ from the live store ({len(streams)} stream(s) affected):")
        for difference in differences:
            print(f"  {difference}")
        return exit_codes.DIFFERENT
    print("live store matches the journal")
    return 0
