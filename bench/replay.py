"""Replay against the pure fold, one build against another: a journal written once, replayed many times.

    .venv/bin/python bench/replay.py [--trees /tmp/old-checkout .] [--rounds 2] [--jobs 1 2] [--repeat 3]
    .venv/bin/python bench/replay.py --profile 30    # replay --jobs 1 in a loop (attach py-spy)
    .venv/bin/python bench/replay.py --save-records /tmp/journal.pickle   # the journal's records, for:
    valgrind --tool=cachegrind --cache-sim=no .venv/bin/python bench/replay.py --work fold /tmp/journal.pickle

Needs the local broker (`bash scripts/kafka/start.sh`). Writes one journal through the journal
worker (a subprocess, its own topic prefix, deleted at the end): plain appends over 200 streams,
one stream of 10 000 items, and `bench/journal.py`'s replay mix (keyed slots, idempotency keys,
requests with answers, settlements and usage reports, compactions). Then, round after round, each
tree in `--trees` (a checkout of this repository) measures in its own process, with its own code
(PYTHONPATH): decode + fold of the journal's records in that process, no Kafka, no rows (best of
three, `bench/journal.py`'s `pure_fold_rate`, with the journal worker's GC policy and with
replay's), then `replay` with each `--jobs` (best of `--repeat` runs, each in a fresh process as
`agentstream replay` runs, so that its helpers are forked). Trees alternate, so a busy
moment of a shared machine falls on both. Each run is printed as it ends, with the ratio of
`replay --jobs 1` to the fold (target >= 60 %) and of `--jobs 2` to `--jobs 1` (target >= 1.5x). The ratio
is also given in events per CPU second of this process (for replay, its librdkafka and RocksDB
threads included), which other processes on the machine disturb less than the wall clock.

`--work fold|replay|none FILE` does one piece of work over records saved by `--save-records`, no
Kafka: decode + fold as above, or replay's fold, row encoding and RocksDB writes of each partition
in batches as `replay` takes them (`none`: only loading them). Counted under valgrind, the
instructions of `fold` and `replay` less those of `none` compare the two whatever else the
machine runs (run each tree with PYTHONPATH and AGENTSTREAM_BENCH_TREE set to it, and
PYTHONHASHSEED=0).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TREE = Path(os.environ.get("AGENTSTREAM_BENCH_TREE", Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(TREE))

from pipeline.settings import Settings  # noqa: E402


def _journal_bench(tree: Path) -> Any:
    """`bench/journal.py` of `tree`, as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location("bench_journal", tree / "bench" / "journal.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- writing the journal (once, with this tree's code) --------------------------------------------


def write_journal(stack: Any, plain: int, big: int, streams: int, per_stream: int) -> int:
    """Journal `plain` appends over 200 streams, `big` items on one stream and the replay mix."""
    from tests.kafka_stack import RecordCounter
    from topics.names import topic_names

    bench = _journal_bench(TREE)
    topics = topic_names(stack.settings.topic_prefix)
    marks = RecordCounter(topics.journal, stack.settings.partitions)
    producer = bench.new_producer()
    try:
        stack.start_worker()
        paths = [f"/bench/t{i:03d}" for i in range(200)]
        records = [(paths[i % 200].encode(), bench.command(paths[i % 200], f"t#{i}")) for i in range(plain)]
        records += [(b"/bench/big", bench.command("/bench/big", f"item #{i} " * 8)) for i in range(big)]
        bench.produce_all(producer, topics.appends, records)
        rng = random.Random(7)
        queues = [
            [(path.encode(), value) for value in bench.mix_commands(path, per_stream, rng)]
            for path in (f"/bench/m{i:03d}" for i in range(streams))
        ]
        mix = [record for group in zip(*queues, strict=False) for record in group]
        mix += [record for queue in queues for record in queue[min(map(len, queues)) :]]
        bench.produce_all(producer, topics.internal_appends, mix)
        bench.wait_for_count(marks, len(records) + len(mix), timeout=900)
        return marks.total()
    finally:
        stack.stop_worker()
        producer.flush(10)
        marks.close()


# --- one measurement (a subprocess running its tree's code) ----------------------------------------


def measure(settings: Settings, out_dir: Path, jobs: list[int], repeat: int = 1) -> dict[str, float]:
    bench = _journal_bench(TREE)
    values = [[message.value() for message in p] for p in read_journal(settings, "bench-replay-values")]
    records = sum(map(len, values))
    figures: dict[str, float] = {"fold": 0.0, "fold_cpu": 0.0}
    for _ in range(3):
        cpu = time.process_time()
        figures["fold"] = max(figures["fold"], bench.pure_fold_rate(values, worker_gc=True))
        figures["fold_cpu"] = max(figures["fold_cpu"], records / (time.process_time() - cpu))
    figures["fold_replay_gc"] = max(bench.pure_fold_rate(values, worker_gc=False) for _ in range(3))
    del values
    for n in jobs:
        for _ in range(repeat):  # the best of `repeat` runs, as the fold's best of three
            events, seconds, cpu = replay_once(settings, out_dir / f"jobs-{n}", n)
            figures[f"jobs{n}"] = max(figures.get(f"jobs{n}", 0.0), events / seconds)
            if n == 1:  # the replaying process's CPU (its librdkafka and RocksDB threads too); helpers are others
                figures["jobs1_cpu"] = max(figures.get("jobs1_cpu", 0.0), events / cpu)
            figures["events"] = events
    return figures


def replay_once(settings: Settings, out_dir: Path, jobs: int) -> tuple[int, float, float]:
    """One replay in a fresh process, as `agentstream replay` runs (its helpers forked): events,
    seconds and the CPU seconds of that process. Run here, after this process's Kafka reads, its
    helpers would be spawned instead."""
    argv = [sys.executable, __file__, "--replay-once", settings.model_dump_json(), str(out_dir), str(jobs)]
    result = subprocess.run(argv, capture_output=True, text=True)  # this tree's environment and directory
    if result.returncode != 0:
        raise RuntimeError(f"replay --jobs {jobs} failed:\n{result.stderr}")
    events, seconds, cpu = json.loads(result.stdout.splitlines()[-1])
    return int(events), float(seconds), float(cpu)


def _replay_once(settings: Settings, out_dir: Path, jobs: int) -> None:
    from pipeline.journal.replay import replay

    cpu = time.process_time()
    stats = replay(settings, out_dir, progress=False, jobs=jobs)
    print(json.dumps([stats.events, stats.seconds, time.process_time() - cpu]))


def run_measure(tree: Path, settings: Settings, out_dir: Path, jobs: list[int], repeat: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "AGENTSTREAM_BENCH_TREE": str(tree)}
    argv = [sys.executable, __file__, "--measure", settings.model_dump_json(), str(out_dir), str(repeat)]
    argv += map(str, jobs)
    result = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"measurement in {tree} failed:\n{result.stderr}")
    return json.loads(result.stdout.splitlines()[-1])


def read_journal(settings: Settings, group: str) -> list[list[Any]]:
    """Every journal record, per partition, as confluent-kafka messages."""
    from confluent_kafka import Consumer, TopicPartition

    from pipeline.kafka.read import read_ranges, watermarks
    from tests.kafka_stack import consumer_config
    from topics.names import topic_names

    topic = topic_names(settings.topic_prefix).journal
    consumer = Consumer(consumer_config(group))
    try:
        partitions = []
        for p in range(settings.partitions):
            ranges = {p: watermarks(consumer, TopicPartition(topic, p))}
            batches = read_ranges(consumer, topic, ranges, max_messages=5000, poll_s=1.0)
            partitions.append([message for batch in batches for message in batch])
    finally:
        consumer.close()
    return partitions


def save_records(settings: Settings, path: Path) -> None:
    """Every journal record, per partition, as replay's fold takes them: (offset, value, headers)."""
    partitions = [
        [(m.offset(), m.value(), m.headers()) for m in p] for p in read_journal(settings, "bench-replay-records")
    ]
    path.write_bytes(pickle.dumps(partitions))


def work(kind: str, path: Path) -> None:
    """One piece of work over saved records (see the module docstring), for an instruction count."""
    from pipeline.journal.replay import BATCH
    from pipeline.journal.replay_fold import PartitionFold
    from pipeline.journal.replay_store import Outputs, RdictRows, write_rows

    partitions = pickle.loads(path.read_bytes())
    if kind == "fold":
        _journal_bench(TREE).pure_fold_rate([[value for _, value, _ in p] for p in partitions], worker_gc=True)
    elif kind == "replay":
        out_dir = Path(tempfile.mkdtemp(prefix="agentstream-bench-work-"))
        outputs = Outputs(out_dir)
        if hasattr(outputs, "open_ahead"):  # as replay --jobs 1 does (an older tree opens each in turn)
            outputs.open_ahead(list(range(len(partitions))))
        gc.disable()  # replay's policy while folding
        for partition, records in enumerate(partitions):
            db = outputs.create(partition)
            fold = PartitionFold(partition, read=RdictRows(db).get)
            for start in range(0, len(records), BATCH):
                fold.fold(records[start : start + BATCH])
                write_rows(db, fold.take())
            write_rows(db, fold.take())
            db.flush(wait=False)
        outputs.close()
        gc.enable()
        shutil.rmtree(out_dir)


def profile(settings: Settings, out_dir: Path, seconds: float) -> None:
    from pipeline.journal.replay import replay

    print(f"[bench] pid {os.getpid()}: replay --jobs 1 for {seconds:.0f}s", file=sys.stderr, flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        stats = replay(settings, out_dir, progress=False, jobs=1)
        print(f"[bench]   {stats.events / stats.seconds:,.0f} events/s", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="+", type=Path, default=[TREE], help="checkouts to compare (default: this)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the trees (default 2)")
    parser.add_argument("--jobs", nargs="+", type=int, default=[1, 2], help="replay --jobs to time (default 1 2)")
    parser.add_argument("--repeat", type=int, default=1, help="replays per --jobs and round, best kept (default 1)")
    parser.add_argument("--plain", type=int, default=30_000, help="plain appends over 200 streams (default 30 000)")
    parser.add_argument("--profile", type=float, metavar="SECONDS", help="only replay --jobs 1, in a loop")
    parser.add_argument("--save-records", type=Path, metavar="FILE", help="only save the journal's records")
    parser.add_argument("--work", nargs=2, metavar=("KIND", "FILE"), help="fold, replay or none over saved records")
    parser.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--replay-once", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.replay_once:
        settings_json, out, jobs_text = args.replay_once
        _replay_once(Settings.model_validate_json(settings_json), Path(out), int(jobs_text))
        return 0
    if args.work:
        work(args.work[0], Path(args.work[1]))
        return 0
    if args.measure:
        settings = Settings.model_validate_json(args.measure[0])
        jobs = [int(n) for n in args.measure[3:]]
        print(json.dumps(measure(settings, Path(args.measure[1]), jobs, repeat=int(args.measure[2]))))
        return 0
    from tests.kafka_stack import Stack, ensure_broker

    ensure_broker()
    tmp = Path(tempfile.mkdtemp(prefix="agentstream-bench-replay-"))
    stack = Stack(tmp / "data", partitions=4)
    try:
        started = time.monotonic()
        records = write_journal(stack, args.plain, 10_000, 20, 400)
        print(f"[bench] journal of {records:,} records in {time.monotonic() - started:.0f}s", file=sys.stderr)
        if args.save_records is not None:
            save_records(stack.settings, args.save_records)
            return 0
        if args.profile is not None:
            profile(stack.settings, tmp / "profile", args.profile)
            return 0
        for round_number in range(args.rounds):
            for tree in args.trees:
                load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
                figures = run_measure(tree.resolve(), stack.settings, tmp / "out", args.jobs, args.repeat)
                line = (
                    f"round {round_number + 1} {tree}: load {load}; fold {figures['fold']:,.0f} /s "
                    f"(replay GC {figures['fold_replay_gc']:,.0f}); "
                )
                line += "; ".join(f"--jobs {n} {figures[f'jobs{n}']:,.0f} /s" for n in args.jobs)
                if 1 in args.jobs:
                    line += f"; jobs 1 / fold {figures['jobs1'] / figures['fold']:.0%}"
                    line += f" (CPU time: {figures['jobs1_cpu'] / figures['fold_cpu']:.0%})"
                    if 2 in args.jobs:
                        line += f"; jobs 2 / jobs 1 {figures['jobs2'] / figures['jobs1']:.2f}x"
                print(line, flush=True)
    finally:
        stack.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
