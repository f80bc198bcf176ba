"""Script runs end to end: runs/s and the host's overhead beyond the script's own run time.

    .venv/bin/python bench/capabilities.py [--agents 200] [--rounds 3] [--concurrency 16]

Starts an isolated topic set, the journal worker and the capability host (no LLM caller: this
benchmark plays it). Every agent gets a user message, which opens an LLM request; per round the
benchmark answers every open request at once, through the workers' door, with the caller's genuine
output: an assistant item naming the request that holds one trivial ```python block, then the
settlement. The journal worker requests the run, the host runs it and settles it, the worker
journals the result item, whose agent-loop trigger opens the next request (the next round's).

Reports, from the Kafka timestamps of the journal records on this one machine:
- script runs/s per round (first answer appended to the last result item journaled);
- end to end: assistant item journaled -> result item journaled, p50/p99;
- host overhead: that minus the run's own time in the sandbox (settlement durationMs), p50/p99,
  and where it goes (worker: answer -> run requested; host: requested -> started -> settled beyond
  the run; worker: settled -> result item).
Needs the local broker running (scripts/kafka/start.sh).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # before bench/: bench/pipeline.py shadows pipeline

import orjson
from confluent_kafka import Consumer, TopicPartition

from pipeline.kafka.read import consume_ready
from schemas.capabilities import SCRIPT_RUN_REQUESTED, SCRIPT_RUN_SETTLED, SCRIPT_RUN_STARTED
from schemas.events import CONTEXT_ADDED, LLM_REQUEST_SETTLED
from tests.kafka_stack import Stack, consumer_config, ensure_broker

SCRIPT = "```python\nsum(range(10))\n```"


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] if ordered else float("nan")


class Follower:
    """Reads a topic from the start, incrementally."""

    def __init__(self, topic: str, partitions: int, group: str) -> None:
        self.consumer = Consumer(consumer_config(group))
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])

    def poll(self) -> list[tuple[str, dict, int]]:
        out = []
        for message in consume_ready(self.consumer, 5000, 0.05):
            if message.error() is None:
                out.append((message.key().decode(), orjson.loads(message.value()), message.timestamp()[1]))
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16, help="scripts the host runs at once")
    args = parser.parse_args()
    ensure_broker()
    stack = Stack(Path(tempfile.mkdtemp(prefix="bench-capabilities-")), partitions=args.partitions, llm_model="bench")
    try:
        stack.start_worker()
        stack.start_capabilities(concurrency=args.concurrency)
        client, internal = stack.client, stack.internal_client
        requests = Follower(client.topics.llm_requests, args.partitions, "bench-capabilities-requests")
        journal = Follower(client.topics.journal, args.partitions, "bench-capabilities-journal")
        print(f"creating {args.agents} agents ...", flush=True)
        agents = [client.agents.create() for _ in range(args.agents)]
        for agent in agents:
            agent.append(
                {
                    "type": CONTEXT_ADDED,
                    "payload": {"role": "user", "content": "run scripts", "actor": {"type": "user", "origin": "cli"}},
                }
            )
        client.flush()
        open_request: dict[str, int] = {}  # path -> newest request offset published
        events: list[tuple[str, dict, int]] = []
        rates = []
        for round_number in range(1, args.rounds + 1):
            while len(open_request) < len(agents):
                for path, record, _ in requests.poll():
                    if record.get("kind") == "call":
                        open_request[path] = record["requestOffset"]
            started = time.monotonic()
            receipts = []
            for agent in agents:
                r = open_request.pop(agent.path)
                stream = internal.streams.get(agent.path)
                receipts.append(
                    stream.append(
                        {
                            "type": CONTEXT_ADDED,
                            "payload": {"role": "assistant", "content": SCRIPT, "llmRequestOffset": r},
                            "idempotencyKey": f"agent/request/{r}/assistant",
                        }
                    )
                )
                receipts.append(
                    stream.append(
                        {
                            "type": LLM_REQUEST_SETTLED,
                            "payload": {"requestOffset": r, "result": {"status": "succeeded", "text": SCRIPT}},
                            "idempotencyKey": f"agent/request/{r}/settled",
                        }
                    )
                )
            for receipt in receipts:
                receipt.wait(timeout=300)
            done = 0
            while done < len(agents):
                for event in journal.poll():
                    events.append(event)
                    payload = event[1]["payload"]
                    if event[1]["type"] == CONTEXT_ADDED and (payload.get("actor") or {}).get("type") == "script":
                        done += 1
            elapsed = time.monotonic() - started
            rates.append(len(agents) / elapsed)
            print(f"round {round_number}: {len(agents)} script runs in {elapsed:.2f}s = {rates[-1]:,.0f} runs/s")

        answered: dict[tuple[str, int], int] = {}  # (path, assistant offset) -> ts
        at: dict[tuple[str, str, str], int] = {}  # (path, execution, stage) -> ts
        duration: dict[tuple[str, str], int] = {}
        for path, event, ts in events:
            kind, payload = event["type"], event["payload"]
            if kind == CONTEXT_ADDED and payload.get("role") == "assistant" and payload.get("llmRequestOffset"):
                answered[(path, event["offset"])] = ts
            elif kind in (SCRIPT_RUN_REQUESTED, SCRIPT_RUN_STARTED, SCRIPT_RUN_SETTLED):
                at[(path, payload["executionId"], kind.rsplit("-", 1)[-1])] = ts
                if kind == SCRIPT_RUN_SETTLED:
                    duration[(path, payload["executionId"])] = payload.get("durationMs", 0)
            elif kind == CONTEXT_ADDED and (payload.get("actor") or {}).get("type") == "script":
                at[(path, payload["actor"]["executionId"], "result")] = ts
        total, overhead, run, worker_in, host_pickup, host_settle, worker_out = [], [], [], [], [], [], []
        for (path, offset), ts in answered.items():
            execution = f"agent-output:{offset}"
            stages = {s: at.get((path, execution, s)) for s in ("requested", "started", "settled", "result")}
            if any(v is None for v in stages.values()):
                continue
            ms = duration[(path, execution)]
            total.append(stages["result"] - ts)
            overhead.append(stages["result"] - ts - ms)
            run.append(ms)
            worker_in.append(stages["requested"] - ts)
            host_pickup.append(stages["started"] - stages["requested"])
            host_settle.append(stages["settled"] - stages["started"] - ms)
            worker_out.append(stages["result"] - stages["settled"])
        print()
        print(f"{'figure':<58} {'p50':>8} {'p99':>8}")
        for name, values in (
            ("assistant journaled -> result journaled (ms)", total),
            ("  overhead beyond the script's run time (ms)", overhead),
            ("  the script's run time in the sandbox (ms)", run),
            ("  worker: answer -> run requested (ms)", worker_in),
            ("  host: run requested -> started journaled (ms)", host_pickup),
            ("  host: started -> settled journaled, minus the run (ms)", host_settle),
            ("  worker: settled -> result item journaled (ms)", worker_out),
        ):
            print(f"{name:<58} {percentile(values, 50):>8,.0f} {percentile(values, 99):>8,.0f}")
        print(f"script runs/s: best round {max(rates):,.0f}, mean {sum(rates) / len(rates):,.0f}")
        print(
            f"(samples: {len(total)} runs; {args.agents} agents x {args.rounds} rounds; "
            f"host concurrency {args.concurrency}; {args.partitions} partitions)"
        )
    finally:
        stack.stop_capabilities()
        stack.close()


if __name__ == "__main__":
    main()
