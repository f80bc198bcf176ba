"""The HTTP gateway and the router against the local broker: ingestion, latency, fan-out.

    .venv/bin/python bench/gateway.py [--quick] [--only ndjson|post|fanout ...] [--rounds N]

Needs the local broker (`bash scripts/kafka/start.sh`; started if missing). Runs `agentstream
gateway` (uvicorn, uvloop, httptools), and for the fan-out `agentstream worker journal` and
`agentstream worker router`, as subprocesses with their own topic prefixes and app ids, and deletes
their topics at the end. The load generator (aiohttp, loopback only) shares the machine's cores
with them and the broker. Figures:

- NDJSON batch ingestion (commands/s, 2,000 lines a request, two requests in flight, every line
  acknowledged by Kafka before its request answers) beside a raw confluent-kafka producer sending
  the same commands (same producer settings) in the same run, rounds of each alternating, the best
  round of each kept: the ratio is the gateway's cost;
- single-event POST requests/s at saturation (64 keep-alive connections, closed loop), then p50/p99
  latency at half that rate (open loop: requests start on schedule whether or not others finished);
- routing fan-out: one source event to 1,000 subscribed agents; time from the source event's POST
  to each subscriber's item being journaled (its createdAt), p50/p99/max over every item.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run by path, sys.path[0] is bench/, whose pipeline.py would shadow the project's `pipeline`.
REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from typing import Any  # noqa: E402

import aiohttp  # noqa: E402
import orjson  # noqa: E402
import uvloop  # noqa: E402
import yaml  # noqa: E402
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from bench.turns import process_cpu_s  # noqa: E402
from pipeline.gateway.kafka import producer_config  # noqa: E402
from pipeline.gateway.tokens import hash_token, new_token  # noqa: E402
from pipeline.kafka.read import consume_ready, watermarks  # noqa: E402
from schemas.events import AGENT_CREATED, CONTEXT_ADDED  # noqa: E402
from schemas.routing import AGENT_SUBSCRIBED  # noqa: E402
from tests.kafka_stack import BIN, BOOTSTRAP, Stack, consumer_config, ensure_broker  # noqa: E402

BATCH_LINES = 2000
PHASES = ("ndjson", "post", "fanout")
SOURCE = "/integrations/bench/fanout"
TICK = "events.iterate.com/bench/tick"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def user_line(path: str, n: int) -> dict[str, Any]:
    return {"streamPath": path, "type": CONTEXT_ADDED, "payload": {"role": "user", "content": f"message {n}"}}


class Gateway:
    """`agentstream gateway` as a subprocess with a stack's settings and a tokens file."""

    def __init__(self, stack: Stack, tmp: Path, name: str) -> None:
        self.user = new_token()
        self.platform = new_token()
        tokens = tmp / f"{name}-tokens.yaml"
        tokens.write_text(
            yaml.safe_dump(
                {
                    "tokens": [
                        {"sha256": hash_token(self.user), "tier": "user", "scope": ["/agents/**"], "userId": "bench"},
                        {"sha256": hash_token(self.platform), "tier": "platform", "scope": ["/**"]},
                    ]
                }
            )
        )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **stack.env(),
            "AGENTSTREAM_GATEWAY_PORT": str(self.port),
            "AGENTSTREAM_GATEWAY_TOKENS_FILE": str(tokens),
            "AGENTSTREAM_GATEWAY_WAIT_TIMEOUT_S": "120",
        }
        self.log = (tmp / f"{name}-gateway.log").open("ab")
        self.process = subprocess.Popen(
            [str(BIN / "agentstream"), "gateway"], env=env, stdout=self.log, stderr=subprocess.STDOUT
        )

    async def wait_ready(self, session: aiohttp.ClientSession, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{self.url}/readyz") as reply:
                    if reply.status == 200:
                        return
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"the gateway did not become ready; see {self.log.name}")
            await asyncio.sleep(0.2)

    def stop(self) -> None:
        _stop(self.process)
        self.log.close()


def _stop(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


class Bench:
    def __init__(self, quick: bool, phases: set[str], rounds: int) -> None:
        self.quick = quick
        self.rounds = rounds
        self.phases = phases
        self.tmp = Path(tempfile.mkdtemp(prefix="agentstream-bench-gateway-"))
        self.stacks: list[Stack] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        self.gateways: list[Gateway] = []
        self.router_app_id = f"agentstream-bench-router-{uuid.uuid4().hex[:8]}"
        self.rows: list[tuple[str, str]] = []

    def stack(self, name: str) -> Stack:
        stack = Stack(self.tmp / name, partitions=4)
        self.stacks.append(stack)
        return stack

    def gateway(self, stack: Stack, name: str) -> Gateway:
        gateway = Gateway(stack, self.tmp, name)
        self.gateways.append(gateway)
        return gateway

    # 1. NDJSON batch ingestion vs a raw producer -----------------------------------------------

    async def batch_ingestion(self, session: aiohttp.ClientSession, gateway: Gateway, stack: Stack) -> None:
        n = 20_000 if self.quick else 40_000
        lines = [user_line(f"/agents/batch-{i % 200:03d}", i) for i in range(n)]
        bodies = [
            b"\n".join(orjson.dumps(line) for line in lines[i : i + BATCH_LINES]) for i in range(0, n, BATCH_LINES)
        ]
        cpu_per_line: list[float] = []  # the gateway process's CPU seconds per line, each round

        async def gateway_round() -> float:
            queue: asyncio.Queue[bytes] = asyncio.Queue()
            for body in bodies:
                queue.put_nowait(body)
            accepted = 0

            async def sender() -> None:
                nonlocal accepted
                headers = {"Authorization": f"Bearer {gateway.user}", "Content-Type": "application/x-ndjson"}
                url = f"{gateway.url}/v1/streams/-/events:batch"
                while not queue.empty():
                    body = queue.get_nowait()
                    async with session.post(url, data=body, headers=headers) as r:
                        result = await r.json()
                        assert r.status == 200 and result["failed"] == 0, result
                        accepted += result["accepted"]

            started, cpu_before = time.perf_counter(), process_cpu_s(gateway.process.pid)
            await asyncio.gather(sender(), sender())
            elapsed, cpu_after = time.perf_counter() - started, process_cpu_s(gateway.process.pid)
            if cpu_before is not None and cpu_after is not None:
                cpu_per_line.append((cpu_after - cpu_before) / accepted)
            return accepted / elapsed

        # The same commands as the gateway writes them (actor stamped, append id), straight to Kafka.
        producer = Producer(producer_config(stack.settings))
        actor = {"type": "user", "origin": "web", "userId": "bench"}
        records = [
            (
                line["streamPath"].encode(),
                orjson.dumps({**line, "payload": {**line["payload"], "actor": actor}, "appendId": uuid.uuid4().hex}),
            )
            for line in lines
        ]
        topic = stack.client.topics.appends

        def raw_round() -> float:
            started = time.perf_counter()
            for key, value in records:
                while True:
                    try:
                        producer.produce(topic, key=key, value=value)
                        break
                    except BufferError:
                        producer.poll(0.01)
                producer.poll(0)
            assert producer.flush(120) == 0
            return n / (time.perf_counter() - started)

        # Both sides run `rounds` times, alternating, and each keeps its best round: a single short
        # round of the raw producer swings by a factor of two with whatever else the 2 cores run.
        gateway_rates: list[float] = []
        raw_rates: list[float] = []
        for _ in range(self.rounds):
            gateway_rates.append(await gateway_round())
            raw_rates.append(raw_round())
        gateway_rate, raw_rate = max(gateway_rates), max(raw_rates)
        rounds = ", ".join(f"{rate:,.0f}" for rate in gateway_rates)
        self.rows.append(
            (f"NDJSON batch ingestion, best of {self.rounds} ({n:,} lines each; commands/s)", f"{gateway_rate:,.0f}")
        )
        self.rows.append(("  rounds", rounds))
        self.rows.append(
            (f"raw confluent-kafka producer, same commands, best of {self.rounds} (commands/s)", f"{raw_rate:,.0f}")
        )
        self.rows.append(("  rounds", ", ".join(f"{rate:,.0f}" for rate in raw_rates)))
        self.rows.append(("batch ingestion / raw producer", f"{gateway_rate / raw_rate:.3f}"))
        if cpu_per_line:
            # Steadier than a rate on a shared machine: what the gateway spends, whoever else runs.
            self.rows.append(
                ("gateway CPU per NDJSON line, each round (µs)", ", ".join(f"{t * 1e6:.1f}" for t in cpu_per_line))
            )

    # 2. single-event POSTs -----------------------------------------------------------------------

    async def single_events(self, session: aiohttp.ClientSession, gateway: Gateway) -> None:
        total = 6_000 if self.quick else 20_000
        clients = 64
        headers = {"Authorization": f"Bearer {gateway.user}", "Content-Type": "application/json"}
        bodies = [
            orjson.dumps({"type": CONTEXT_ADDED, "payload": {"role": "user", "content": f"m{i}"}}) for i in range(8)
        ]
        sent = 0
        statuses: dict[int, int] = {}

        async def client(index: int) -> None:
            nonlocal sent
            url = f"{gateway.url}/v1/streams/agents/single-{index:02d}/events"
            while sent < total:
                sent += 1
                async with session.post(url, data=bodies[sent % 8], headers=headers) as reply:
                    await reply.read()
                    statuses[reply.status] = statuses.get(reply.status, 0) + 1

        started, cpu_before = time.perf_counter(), process_cpu_s(gateway.process.pid)
        await asyncio.gather(*(client(i) for i in range(clients)))
        elapsed, cpu_after = time.perf_counter() - started, process_cpu_s(gateway.process.pid)
        saturation = statuses.get(202, 0) / elapsed
        self.rows.append((f"single-event POST at saturation ({clients} connections; requests/s)", f"{saturation:,.0f}"))
        if cpu_before is not None and cpu_after is not None:
            cpu_per_request = (cpu_after - cpu_before) / sum(statuses.values())
            self.rows.append(("gateway CPU per single-event POST at saturation (µs)", f"{cpu_per_request * 1e6:.0f}"))
        if set(statuses) != {202}:
            self.rows.append(("  statuses at saturation", str(statuses)))

        # Open loop at half the saturated rate: requests are due on a fixed schedule, and each
        # latency runs from its due time (a late start counts), served by a pool of connections.
        rate = saturation / 2
        duration = 5.0 if self.quick else 10.0
        count = int(rate * duration)
        latencies: list[float] = []
        failures = 0
        next_index = 0
        begin = time.perf_counter() + 0.1

        async def paced(index: int) -> None:
            nonlocal failures, next_index
            url = f"{gateway.url}/v1/streams/agents/paced-{index:02d}/events"
            while next_index < count:
                i, next_index = next_index, next_index + 1
                due = begin + i / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                async with session.post(url, data=bodies[i % 8], headers=headers) as reply:
                    await reply.read()
                    failures += reply.status != 202
                latencies.append(time.perf_counter() - due)

        await asyncio.gather(*(paced(i) for i in range(clients)))
        self.rows.append(
            (
                f"single-event POST latency at {rate:,.0f}/s (half of saturation) p50 / p99",
                f"{statistics.median(latencies) * 1000:.1f} ms / {percentile(latencies, 0.99) * 1000:.1f} ms"
                + (f" ({failures} not 202)" if failures else ""),
            )
        )

    # 3. fan-out ------------------------------------------------------------------------------------

    async def fanout(self, session: aiohttp.ClientSession, gateway: Gateway, stack: Stack) -> None:
        subscribers = 1000
        events = 3 if self.quick else 10
        agents = [f"/agents/fan-{i:04d}" for i in range(subscribers)]
        auth = {"Authorization": f"Bearer {gateway.platform}"}
        # Only agents subscribe (behaviour §6.6): each line pair makes the agent, then subscribes it.
        lines = b"\n".join(
            orjson.dumps(command)
            for a in agents
            for command in (
                {"streamPath": a, "type": AGENT_CREATED, "payload": {}},
                {"streamPath": a, "type": AGENT_SUBSCRIBED, "payload": {"source": SOURCE, "eventTypes": [TICK]}},
            )
        )
        async with session.post(
            f"{gateway.url}/v1/streams/-/events:batch?wait=true", data=lines, headers=auth
        ) as reply:
            result = await reply.json()
            assert reply.status == 200 and result["failed"] == 0, result
        await asyncio.to_thread(self._wait_for_subscribers, stack, subscribers)

        follower = JournalFollower(stack.client.topics.journal, SOURCE)
        follower.start()
        latencies: list[float] = []
        complete: list[float] = []
        try:
            for n in range(events):
                posted = time.time()
                async with session.post(
                    f"{gateway.url}/v1/streams{SOURCE}/events?wait=true",
                    data=orjson.dumps({"type": TICK, "payload": {"n": n}}),
                    headers={**auth, "Content-Type": "application/json"},
                ) as reply:
                    offset = (await reply.json())["offset"]
                times = await asyncio.to_thread(follower.wait, offset, subscribers, 180)
                latencies.extend(t - posted for t in times)
                complete.append(max(times) - posted)
        finally:
            follower.close()
        self.rows.append(
            (
                f"fan-out to {subscribers} subscribers: POST -> item journaled p50 / p99 / max ({events} events)",
                f"{statistics.median(latencies) * 1000:.0f} ms / {percentile(latencies, 0.99) * 1000:.0f} ms / "
                f"{max(latencies) * 1000:.0f} ms",
            )
        )
        self.rows.append(
            (
                f"fan-out: all {subscribers} items journaled, median per event",
                f"{statistics.median(complete) * 1000:.0f} ms",
            )
        )

    def _wait_for_subscribers(self, stack: Stack, count: int, timeout: float = 300) -> None:
        from pipeline.router import decode_routes

        deadline = time.monotonic() + timeout
        changelog = f"{self.router_app_id}-subscriptions-changelog"
        while time.monotonic() < deadline:
            latest = None
            with contextlib.suppress(Exception):
                for record in stack.read_topic(changelog):
                    if record.key() == SOURCE.encode():
                        latest = record.value()
            if latest is not None and len(decode_routes(latest)) >= count:
                return
            time.sleep(1)
        raise RuntimeError("the router never held every subscription")

    # ---------------------------------------------------------------------------------------------

    async def run(self) -> None:
        ingest = self.stack("ingest")  # no journal worker: ingestion is measured up to Kafka's ack
        ingest_gateway = self.gateway(ingest, "ingest")
        connector = aiohttp.TCPConnector(limit=128)
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            await ingest_gateway.wait_ready(session)
            print(f"gateway pid {ingest_gateway.process.pid}", flush=True)
            if "ndjson" in self.phases:
                print("NDJSON batch ingestion vs a raw producer ...", flush=True)
                await self.batch_ingestion(session, ingest_gateway, ingest)
            if "post" in self.phases:
                print("single-event POSTs: saturation, then latency at half of it ...", flush=True)
                await self.single_events(session, ingest_gateway)
            ingest_gateway.stop()
            if "fanout" in self.phases:
                routed = self.stack("routed")
                routed.start_worker()
                self._start_router(routed)
                routed_gateway = self.gateway(routed, "routed")
                await routed_gateway.wait_ready(session)
                print("routing fan-out to 1,000 subscribers ...", flush=True)
                await self.fanout(session, routed_gateway, routed)

    def _start_router(self, routed: Stack) -> None:
        router_env = {
            **routed.env(),
            "AGENTSTREAM_ROUTER_APP_ID": self.router_app_id,
            "AGENTSTREAM_ROUTER_METRICS_PORT": "0",
        }
        router_log = (self.tmp / "router.log").open("ab")
        self.processes.append(
            subprocess.Popen(
                [str(BIN / "agentstream"), "worker", "router"],
                env=router_env,
                stdout=router_log,
                stderr=subprocess.STDOUT,
            )
        )

    def close(self) -> None:
        for gateway in self.gateways:
            gateway.stop()
        for process in self.processes:
            _stop(process)
        prefixes = [stack.settings.topic_prefix for stack in self.stacks]
        for stack in self.stacks:
            stack.close()
        admin = AdminClient({"bootstrap.servers": BOOTSTRAP, "log_level": 3})
        leftovers = [
            t
            for t in admin.list_topics(timeout=10).topics
            if t.startswith(self.router_app_id) or any(t.startswith(p) for p in prefixes)
        ]
        if leftovers:
            for future in admin.delete_topics(leftovers, operation_timeout=10).values():
                with contextlib.suppress(Exception):
                    future.result()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def report(self) -> None:
        width = max(len(name) for name, _ in self.rows)
        print()
        for name, value in self.rows:
            print(f"{name.ljust(width)}  {value}")


class JournalFollower:
    """Reads agent-journal from its end; records each routed item's createdAt by source offset."""

    def __init__(self, topic: str, source: str) -> None:
        self.consumer = Consumer(consumer_config("bench-gateway"))
        partitions = self.consumer.list_topics(topic, timeout=10).topics[topic].partitions
        assignment = []
        for p in partitions:
            tp = TopicPartition(topic, p)
            _, tp.offset = watermarks(self.consumer, tp)
            assignment.append(tp)
        self.consumer.assign(assignment)
        self.prefix = f"route/{source}@"
        self.times: dict[int, list[float]] = {}
        self.cond = threading.Condition()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            for message in consume_ready(self.consumer, 1000, 0.1):
                if message.error() is not None or b'"idempotencyKey":"route/' not in message.value():
                    continue
                event = orjson.loads(message.value())
                key = event.get("idempotencyKey", "")
                if key.startswith(self.prefix):
                    journaled = datetime.datetime.fromisoformat(event["createdAt"].replace("Z", "+00:00"))
                    with self.cond:
                        self.times.setdefault(int(key[len(self.prefix) :]), []).append(journaled.timestamp())
                        self.cond.notify_all()

    def wait(self, offset: int, count: int, timeout: float) -> list[float]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.times.get(offset, [])) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RuntimeError(f"only {len(self.times.get(offset, []))} of {count} routed items journaled")
                self.cond.wait(remaining)
            return list(self.times[offset])

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(10)
        self.consumer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short run (smaller counts, shorter windows)")
    parser.add_argument(
        "--only",
        action="append",
        choices=PHASES,
        help="run only this phase (repeatable; default: all three)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="NDJSON rounds of each side (default 3)")
    args = parser.parse_args(argv)
    ensure_broker()
    bench = Bench(args.quick, set(args.only or PHASES), args.rounds)
    try:
        uvloop.run(bench.run())
    finally:
        bench.close()
    bench.report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
