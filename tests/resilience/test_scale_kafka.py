"""Scale-out by partition: journal workers join and leave one group while appends flow
(docs/operations.md, "Scaling").

One worker starts; a second and a third join mid-load; then one is SIGKILLed and another stopped
with SIGTERM; the last one standing takes every partition back (Faust restores the rows of the
partitions it did not own from the changelog). Every append is journaled exactly once, offsets are
gapless per stream and follow the order of sending, every worker owned partitions at some point,
and a replay of the journal equals the rows of the last owner.

Bounded for `make test` (AGENTSTREAM_SCALE_APPENDS, default 6000, at AGENTSTREAM_SCALE_RATE/s).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.client import Receipt
from pipeline.journal.replay import replay
from pipeline.journal.replay_store import live_store_paths
from pipeline.journal.replay_verify import verify
from schemas.events import CONTEXT_ADDED
from tests.kafka_stack import Stack, Worker, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(900)]

APPENDS = int(os.environ.get("AGENTSTREAM_SCALE_APPENDS", "6000"))
RATE = float(os.environ.get("AGENTSTREAM_SCALE_RATE", "300"))
PARTITIONS = 6
STREAMS = 60


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(tmp_path / "w0", partitions=PARTITIONS, log_level="INFO", session_timeout_s=6.0)
    try:
        yield stack
    finally:
        stack.close()


def user(content: str) -> dict[str, Any]:
    payload = {"role": "user", "content": content, "actor": {"type": "user", "origin": "cli"}}
    return {"type": CONTEXT_ADDED, "payload": payload}


def test_workers_join_and_leave_mid_load_and_every_append_is_journaled_once(stack: Stack, tmp_path: Path) -> None:
    client = stack.client
    paths = [f"/scale/s{i:02d}" for i in range(STREAMS)]
    sent: dict[str, list[str]] = defaultdict(list)
    receipts: list[tuple[Receipt, str]] = []
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            started = time.monotonic()
            for n in range(APPENDS):
                delay = started + n / RATE - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                path = paths[n % STREAMS]
                content = f"{path}#{len(sent[path])}"
                receipts.append((client.streams.get(path).append(user(content)), content))
                sent[path].append(content)
            client.flush(60)
        except BaseException as error:
            errors.append(error)

    workers = [Worker(stack, 0, tmp_path)]
    producer = threading.Thread(target=produce, name="scale-producer")
    producer.start()
    phase = APPENDS / RATE / 5  # five phases while the producer runs
    time.sleep(phase)
    workers.append(Worker(stack, 1, tmp_path))
    time.sleep(phase)
    workers.append(Worker(stack, 2, tmp_path))
    time.sleep(phase)
    wait_until(lambda: all(w.owned() for w in workers), 120, "every worker to own partitions")
    workers[1].stop(signal.SIGKILL)
    time.sleep(phase)
    workers[2].stop(signal.SIGTERM)
    survivor = workers[0]
    seen = survivor.log_size()
    producer.join()
    assert not errors, repr(errors[0])
    assert survivor.process.poll() is None, survivor.log_path.read_text()[-4000:]

    # Every receipt comes back with the offset the journal gave it.
    offsets_of = {content: receipt.wait(timeout=300) for receipt, content in receipts}
    journal: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for message in stack.read_topic(client.topics.journal, timeout=60):
        event = orjson.loads(message.value())
        journal[event["streamPath"]].append(event)
    for path in paths:
        events = journal[path]
        assert [e["offset"] for e in events] == list(range(1, len(events) + 1)), f"{path}: offsets not gapless"
        assert [e["payload"]["content"] for e in events] == sent[path], f"{path}: not exactly once, in order"
        assert all(offsets_of[e["payload"]["content"]] == e["offset"] for e in events)
    owned = [sorted(w.owned()) for w in workers]
    assert all(owned), f"a worker never owned a partition: {owned}"

    # The survivor owns everything again (after the last rebalance); its rows equal a fold of the journal.
    def owns_everything() -> bool:
        return survivor.owned(since=seen) == set(range(PARTITIONS))

    wait_until(owns_everything, 120, "the survivor to own every partition")
    time.sleep(2)
    survivor.stop(signal.SIGTERM)
    settings = stack.settings.model_copy(update={"data_dir": survivor.data_dir})
    out = tmp_path / "replay"
    stats = replay(settings, out, progress=False)
    assert stats.events == APPENDS
    differences = verify(out, live_store_paths(settings))
    assert differences == [], [str(d) for d in differences[:10]]
    print(f"\nscale-out: {APPENDS} appends at {RATE:.0f}/s over {PARTITIONS} partitions; partitions owned: {owned}")
