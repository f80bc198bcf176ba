"""Turns per second and per-turn overhead with an instant model (issue: turns).

    .venv/bin/python bench/turns.py [--agents 1000] [--rounds 3]

    .venv/bin/python bench/turns.py --cpu-only [--cpu-calls 500]

First, the LLM caller's CPU per provider call with a 20-message request (a rendered request's
shape), measured in a separate process against a local instant server: the caller's path
(`pipeline/caller/provider.py`: one aiohttp POST of the body rendered once, its events decoded
with orjson) against the openai client's `post` of the same body on its aiohttp transport (the
caller before) and `chat.completions.create` with the same request on the default httpx transport,
alternating in blocks in the same run, with the ratios. Then it starts an isolated topic set, the
journal worker, the LLM caller and the scripted OpenAI-compatible server answering instantly;
creates N agents and waits until the journal holds them (so no round also measures the creations);
then, per round, sends one user message to every agent at once and waits until every turn is
settled; then one more message per agent, paced at half the best round's rate. Reports:
- complete turns/s across all agents (first append of the round to the last settlement);
- scheduling overhead: user message journaled -> request published on llm-requests, minus the
  debounce, in the bursts and at half the max rate (target there: p99 <= 30 ms over the debounce);
- turn overhead: user message journaled -> answer journaled (settlement), model time ~0.
- CPU per turn during the rounds of each process on the path: caller, journal worker, model
  server, broker, this bench (Linux /proc), to show where the machine's cores go.
Times are Kafka record timestamps on this one machine. Needs the local broker (not `--cpu-only`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from confluent_kafka import Consumer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the test-support package (tests/)

from pipeline.base_policy import TEXT as SYSTEM_PROMPT
from pipeline.kafka.read import consume_ready, read_ranges, watermarks
from processors import llm_outcomes
from processors.render import CONTEXT_PROTOCOL
from schemas.events import CONTEXT_ADDED, LLM_REQUEST_REQUESTED, LLM_REQUEST_SETTLED
from schemas.requests import Message
from tests.kafka_stack import Stack, consumer_config, ensure_broker

DEBOUNCE_MS = 250
CPU_BLOCK = 50  # calls per block; the two ways alternate block by block


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def read_all(topic: str) -> list[tuple[bytes, bytes, int]]:
    consumer = Consumer(consumer_config("bench-turns"))
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        ranges = {p: watermarks(consumer, TopicPartition(topic, p)) for p in metadata.partitions}
        batches = read_ranges(consumer, topic, ranges, max_messages=5000, poll_s=1.0)
        return [(m.key(), m.value(), m.timestamp()[1]) for batch in batches for m in batch]
    finally:
        consumer.close()


class SettlementFollower:
    """Counts events and settlements per stream as they are journaled (one consumer, read incrementally)."""

    def __init__(self, topic: str, partitions: int) -> None:
        self.consumer = Consumer(consumer_config("bench-follow"))
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self.events: dict[str, int] = {}
        self.settled: dict[str, int] = {}
        self.marker = b'"' + LLM_REQUEST_SETTLED.encode() + b'"'

    def poll(self) -> None:
        for message in consume_ready(self.consumer, 5000, 0.05):
            if message.error() is None:
                path = message.key().decode()
                self.events[path] = self.events.get(path, 0) + 1
                if self.marker in message.value():
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


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a running process (None where /proc is missing)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker_pid() -> int | None:
    """The local broker's pid (scripts/kafka/start.sh writes it), if it runs here."""
    try:
        return int((Path(__file__).resolve().parent.parent / ".local/kafka/kafka.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def rendered_request(messages: int = 20) -> list[Message]:
    """A request as the journal worker renders one (openai-compatible transport): the protocol,
    the system prompt, a history of user and assistant items with header lines, the timestamp."""
    history = [
        Message(
            role="user" if i % 2 == 0 else "assistant",
            content=f"@{10 + i}" + (" actor=user:cli" if i % 2 == 0 else "") + f"\nturn {i}: " + "lorem ipsum " * 30,
        )
        for i in range(messages - 4)
    ]
    return [
        Message(role="system", content=CONTEXT_PROTOCOL),
        Message(role="system", content='@2 key="agent/system-prompt"\n' + SYSTEM_PROMPT),
        *history,
        Message(role="user", content=f"@{10 + len(history)} actor=user:cli\nround 1"),
        Message(role="system", content="Current date and time (UTC): 2026-12-02T10:13:51.123Z"),
    ]


async def cpu_per_call(url: str, calls: int) -> dict[str, list[float]]:
    """ms of this process's CPU per call, per block, for the caller's path, for the openai client's
    `post` of the same body on its aiohttp transport (the caller before) and for `create`."""
    from openai import AsyncOpenAI, AsyncStream, DefaultAioHttpClient

    from pipeline.caller.provider import CHAT_PATH, Provider, request_body
    from pipeline.settings import Settings

    settings = Settings.from_env({}, openai_base_url=url, openai_api_key="bench", llm_max_tokens=64)
    provider = Provider(settings)
    sdk = AsyncOpenAI(base_url=url, api_key="bench", max_retries=0, timeout=settings.llm_timeout_s)
    sdk_aiohttp = AsyncOpenAI(
        base_url=url,
        api_key="bench",
        max_retries=0,
        timeout=settings.llm_timeout_s,
        http_client=DefaultAioHttpClient(),
    )
    record = rendered_request()

    async def caller() -> None:  # what the caller does per call, rendering of the provider messages included
        await provider.stream("instant", "openai-compatible", llm_outcomes.provider_messages(record), [])

    async def sdk_post() -> None:  # the caller before: the same body through the client's `post`, raw chunks
        body = request_body("instant", "openai-compatible", llm_outcomes.provider_messages(record), 64, stream=True)
        stream = await sdk_aiohttp.post(
            CHAT_PATH,
            cast_to=object,
            content=body,
            options={"security": {"bearer_auth": True}},  # type: ignore[arg-type]
            stream=True,
            stream_cls=AsyncStream[object],
        )
        async for _ in stream:
            pass

    async def create() -> None:  # the same request through the SDK's typed path, default httpx transport
        stream = await sdk.chat.completions.create(
            model="instant",
            messages=llm_outcomes.provider_messages(record),  # type: ignore[arg-type]
            max_tokens=64,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for _ in stream:
            pass

    ways = {"caller": caller, "sdk_post": sdk_post, "create": create}
    for way in ways.values():  # warm up connections and caches
        for _ in range(20):
            await way()
    blocks: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(max(1, calls // CPU_BLOCK)):
        for name, way in ways.items():
            started = time.process_time()
            for _ in range(CPU_BLOCK):
                await way()
            blocks[name].append((time.process_time() - started) * 1000 / CPU_BLOCK)
    await provider.close()
    await sdk.close()
    await sdk_aiohttp.close()
    return blocks


def measure_cpu(url: str, calls: int) -> tuple[float, float, float]:
    """Median ms of CPU per call (the caller's path, the client's `post`, `create`), measured in a
    fresh process (nothing else in it)."""
    probe = subprocess.run(
        [sys.executable, __file__, "--cpu-probe", url, "--cpu-calls", str(calls)],
        capture_output=True,
        check=True,
    )
    blocks = orjson.loads(probe.stdout)
    return tuple(statistics.median(blocks[way]) for way in ("caller", "sdk_post", "create"))  # type: ignore[return-value]


def report_cpu(url: str, calls: int) -> None:
    caller, sdk_post, create = measure_cpu(url, calls)
    print(f"{'figure':<52} {'value':>12} {'target':>14}")
    print(f"{'caller CPU per call (ms, 20 messages)':<52} {caller:>12.2f} {'<= 1.5':>14}")
    print(f"{'the client post of the same body (ms, same run)':<52} {sdk_post:>12.2f}")
    print(f"{'the client post / caller':<52} {sdk_post / caller:>11.1f}x")
    print(f"{'create on httpx (ms, same run)':<52} {create:>12.2f}")
    print(f"{'create / caller':<52} {create / caller:>11.1f}x {'>= 4x':>14}")
    print(f"(median of blocks of {CPU_BLOCK} calls, {calls} calls each way, alternating; instant scripted model)")
    print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--cpu-calls", type=int, default=500, help="provider calls per way for CPU per call")
    parser.add_argument("--cpu-only", action="store_true", help="only CPU per call (no broker needed)")
    parser.add_argument("--cpu-probe", metavar="URL", help=argparse.SUPPRESS)  # the measuring child process
    args = parser.parse_args()
    if args.cpu_probe:
        sys.stdout.buffer.write(orjson.dumps(asyncio.run(cpu_per_call(args.cpu_probe, args.cpu_calls))))
        return
    server, url = start_llm_server()
    try:
        report_cpu(url, args.cpu_calls)
    except BaseException:
        server.terminate()
        raise
    if args.cpu_only:
        server.terminate()
        return
    ensure_broker()
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
        # Round 1 starts once every agent is journaled (created, base policy): else it also
        # measures the worker journaling the creations.
        while sum(1 for a in agents if follower.events.get(a.path, 0) >= 2) < len(agents):
            follower.poll()
        assert stack.caller is not None and stack.worker is not None
        processes = {
            "LLM caller": stack.caller.pid,
            "journal worker": stack.worker.pid,
            "scripted model server": server.pid,
            "Kafka broker": broker_pid(),
            "this bench (load, follower)": os.getpid(),
        }
        cpu_before = {name: process_cpu_s(pid) for name, pid in processes.items() if pid}
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

        cpu_after = {name: process_cpu_s(pid) for name, pid in processes.items() if pid}
        # Paced: every agent gets one more message, spread evenly at half the best burst rate, so the
        # scheduling overhead is measured under a sustainable load (the target), not a burst.
        paced_rate = max(turn_rates) / 2
        paced_from = time.time() * 1000
        started = time.monotonic()
        for n, agent in enumerate(agents):
            delay = started + n / paced_rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            agent.append(
                {
                    "type": CONTEXT_ADDED,
                    "payload": {"role": "user", "content": "paced", "actor": {"type": "user", "origin": "cli"}},
                }
            )
        client.flush()
        while sum(1 for a in agents if follower.settled.get(a.path, 0) >= args.rounds + 1) < len(agents):
            follower.poll()
        print(f"paced: {args.agents} turns offered at {paced_rate:,.0f}/s (half the best round)")
        journal = read_all(stack.client.topics.journal)
        requests = read_all(stack.client.topics.llm_requests)
        user_at: dict[tuple[str, int], int] = {}
        settled_at: dict[tuple[str, int], int] = {}
        request_journaled_at: dict[tuple[str, int], int] = {}
        request_trigger: dict[tuple[str, int], int] = {}
        for key, value, ts in journal:
            event = orjson.loads(value)
            path = key.decode()
            if event["type"] == CONTEXT_ADDED and event["payload"]["role"] == "user":
                user_at[(path, event["offset"])] = ts
            elif event["type"] == LLM_REQUEST_SETTLED:
                settled_at[(path, event["payload"]["requestOffset"])] = ts
            elif event["type"] == LLM_REQUEST_REQUESTED:
                request_journaled_at[(path, event["offset"])] = ts
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
        burst = {k: t for k, t in request_trigger.items() if user_at[(k[0], t)] < paced_from}
        paced = {k: t for k, t in request_trigger.items() if user_at[(k[0], t)] >= paced_from}

        def scheduling_of(triggers: dict[tuple[str, int], int]) -> list[float]:
            return [published_at[k] - user_at[(k[0], t)] - DEBOUNCE_MS for k, t in triggers.items()]

        def turn_of(triggers: dict[tuple[str, int], int]) -> list[float]:
            return [settled_at[k] - user_at[(k[0], t)] for k, t in triggers.items() if k in settled_at]

        def hops_of(triggers: dict[tuple[str, int], int]) -> dict[str, list[float]]:
            """The scheduling path hop by hop: debounce over -> request journaled -> call record out."""
            hops: dict[str, list[float]] = {"due -> request journaled": [], "journaled -> call record": []}
            for k, t in triggers.items():
                if k in request_journaled_at:
                    hops["due -> request journaled"].append(request_journaled_at[k] - user_at[(k[0], t)] - DEBOUNCE_MS)
                    hops["journaled -> call record"].append(published_at[k] - request_journaled_at[k])
            return hops

        scheduling, turn = scheduling_of(burst), turn_of(burst)
        paced_scheduling, paced_turn = scheduling_of(paced), turn_of(paced)
        print()
        print(f"{'figure':<52} {'value':>12} {'target':>14}")
        print(f"{'complete turns/s (best round)':<52} {max(turn_rates):>12,.0f} {'>= 500':>14}")
        print(f"{'complete turns/s (mean of rounds)':<52} {sum(turn_rates) / len(turn_rates):>12,.0f}")
        for name, values, target in (
            ("burst: scheduling beyond debounce p50 (ms)", scheduling, ""),
            ("burst: scheduling beyond debounce p99 (ms)", scheduling, ""),
            ("burst: user journaled -> answer journaled p50 (ms)", turn, ""),
            ("burst: user journaled -> answer journaled p99 (ms)", turn, ""),
            ("half max: scheduling beyond debounce p50 (ms)", paced_scheduling, ""),
            ("half max: scheduling beyond debounce p99 (ms)", paced_scheduling, "<= 30"),
            ("half max: user journaled -> answer journaled p50 (ms)", paced_turn, ""),
            ("half max: user journaled -> answer journaled p99 (ms)", paced_turn, ""),
        ):
            p = 99 if "p99" in name else 50
            print(f"{name:<52} {percentile(values, p):>12,.0f} {target:>14}")
        for hop, values in hops_of(paced).items():
            if values:
                name = f"half max: {hop} p50 / p99 (ms)"
                print(f"{name:<52} {percentile(values, 50):>5,.0f} / {percentile(values, 99):<4,.0f}")
        turns = args.agents * args.rounds
        for name, before in cpu_before.items():
            after = cpu_after.get(name)
            if before is not None and after is not None:
                print(f"{'CPU per turn during rounds (ms): ' + name:<52} {(after - before) * 1000 / turns:>12.2f}")
        print(
            f"(samples: {len(scheduling)} burst and {len(paced_scheduling)} paced requests; debounce {DEBOUNCE_MS} ms; "
            "instant scripted model)"
        )
    finally:
        stack.close()
        server.terminate()


if __name__ == "__main__":
    main()
