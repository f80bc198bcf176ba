"""The journal worker's own CPU per command, without Kafka: the engine against the pure fold.

    .venv/bin/python bench/engine.py [--commands 60000] [--streams 200] [--profile out.svg]

One partition's `PartitionEngine` (the code the worker runs per command: parse, dedupe, journal,
fold, rows, results, follow-ups, staging in the checkpoint, committing the checkpoint's records and
rows) decides client-shaped commands (`context-added` user items with an append id, as
bench/journal.py produces them) over 200 streams, with an in-memory row store and producer
(tests/support/journal_fakes.py) standing in for RocksDB and Kafka. Baseline, in the same run:
decode + fold of the journal records the engine wrote (bench/reduce.py's figure), no rows.

The ratio engine / pure fold is the worker's ceiling: the live worker adds Kafka I/O and Faust on
top (bench/journal.py measures that, and prints its rate against the same pure fold). The target
of the live worker is at least 25% of the pure fold; this figure shows how much of the gap is the
worker's own Python. `--profile` records the engine phase with py-spy (pip-installable) into an
SVG flame graph, to see where the time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import orjson  # noqa: E402

from pipeline.journal import heap  # noqa: E402
from pipeline.journal.checkpoint import WorkerCommitter  # noqa: E402
from pipeline.journal.decisions import CommandRecord  # noqa: E402
from pipeline.journal.engine import PartitionEngine  # noqa: E402
from processors.reducer import fold  # noqa: E402
from processors.state import AgentState  # noqa: E402
from schemas.events import CONTEXT_ADDED, decode_event  # noqa: E402
from tests.support.journal_fakes import DictStore, FakeTransactions  # noqa: E402
from topics.names import topic_names  # noqa: E402

ACTOR = {"type": "user", "origin": "cli"}
BATCH = 500  # commands per handle_batch, as the command reader hands them over


def commands(count: int, streams: int) -> list[CommandRecord]:
    paths = [f"/bench/s{i:04d}" for i in range(streams)]
    records = []
    for n in range(count):
        path = paths[n % streams]
        value = orjson.dumps(
            {
                "streamPath": path,
                "type": CONTEXT_ADDED,
                "payload": {"role": "user", "content": f"message {n} " + "x" * 60, "actor": ACTOR},
                "appendId": uuid.uuid4().hex,
            }
        )
        records.append(CommandRecord(partition=0, offset=n, key=path.encode(), value=value, headers={}))
    return records


async def engine_rate(records: list[CommandRecord]) -> tuple[float, list[bytes]]:
    names = topic_names("bench-")
    kafka = FakeTransactions()
    commits = WorkerCommitter(kafka, names.journal, names.results, (names.appends, names.internal_appends))
    engine = PartitionEngine(0, DictStore(), names, commits, max_cached_streams=10_000, max_pending=1_000_000)
    heap.settle()
    started = time.perf_counter()
    for i in range(0, len(records), BATCH):
        await engine.handle_batch(records[i : i + BATCH])
        await asyncio.sleep(0)  # let the committer run, as the worker's loop does
    await engine.checkpoints.flush()
    elapsed = time.perf_counter() - started
    journal = [record.value for record in kafka.on(names.journal)]
    assert len(journal) == len(records), f"journaled {len(journal)} of {len(records)}"
    return len(records) / elapsed, journal


def pure_fold_rate(values: list[bytes]) -> float:
    states: dict[str, AgentState] = {}
    gc.collect()
    heap.settle()
    started = time.perf_counter()
    for count, value in enumerate(values, 1):
        event = decode_event(value)
        state = states.get(event.streamPath)
        if state is None:
            state = states[event.streamPath] = AgentState()
        fold(state, event)
        if count % heap.SETTLE_EVERY == 0:
            heap.settle()
    return len(values) / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commands", type=int, default=60_000)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="best of this many runs of each (default 3)")
    parser.add_argument("--profile", metavar="SVG", help="record the engine phase with py-spy into this file")
    args = parser.parse_args(argv)
    if args.profile:
        return _profiled(args)
    engine_rates, fold_rates = [], []
    for _ in range(args.rounds):  # alternating: other work on a shared machine only slows a run
        rate, journal = asyncio.run(engine_rate(commands(args.commands, args.streams)))
        engine_rates.append(rate)
        fold_rates.append(pure_fold_rate(journal))
    engine, pure = max(engine_rates), max(fold_rates)
    runs = ", ".join(f"{r:,.0f}" for r in engine_rates)
    print(f"engine, commands/s (in memory, no Kafka): {engine:,.0f}  (runs: {runs})")
    print(
        f"pure decode + fold, events/s:              {pure:,.0f}  (runs: {', '.join(f'{r:,.0f}' for r in fold_rates)})"
    )
    print(f"engine / pure fold: {engine / pure:.0%}  ({args.commands:,} commands over {args.streams} streams)")
    return 0


def _profiled(args: argparse.Namespace) -> int:
    """Run one engine phase under py-spy (a child process, so the profile holds only the engine)."""
    spy = Path(sys.executable).parent / "py-spy"
    child = [
        sys.executable,
        __file__,
        "--commands",
        str(args.commands),
        "--streams",
        str(args.streams),
        "--rounds",
        "1",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.call([str(spy), "record", "-o", args.profile, "-r", "200", "--", *child], env=env)


if __name__ == "__main__":
    raise SystemExit(main())
