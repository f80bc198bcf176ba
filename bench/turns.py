"""Turns per second and per-turn overhead with an instant model (issue: turns).

    .venv/bin/python bench/turns.py [--agents 1000] [--rounds 3]

Starts an isolated topic set, the journal worker, the LLM caller and the scripted
OpenAI-compatible server answering instantly; creates N agents; then, per round, sends one user
message to every agent at once and waits until every turn is settled. Reports:
- complete turns/s across all agents (first append of the round to the last settlement);
- scheduling overhead: user message journaled -> request published on llm-requests, minus the
  debounce (target p99 <= 30 ms over the debounce);
- turn overhead: user message journaled -> answer journaled (settlement), model time ~0.
Times are Kafka record timestamps on this one machine. Needs the local broker running.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from confluent_kafka import Consumer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the test-support package (tests/)

from pipeline.client import consume_ready, watermarks
from schemas.events import CONTEXT_ADDED, LLM_REQUEST_SETTLED
from tests.kafka_stack import BOOTSTRAP, Stack, ensure_broker

DEBOUNCE_MS = 250


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def read_all(topic: str) -> list[tuple[bytes, bytes, int]]:
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "bench-turns", "log_level": 3})
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        assignment, ends = [], {}
        for p in metadata.partitions:
            low, high = watermarks(consumer, TopicPartition(topic, p))
            if high > low:
                assignment.append(TopicPartition(topic, p, low))
                ends[p] = high
        consumer.assign(assignment)
        records: list[tuple[bytes, bytes, int]] = []
        done: set[int] = set()
        while len(done) < len(ends):
            for m in consume_ready(consumer, 5000, 1.0):
                if m.error() is None:
                    records.append((m.key(), m.value(), m.timestamp()[1]))
                    if m.offset() + 1 >= ends[m.partition()]:
                        done.add(m.partition())
        return records
    finally:
        consumer.close()


class SettlementFollower:
    """Counts settlements per stream as they are journaled (one consumer, read incrementally)."""

    def __init__(self, topic: str, partitions: int) -> None:
        self.consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "bench-follow", "log_level": 3})
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self.settled: dict[str, int] = {}
        self.marker = b'"' + LLM_REQUEST_SETTLED.encode() + b'"'

    def poll(self) -> None:
        for message in consume_ready(self.consumer, 5000, 0.05):
            if message.error() is None and self.marker in message.value():
                path = message.key().decode()
                self.settled[path] = self.settled.get(path, 0) + 1


def start_llm_server() -> tuple[subprocess.Popen[bytes], str]:
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.support.scripted_llm", "--port", "0", "--instant"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert server.stdout is not None
    line = server.stdout.readline().decode()
    url = line.split("listening on ", 1)[1].strip()
    return server, url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    ensure_broker()
    server, url = start_llm_server()
    try:
        stack = Stack(
            Path(tempfile.mkdtemp(prefix="bench-turns-")),
            partitions=args.partitions,
            openai_base_url=url,
            openai_api_key="bench",
            llm_transport="openai-compatible",
            llm_model="instant",
        )
    except BaseException:
        server.terminate()
        raise
    try:
        stack.start_worker()
        stack.start_caller()
        client = stack.client
        print(f"creating {args.agents} agents ...", flush=True)
        agents = [client.agents.create() for _ in range(args.agents)]
        client.flush()
        follower = SettlementFollower(stack.client.topics.journal, args.partitions)
        turn_rates = []
        for round_number in range(1, args.rounds + 1):
            started = time.monotonic()
            receipts = [
                agent.append(
                    {
                        "type": CONTEXT_ADDED,
                        "payload": {
                            "role": "user",
                            "content": f"round {round_number}",
                            "actor": {"type": "user", "origin": "cli"},
                        },
                    }
                )
                for agent in agents
            ]
            for receipt in receipts:
                receipt.wait(timeout=300)
            # Wait until every agent has one more settlement than before the round.
            target = round_number
            while sum(1 for a in agents if follower.settled.get(a.path, 0) >= target) < len(agents):
                follower.poll()
            elapsed = time.monotonic() - started
            turn_rates.append(args.agents / elapsed)
            print(f"round {round_number}: {args.agents} turns in {elapsed:.2f}s = {args.agents / elapsed:,.0f} turns/s")

        journal = read_all(stack.client.topics.journal)
        requests = read_all(stack.client.topics.llm_requests)
        user_at: dict[tuple[str, int], int] = {}
        settled_at: dict[tuple[str, int], int] = {}
        request_trigger: dict[tuple[str, int], int] = {}
        for key, value, ts in journal:
            event = orjson.loads(value)
            path = key.decode()
            if event["type"] == CONTEXT_ADDED and event["payload"]["role"] == "user":
                user_at[(path, event["offset"])] = ts
            elif event["type"] == LLM_REQUEST_SETTLED:
                settled_at[(path, event["payload"]["requestOffset"])] = ts
        published_at: dict[tuple[str, int], int] = {}
        for key, value, ts in requests:
            record = orjson.loads(value)
            if record["kind"] == "call":
                published_at[(key.decode(), record["requestOffset"])] = ts
        # A request's trigger is the newest user item before it (one user message per round).
        for path, r in published_at:
            triggers = [o for (p, o) in user_at if p == path and o < r]
            if triggers:
                request_trigger[(path, r)] = max(triggers)
        scheduling = [published_at[k] - user_at[(k[0], t)] - DEBOUNCE_MS for k, t in request_trigger.items()]
        turn = [settled_at[k] - user_at[(k[0], t)] for k, t in request_trigger.items() if k in settled_at]
        print()
        print(f"{'figure':<52} {'value':>12} {'target':>14}")
        print(f"{'complete turns/s (best round)':<52} {max(turn_rates):>12,.0f} {'>= 500':>14}")
        print(f"{'complete turns/s (mean of rounds)':<52} {sum(turn_rates) / len(turn_rates):>12,.0f}")
        for name, values, target in (
            ("scheduling overhead beyond debounce p50 (ms)", scheduling, ""),
            ("scheduling overhead beyond debounce p99 (ms)", scheduling, "<= 30"),
            ("user journaled -> answer journaled p50 (ms)", turn, ""),
            ("user journaled -> answer journaled p99 (ms)", turn, ""),
        ):
            p = 99 if "p99" in name else 50
            print(f"{name:<52} {percentile(values, p):>12,.0f} {target:>14}")
        print(f"(samples: {len(scheduling)} requests; debounce {DEBOUNCE_MS} ms; instant scripted model)")
    finally:
        stack.close()
        server.terminate()


if __name__ == "__main__":
    main()
