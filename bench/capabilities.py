"""Script runs end to end: runs/s and the host's overhead beyond the script's own run time.

    .venv/bin/python bench/capabilities.py [--agents 200] [--rounds 3] [--concurrency 16] [--rate N]

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
import contextlib
import gc
import os
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # before bench/: bench/pipeline.py shadows pipeline

import orjson
from confluent_kafka import Consumer, TopicPartition

from pipeline.kafka.read import consume_ready
from schemas.capabilities import SCRIPT_RUN_REQUESTED, SCRIPT_RUN_SETTLED, SCRIPT_RUN_STARTED
from schemas.events import CONTEXT_ADDED, LLM_REQUEST_SETTLED
from tests.kafka_stack import Stack, consumer_config, ensure_broker

SCRIPT = "```python\nsum(range(10))\n```"


# What each printed figure is, from the Kafka (producer) timestamps of a run's records.
FIGURES: tuple[tuple[str, Callable[[dict[str, int]], int]], ...] = (
    ("assistant journaled -> result journaled (ms)", lambda s: s["result"] - s["answer"]),
    ("  overhead beyond the script's run time (ms)", lambda s: s["result"] - s["answer"] - s["run"]),
    ("  the script's run time in the sandbox (ms)", lambda s: s["run"]),
    ("  worker: answer -> run requested (ms)", lambda s: s["requested"] - s["answer"]),
    ("  host: run requested -> started journaled (ms)", lambda s: s["started"] - s["requested"]),
    ("  host: started -> settled journaled, minus the run (ms)", lambda s: s["settled"] - s["started"] - s["run"]),
    ("  worker: settled -> result item journaled (ms)", lambda s: s["result"] - s["settled"]),
    (
        "  the host's own part, the two rows marked * (ms)",
        lambda s: s["started sent"] - s["published"] + s["settled sent"] - s["started"] - s["run"],
    ),
    ("    worker: run requested -> on script-runs (ms)", lambda s: s["published"] - s["requested"]),
    ("  * host: on script-runs -> started command sent (ms)", lambda s: s["started sent"] - s["published"]),
    ("    worker: started command -> journaled (ms)", lambda s: s["started"] - s["started sent"]),
    (
        "  * host: started journaled -> settled command sent, minus the run (ms)",
        lambda s: s["settled sent"] - s["started"] - s["run"],
    ),
    ("    worker: settled command -> journaled (ms)", lambda s: s["settled"] - s["settled sent"]),
)


def cpu_seconds(pid: int) -> float:
    """CPU time so far of a process and its children (the host's sandbox workers), live or reaped."""
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        pids.extend(int(child) for child in task.read_text().split())
    total = 0.0
    for each in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
            if each == pid:
                total += int(fields[13]) + int(fields[14])  # cutime, cstime: children reaped so far
    return total / tick


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] if ordered else float("nan")


class Follower:
    """Reads a topic from the start, incrementally."""

    def __init__(self, topic: str, partitions: int, group: str) -> None:
        self.consumer = Consumer(consumer_config(group))
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])

    def poll(self, timeout: float = 0.05) -> list[tuple[str, dict, int]]:
        out = []
        for message in consume_ready(self.consumer, 5000, timeout):
            if message.error() is None:
                out.append((message.key().decode(), orjson.loads(message.value()), message.timestamp()[1]))
        return out

    def drain(self) -> list[tuple[str, dict, int]]:
        """Everything there is now."""
        out = []
        while batch := self.poll():
            out.extend(batch)
        return out


def bursts(
    args: Any, agents: list[Any], internal: Any, requests: Follower, journal: Follower, events: list
) -> list[float]:
    """Per round, every agent's open request answered at once; runs/s per round."""
    open_request: dict[str, int] = {}  # path -> newest request offset published
    rates = []
    for round_number in range(1, args.rounds + 1):
        while len(open_request) < len(agents):
            for path, record, _ in requests.poll():
                if record.get("kind") == "call":
                    open_request[path] = record["requestOffset"]
        started = time.monotonic()
        receipts = []
        for agent in agents:
            receipts.extend(answer(internal, agent.path, open_request.pop(agent.path)))
        for receipt in receipts:
            receipt.wait(timeout=300)
        done = 0
        while done < len(agents):
            for event in journal.poll():
                events.append(event)
                done += is_result(event[1])
        elapsed = time.monotonic() - started
        rates.append(len(agents) / elapsed)
        print(f"round {round_number}: {len(agents)} script runs in {elapsed:.2f}s = {rates[-1]:,.0f} runs/s")
    return rates


def paced(args: Any, internal: Any, requests: Follower, journal: Follower, events: list) -> float:
    """Open requests answered one by one at `args.rate` per second, oldest first, until agents x
    rounds runs are answered; every run's result awaited. Returns the runs/s answered.

    Time with no open request banks no answers: the schedule restarts when one opens. (It used to
    run from the start, so the requests the worker opened after setting up the agents, a second or
    more later, were answered in one catch-up burst of 100-200, which alone made the p99.)"""
    total = args.agents * args.rounds
    interval = 1 / args.rate
    ready: deque[tuple[str, int]] = deque()  # (path, request offset), in the order they opened
    receipts = []
    answered = 0
    started = due = time.monotonic()  # reset at the first answer: the rate counts from there
    while answered < total:
        for path, record, _ in requests.poll(timeout=0.001):
            if record.get("kind") == "call":
                ready.append((path, record["requestOffset"]))
        now = time.monotonic()
        if not ready:
            due = max(due, now)
        while ready and answered < total and now >= due:
            if not answered:
                started = now
            receipts.extend(answer(internal, *ready.popleft()))
            answered += 1
            due += interval
            now = time.monotonic()
        for event in journal.poll(timeout=0):
            events.append(event)
        time.sleep(max(0.0, min(due - time.monotonic(), 0.002)))
    elapsed = time.monotonic() - started
    for receipt in receipts:
        receipt.wait(timeout=300)
    done = sum(is_result(event) for _, event, _ in events)
    while done < total:
        for event in journal.poll():
            events.append(event)
            done += is_result(event[1])
    print(
        f"paced: {total} script runs answered in {elapsed:.2f}s = {total / elapsed:,.0f} runs/s (asked {args.rate:g})"
    )
    return total / elapsed


def answer(internal: Any, path: str, request_offset: int) -> list[Any]:
    """The caller's genuine output for an open request: an assistant item holding one python block,
    then the request's settlement (both through the workers' door)."""
    stream = internal.streams.get(path)
    return [
        stream.append(
            {
                "type": CONTEXT_ADDED,
                "payload": {"role": "assistant", "content": SCRIPT, "llmRequestOffset": request_offset},
                "idempotencyKey": f"agent/request/{request_offset}/assistant",
            }
        ),
        stream.append(
            {
                "type": LLM_REQUEST_SETTLED,
                "payload": {"requestOffset": request_offset, "result": {"status": "succeeded", "text": SCRIPT}},
                "idempotencyKey": f"agent/request/{request_offset}/settled",
            }
        ),
    ]


def is_result(event: dict) -> bool:
    return event["type"] == CONTEXT_ADDED and (event["payload"].get("actor") or {}).get("type") == "script"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16, help="scripts the host runs at once")
    parser.add_argument(
        "--rate",
        type=float,
        default=0,
        help="paced: answer open requests at this many per second (agents x rounds runs in all) instead of "
        "every agent's at once per round",
    )
    args = parser.parse_args()
    ensure_broker()
    stack = Stack(Path(tempfile.mkdtemp(prefix="bench-capabilities-")), partitions=args.partitions, llm_model="bench")
    try:
        stack.start_worker()
        stack.start_capabilities(concurrency=args.concurrency)
        client, internal = stack.client, stack.internal_client
        requests = Follower(client.topics.llm_requests, args.partitions, "bench-capabilities-requests")
        journal = Follower(client.topics.journal, args.partitions, "bench-capabilities-journal")
        # The host's side of each run: when the run request reached script-runs, and when the host
        # produced its started and settled commands (producer timestamps, like the journal's).
        script_runs = Follower(client.topics.script_runs, args.partitions, "bench-capabilities-runs")
        commands = Follower(client.topics.internal_appends, args.partitions, "bench-capabilities-commands")
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
        # Out of the collector's view, as in the workers: a full collection of this process would
        # pause the answers for tens of milliseconds, then send them in a burst.
        gc.collect()
        gc.freeze()
        events: list[tuple[str, dict, int]] = []
        rates = []
        host_pid = stack.capabilities.pid
        host_cpu = cpu_seconds(host_pid)
        if args.rate > 0:
            rates.append(paced(args, internal, requests, journal, events))
        else:
            rates.extend(bursts(args, agents, internal, requests, journal, events))
        host_cpu = cpu_seconds(host_pid) - host_cpu
        at: dict[tuple[str, str, str], int] = {}  # (path, execution, stage) -> ts
        for path, record, ts in script_runs.drain():
            at[(path, record["executionId"], "published")] = ts
        for path, command, ts in commands.drain():
            kind = command.get("type")
            if kind in (SCRIPT_RUN_STARTED, SCRIPT_RUN_SETTLED):
                at.setdefault((path, command["payload"]["executionId"], f"{kind.rsplit('-', 1)[-1]} sent"), ts)
        answered: dict[tuple[str, int], int] = {}  # (path, assistant offset) -> ts
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
        figures: dict[str, list[int]] = {name: [] for name, _ in FIGURES}
        stage_names = ("requested", "published", "started sent", "started", "settled sent", "settled", "result")
        for (path, offset), ts in answered.items():
            execution = f"agent-output:{offset}"
            stages = {s: at.get((path, execution, s)) for s in stage_names}
            if any(v is None for v in stages.values()):
                continue
            stages["answer"] = ts
            stages["run"] = duration[(path, execution)]
            for name, figure in FIGURES:
                figures[name].append(figure(stages))
        print()
        print(f"{'figure':<72} {'p50':>8} {'p99':>8}")
        for name, values in figures.items():
            print(f"{name:<72} {percentile(values, 50):>8,.0f} {percentile(values, 99):>8,.0f}")
        runs = args.agents * args.rounds
        print(f"capability host CPU per run (its process and sandbox workers): {host_cpu / runs * 1000:.2f} ms")
        print(f"script runs/s: best round {max(rates):,.0f}, mean {sum(rates) / len(rates):,.0f}")
        print(
            f"(samples: {len(figures[FIGURES[0][0]])} runs; {args.agents} agents x {args.rounds} rounds; "
            f"host concurrency {args.concurrency}; {args.partitions} partitions)"
        )
    finally:
        stack.stop_capabilities()
        stack.close()


if __name__ == "__main__":
    main()
