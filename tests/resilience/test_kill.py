"""Kill test: SIGKILLs of the journal worker never lose, duplicate or misnumber an append.

At least 20 000 appends over 50 raw streams (no system prompt, so no LLM turn is ever scheduled)
are sent through the client API at a steady pace while the journal worker is SIGKILLed (6 times by
default) and restarted after a short random pause; the producer never stops, and keeps sending until
the last kill has landed however slowly the worker restarts (past the first 20 000, at 25/s). Each kill lands at a
random moment (seeded) after the restarted worker has begun journaling again, while it works
through the backlog its downtime left, so rows, acknowledgements and changelog records are in
flight. Each content is unique ("s07#123|" plus filler: items of a few kilobytes make the changelog
bursts span several produce requests, as real ones do).

The assertions are on the journal, the source of truth (docs/architecture.md: at-least-once delivery +
idempotence, proven by kill tests):
- every stream's offsets are gapless 1..n, in journal order, and follow the order of sending;
- every append is journaled exactly once (by content) and nothing else is journaled;
- every receipt comes back and names the journaled offset (outcomes are republished for
  redelivered commands and re-folded events);
- `replay` of the journal equals the live store (`verify` finds no difference).

Knobs (environment): AGENTSTREAM_KILL_SEED, AGENTSTREAM_KILL_APPENDS, AGENTSTREAM_KILL_RATE
(appends/s), AGENTSTREAM_KILL_COUNT, AGENTSTREAM_KILL_PAD (filler bytes per content). The journal is
dumped to <tmp>/journal.jsonl and the worker log kept in <tmp>/data/worker.log for diagnosis.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka.admin import AdminClient

from pipeline.client import AppendTimeout, Receipt
from pipeline.journal.replay import replay
from pipeline.journal.replay_store import live_store_paths
from pipeline.journal.replay_verify import verify
from schemas.events import CONTEXT_ADDED
from schemas.outcomes import decode_outcomes
from tests.kafka_stack import BOOTSTRAP, RecordCounter, Stack, wait_until
from topics.headers import H_APPEND_ID

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(900)]

SEED = int(os.environ.get("AGENTSTREAM_KILL_SEED", "20240917"))
APPENDS = int(os.environ.get("AGENTSTREAM_KILL_APPENDS", "20000"))
# Appends/s offered: slow enough for 5+ kill cycles on a busy 2-core machine.
RATE = float(os.environ.get("AGENTSTREAM_KILL_RATE", "350"))
KILLS = int(os.environ.get("AGENTSTREAM_KILL_COUNT", "6"))
# Appends/s once the first APPENDS are sent while kills are still to come (a slow machine's restarts).
TRICKLE_RATE = 25.0
PAD = int(os.environ.get("AGENTSTREAM_KILL_PAD", "2500"))
STREAMS = 50
PARTITIONS = 4


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    # INFO: the worker logs each partition's catch-up ("re-folded N journal events ...").
    stack = Stack(tmp_path / "data", partitions=PARTITIONS, log_level="INFO")
    try:
        yield stack
    finally:
        stack.close()
        admin = AdminClient({"bootstrap.servers": BOOTSTRAP, "log_level": 3})
        leader = f"{stack.settings.app_id}-__assignor-__leader"  # Faust's; Stack.close leaves it
        for future in admin.delete_topics([leader], operation_timeout=10).values():
            with contextlib.suppress(Exception):
                future.result()


def context(content: str) -> dict[str, object]:
    return {
        "type": CONTEXT_ADDED,
        "payload": {"role": "user", "content": content, "actor": {"type": "user", "origin": "cli"}},
    }


def filler(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(PAD))


@pytest.fixture
def journal(stack: Stack) -> Iterator[RecordCounter]:
    """Counts agent-journal's records as they are read (its watermarks count transaction markers too)."""
    counter = RecordCounter(stack.client.topics.journal, PARTITIONS)
    try:
        yield counter
    finally:
        counter.close()


def test_sigkill_storm_journals_every_append_once_gapless_and_replay_equals_live(
    stack: Stack, journal: RecordCounter, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    client = stack.client  # its result follower starts now, before any append
    paths = [f"/kill/s{i:02d}" for i in range(STREAMS)]
    streams = [client.streams.get(path) for path in paths]
    plan = random.Random(SEED + 1)  # the stream of each append
    killing = threading.Event()  # set while kills are still to come: the producer goes on
    killing.set()
    pad = filler(rng)
    # Each kill lands at a random moment after the (re)started worker has begun journaling (so it
    # hits a worker at work, with a backlog, rather than one still starting), while the producer
    # keeps sending; the worker is restarted after a random pause.
    delays = [rng.uniform(0.0, 1.0) for _ in range(KILLS)]
    pauses = [rng.uniform(0.05, 1.5) for _ in range(KILLS)]

    sent: dict[str, list[str]] = defaultdict(list)  # path -> contents in send order
    receipts: list[tuple[Receipt, str, str]] = []  # (receipt, path, content)
    producer_error: list[BaseException] = []

    def produce() -> None:
        try:
            started = time.monotonic()
            counters = [0] * STREAMS
            n = 0
            trickle_from = 0.0
            while n < APPENDS or (killing.is_set() and n < APPENDS * 2):
                index = plan.randrange(STREAMS)
                if n < APPENDS:
                    due = started + n / RATE
                else:  # kills still to come: a trickle keeps the worker at work without a long drain
                    trickle_from = trickle_from or time.monotonic()
                    due = trickle_from + (n - APPENDS) / TRICKLE_RATE
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                content = f"s{index:02d}#{counters[index]}|{pad}"
                counters[index] += 1
                path = paths[index]
                receipts.append((streams[index].append(context(content)), path, content))
                sent[path].append(content)
                n += 1
            client.flush(60)
        except BaseException as error:  # reported by the main thread
            producer_error.append(error)

    stack.start_worker()
    started = time.monotonic()
    producer = threading.Thread(target=produce, name="kill-producer")
    producer.start()
    kills: list[str] = []
    for delay, pause in zip(delays, pauses, strict=True):
        base = journal.total()
        deadline = time.monotonic() + 60
        while journal.total() == base and producer.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not producer.is_alive():
            break  # every kill lands while the producer is sending
        time.sleep(delay)
        assert stack.worker is not None
        exit_code = stack.worker.poll()
        assert exit_code is None, f"the worker died on its own (exit {exit_code}):\n{stack.worker_log()[-5000:]}"
        size = journal.total()
        stack.stop_worker(signal.SIGKILL)
        kills.append(f"{time.monotonic() - started:.1f}s (journal {size}, pause {pause:.2f}s)")
        time.sleep(pause)
        stack.start_worker()
    killing.clear()
    producer.join()
    assert not producer_error, f"producer failed: {producer_error[0]!r}"
    produced_s = time.monotonic() - started
    appends = len(receipts)
    assert appends >= APPENDS
    assert len(kills) == KILLS, f"only {len(kills)} of {KILLS} kills while producing {appends} appends"
    context_of_run = f"seed {SEED}; kills at " + ", ".join(kills)

    # The real check is the journal: wait until it holds every append, then read all of it.
    wait_until(lambda: journal.total() >= appends, timeout=300, what=f"{appends} journal records", interval=0.5)
    drained_s = time.monotonic() - started
    time.sleep(1)  # anything journaled twice would show up now
    assert stack.worker is not None and stack.worker.poll() is None, stack.worker_log()[-5000:]
    records = stack.read_topic(client.topics.journal, timeout=60)
    with (tmp_path / "journal.jsonl").open("wb") as dump:
        for message in records:
            where = {
                "partition": message.partition(),
                "kafkaOffset": message.offset(),
                "headers": {k: v.decode() for k, v in message.headers() or ()},
            }
            dump.write(orjson.dumps({**where, "event": orjson.loads(message.value())}) + b"\n")

    journal: dict[str, list[dict[str, Any]]] = defaultdict(list)
    append_ids: Counter[str] = Counter()
    for message in records:
        event = orjson.loads(message.value())
        assert message.key() == event["streamPath"].encode()
        event["_at"] = f"{message.partition()}:{message.offset()}"
        journal[event["streamPath"]].append(event)
        append_id = dict(message.headers() or ()).get(H_APPEND_ID)
        if append_id is not None:
            append_ids[append_id.decode()] += 1

    def short(content: str) -> str:
        return content.split("|", 1)[0]

    contents = Counter(e["payload"]["content"] for events in journal.values() for e in events)
    all_sent = {c for cs in sent.values() for c in cs}
    duplicated = sorted(short(c) for c, n in contents.items() if n > 1)
    missing = sorted(short(c) for c in all_sent - set(contents))
    unexpected = sorted(short(c) for c in set(contents) - all_sent)
    assert not duplicated, f"{len(duplicated)} appends journaled twice, e.g. {duplicated[:10]}; {context_of_run}"
    assert not missing, f"{len(missing)} appends never journaled, e.g. {missing[:10]}; {context_of_run}"
    assert not unexpected, f"journal holds content never sent: {unexpected[:10]}; {context_of_run}"
    assert len(records) == appends
    assert set(journal) == set(sent)
    assert max(append_ids.values()) == 1, "an append id was journaled twice"

    broken: list[str] = []
    offset_of: dict[str, int] = {}
    for path, events in sorted(journal.items()):
        offsets = [e["offset"] for e in events]
        if offsets != list(range(1, len(events) + 1)):
            at = next(i for i, o in enumerate(offsets) if o != i + 1)
            around = [
                f"@{e['offset']} {short(e['payload']['content'])} (kafka {e['_at']})" for e in events[at - 3 : at + 3]
            ]
            broken.append(f"{path}: offsets not 1..n in journal order at index {at}: {around}")
        elif [e["payload"]["content"] for e in events] != sent[path]:
            broken.append(f"{path}: journal order differs from send order")
        offset_of.update((e["payload"]["content"], e["offset"]) for e in events)
    assert not broken, f"{len(broken)} stream(s) broken; {context_of_run}:\n" + "\n".join(broken)
    assert all(e["type"] == CONTEXT_ADDED for events in journal.values() for e in events)
    assert stack.read_topic(client.topics.dlq, timeout=5) == []

    # Every journaled command gets its outcome: a command re-delivered after a kill publishes its
    # result again, and catch-up publishes the results of the events it re-folds, so no receipt
    # times out and each names the journaled offset.
    deadline = time.monotonic() + 60
    lost_results: list[str] = []
    for receipt, path, content in receipts:
        try:
            result = receipt.result(timeout=max(deadline - time.monotonic(), 0.001))
        except AppendTimeout:
            lost_results.append(short(content))
            continue
        assert result.status in ("journaled", "duplicate"), (short(content), result)
        assert result.offset == offset_of[content], f"{path}: receipt of {short(content)} says @{result.offset}"
    if lost_results:
        # For the message: are the outcomes on the results topic (the client missed them) or not
        # (the worker never published them)?
        lost_ids = {r.append_id: short(c) for r, _, c in receipts if short(c) in set(lost_results)}
        on_topic = set()
        for message in stack.read_topic(client.topics.results, timeout=60):
            with contextlib.suppress(Exception):
                on_topic.update(lost_ids.get(outcome.appendId) for outcome in decode_outcomes(message.value()))
        on_topic.discard(None)
        raise AssertionError(
            f"{len(lost_results)} receipts never came back ({len(on_topic)} of them have an outcome on the results "
            f"topic), e.g. {lost_results[:10]}; {context_of_run}"
        )

    # Replay the journal into a fresh store and compare with the live rows, the worker idle and
    # stopped cleanly.
    time.sleep(1)
    stack.stop_worker(signal.SIGTERM, timeout=60)
    out = tmp_path / "replay"
    stats = replay(stack.settings, out, progress=False)
    assert stats.events == appends
    differing = verify(out, live_store_paths(stack.settings))
    assert differing == [], f"{len(differing)} stream(s) differ between replay and live rows: {differing[:10]}"

    log = stack.worker_log()
    print(
        f"\nkill test: {appends} appends (contents of ~{PAD + 8} B) over "
        f"{STREAMS} streams, {PARTITIONS} partitions, offered {RATE:.0f}/s; {len(kills)} SIGKILLs: {', '.join(kills)}; "
        f"producing {produced_s:.1f}s, journal complete at {drained_s:.1f}s, total {time.monotonic() - started:.1f}s "
        f"(replay {stats.seconds:.1f}s); catch-ups logged: {log.count('re-folded')}; "
        "every receipt came back"
    )
