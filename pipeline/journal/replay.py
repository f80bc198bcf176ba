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
resumed. An interrupted replay (Ctrl-C, SIGTERM, a crash, a lost machine) may leave partial
databases; the next replay into the same directory deletes them and starts over. Ctrl-C or SIGTERM
stops replay within about a second wherever it is, helper processes included (exit 130 or 143).

The output directory is replay's own: it must be new, empty or a previous replay output (marked by
a `.agentstream-replay` file), and outside the live data directory; anything else is refused, never
deleted."""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import multiprocessing
import os
import pickle
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from rocksdict import Rdict
from tqdm import tqdm

from pipeline.journal.replay_fold import PartitionFold, Record
from pipeline.journal.replay_store import Outputs, RdictRows, prepare_out_dir, write_rows
from pipeline.kafka.partitioner import partition_for
from pipeline.kafka.read import consume_ready, watermarks
from pipeline.settings import Settings
from processors import dedupe
from topics.admin import KafkaSetupError, quiet_librdkafka
from topics.names import topic_names

log = logging.getLogger("agentstream.replay")

BATCH = 10_000  # records per consume call, and at most per write batch
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
HELPERS_STOP_S = 3.0  # how long terminated helpers may take to end before they are killed


class ReplayInterrupted(KeyboardInterrupt):
    """Replay stopped on SIGINT (Ctrl-C) or SIGTERM: its output is incomplete, its helpers are gone."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    def __str__(self) -> str:
        return f"replay stopped by {signal.Signals(self.signum).name}"


class _Stop:
    """SIGINT and SIGTERM while replay runs, noted rather than raised where they land.

    A KeyboardInterrupt raised inside library code can leave a lock held that the clean-up then
    waits on forever (a multiprocessing queue's, cut off inside `put`). So the handlers only note
    the signal, and replay calls `check` where stopping is safe: between batches, between Kafka
    calls and in each of its waits, none of which blocks for more than a second while the broker
    answers. Installed only from the main thread (the only one Python runs handlers on); a signal
    the caller ignores stays ignored.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Stop:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                if signal.getsignal(signum) not in (signal.SIG_IGN, None):  # None: set outside Python
                    self._previous[signum] = signal.signal(signum, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        while self._previous:
            signal.signal(*self._previous.popitem())

    def _note(self, signum: int, _frame: object) -> None:
        if self.signum is None:  # only an assignment: this runs between any two bytecodes
            self.signum = signum

    def check(self) -> None:
        if self.signum is not None:
            raise ReplayInterrupted(self.signum)


def _go_on() -> None:
    """The `check` of code run without replay's signal handling (a helper, a test)."""


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
    _start_reading(consumer, topic, task)
    batches = _read_partition(consumer, topic, task)
    fold = _fold_partition(batches, task, lambda: db, only_path, report, append_id_window)
    return fold.folded, list(fold.streams)


def _start_reading(consumer: Consumer, topic: str, task: PartitionTask) -> None:
    """Assign `consumer` to the task's partition from its start: librdkafka's threads fetch from
    here on, so a consumer started ahead has records waiting when `_read_partition` asks."""
    consumer.assign([TopicPartition(topic, task.partition, task.low)])


def _read_partition(
    consumer: Consumer, topic: str, task: PartitionTask, check: Callable[[], None] = _go_on
) -> Iterator[list[Message]]:
    """`pipeline.kafka.read.read_ranges` of the one partition `consumer` reads (`_start_reading`):
    batches of its records until the consumer's position reaches `task.high`, the end replay began
    with (by position: the last offsets may be transaction markers). Records with errors, of
    another partition (one the consumer read before) or past that end are left out; the usual
    batch has none and is passed on as it came, checked in C (no Python frame per message).
    `check()` is called after every poll (a stop requested while no records come)."""
    if task.low >= task.high:
        return
    high, number, partition = task.high, task.partition, [TopicPartition(topic, task.partition)]
    while True:
        messages = consume_ready(consumer, BATCH, 1.0)
        check()
        if messages:
            if (
                messages[-1].offset() < high  # offsets grow along a partition's batch
                and not any(map(Message.error, messages))
                and set(map(Message.partition, messages)) == {number}
            ):
                yield messages
            else:
                batch = [m for m in messages if m.error() is None and m.partition() == number and m.offset() < high]
                if batch:
                    yield batch
        # Asked after every poll, records or none: a trailing marker moves only the position.
        if consumer.position(partition)[0].offset >= high:  # unknown before any fetch: negative
            return


def _fold_partition(
    batches: Iterable[list[Message]],
    task: PartitionTask,
    output: Callable[[], Rdict],
    only_path: str | None,
    report: Callable[[int], None],
    append_id_window: int,
) -> PartitionFold:
    """`replay_partition` of the partition's `batches` (`_read_partition`), giving back the fold
    itself: its projections are freed where the caller drops it (freeing a partition's projections
    takes about 6 % of folding them).

    `output()` gives the partition's database; it is first asked for once records are in, so that
    a database opened ahead (`Outputs.open_ahead`) opens while the first ones are fetched.
    """
    db: Rdict | None = None

    def database() -> Rdict:
        nonlocal db
        if db is None:
            db = output()
        return db

    def read(key: bytes) -> bytes | None:  # the append-id window's rows written before (rare)
        return RdictRows(database()).get(key)

    fold = PartitionFold(task.partition, append_id_window=append_id_window, read=read)
    only_key = None if only_path is None else only_path.encode()
    for messages in batches:
        wanted = messages if only_key is None else [message for message in messages if message.key() == only_key]
        fold.fold(_records(wanted))
        staged = fold.take()
        if staged:
            write_rows(database(), staged)
        report(len(messages))
    staged = fold.take()  # the format row of a partition with nothing to replay
    if staged:
        write_rows(database(), staged)
    database().flush(wait=False)
    return fold


def _records(messages: list[Message]) -> Iterator[Record]:
    """Each message as a `Record`, built in C (no Python frame per message)."""
    return zip(map(Message.offset, messages), map(Message.value, messages), map(Message.headers, messages), strict=True)


def replay(
    settings: Settings,
    out_dir: Path,
    only_path: str | None = None,
    progress: bool = True,
    jobs: int = 1,
) -> ReplayStats:
    """Fold agent-journal (every stream, or one) into fresh rows under `out_dir`.

    With `jobs` > 1, up to `jobs - 1` helper processes replay partitions beside this one (each
    partition's rows are their own database; one process folds a partition from start to end).
    They are started before this process opens any Kafka client or database: forked, if it has no
    other thread then (`helper_start_method`), otherwise with multiprocessing's "spawn" method, so a
    script calling this with jobs > 1 needs the usual `if __name__ == "__main__":` guard.

    Called from the main thread, SIGINT and SIGTERM stop it at its next safe point (`_Stop`),
    within about a second: its helpers are ended and `ReplayInterrupted` raised, whatever else
    went wrong meanwhile (a helper the same Ctrl-C reached, say). The output is then incomplete.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    prepare_out_dir(out_dir, settings.data_dir)
    stats = ReplayStats()
    started = time.monotonic()
    with _Stop() as stop:
        try:
            _replay(settings, out_dir, only_path, progress, jobs, stats, stop.check)
        except ReplayInterrupted:
            raise
        except BaseException as error:
            if stop.signum is not None:
                raise ReplayInterrupted(stop.signum) from error
            raise
        stop.check()  # a signal during the clean-up: the user asked to stop, so it is not reported done
    stats.seconds = time.monotonic() - started
    return stats


def _replay(
    settings: Settings,
    out_dir: Path,
    only_path: str | None,
    progress: bool,
    jobs: int,
    stats: ReplayStats,
    check: Callable[[], None],
) -> None:
    """`replay`'s work, adding to `stats`; `check()` raises once a stop is requested."""
    names = topic_names(settings.topic_prefix)
    consumer: Consumer | None = None
    helpers: _Helpers | None = None
    readers: _Readers | None = None
    outputs = Outputs(out_dir)
    try:
        if only_path is None and min(jobs, settings.partitions) > 1:
            # Started first, before this process has a Kafka client (librdkafka's threads) or a
            # database (RocksDB's), so that they can be forked and start at once; a spawned helper
            # spends 0.3-0.5 s importing what this process has loaded, meanwhile the journal's
            # ends are read. A journal with fewer partitions than configured leaves a helper
            # nothing to take: it ends at once.
            helpers = _Helpers(
                min(jobs, settings.partitions) - 1,
                settings.kafka_consumer_config(),
                names.journal,
                out_dir,
                only_path,
                settings.append_id_window,
                check=check,
            )
        check()
        consumer = _consumer(settings.kafka_consumer_config())
        partitions = _journal_partitions(consumer, names.journal)
        if only_path is not None:
            partitions = [partition_for(only_path, len(partitions))]
        if helpers is None:  # this process replays every partition, in this order
            outputs.open_ahead(partitions)
        tasks = []
        for partition in partitions:
            check()
            tasks.append(PartitionTask(partition, *watermarks(consumer, TopicPartition(names.journal, partition))))
        total = sum(task.high - task.low for task in tasks)
        with tqdm(total=total, unit="ev", desc="replay", disable=not progress, file=sys.stderr, mininterval=0.5) as bar:

            def report(consumed: int) -> None:
                bar.update(consumed)
                check()
                if helpers is not None:
                    helpers.poll(bar.update)  # their progress (and failures) between two of our batches

            if helpers is not None:
                helpers.hand_out(tasks)
            readers = _Readers(consumer, settings.kafka_consumer_config(), names.journal, check)
            with _folding_gc():
                for number, task in enumerate(iter(helpers.take, None) if helpers is not None else tasks):
                    check()
                    outputs.open_ahead([task.partition])  # unless opening already (--jobs 1)
                    batches = readers.read(task)
                    if helpers is None and number + 1 < len(tasks):
                        readers.start_ahead(tasks[number + 1])
                    fold = _fold_partition(
                        batches,
                        task,
                        functools.partial(outputs.create, task.partition),
                        only_path,
                        report,
                        settings.append_id_window,
                    )
                    stats.events += fold.folded
                    stats.streams.update(fold.streams)
                    del fold  # its projections, before the next partition's are built
                outputs.close()
            if helpers is not None:
                for events, streams in helpers.wait(bar.update):
                    stats.events += events
                    stats.streams.update(streams)
            bar.total = bar.n  # the ends' sum was an upper bound: transaction markers take offsets too
    finally:
        with contextlib.ExitStack() as cleanup:  # each one runs, whatever those before it raise
            cleanup.callback(outputs.close)
            if consumer is not None:
                cleanup.callback(consumer.close)
            if readers is not None:
                cleanup.callback(readers.close)
            if helpers is not None:
                cleanup.callback(helpers.close)  # first: whatever fails next, they are gone


class _Readers:
    """The consumers one process reads partitions with: its own, and for `--jobs 1` one more per
    partition, started while the partition before it is folded, so that its first fetch (10-100 ms
    measured) passes meanwhile on librdkafka's threads. At most two read at once, and librdkafka
    bounds what each fetches ahead (`queued.max.messages.kbytes`)."""

    def __init__(
        self, consumer: Consumer, client_config: dict[str, Any], topic: str, check: Callable[[], None] = _go_on
    ) -> None:
        self.consumer = consumer  # reads every partition not started ahead
        self.client_config = client_config
        self.topic = topic
        self.check = check
        self._ahead: dict[int, Consumer] = {}

    def start_ahead(self, task: PartitionTask) -> None:
        if task.partition not in self._ahead:
            ahead = self._ahead[task.partition] = _consumer(self.client_config)
            _start_reading(ahead, self.topic, task)

    def read(self, task: PartitionTask) -> Iterator[list[Message]]:
        """The task's batches (`_read_partition`), from a consumer started ahead if there is one."""
        ahead = self._ahead.pop(task.partition, None)
        if ahead is None:
            _start_reading(self.consumer, self.topic, task)
            return _read_partition(self.consumer, self.topic, task, self.check)
        return self._read_ahead(ahead, task)

    def _read_ahead(self, consumer: Consumer, task: PartitionTask) -> Iterator[list[Message]]:
        try:
            yield from _read_partition(consumer, self.topic, task, self.check)
        finally:
            consumer.close()  # its partition is read (or replay stopped)

    def close(self) -> None:
        while self._ahead:
            self._ahead.popitem()[1].close()


class _Helpers:
    """Processes that replay partitions beside this one.

    Partitions are handed out through a shared queue, largest first, to the helpers and to this
    process alike; helpers report progress, results and failures on another queue. Every wait
    for them calls `check()` at least twice a second (replay's stop, `_Stop`).
    """

    def __init__(
        self,
        count: int,
        client_config: dict[str, Any],
        topic: str,
        out_dir: Path,
        only_path: str | None,
        append_id_window: int = dedupe.DEFAULT_APPEND_ID_WINDOW,
        check: Callable[[], None] = _go_on,
    ):
        self.check = check
        method = helper_start_method()
        if method == "fork":  # a child must not write out what this process had buffered
            sys.stdout.flush()
            sys.stderr.flush()
        self.start_method = method
        context = multiprocessing.get_context(method)
        log.debug("replay: %d helper process(es), started by %s", count, method)
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
        # Started with SIGINT and SIGTERM blocked, which a child inherits: a helper takes them
        # only once it has set its own handling (`_replay_worker`); a forked one would otherwise
        # run replay's handler, which only notes them. Here they wait until every helper is started.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            for process in self.processes:
                process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
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
            self.check()
            try:
                task = self.tasks.get(timeout=0.25)
            except queue.Empty:
                self._raise_if_one_died()  # a helper that died holding the queue's lock would block us forever
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
            self.check()
            self.poll(report, timeout=0.25)
            if len(self.results) < self.expected:
                self._raise_if_one_died()
        return self.results

    def _raise_if_one_died(self) -> None:
        for process in self.processes:
            if process.exitcode not in (None, 0):
                self.poll(lambda _: None)  # its own report of what went wrong, if it sent one
                raise RuntimeError(f"replay worker {process.name} exited with code {process.exitcode}")

    def close(self) -> None:
        # Finished: every partition's rows are on disk, so a helper still alive has nothing left to
        # do (it may still be starting up). Interrupted or failed: stop them now; their half-written
        # databases are rebuilt from scratch by the next replay into this directory. SIGTERM ends a
        # helper at once (`_replay_worker`); one still starting takes it once started, one stuck
        # anywhere is killed after HELPERS_STOP_S.
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        deadline = time.monotonic() + HELPERS_STOP_S
        for process in self.processes:
            process.join(max(deadline - time.monotonic(), 0.0))
            if process.is_alive():
                process.kill()
                process.join(HELPERS_STOP_S)
        for channel in (self.tasks, self.reports):
            # Neither closed nor joined: a feeder thread may be blocked on a pipe no helper reads
            # any more, and multiprocessing would join it at exit. The queue's finalizer closes it;
            # the lock that takes is free, since no signal raises inside a `put` (`_Stop`).
            channel.cancel_join_thread()


def helper_start_method() -> str:
    """How replay's helpers start: "fork" while this process runs a single thread, else "spawn".

    A forked helper starts at once, with every module this process has imported. Forking is only
    safe with no other thread: a librdkafka or RocksDB thread (or any lock one holds) would not
    exist in the child, and its client or database would hang there. Where the thread count
    cannot be read (no /proc), helpers are spawned."""
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        return "spawn"
    return "fork" if threads == 1 else "spawn"


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
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # how it does: at once, wherever we are
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked while we were started (`_Helpers`)

    def report(consumed: int) -> None:
        if os.getppid() != parent:
            os._exit(1)  # orphaned (the parent was killed): stop writing into a directory nobody owns
        reports.put(("progress", consumed))

    consumer = None
    outputs = Outputs(out_dir)
    results = []
    last: PartitionFold | None = None  # never freed: the process ends once done is reported
    try:
        consumer = _consumer(client_config)
        with _folding_gc():
            while (task := _next_task(tasks, parent)) is not None:
                last = None  # the previous partition's projections, freed before the next is folded
                outputs.open_ahead([task.partition])
                output = functools.partial(outputs.create, task.partition)
                _start_reading(consumer, topic, task)
                batches = _read_partition(consumer, topic, task)
                last = _fold_partition(batches, task, output, only_path, report, append_id_window)
                results.append((last.folded, list(last.streams)))
            outputs.close()  # reported done only once the rows are on disk
        for events, streams in results:
            reports.put(("done", events, streams))
        reports.close()
        reports.join_thread()  # the reports are in the pipe
        consumer.close()
        # Ended at once: the last partition's projections are not freed object by object (about 6 %
        # of folding them) on a core the parent may still fold on. The earlier ones were freed
        # partition by partition, so a helper's memory is one partition's at a time.
        os._exit(0)
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
