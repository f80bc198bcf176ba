"""`agentstream replay`: rebuild projections from agent-journal alone, and verify the live store.

The journal is the source of truth. Replay reads every partition of agent-journal from its start to
the end it had when replay began, folds each stream through the same `PartitionEngine.catch_up`
the worker uses after a crash, and writes the rows into a fresh RocksDB directory (one database
per partition, the layout of the live store). `--verify` then compares them, stream by stream,
with the journal worker's live rows and prints every stream that differs.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from rocksdict import AccessType, Options, Rdict
from tqdm import tqdm

from pipeline.client import consume_ready, watermarks
from pipeline.journal_processor import PartitionEngine
from pipeline.partitioner import partition_for
from pipeline.settings import Settings
from processors import rows
from topics.names import topic_names

EXIT_DIFFERENT = 1
EXIT_ERROR = 2


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
        raise SystemExit(f"agentstream replay: topic {topic} not found; is the bootstrap server right?")
    return sorted(metadata.partitions)


def replay(settings: Settings, out_dir: Path, only_path: str | None = None, progress: bool = True) -> ReplayStats:
    """Fold agent-journal (every stream, or one) into fresh rows under `out_dir`."""
    names = topic_names(settings.topic_prefix)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    consumer = Consumer(
        {
            **settings.kafka_client_config(),
            "group.id": "agentstream-replay",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "fetch.max.bytes": 64 << 20,
            "fetch.wait.max.ms": 10,  # partitions are read one after another: do not idle at each switch
            "log_level": 3,
        }
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


def stream_rows(db: Rdict) -> dict[str, dict[bytes, bytes]]:
    """Every stream's rows (items, metadata, dedupe rows); partition position rows excluded."""
    by_stream: dict[str, dict[bytes, bytes]] = {}
    for key, value in db.items():
        path = rows.stream_of_key(bytes(key))
        if path is not None:
            by_stream.setdefault(path, {})[bytes(key)] = bytes(value)
    return by_stream


def verify(replayed_dir: Path, live_paths: dict[int, Path], only_path: str | None = None) -> list[str]:
    """Streams whose live rows differ from the replayed ones (missing on either side included)."""
    differing: list[str] = []
    for partition, live_path in sorted(live_paths.items()):
        replayed_path = replayed_dir / f"rows-{partition}.db"
        replayed = stream_rows(open_rows(replayed_path, read_only=True)) if replayed_path.exists() else {}
        live = stream_rows(open_rows(live_path, read_only=True)) if live_path.exists() else {}
        paths = set(replayed) | set(live)
        if only_path is not None:
            paths &= {only_path}
        differing.extend(path for path in sorted(paths) if replayed.get(path) != live.get(path))
    return differing


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
        "--out", type=Path, help="directory for the rebuilt rows (default: <data dir>/replay, replaced)"
    )
    parser.add_argument("--verify", action="store_true", help="compare with the live store; exit 1 if any differ")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    out_dir = args.out or settings.data_dir / "replay"
    stats = replay(settings, out_dir, args.path, progress=not args.quiet)
    rate = stats.events / stats.seconds if stats.seconds else 0.0
    print(
        f"replayed {stats.events} events of {len(stats.streams)} streams in {stats.seconds:.2f}s "
        f"({rate:,.0f} events/s) into {out_dir}"
    )
    if not args.verify:
        return 0
    differing = verify(out_dir, live_store_paths(settings), args.path)
    if differing:
        print(f"{len(differing)} stream(s) differ from the live store:")
        for path in differing:
            print(f"  {path}")
        return EXIT_DIFFERENT
    print("live store matches the journal")
    return 0
