"""`agentstream replay` against the real broker: parallel replay equals serial replay equals the
live rows, and an interrupted replay is rebuilt from scratch.

The journal is written by the journal worker from commands sent through the client API (the
workers' events through the internal client): several streams on every partition, idempotency
keys (and a resent duplicate), append ids, keyed slots, requests with their answers, settlements
and usage reports, compactions, and one live agent whose scheduler opens a request by itself. The
worker is stopped before replaying, so the live store is complete and idle.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from rocksdict import Options, Rdict

import pipeline.journal.replay
from pipeline.client import Receipt
from pipeline.journal.replay import PartitionTask, _Helpers, replay
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
from tests.kafka_stack import BIN, Stack, wait_until

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
        process = subprocess.Popen(
            [str(BIN / "agentstream"), "replay", "--jobs", "2", "--quiet", "--out", str(out)],
            env=stack.env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        wait_until(functools.partial(helper_up, stack, process), 30, "replay and its helper", interval=0.005)
        process.send_signal(sig)  # its helper is waiting for work or folding, unless it finished already
        # 130: interrupted (Ctrl-C); -SIGINT: it had finished and was exiting; 0: done before the signal.
        _, stderr = process.communicate(timeout=30)
        assert process.returncode in (0, 130, -signal.SIGINT, -signal.SIGKILL), stderr.decode()[-2000:]
        wait_until(lambda: not replay_workers(stack), 30, "no replay worker left")
    again = replay(stack.settings, out, progress=False, jobs=2)
    assert again.events == journal_size(stack)
    assert verify(out, live_store_paths(stack.settings)) == []


def agentstream(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "agentstream"), *args], env=stack.env(), capture_output=True, text=True, timeout=300
    )


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
