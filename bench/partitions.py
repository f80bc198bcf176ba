"""Partitions' cost to one journal worker: two builds side by side, at several partition counts.

    .venv/bin/python bench/partitions.py [--quick] [--partitions 4,16,64,128]
        [--baseline ../baseline | --baseline none] [--current .] [--builds baseline,current]

Needs the local broker (`bash scripts/kafka/start.sh`) and, for the baseline, a work tree of the
build to compare against (`git worktree add ../baseline <commit>`, beside this checkout). Each build is a source tree
run by this venv's interpreter: the worker is what the `agentstream` console script runs
(`pipeline.cli:main`, `worker journal`) with the tree as working directory and as PYTHONPATH;
before measuring, the same command line prints `pipeline.__file__`, and the bench stops unless it
lies in that tree. For each partition count, the builds run one after the other, in the order of
`--builds` for the first count and reversed for the next (baseline, current; current, baseline;
...), so slow drift of a shared machine favours neither. Each run is bench/journal.py's `Bench`
(its own topic prefix, Faust app id and data directory, its topics deleted at the end, its
producer, journal record counter and paced latency probe), with the worker started from the build's
tree, and one worker owning every partition. Per build and partition count it prints:

- worker threads and RSS: the highest count of /proc/<pid>/task and the highest VmRSS of
  /proc/<pid>/status, sampled every 0.2 s from the moment the worker owns every partition (a
  command journaled on each: the warm-up also gives each of the 200 load streams its first event)
  through the backlog and both paced loads;
- backlog appends/s: valid AppendCommand JSON (with append ids, as the client API sends them) over
  200 streams (60 000, `--quick` 10 000), produced while the worker runs but inside one
  transaction of the bench's producer, so the worker sees none of them until the transaction
  commits and then all of them, as a backlog. The rate is n over the time from the commit to the
  last one journaled (bench/journal.py's sustained rate, from "first produced" to "readable"),
  the best of two backlogs one after the other after a warm-up backlog of a quarter of the size
  (as bench/journal.py), beside the worker's CPU per append meanwhile (the lower of the two).
  With 200 streams, a partition count above ~100 leaves some partitions without load (as it would
  with few busy agents);
- at a paced 500 and 5 000 appends/s for 20 s each (`--quick` 6 s), after one uncounted second:
  worker and broker CPU per append (user + system time of all threads, from /proc/<pid>/stat,
  over the counted probes: bench/journal.py's `Bench.latency`, the broker's pid as bench/turns.py
  finds it) and append→journaled p50/p99 (produce time of the command to consume time of its
  journal record, by the same probe). The broker serves every client of this machine: its figure
  includes their traffic, so its CPU over the 3 idle seconds before each paced load is printed too,
  and its CPU per append less that idle rate (the targets use the raw figure).

Then a summary: every figure of the current build relative to the baseline's, the figures relative
to the 4-partition run of the same build (threads and RSS per added partition, backlog appends/s,
worker + broker CPU per append at 500/s), and the targets of the one-producer-per-worker change,
each with PASS or FAIL for both builds:

- backlog appends/s at 64 and at 128 partitions >= 90% of the figure at 4;
- worker threads <= 40 at every partition count;
- RSS at most 1 MiB more per partition than at 4;
- worker + broker CPU per append at 500/s at 64 partitions <= 1.2x the figure at 4; at 4
  partitions <= 40% of the baseline's and <= 0.6 ms;
- append→journaled p99 at 500/s <= 50 ms at 4 and at 64 partitions.

Last, at each partition count (unless `--no-floor`), the floor: the same paced load at 500/s
through bench/journal.py's raw consume→produce loop instead of a worker (no transactions, no
rows), its CPU and the broker's per append and its latency. The broker's figure above includes
what this bench's own producer and latency reader cost it; the floor shows how much that is.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.journal import Bench, command, new_producer, percentile, produce_all, wait_for_count  # noqa: E402
from bench.turns import broker_pid, process_cpu_s  # noqa: E402

# What the `agentstream` console script runs (pyproject.toml: `agentstream = "pipeline.cli:main"`);
# the package has no __main__ module, so `-m pipeline.cli` would not run it.
LAUNCH = "import sys; from pipeline.cli import main; sys.exit(main())"
STREAMS = 200
RATES = (500, 5000)
LOW_RATE = RATES[0]
NAN = math.nan

# The targets of the one-producer-per-worker change.
BACKLOG_KEPT = 0.90  # backlog appends/s at 64 and 128 partitions, of the figure at 4
MAX_THREADS = 40
RSS_PER_PARTITION_MIB = 1.0
CPU_GROWTH = 1.2  # worker + broker CPU per append at 500/s, 64 partitions against 4
CPU_OF_BASELINE = 0.40  # ... at 4 partitions, current against baseline
CPU_AT_4_US = 600.0
P99_MS = 50.0
P99_AT = (4, 64)


# --- builds ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Build:
    """A source tree whose journal worker runs on this venv's interpreter."""

    name: str
    root: Path

    def env(self, env: dict[str, str]) -> dict[str, str]:
        return {**env, "PYTHONPATH": str(self.root)}

    def worker_command(self) -> list[str]:
        return [sys.executable, "-c", LAUNCH, "worker", "journal"]

    def imported_from(self) -> Path:
        """Where the worker's command line imports `pipeline` from; exits unless it is this tree."""
        result = subprocess.run(
            [sys.executable, "-c", "import pipeline; print(pipeline.__file__)"],
            cwd=self.root,
            env=self.env(dict(os.environ)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        path = Path(result.stdout.strip()).resolve()
        if result.returncode != 0 or not path.is_relative_to(self.root.resolve()):
            raise SystemExit(f"{self.name} build ({self.root}) imports pipeline from {path}:\n{result.stderr}")
        return path


# --- the worker process, from /proc ---------------------------------------------------------------


def process_threads(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


def process_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class Peaks:
    """The highest thread count and RSS of a process, sampled every 0.2 s by a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.threads = 0
        self.rss_mib = 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def sample(self) -> None:
        while not self.done.is_set():
            threads, rss = process_threads(self.pid), process_rss_mib(self.pid)
            self.threads = max(self.threads, threads or 0)
            self.rss_mib = max(self.rss_mib, rss or 0.0)
            self.done.wait(0.2)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join()


# --- one build at one partition count --------------------------------------------------------------


@dataclass
class Paced:
    rate: float = NAN
    worker_us: float = NAN
    broker_us: float = NAN
    p50_ms: float = NAN
    p99_ms: float = NAN
    broker_idle: float = NAN  # cores, over the idle seconds before the load

    @property
    def total_us(self) -> float:
        return self.worker_us + self.broker_us

    @property
    def broker_net_us(self) -> float:
        """The broker's CPU per append less what it spent at its idle rate (other clients included)."""
        return self.broker_us - self.broker_idle * 1e6 / self.rate


@dataclass
class Result:
    build: str
    partitions: int
    threads: float = NAN
    rss_mib: float = NAN
    backlog_rate: float = NAN
    backlog_cpu_us: float = NAN
    paced: dict[int, Paced] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def at(self, rate: int) -> Paced:
        return self.paced.get(rate) or Paced()

    @property
    def idle(self) -> float:
        """The broker's CPU (cores) over the idle seconds before the paced loads, on average."""
        return _mean(paced.broker_idle for paced in self.paced.values())

    def line(self) -> str:
        parts = [
            f"threads {_num(self.threads, '.0f')}",
            f"RSS {_num(self.rss_mib, '.0f')} MiB",
            f"backlog {_num(self.backlog_rate, ',.0f')} appends/s (worker {_num(self.backlog_cpu_us, '.0f')} us each)",
        ]
        for rate, paced in self.paced.items():
            parts.append(
                f"@{rate}/s worker {_num(paced.worker_us, '.0f')} + broker {_num(paced.broker_us, '.0f')} us, "
                f"p50 {_num(paced.p50_ms, '.1f')} p99 {_num(paced.p99_ms, '.1f')} ms"
            )
        return "; ".join(parts + self.notes) + "".join(f"; FAILED: {error}" for error in self.errors)


class Run(Bench):
    """bench/journal.py's Bench (fresh topics, app id and data directory) with `build`'s worker."""

    def __init__(self, build: Build, quick: bool, partitions: int) -> None:
        super().__init__(quick, partitions)
        self.build = build

    def start_worker(self) -> None:
        """The build's worker, ready once it journaled a command on every partition: the first
        event of each load stream, then streams of their own for the partitions still without one."""
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        self.stack.worker = subprocess.Popen(
            self.build.worker_command(),
            cwd=self.build.root,
            env=self.build.env(self.stack.env()),
            stdout=self.stack.log_path.open("ab"),
            stderr=subprocess.STDOUT,
        )
        covered: set[int] = set()

        def delivered(error: Any, message: Any) -> None:
            if error is None:
                covered.add(message.partition())

        paths = [f"/bench/t{i:03d}" for i in range(STREAMS)] + [f"/bench/l{i:03d}" for i in range(STREAMS)]
        before, sent, extra = self.journal_marks.total(), 0, 0
        while True:
            for path in paths:
                value = command(path, "warm-up")
                self.producer.produce(self.topics.appends, key=path.encode(), value=value, on_delivery=delivered)
                self.producer.poll(0)
            sent += len(paths)
            self.producer.flush(60)
            if len(covered) == self.partitions:
                break
            paths = [f"/bench/w{i:04d}" for i in range(extra, extra + 4 * self.partitions)]
            extra += len(paths)
        deadline = time.monotonic() + 300
        while self.journal_marks.total() < before + sent:
            if self.stack.worker.poll() is not None:
                raise RuntimeError(f"worker exited with {self.stack.worker.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker not ready after 300s:\n{self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.stack.worker_log().splitlines()[-lines:])

    def backlog(self, n: int) -> tuple[float, float]:
        """(appends/s, worker CPU us per append) draining n commands made readable at once."""
        paths = [f"/bench/t{i:03d}" for i in range(STREAMS)]
        records = [(paths[i % STREAMS].encode(), command(paths[i % STREAMS], f"b#{i}")) for i in range(n)]
        producer = new_producer(**{"transactional.id": f"bench-backlog-{uuid.uuid4().hex[:8]}"})
        producer.init_transactions(30)
        producer.begin_transaction()
        produce_all(producer, self.topics.appends, records)
        start = self.journal_marks.total()
        samples: list[tuple[float, int]] = []
        waiter = threading.Thread(target=wait_for_count, args=(self.journal_marks, start + n, 600, samples))
        pid = self.worker_pid()
        cpu_before = process_cpu_s(pid)
        readable_at = time.perf_counter()
        producer.commit_transaction(30)
        waiter.start()
        waiter.join()
        cpu_after = process_cpu_s(pid)
        if not samples or samples[-1][1] < start + n:
            raise RuntimeError(f"backlog: {samples[-1][1] - start if samples else 0} of {n} journaled")
        cpu = (cpu_after - cpu_before) * 1e6 / n if cpu_before is not None and cpu_after is not None else NAN
        return n / (samples[-1][0] - readable_at), cpu

    def paced(self, rate: int, seconds: float) -> Paced:
        broker = broker_pid() or 0
        idle_before, started = process_cpu_s(broker), time.perf_counter()
        time.sleep(3)  # the worker and broker settle after the run before (as bench/journal.py)
        idle_after, idle_s = process_cpu_s(broker), time.perf_counter() - started
        paced = self.paced_through(self.topics.appends, self.topics.journal, rate, seconds, self.worker_pid(), broker)
        paced.broker_idle = NAN if idle_before is None or idle_after is None else (idle_after - idle_before) / idle_s
        return paced

    def paced_through(self, source: str, sink: str, rate: int, seconds: float, processor: int, broker: int) -> Paced:
        """`rate` commands/s from `source` to `sink` for `seconds`: the processor's and the broker's
        CPU per command and the latency percentiles."""
        lat = self.latency(source, sink, rate, seconds, STREAMS, cpu_of={"worker": processor, "broker": broker})
        return Paced(
            rate=rate,
            worker_us=self.paced_cpu_us.get("worker", NAN),
            broker_us=self.paced_cpu_us.get("broker", NAN),
            p50_ms=percentile(lat, 0.5),
            p99_ms=percentile(lat, 0.99),
        )


def floor(partitions: int, quick: bool) -> Paced:
    """The same paced load at `LOW_RATE` through bench/journal.py's raw pass-through loop (consume,
    produce, no transactions) instead of a worker: what the load itself costs the broker (this
    bench's producer and latency reader included), a floor no processor gets under."""
    run = Run(Build("pass-through", REPO), quick, partitions)
    try:
        run.raw_throughput(200, STREAMS)  # starts the loop (and drains a few records)
        assert run.passthrough is not None
        broker = broker_pid() or 0
        time.sleep(3)
        source, target = run.raw_topics
        seconds = 6.0 if quick else 20.0
        return run.paced_through(source, target, LOW_RATE, seconds, run.passthrough.pid, broker)
    finally:
        run.stop_passthrough()
        run.close()


def measure(build: Build, partitions: int, quick: bool) -> Result:
    n, seconds = (10_000, 6.0) if quick else (60_000, 20.0)
    result = Result(build.name, partitions)
    progress = sys.stderr
    run = Run(build, quick, partitions)
    print(
        f"[partitions] {build.name} @ {partitions} partitions: {build.root}, topic prefix {run.settings.topic_prefix}, "
        f"app id {run.settings.app_id}, data {run.tmp}",
        file=progress,
        flush=True,
    )
    peaks: Peaks | None = None
    try:
        started = time.monotonic()
        run.start_worker()
        print(
            f"[partitions]   owns all {partitions} partitions after {time.monotonic() - started:.0f}s; "
            f"backlog of {n:,}",
            file=progress,
            flush=True,
        )
        peaks = Peaks(run.worker_pid())
        peaks.start()
        # A warm-up, then the best of two, as bench/journal.py's sustained rate: the first backlog
        # after the start pays for first growth (rows, caches); other work on the cores only slows a run.
        run.backlog(n // 4)
        backlogs = [run.backlog(n) for _ in range(2)]
        result.backlog_rate, result.backlog_cpu_us = max(r for r, _ in backlogs), min(c for _, c in backlogs)
        result.notes.append("backlog runs " + ", ".join(f"{r:,.0f}" for r, _ in backlogs) + " appends/s")
        for rate in RATES:
            print(f"[partitions]   paced {rate}/s for {seconds:.0f}s", file=progress, flush=True)
            try:
                result.paced[rate] = run.paced(rate, seconds)
            except RuntimeError as error:  # probes lost or late: the worker did not keep up
                result.paced[rate] = Paced()
                result.errors.append(f"@{rate}/s: {error}")
    except Exception as error:
        result.errors.append(f"{type(error).__name__}: {error}")
    finally:
        if peaks is not None:
            peaks.stop()
            result.threads, result.rss_mib = float(peaks.threads), peaks.rss_mib
        run.close()
    print(f"[partitions]   {build.name} @ {partitions}: {result.line()}", file=progress, flush=True)
    return result


# --- the report -----------------------------------------------------------------------------------


def _num(value: float, spec: str) -> str:
    return "n/a" if value is None or math.isnan(value) else format(value, spec)


def _ratio(value: float, base: float) -> float:
    return value / base if base and not math.isnan(base) and not math.isnan(value) else NAN


def _verdict(value: float, ok: bool) -> str:
    return "" if math.isnan(value) else (" PASS" if ok else " FAIL")


def table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    print(line)
    print("-" * len(line))
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def report(results: dict[tuple[str, int], Result], builds: list[Build], counts: list[int]) -> None:
    """The figures of every build at every partition count (with current/baseline), the figures
    relative to 4 partitions, then the targets with PASS or FAIL for each build."""
    names = [build.name for build in sorted(builds, key=lambda b: b.name != "baseline")]
    compare = len(names) == 2

    def of(name: str, n: int) -> Result:
        return results.get((name, n)) or Result(name, n)

    def low(name: str, n: int) -> Paced:
        return of(name, n).at(LOW_RATE)

    def per_partition(name: str, n: int, get: Callable[[Result], float]) -> float:
        return (get(of(name, n)) - get(of(name, 4))) / (n - 4)

    figures: list[tuple[str, str, Callable[[str, int], float]]] = [  # (figure, format, value of build at n)
        ("worker threads", ".0f", lambda name, n: of(name, n).threads),
        ("worker RSS (MiB)", ".0f", lambda name, n: of(name, n).rss_mib),
        ("backlog appends/s", ",.0f", lambda name, n: of(name, n).backlog_rate),
        ("worker CPU per append, backlog (us)", ".0f", lambda name, n: of(name, n).backlog_cpu_us),
    ]
    for rate in RATES:
        figures += [
            (f"worker CPU per append @ {rate}/s (us)", ".0f", lambda name, n, r=rate: of(name, n).at(r).worker_us),
            (f"broker CPU per append @ {rate}/s (us)", ".0f", lambda name, n, r=rate: of(name, n).at(r).broker_us),
            (
                f"worker+broker CPU per append @ {rate}/s (us)",
                ".0f",
                lambda name, n, r=rate: of(name, n).at(r).total_us,
            ),
            (
                f"broker CPU per append @ {rate}/s less its idle rate (us)",
                ".0f",
                lambda name, n, r=rate: of(name, n).at(r).broker_net_us,
            ),
            (f"append->journaled p50 @ {rate}/s (ms)", ".1f", lambda name, n, r=rate: of(name, n).at(r).p50_ms),
            (f"append->journaled p99 @ {rate}/s (ms)", ".1f", lambda name, n, r=rate: of(name, n).at(r).p99_ms),
        ]
    figures.append(("broker CPU when idle, before the paced loads (cores)", ".2f", lambda name, n: of(name, n).idle))
    rows = [(figure, spec, n, get) for figure, spec, get in figures for n in counts]
    if 4 in counts:
        relative: list[tuple[str, str, Callable[[str, int], float]]] = [
            (
                "worker threads per partition beyond 4",
                ".2f",
                lambda name, n: per_partition(name, n, lambda r: r.threads),
            ),
            (
                "worker RSS per partition beyond 4 (MiB)",
                ".2f",
                lambda name, n: per_partition(name, n, lambda r: r.rss_mib),
            ),
            (
                "backlog appends/s, of the figure at 4",
                ".0%",
                lambda name, n: _ratio(of(name, n).backlog_rate, of(name, 4).backlog_rate),
            ),
            (
                f"worker+broker CPU per append @ {LOW_RATE}/s, x the figure at 4",
                ".2f",
                lambda name, n: _ratio(low(name, n).total_us, low(name, 4).total_us),
            ),
        ]
        rows += [(figure, spec, n, get) for figure, spec, get in relative for n in counts if n > 4]

    print()
    lines = []
    for index, (figure, spec, n, get) in enumerate(rows):
        values = [get(name, n) for name in names]
        ratio = [_num(_ratio(values[1], values[0]), ".2f")] if compare else []
        shown = "" if index and rows[index - 1][0] == figure else figure  # a figure's name on its first row
        lines.append((shown, str(n), *(_num(value, spec) for value in values), *ratio))
    table(("figure", "partitions", *names, *(["current/baseline"] if compare else [])), lines)

    # The targets, for both builds.
    targets: list[tuple[str, str, Callable[[float], bool], Callable[[str], float]]] = []
    for n in (64, 128):
        if 4 in counts and n in counts:
            targets.append(
                (
                    f"backlog appends/s @ {n} >= {BACKLOG_KEPT:.0%} of @ 4",
                    ".0%",
                    lambda v: v >= BACKLOG_KEPT,
                    lambda name, n=n: _ratio(of(name, n).backlog_rate, of(name, 4).backlog_rate),
                )
            )
    targets.append(
        (
            f"worker threads <= {MAX_THREADS} (highest of @ {', '.join(map(str, counts))})",
            ".0f",
            lambda v: v <= MAX_THREADS,
            lambda name: _max(of(name, n).threads for n in counts),
        )
    )
    if 4 in counts and max(counts) > 4:
        targets.append(
            (
                f"worker RSS per partition beyond 4 <= {RSS_PER_PARTITION_MIB:g} MiB (highest)",
                ".2f",
                lambda v: v <= RSS_PER_PARTITION_MIB,
                lambda name: _max(per_partition(name, n, lambda r: r.rss_mib) for n in counts if n > 4),
            )
        )
    if 4 in counts and 64 in counts:
        targets.append(
            (
                f"worker+broker CPU per append @ {LOW_RATE}/s: @ 64 <= {CPU_GROWTH:g}x @ 4",
                ".2f",
                lambda v: v <= CPU_GROWTH,
                lambda name: _ratio(low(name, 64).total_us, low(name, 4).total_us),
            )
        )
    if 4 in counts and compare:
        targets.append(
            (
                f"worker+broker CPU per append @ {LOW_RATE}/s @ 4 <= {CPU_OF_BASELINE:.0%} of the baseline's",
                ".0%",
                lambda v: v <= CPU_OF_BASELINE,
                lambda name: _ratio(low(name, 4).total_us, low("baseline", 4).total_us) if name != "baseline" else NAN,
            )
        )
    if 4 in counts:
        targets.append(
            (
                f"worker+broker CPU per append @ {LOW_RATE}/s @ 4 <= {CPU_AT_4_US:g} us",
                ".0f",
                lambda v: v <= CPU_AT_4_US,
                lambda name: low(name, 4).total_us,
            )
        )
    for n in P99_AT:
        if n in counts:
            targets.append(
                (
                    f"append->journaled p99 @ {LOW_RATE}/s @ {n} <= {P99_MS:g} ms",
                    ".1f",
                    lambda v: v <= P99_MS,
                    lambda name, n=n: low(name, n).p99_ms,
                )
            )
    print()
    lines = []
    for text, spec, check, value_of in targets:
        values = [value_of(name) for name in names]
        lines.append((text, *(_num(value, spec) + _verdict(value, check(value)) for value in values)))
    table(("target", *names), lines)
    for result in results.values():
        for note in result.notes:
            print(f"note: {result.build} @ {result.partitions} partitions: {note}")
        for error in result.errors:
            print(f"note: {result.build} @ {result.partitions} partitions failed: {error.splitlines()[0]}")


def _mean(values: Iterable[float]) -> float:
    found = [v for v in values if not math.isnan(v)]
    return sum(found) / len(found) if found else NAN


def _max(values: Iterable[float]) -> float:
    found = [v for v in values if not math.isnan(v)]
    return max(found) if found else NAN


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short runs: checks the bench, not the worker")
    parser.add_argument("--partitions", default="4,16,64,128", help="partition counts (default 4,16,64,128)")
    parser.add_argument(
        "--baseline",
        default=str(REPO.parent / "baseline"),
        help="source tree of the baseline (default ../baseline), or none",
    )
    parser.add_argument("--current", default=str(REPO), help=f"source tree of the current build (default {REPO})")
    parser.add_argument(
        "--builds",
        default="baseline,current",
        help="run order of the builds at the first partition count, reversed at the next (default baseline,current)",
    )
    parser.add_argument(
        "--no-floor", dest="floor", action="store_false", help="skip the raw pass-through floor at each count"
    )
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.partitions.split(",")]
    trees = {"current": Path(args.current)}
    if args.baseline != "none":
        trees["baseline"] = Path(args.baseline)
    order = [name for name in args.builds.split(",") if name in trees]
    order += [name for name in trees if name not in order]
    builds = [Build(name, trees[name].resolve()) for name in order]
    imports: dict[str, Path] = {}
    for build in builds:
        if not build.root.is_dir():
            raise SystemExit(f"no {build.name} tree at {build.root} (git worktree add {build.root} <commit>)")
        imports[build.name] = build.imported_from()
        print(f"[partitions] {build.name}: {build.root}, imports {imports[build.name]}", file=sys.stderr)

    from tests.kafka_stack import ensure_broker

    ensure_broker()
    started = time.monotonic()
    results: dict[tuple[str, int], Result] = {}
    floors: dict[int, Paced] = {}
    for index, n in enumerate(counts):
        for build in builds if index % 2 == 0 else builds[::-1]:
            results[(build.name, n)] = measure(build, n, args.quick)
        if args.floor:
            try:
                floors[n] = floor(n, args.quick)
            except Exception as error:  # reported, the figures above stand
                print(f"[partitions] pass-through floor @ {n} failed: {error}", file=sys.stderr)
                floors[n] = Paced()
    print(
        f"\n{STREAMS} streams, one worker; {'--quick' if args.quick else 'full'} run of "
        f"{time.monotonic() - started:.0f}s; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}"
    )
    for build in builds:
        print(f"{build.name}: {build.root} (its worker imports {imports[build.name]})")
    report(results, builds, counts)
    if floors:
        print()
        print(f"The floor: the same paced load at {LOW_RATE}/s through a raw consume->produce loop, no worker")
        rows = [
            (
                str(n),
                _num(f.worker_us, ".0f"),
                _num(f.broker_us, ".0f"),
                _num(f.total_us, ".0f"),
                _num(f.p50_ms, ".1f"),
                _num(f.p99_ms, ".1f"),
            )
            for n, f in floors.items()
        ]
        table(("partitions", "loop CPU/append (us)", "broker CPU/append (us)", "sum (us)", "p50 ms", "p99 ms"), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
