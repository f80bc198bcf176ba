"""`agentstream replay`: rebuild projections from agent-journal alone, and verify the live store.

The journal is the source of truth. Replay reads every partition of agent-journal from its start to
the end it had when replay began, folds each stream through the same `PartitionEngine.catch_up`
the worker uses after a crash, and writes the rows into a fresh RocksDB directory (one database
per partition, the layout of the live store). `--verify` then compares every row of the two
stores, partition by partition (each stream's metadata, item, idempotency and append-id rows, the
partition's journal position and any row no stream owns), and prints every row that exists on one
side only or differs.

The output directory is replay's own: it must be new, empty or a previous replay output (marked by
a `.agentstream-replay` file), and outside the live data directory; anything else is refused, never
deleted.
"""

from __future__ import annotations

import argparse
import shutil
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from rocksdict import AccessType, Options, Rdict
from tqdm import tqdm

from pipeline.agent_command import check_path
from pipeline.client import consume_ready, watermarks
from pipeline.journal_processor import PartitionEngine
from pipeline.partitioner import partition_for
from pipeline.settings import Settings
from processors import rows
from topics.admin import KafkaSetupError, quiet_librdkafka, require_topics
from topics.names import topic_names

EXIT_DIFFERENT = 1
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

    async def commit(self) -> None:
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


def replay(settings: Settings, out_dir: Path, only_path: str | None = None, progress: bool = True) -> ReplayStats:
    """Fold agent-journal (every stream, or one) into fresh rows under `out_dir`."""
    names = topic_names(settings.topic_prefix)
    prepare_out_dir(out_dir, settings.data_dir)
    consumer = Consumer(
        quiet_librdkafka(
            {
                **settings.kafka_client_config(),
                "group.id": "agentstream-replay",
                "enable.auto.commit": False,
                "enable.partition.eof": False,
                "fetch.max.bytes": 64 << 20,
                "fetch.wait.max.ms": 10,  # partitions are read one after another: do not idle at each switch
            }
        )
    )
    stats = ReplayStats()
    started = time.monotonic()
    try:
        partitions = _journal_partitions(consumer, names.journal)
        if only_path is not None:
            partitions = [partition_for(only_path, len(partitions))]
        ends: dict[int, tuple[int, int]] = {}
        for p in partitions:
            ends[p] = watermarks(consumer, TopicPartition(names.journal, p))
        total = sum(high - low for low, high in ends.values())
        bar = tqdm(total=total, unit="ev", desc="replay", disable=not progress, file=sys.stderr, mininterval=0.5)
        for p in partitions:
            low, high = ends[p]
            db = open_rows(out_dir / f"rows-{p}.db")
            engine = PartitionEngine(p, RdictRows(db), names, _no_send, max_cached_streams=1 << 30)
            try:
                if high > low:
                    consumer.assign([TopicPartition(names.journal, p, low)])
                    position = low
                    while position < high:
                        batch: list[tuple[int, bytes, dict[str, bytes]]] = []
                        consumed = 0
                        for message in consume_ready(consumer, 5000, 1.0):
                            if message.error() is not None or message.offset() >= high:
                                continue
                            position = message.offset() + 1
                            consumed += 1
                            if only_path is not None and message.key() != only_path.encode():
                                continue
                            batch.append((message.offset(), message.value(), dict(message.headers() or ())))
                        stats.events += engine.catch_up(batch)
                        bar.update(consumed)
                stats.streams.update(engine.streams)
            finally:
                db.close()
        bar.close()
    finally:
        consumer.close()
    stats.seconds = time.monotonic() - started
    return stats


async def _no_send(*_: Any) -> Any:
    raise RuntimeError("replay never produces")


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
    if kind == rows.POSITION:
        return f"journal position row ({_text(rest)})"
    return f"row {key!r} (no stream owns it)"


def _rows_at(path: Path) -> Iterator[tuple[bytes, bytes]]:
    """Every row of one partition's store in key order, but bookkeeping the journal cannot
    rebuild: Faust's changelog offset and the command topics' read positions."""
    if not path.exists():
        return
    db = open_rows(path, read_only=True)
    try:
        for key, value in db.items():
            if key != FAUST_OFFSET_KEY and not key.startswith(rows.COMMAND_POSITIONS + rows.SEP):
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
    from pipeline.journal_worker import ROWS_TABLE, build_app

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
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


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
    stats = replay(settings, out_dir, args.path, progress=not args.quiet)
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
        return EXIT_DIFFERENT
    print("live store matches the journal")
    return 0
