"""Scale-out by partition: journal throughput with one worker process against two, in one run.

    .venv/bin/python bench/scale.py [--appends 200000] [--partitions 4]

Needs the local broker (`bash scripts/kafka/start.sh`). For each worker count it creates a fresh
topic set, produces a backlog of valid append commands (with append ids, as the client sends them)
over 200 streams, starts that many `agentstream worker journal` processes in one group, and reads
the rate at which agent-journal grows from 10% to 100% of the backlog (the start-up and the
rebalance are left out). On a 2-core machine the broker and the workers share the cores, so the
ratio says how much of the second core a second worker can use, not what a cluster would do.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import orjson  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

from schemas.events import CONTEXT_ADDED  # noqa: E402
from tests.kafka_stack import BIN, BOOTSTRAP, RecordCounter, Stack  # noqa: E402

ACTOR = {"type": "user", "origin": "cli"}


def produce_backlog(stack: Stack, appends: int) -> None:
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "partitioner": "murmur2_random", "linger.ms": 20})
    topic = stack.client.topics.appends
    for n in range(appends):
        path = f"/bench/s{n % 200}"
        command = {
            "streamPath": path,
            "type": CONTEXT_ADDED,
            "appendId": uuid.uuid4().hex,
            "payload": {
                "role": "user",
                "content": f"message {n} " + "x" * 100,
                "actor": {"type": "user", "origin": "cli"},
            },
        }
        while True:
            try:
                producer.produce(topic, key=path.encode(), value=orjson.dumps(command))
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(120)


def journal_rate(stack: Stack, workers: int, appends: int, partitions: int) -> float:
    journal = RecordCounter(stack.client.topics.journal, partitions)  # its watermarks count markers too
    processes = []
    for index in range(workers):
        data_dir = stack.settings.data_dir / f"w{index}"
        data_dir.mkdir(parents=True, exist_ok=True)
        env = stack.env()
        env["AGENTSTREAM_DATA_DIR"] = str(data_dir)
        env["AGENTSTREAM_WORKER_INSTANCE_ID"] = f"{stack.settings.app_id}-{index}"
        log = (data_dir / "worker.log").open("ab")
        processes.append(
            subprocess.Popen([str(BIN / "agentstream"), "worker", "journal"], env=env, stdout=log, stderr=log)
        )
    try:
        samples: list[tuple[float, int]] = []
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            count = journal.total()
            samples.append((time.monotonic(), count))
            if count >= appends:
                break
            time.sleep(0.25)
        start = next((t, c) for t, c in samples if c >= appends * 0.1)
        end = samples[-1]
        return (end[1] - start[1]) / (end[0] - start[0])
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(60)
        journal.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--appends", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    rates: dict[int, float] = {}
    for workers in (1, 2):
        root = Path(tempfile.mkdtemp(prefix="bench-scale-"))
        stack = Stack(root / "data", partitions=args.partitions, session_timeout_s=6.0)
        try:
            produce_backlog(stack, args.appends)
            rates[workers] = journal_rate(stack, workers, args.appends, args.partitions)
            print(f"{workers} worker(s): {rates[workers]:,.0f} appends/s journaled", flush=True)
        finally:
            stack.close()
            shutil.rmtree(root, ignore_errors=True)
    print(f"two workers against one: x{rates[2] / rates[1]:.2f} ({os.cpu_count()} CPUs, broker on the same cores)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
