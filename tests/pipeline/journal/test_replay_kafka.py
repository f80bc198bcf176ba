"""`agentstream replay` against the real broker: parallel replay equals serial replay equals the
live rows, an interrupted replay is rebuilt from scratch, and Ctrl-C or SIGTERM stops a parallel
replay promptly in every phase (on a larger journal written straight to agent-journal, under CPU
load, at random moments: AGENTSTREAM_REPLAY_STOP_SEED replays a run's moments).

The journal is written by the journal worker from commands sent through the client API (the
workers' events through the internal client): several streams on every partition, idempotency
keys (and a resent duplicate), append ids, keyed slots, requests with their answers, settlements
and usage reports, compactions, and one live agent whose scheduler opens a request by itself. The
worker is stopped before replaying, so the live store is complete and idle.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from rocksdict import Options, Rdict

import pipeline.journal.replay
from pipeline import exit_codes
from pipeline.client import Receipt
from pipeline.journal.replay import PartitionTask, ReplayInterrupted, _Helpers, replay
from pipeline.journal.replay_store import MARKER, live_store_paths, open_rows, prepare_out_dir
from pipeline.journal.replay_verify import verify
from pipeline.kafka.partitioner import partition_for
from pipeline.kafka.read import watermarks
from processors import row_codec, rows
from schemas.events import (
    CONTEXT_ADDED,
    LLM_REQUEST_REQUESTED,
    LLM_REQUEST_SETTLED,
    TOKEN_USAGE_REPORTED,
)
from tests.kafka_stack import BIN, BOOTSTRAP, Stack, wait_until
from tests.support.journal_builder import Journal

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

PARTITIONS = 4


def two_per_partition() -> list[str]:
    chosen: dict[int, list[str]] = {partition: [] for partition in range(PARTITIONS)}
    for n in range(1000):
        path = f"/agents/replay-{n}"
        streams = chosen[partition_for(path, PARTITIONS)]
        if len(streams) < 2:
            streams.append(path)
    return [path for streams in chosen.values() for path in streams]


STREAMS = two_per_partition()
DONT_TRIGGER = {"behaviour": "dont-trigger-request"}


def user(text: str, **fields: Any) -> dict[str, Any]:
    payload = {"role": "user", "content": text, "actor": {"type": "user", "origin": "web"}, **fields}
    return {"type": CONTEXT_ADDED, "payload": payload}


def write_stream(stack: Stack, path: str) -> None:
    """One stream's life: keyed and unkeyed input, two answered requests, a compaction."""
    stream, internal = stack.client.streams.get(path), stack.internal_client.streams.get(path)
    receipts: list[Receipt] = [
        stream.append({"type": CONTEXT_ADDED, "payload": {"role": "system", "content": "policy", "key": "policy"}})
    ]
    for n in range(6):
        event = user(f"{path} says {n} é🙂", **({"key": "status"} if n % 2 else {}))
        if n % 3 == 0:
            event["idempotencyKey"] = f"web/{path}/{n}"
        receipts.append(stream.append(event))
    receipts.append(stream.append({**user(f"{path} says 0 é🙂"), "idempotencyKey": f"web/{path}/0"}))  # resent
    for receipt in receipts:
        receipt.wait(timeout=120)

    def worker(event_type: str, payload: dict[str, Any], key: str | None = None) -> int:
        event = {"type": event_type, "payload": payload, **({"idempotencyKey": key} if key else {})}
        return internal.append(event).wait(timeout=60)

    for turn in range(2):
        request = worker(LLM_REQUEST_REQUESTED, {"model": "m", "expiresAt": 4_000_000_000_000}, f"request/{turn}")
        worker(CONTEXT_ADDED, {"role": "assistant", "content": f"answer {turn}", "llmRequestOffset": request})
        result = {"status": "succeeded", "text": "ok"}
        worker(LLM_REQUEST_SETTLED, {"requestOffset": request, "durationMs": 5, "result": result}, f"settled/{request}")
        usage = {
            "llmRequestOffset": request,
            "model": "m",
            "maxContextTokens": 100,
            "inputTokens": 90,
            "outputTokens": 3,
        }
        worker(TOKEN_USAGE_REPORTED, usage, f"usage/{request}")
        if turn == 0:
            summary = {
                "role": "developer",
                "content": "summary of the start",
                "compaction": {"replacesHistoryThrough": request - 1},
                "llmRequestPolicy": DONT_TRIGGER,
            }
            worker(CONTEXT_ADDED, summary, f"compaction/{request}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(tmp_path_factory.mktemp("replay") / "data", partitions=PARTITIONS)
    stack.start_worker()
    try:
        assert {partition_for(path, PARTITIONS) for path in STREAMS} == set(range(PARTITIONS))
        for path in STREAMS:
            write_stream(stack, path)
        agent = stack.client.agents.create()  # the scheduler asks for a turn on its own
        agent.append(user("hello, agent")).wait(timeout=60)
        wait_until(
            lambda: any(e.type == LLM_REQUEST_REQUESTED for e in agent.stream.events()), 60, "the agent's request"
        )
        stack.stop_worker()  # an idle, complete live store
        yield stack
    finally:
        stack.close()


def journal_size(stack: Stack) -> int:
    return len(stack.read_topic(stack.client.topics.journal))


def rows_of(database: Path) -> dict[bytes, bytes]:
    db = open_rows(database, read_only=True)
    try:
        return {bytes(key): bytes(value) for key, value in db.items()}
    finally:
        db.close()


def test_parallel_replay_equals_serial_replay_equals_live(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    serial = replay(stack.settings, tmp_path / "serial", progress=False, jobs=1)
    parallel = replay(stack.settings, tmp_path / "parallel", progress=True, jobs=2)
    total = journal_size(stack)
    assert serial.events == parallel.events == total
    assert serial.streams == parallel.streams and set(STREAMS) < serial.streams
    assert f"{total}/{total}" in capsys.readouterr().err  # the progress bar counted every record

    live = live_store_paths(stack.settings)
    assert verify(tmp_path / "serial", live) == []
    assert verify(tmp_path / "parallel", live) == []
    # Byte for byte the same databases, row for row.
    for partition in range(PARTITIONS):
        assert rows_of(tmp_path / "parallel" / f"rows-{partition}.db") == rows_of(
            tmp_path / "serial" / f"rows-{partition}.db"
        )

    # The journal had what this test is about, and replay rebuilt it.
    replayed: dict[bytes, bytes] = {}
    for partition in range(PARTITIONS):
        replayed.update(rows_of(tmp_path / "parallel" / f"rows-{partition}.db"))
        assert rows.position_key(partition) in replayed
    for path in STREAMS:
        state, _ = row_codec.decode_meta(replayed[rows.meta_key(path)])
        assert state.compacted_through > 0 and state.open is None and state.usage.inputTokens == 180
        assert row_codec.decode_idempotency(replayed[rows.idempotency_key(path, f"web/{path}/0")])[0] == 2
        assert rows.idempotency_key(path, "request/1") in replayed
    assert sum(key.startswith(rows.APPEND_ID + rows.SEP) for key in replayed) >= len(STREAMS) * 10


def test_helper_processes_alone_replay_every_partition(stack: Stack, tmp_path: Path) -> None:
    """On a journal this small `replay(jobs=2)` may fold every partition itself before its helper
    is up; here the helpers take every partition, and report their progress and results."""
    out = tmp_path / "helpers"
    prepare_out_dir(out, stack.settings.data_dir)
    topic = stack.client.topics.journal
    consumer = Consumer({**stack.settings.kafka_consumer_config(), "group.id": "test", "log_level": 3})
    try:
        tasks = [PartitionTask(p, *watermarks(consumer, TopicPartition(topic, p))) for p in range(PARTITIONS)]
    finally:
        consumer.close()
    helpers = _Helpers(2, stack.settings.kafka_consumer_config(), topic, out, None)
    progress: list[int] = []
    try:
        helpers.hand_out(tasks)
        results = helpers.wait(progress.append)
    finally:
        helpers.close()
    assert len(results) == PARTITIONS
    assert sum(events for events, _ in results) == sum(progress) == journal_size(stack)
    assert {path for _, streams in results for path in streams} >= set(STREAMS)
    assert verify(out, live_store_paths(stack.settings)) == []


def test_cli_replay_jobs_verify(stack: Stack, tmp_path: Path) -> None:
    result = agentstream(stack, "replay", "--jobs", "2", "--verify", "--out", str(tmp_path / "cli"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "live store matches the journal" in result.stdout
    one = agentstream(stack, "replay", "--jobs", "3", "--quiet", "--path", STREAMS[1], "--out", str(tmp_path / "one"))
    assert one.returncode == 0 and "of 1 streams" in one.stdout, one.stdout + one.stderr
    refused = agentstream(stack, "replay", "--jobs", "0", "--out", str(tmp_path / "none"))
    assert refused.returncode == 2 and "at least 1" in refused.stderr
    assert not (tmp_path / "none").exists()


def test_interrupted_replay_is_rebuilt_from_scratch(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    write = pipeline.journal.replay_store.write_rows
    calls = 0

    def interrupt_second_batch(db: Rdict, staged: dict[bytes, bytes | None]) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KeyboardInterrupt  # Ctrl-C halfway through
        write(db, staged)

    monkeypatch.setattr(pipeline.journal.replay, "write_rows", interrupt_second_batch)
    with pytest.raises(KeyboardInterrupt):
        replay(stack.settings, out, progress=False)
    monkeypatch.undo()
    assert (out / MARKER).is_file()
    assert verify(out, live_store_paths(stack.settings)) != []  # what was left is not a replay

    # What an interrupted, log-less write may leave: a stray row, a database of no partition.
    first = sorted(out.glob("rows-*.db"))[0]
    db = open_rows(first)
    db[rows.meta_key("/agents/never-journaled")] = b"{}"
    db.close()
    stray = Rdict(str(out / "rows-9.db"), options=_created())
    stray[b"x"] = b"y"
    stray.close()

    again = replay(stack.settings, out, progress=False, jobs=2)
    assert again.events == journal_size(stack)
    assert verify(out, live_store_paths(stack.settings)) == []
    assert not (out / "rows-9.db").exists()


def test_killed_parallel_replay_leaves_no_workers_and_is_rebuilt(stack: Stack, tmp_path: Path) -> None:
    """SIGINT (Ctrl-C) or SIGKILL of the command mid-replay: its worker processes stop too, and the
    next replay into the directory starts over."""
    out = tmp_path / "out"
    for sig in (signal.SIGINT, signal.SIGKILL):
        with started(stack, "replay", "--jobs", "2", "--quiet", "--out", str(out)) as process:
            wait_until(functools.partial(helper_up, stack, process), 30, "replay and its helper", interval=0.005)
            process.send_signal(sig)  # its helper is waiting for work or folding, unless it finished already
            # 130: interrupted (Ctrl-C); -SIGINT: it had finished and was exiting; 0: done before the signal.
            _, stderr = process.communicate(timeout=30)
            assert process.returncode in (0, 130, -signal.SIGINT, -signal.SIGKILL), stderr[-2000:]
            wait_until(lambda: not replay_workers(stack), 30, "no replay worker left")
    again = replay(stack.settings, out, progress=False, jobs=2)
    assert again.events == journal_size(stack)
    assert verify(out, live_store_paths(stack.settings)) == []


STOP_LIMIT_S = 5.0  # how long a signalled replay may take to end, under load
RANDOM_STOPS = 12
BIG_STREAMS, BIG_EVENTS = 400, 60_000  # about 1.5 s of `replay --jobs 2` on two busy cores


@pytest.fixture(scope="module")
def big_journal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A topic set whose journal holds BIG_EVENTS user messages over BIG_STREAMS streams, written
    straight to agent-journal (no worker, no live store): a replay long enough to stop midway."""
    stack = Stack(tmp_path_factory.mktemp("replay-big") / "data", partitions=PARTITIONS)
    try:
        producer = Producer(
            {"bootstrap.servers": BOOTSTRAP, "linger.ms": 20, "queue.buffering.max.messages": 1_000_000, "log_level": 3}
        )
        for n in range(BIG_STREAMS):
            path = f"/agents/big-{n}"
            journal = Journal(path)
            for i in range(BIG_EVENTS // BIG_STREAMS):
                journal.user(f"message {i} of {path}")
            partition = partition_for(path, PARTITIONS)
            for line in journal.lines():
                producer.produce(stack.client.topics.journal, key=path.encode(), value=line, partition=partition)
        assert producer.flush(60) == 0
        yield stack
    finally:
        stack.close()


@pytest.fixture
def cpu_hog() -> Iterator[None]:
    """A busy loop on every core for the test's duration: the load of a fresh clone's `make test`,
    under which a stopped replay used to hang."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def test_signals_at_random_moments_stop_parallel_replay_promptly(
    big_journal: Stack, tmp_path: Path, cpu_hog: None
) -> None:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) or SIGTERM (to the command) at a
    random moment of `replay --jobs 2` under CPU load, many times: every run ends within
    STOP_LIMIT_S of the signal with its documented exit code (130, 143; 0 if it was done first)
    and no traceback, and leaves no process behind. Most signals fall once the helper is up
    (reading, folding, handing out, collecting), some while the command starts."""
    stack, seed = big_journal, int(os.environ.get("AGENTSTREAM_REPLAY_STOP_SEED") or random.randrange(1 << 32))
    rng = random.Random(seed)
    out = tmp_path / "out"
    command = ("replay", "--jobs", "2", "--quiet", "--out", str(out))
    began = time.monotonic()
    with started(stack, *command) as process:  # how long a whole run takes under this load
        wait_until(functools.partial(helper_up, stack, process), 60, "replay and its helper", interval=0.005)
        up = time.monotonic() - began
        _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr[-2000:]
    replaying = max(time.monotonic() - began - up, 0.1)
    outcomes = []
    for run in range(RANDOM_STOPS):
        sig = (signal.SIGINT, signal.SIGTERM)[run % 2]
        starting = run % 6 >= 4  # a third of the runs: a signal while the command starts
        delay = rng.uniform(0, up if starting else replaying)
        where = f"seed {seed}, run {run}: {sig.name} {delay:.2f}s after {'start' if starting else 'helper up'}"
        with started(stack, *command) as process:
            if not starting:
                wait_until(functools.partial(helper_up, stack, process), 60, "replay and its helper", interval=0.005)
            time.sleep(delay)
            if sig == signal.SIGINT:
                os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the helpers get it too
            else:
                process.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            try:
                _, stderr = process.communicate(timeout=STOP_LIMIT_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{where}: replay still running {STOP_LIMIT_S}s after the signal")
            took = time.monotonic() - sent
            # Replay's code, or death by the signal itself: it came before replay took the signals
            # over (while starting) or once replay was done, as a 0 did.
            expected = {
                signal.SIGINT: (exit_codes.INTERRUPTED, -signal.SIGINT, 0),
                signal.SIGTERM: (exit_codes.TERMINATED, -signal.SIGTERM, 0),
            }[sig]
            assert process.returncode in expected, f"{where}: exit {process.returncode}\n{stderr[-2000:]}"
            if process.returncode > 0:
                assert "Traceback" not in stderr, f"{where}\n{stderr[-3000:]}"
            if process.returncode == exit_codes.TERMINATED:  # 130 is also Ctrl-C outside replay
                assert f"{out} is incomplete" in stderr, f"{where}\n{stderr[-3000:]}"
            wait_until(lambda: not replay_workers(stack), 2, f"no replay process left ({where})")
        outcomes.append((process.returncode, round(took, 2)))
    print(f"seed {seed}: whole run {up:.2f}s + {replaying:.2f}s; (exit, seconds to end) {outcomes}")
    stopped = sum(code in (exit_codes.INTERRUPTED, exit_codes.TERMINATED) for code, _ in outcomes)
    assert stopped >= RANDOM_STOPS // 3, f"seed {seed}: most signals missed the replay: {outcomes}"
    again = replay(stack.settings, out, progress=False, jobs=2)
    assert (again.events, len(again.streams)) == (BIG_EVENTS, BIG_STREAMS)


def _signal_first(function: Callable[..., Any], sent: list[float]) -> Callable[..., Any]:
    """`function`, after a SIGINT to this process (Ctrl-C at that moment), the first time noted in `sent`."""

    @functools.wraps(function)
    def signalled(*args: Any, **kwargs: Any) -> Any:
        if not sent:
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)
        return function(*args, **kwargs)

    return signalled


def _parent_takes_nothing(_helpers: _Helpers) -> None:
    """`_Helpers.take` leaving every partition to the helpers: replay then waits for their results."""


@pytest.mark.parametrize(
    ("target", "name", "stops_in"),
    [
        pytest.param(_Helpers, "hand_out", "take", id="handing out"),
        pytest.param(_Helpers, "take", "take", id="taking a partition"),
        pytest.param(pipeline.journal.replay, "consume_ready", "_read_partition", id="reading"),
        pytest.param(pipeline.journal.replay, "write_rows", "report", id="folding"),
        pytest.param(_Helpers, "wait", "wait", id="collecting results"),
    ],
)
def test_ctrl_c_in_each_phase_of_a_parallel_replay(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: Any, name: str, stops_in: str
) -> None:
    """Ctrl-C reaching `replay(jobs=2)` at a known point of each phase: it stops at the next safe
    point (`stops_in`), promptly, raising ReplayInterrupted (a KeyboardInterrupt), its helpers
    ended and SIGINT's handler back."""
    if name == "wait":
        monkeypatch.setattr(_Helpers, "take", _parent_takes_nothing)
    sent: list[float] = []
    monkeypatch.setattr(target, name, _signal_first(getattr(target, name), sent))
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(ReplayInterrupted) as stopped:
        replay(stack.settings, tmp_path / "out", progress=False, jobs=2)
    assert sent and time.monotonic() - sent[0] < STOP_LIMIT_S
    assert stopped.value.signum == signal.SIGINT
    assert [frame.name for frame in traceback.extract_tb(stopped.value.__traceback__)][-2:] == [stops_in, "check"]
    assert multiprocessing.active_children() == []
    assert signal.getsignal(signal.SIGINT) is handler


@contextlib.contextmanager
def started(stack: Stack, *args: str) -> Iterator[subprocess.Popen[str]]:
    """`agentstream *args` in a process group of its own, killed with everything it started on the
    way out, so that a failing test leaves nothing running."""
    process = subprocess.Popen(
        [str(BIN / "agentstream"), *args],
        env=stack.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:  # still running: its group is certainly still its own
            os.killpg(process.pid, signal.SIGKILL)
        for pid in replay_workers(stack):  # helpers it left behind, orphaned
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.communicate()


def agentstream(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    with started(stack, *args) as process:
        stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def helper_up(stack: Stack, process: subprocess.Popen[bytes]) -> bool:
    """The command runs with its helper (they share a command line once forked), or it has ended."""
    return len(replay_workers(stack)) >= 2 or process.poll() is not None


def replay_workers(stack: Stack) -> list[int]:
    """Processes of this stack's replays still alive: spawned helpers (a multiprocessing command
    line) or forked ones (the `agentstream replay` command line of their parent), which all carry
    the stack's environment."""
    marker = f"AGENTSTREAM_TOPIC_PREFIX={stack.settings.topic_prefix}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in environ and (b"multiprocessing" in command or b"\0replay\0" in command):
            found.append(int(entry.name))
    return found


def _created() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    return options
