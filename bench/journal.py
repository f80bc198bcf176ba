"""The journal pipeline against the local broker: throughput, latency, replay, changelog bytes.

    .venv/bin/python bench/journal.py [--quick] [--partitions 4]

Needs the local broker (`bash scripts/kafka/start.sh`). Uses its own topic prefix, Faust app id and
data directory, runs the journal worker as a subprocess (`agentstream worker journal`, the same
process the tests start), and deletes its topics at the end. Each figure is printed beside a
baseline measured in the same run on the same machine:

- sustained appends/s: valid AppendCommand JSON (with append ids, as the client API sends them)
  produced as fast as possible with confluent-kafka straight to agent-appends over 200 raw streams;
  the rate is n over the time from the first command produced to the last one journaled, the
  best of two runs after a warm-up over the same streams (records become visible a transaction at
  a time, so no window inside a run).
  Baseline: a Python confluent-kafka consume→produce loop copying one topic to another (same
  partition count, also a subprocess, acks=all), started on a backlog of the same commands (more
  of them: it is fast), its rate read on its output topic between the moments 10% and 100% of the
  records had arrived (its output is continuous, not transactional). Second baseline, the one
  that holds across machines: decode + fold of the journal records written so far, in this
  process (target: the worker at >= 25% of it). The same comparison in CPU time: the worker
  process's CPU (all its threads, from /proc) per append in the sustained runs, against this
  process's CPU per event of decode + fold. Other processes on the cores (the broker, this
  bench's producer) slow the worker's wall clock, not its CPU per append, so this ratio moves less
  between runs.
- fencing's cost: sustained appends/s with Kafka transactions (the default) against the same build
  with `AGENTSTREAM_TRANSACTIONS=false`, run alternately (target: at least 85%).
- append→journaled latency p50/p99 at a fixed offered load (paced producer): consume time of the
  journal record minus produce time of the command. Baseline: the same load through the raw loop.
  Then at half the sustained rate, with transactions and without (target: p99 <= 50 ms).
- commit pacing's effect: CPU per append of the worker and of the broker (from /proc) at a
  moderate paced load of 500 appends/s, with `AGENTSTREAM_COMMIT_INTERVAL_MS=0` against the
  default, alternately, beside append->journaled p50/p99 of the same runs.
- replay events/s of `agentstream replay`, each run in a fresh process as a user runs it, over the
  whole journal written by the run (topped up with a realistic mix through the workers' door:
  keyed slots, idempotency keys, requests with answers, settlements and usage reports,
  compactions), with `--jobs 1` and `--jobs 2`, beside a raw
  confluent-kafka consume of the same topic (no processing) and the pure fold rate of the same
  records: decode (JSON bytes -> validated event) + fold, in this process, no Kafka, no rows (what
  `bench/reduce.py` measures, with the journal worker's GC policy and with replay's). Targets:
  jobs 1 >= 60% of the pure fold; jobs 2 >= 1.5x jobs 1.
- traces' cost (`--traces`: only this): sustained appends/s with tracing off (no `OTEL_*`
  variable, commands without a traceparent) against on (`OTEL_EXPORTER_OTLP_ENDPOINT` naming an
  OTLP/HTTP sink in this process that accepts and drops every batch, every command carrying a
  traceparent as a tracing client sends it, so the worker makes one `agentstream.journal` span per
  command and exports it), run alternately, best of each (docs/behaviour.md §8).
- changelog bytes per appended context event (sum of key + value sizes of the records read back from
  `<app_id>-rows-changelog`) while one stream's projection holds ~10 items, and ~10 000 items.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import orjson  # noqa: E402
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from bench.turns import broker_pid, process_cpu_s  # noqa: E402
from pipeline.journal import heap  # noqa: E402
from pipeline.kafka.read import consume_ready, read_ranges, watermarks  # noqa: E402
from processors.reducer import fold  # noqa: E402
from processors.state import AgentState  # noqa: E402
from schemas.events import (  # noqa: E402
    CONTEXT_ADDED,
    LLM_REQUEST_REQUESTED,
    LLM_REQUEST_SETTLED,
    TOKEN_USAGE_REPORTED,
    EnvelopeError,
    decode_event,
)
from tests.kafka_stack import RecordCounter, consumer_config  # noqa: E402
from topics.names import topic_names  # noqa: E402

BOOTSTRAP = os.environ.get("AGENTSTREAM_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
ACTOR = {"type": "user", "origin": "cli"}
# The summary line of `agentstream replay` (pipeline/cli/replay_verb.py).
# The moderate load of the commit-pacing figure: below any saturation on two cores.
MODERATE_RATE = 500

REPLAYED = re.compile(r"replayed (?P<events>\d+) events of \d+ streams in [\d.]+s \((?P<rate>[\d,]+) events/s\)")

# --- helpers --------------------------------------------------------------------------------------


def command(path: str, content: str) -> bytes:
    """One AppendCommand as the client API writes it (appendId included)."""
    return orjson.dumps(
        {
            "streamPath": path,
            "type": CONTEXT_ADDED,
            "payload": {"role": "user", "content": content, "actor": ACTOR},
            "appendId": uuid.uuid4().hex,
        }
    )


def new_producer(**extra: Any) -> Producer:
    return Producer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "partitioner": "murmur2_random",  # the client API's partitioner: same partition everywhere
            "linger.ms": 2,
            "acks": "all",
            "enable.idempotence": True,
            "log_level": 3,
            **extra,
        }
    )


def produce_all(
    producer: Producer, topic: str, records: list[tuple[bytes, bytes]], headers: list[tuple[str, bytes]] | None = None
) -> None:
    for key, value in records:
        while True:
            try:
                if headers is None:
                    producer.produce(topic, key=key, value=value)
                else:
                    producer.produce(topic, key=key, value=value, headers=headers)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush(60)


class Watermarks:
    """A topic's end offsets: where a later read starts, and whether anything was written meanwhile.
    Not a record count: transaction markers take offsets too (`RecordCounter` counts records)."""

    def __init__(self, topic: str, partitions: int) -> None:
        self.consumer = Consumer(consumer_config("bench-watermarks"))
        self.tps = [TopicPartition(topic, p) for p in range(partitions)]

    def total(self) -> int:
        return sum(watermarks(self.consumer, tp)[1] for tp in self.tps)

    def per_partition(self) -> list[int]:
        return [watermarks(self.consumer, tp)[1] for tp in self.tps]

    def close(self) -> None:
        self.consumer.close()


def wait_for_count(
    marks: RecordCounter, target: int, timeout: float, samples: list[tuple[float, int]] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        count = marks.total()
        if samples is not None:
            samples.append((time.perf_counter(), count))
        if count >= target:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out: {count} of {target} records after {timeout:.0f}s")
        time.sleep(0.005)


def sustained_rate(samples: list[tuple[float, int]], start: int, n: int) -> float:
    """Records/s between the moments 10% and 100% of the n records had arrived. When the last 90%
    all arrived between two samples (a fast loop on a quiet machine), from the sample before."""
    first = next(index for index, (_, c) in enumerate(samples) if c - start >= n // 10)
    if first == len(samples) - 1:
        first = max(0, first - 1)
    (t10, c10), (t_end, c_end) = samples[first], samples[-1]
    return (c_end - c10) / (t_end - t10)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# --- the replay mix -------------------------------------------------------------------------------

MIX_ACTORS: list[dict[str, Any] | None] = [
    None,
    {"type": "user", "origin": "web"},
    {"type": "integration", "name": "github"},
    {"type": "slack", "userId": "U123"},
]


def mix_commands(path: str, count: int, rng: random.Random) -> list[bytes]:
    """About `count` commands of one stream, in order, as the workers' door takes them: context in
    both lanes (keyed slots, actors, refs), a fifth with idempotency keys and half with append ids,
    a request every ~10 items (its answer, settlement and usage report, keyed as the caller keys
    them) and a compaction every ~300 events. Offsets are predictable: nothing is rejected."""
    commands: list[bytes] = []
    offset = 0
    history: list[int] = []

    def add(event_type: str, payload: dict[str, Any], key: str | None = None, append_id: bool = False) -> int:
        nonlocal offset
        offset += 1
        command: dict[str, Any] = {"streamPath": path, "type": event_type, "payload": payload}
        if key is not None:
            command["idempotencyKey"] = key
        if append_id:
            command["appendId"] = uuid.uuid4().hex
        commands.append(orjson.dumps(command))
        return offset

    while len(commands) < count:
        roll = rng.random()
        if roll < 0.03:
            add(CONTEXT_ADDED, {"role": "system", "content": "Policy line " * 4, "key": f"policy/{rng.randrange(5)}"})
        else:
            role = "user" if roll < 0.5 else "developer"
            payload: dict[str, Any] = {"role": role, "content": "x" * rng.randrange(40, 400)}
            actor = MIX_ACTORS[1] if role == "user" else rng.choice(MIX_ACTORS)
            if actor is not None:
                payload["actor"] = actor
            if rng.random() < 0.2:
                payload["key"] = f"slot/{rng.randrange(50)}"
            if rng.random() < 0.3:
                payload["refs"] = [{"type": "event", "streamPath": "/integrations/github/main", "offset": offset + 1}]
            if rng.random() < 0.5:
                payload["llmRequestPolicy"] = {"behaviour": "dont-trigger-request"}
            key = f"web/{uuid.uuid4().hex[:12]}" if rng.random() < 0.2 else None
            history.append(add(CONTEXT_ADDED, payload, key, append_id=rng.random() < 0.5))
        if rng.random() < 0.1:
            request = add(LLM_REQUEST_REQUESTED, {"model": "bench", "expiresAt": 4_000_000_000_000}, f"r/{offset + 1}")
            answer = {"role": "assistant", "content": "answer " * 20, "llmRequestOffset": request}
            history.append(add(CONTEXT_ADDED, answer, f"answer/{request}"))
            result = {"status": "succeeded", "text": "answer"}
            add(LLM_REQUEST_SETTLED, {"requestOffset": request, "durationMs": 900, "result": result}, f"s/{request}")
            usage = {
                "llmRequestOffset": request,
                "model": "bench",
                "maxContextTokens": 128_000,
                "inputTokens": 1200,
                "outputTokens": 80,
                "cachedInputTokens": 1000,
            }
            add(TOKEN_USAGE_REPORTED, usage, f"usage/{request}")
        if len(history) > 200 and rng.random() < 0.01:
            cutoff = history[len(history) // 2]
            del history[: len(history) // 2 + 1]
            summary = {
                "role": "developer",
                "content": "Summary of earlier conversation. " * 10,
                "compaction": {"replacesHistoryThrough": cutoff},
                "llmRequestPolicy": {"behaviour": "dont-trigger-request"},
            }
            add(CONTEXT_ADDED, summary, f"compaction/{offset + 1}")
    return commands


def pure_fold_rate(partitions: list[list[bytes]], worker_gc: bool) -> float:
    """Events/s of decode (JSON bytes -> validated event) + fold alone, partition after partition."""
    return pure_fold(partitions, worker_gc)[0]


def pure_fold(partitions: list[list[bytes]], worker_gc: bool) -> tuple[float, float]:
    """Decode (JSON bytes -> validated event) + fold alone, partition after partition: events per
    second of wall clock, and this process's CPU microseconds per event.

    `worker_gc`: the journal worker's GC policy (`pipeline/journal/heap.py`, as bench/reduce.py); else
    replay's (no collections while folding).
    """
    states: dict[str, AgentState] = {}
    count = 0
    gc.collect()
    if not worker_gc:
        gc.disable()
    start, cpu = time.perf_counter(), time.process_time()
    for values in partitions:
        for value in values:
            try:
                event = decode_event(value)
            except EnvelopeError:
                continue
            state = states.get(event.streamPath)
            if state is None:
                state = states[event.streamPath] = AgentState()
            if event.offset > state.cursor:
                fold(state, event)
            count += 1
            if worker_gc and count % heap.SETTLE_EVERY == 0:
                heap.settle()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    gc.unfreeze()
    gc.enable()
    return count / elapsed, cpu * 1e6 / count


# --- the raw pass-through baseline ----------------------------------------------------------------


def passthrough_main(source: str, target: str) -> None:
    """A plain confluent-kafka consume→produce loop (run as a subprocess, like the worker)."""
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": f"bench-passthrough-{source}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "fetch.wait.max.ms": 10,
            "log_level": 3,
        }
    )
    producer = Producer(
        {"bootstrap.servers": BOOTSTRAP, "linger.ms": 1, "acks": "all", "enable.idempotence": True, "log_level": 3}
    )
    consumer.subscribe([source])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.is_set():
        for message in consume_ready(consumer, 1000, 0.05):
            if message.error() is not None:
                continue
            while True:
                try:
                    producer.produce(target, key=message.key(), value=message.value(), partition=message.partition())
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.poll(0)
    producer.flush(10)
    consumer.close()


class OtlpSink:
    """An OTLP/HTTP endpoint that accepts every span batch and drops it: what the worker pays to
    trace and export, without a trace backend's own cost on this machine."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        sink = self
        self.batches = 0
        self.bytes = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("content-length") or 0)
                self.rfile.read(size)
                sink.batches += 1
                sink.bytes += size
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- the bench ------------------------------------------------------------------------------------


class Bench:
    def __init__(self, quick: bool, partitions: int, latency_rate: float = 2000.0, traces: bool = False) -> None:
        from tests.kafka_stack import Stack

        self.quick = quick
        self.traces = traces
        self.partitions = partitions
        self.latency_rate = latency_rate
        self.tmp = Path(tempfile.mkdtemp(prefix="agentstream-bench-"))
        self.stack = Stack(self.tmp / "data", partitions=partitions)
        self.settings = self.stack.settings
        self.topics = topic_names(self.settings.topic_prefix)  # no Client: its result follower costs CPU
        self.journal_marks = RecordCounter(self.topics.journal, partitions)
        self.producer = new_producer()
        self.raw_topics = [f"{self.settings.topic_prefix}raw-in", f"{self.settings.topic_prefix}raw-out"]
        self.passthrough: subprocess.Popen[bytes] | None = None
        self.rows: list[tuple[str, str, str, str]] = []  # (figure, value, baseline, ratio)
        self.notes: list[str] = []
        self.paced_cpu_us: dict[str, float] = {}  # per process, of the last `latency` run
        # The journal worker's CPU (every thread) per append in each throughput run, in microseconds.
        self.worker_cpu_us: list[float] = []

    # the worker ---------------------------------------------------------------------------------

    def start_worker(self) -> None:
        self.stack.start_worker()
        # Ready when a first append is journaled (group joined, partitions recovered).
        before = self.journal_marks.total()
        produce_all(self.producer, self.topics.appends, [(b"/bench/warmup", command("/bench/warmup", "warm-up"))])
        wait_for_count(self.journal_marks, before + 1, timeout=120)

    def restart_worker(self, **settings: Any) -> None:
        """The journal worker again, with these settings changed (`transactions`: writing in Kafka
        transactions or not, `commit_interval_ms`: commit pacing)."""
        self.stack.stop_worker()
        self.stack.settings = self.settings = self.settings.model_copy(update=settings)
        self.start_worker()

    def restart_worker_traced(self, traced: bool, endpoint: str) -> None:
        """The journal worker again, with the standard OTel variables set (tracing on) or not."""
        self.stack.stop_worker()
        if traced:
            os.environ.update({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "bench-journal"})
        else:
            for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME"):
                os.environ.pop(name, None)
        try:
            self.start_worker()
        finally:
            for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME"):
                os.environ.pop(name, None)

    def traces_cost(self, n: int) -> None:
        """Sustained appends/s with tracing off and on, alternately (docs/behaviour.md §8)."""
        sink = OtlpSink()
        rates: dict[bool, list[float]] = {False: [], True: []}
        try:
            for traced in (False, True, False, True):
                self.restart_worker_traced(traced, sink.endpoint)
                rates[traced].append(self.throughput(n, traced=traced))
                print(f"[bench]   tracing {'on' if traced else 'off'}: {rates[traced][-1]:,.0f} /s", file=sys.stderr)
        finally:
            self.restart_worker_traced(False, sink.endpoint)
            sink.close()
        on, off = max(rates[True]), max(rates[False])
        self.add("sustained appends/s, tracing on", f"{on:,.0f} /s", f"tracing off {off:,.0f} /s", f"{on / off:.0%}")
        self.notes.append(
            "tracing on: "
            + ", ".join(f"{r:,.0f}" for r in rates[True])
            + " /s; off: "
            + ", ".join(f"{r:,.0f}" for r in rates[False])
            + f" /s (each run in order); the sink received {sink.batches} span batches, {sink.bytes:,} bytes"
        )

    def worker_pid(self) -> int:
        assert self.stack.worker is not None
        return self.stack.worker.pid

    # 1. throughput ------------------------------------------------------------------------------

    def throughput(self, n: int, streams: int = 200, traced: bool = False) -> float:
        paths = [f"/bench/t{i:03d}" for i in range(streams)]
        records = [(paths[i % streams].encode(), command(paths[i % streams], f"t#{i}")) for i in range(n)]
        headers = [("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")] if traced else None
        start = self.journal_marks.total()
        samples: list[tuple[float, int]] = []
        waiter = threading.Thread(target=wait_for_count, args=(self.journal_marks, start + n, 600, samples))
        waiter.start()
        cpu_before = process_cpu_s(self.worker_pid())
        produced_at = time.perf_counter()
        produce_all(self.producer, self.topics.appends, records, headers)
        waiter.join()
        cpu_after = process_cpu_s(self.worker_pid())
        if cpu_before is not None and cpu_after is not None:
            self.worker_cpu_us.append((cpu_after - cpu_before) * 1e6 / n)
        # From the first command produced to the last journaled: records become visible a whole
        # checkpoint (transaction) at a time, so a window between two sample counts would measure
        # the spacing of a few large commits, not the rate.
        return n / (samples[-1][0] - produced_at)

    def raw_throughput(self, n: int, streams: int = 200) -> float:
        """The pass-through loop draining a backlog of `n` commands produced before it starts."""
        source, target = self.raw_topics
        admin = AdminClient({"bootstrap.servers": BOOTSTRAP, "log_level": 3})
        futures = admin.create_topics([NewTopic(name, self.partitions, 1) for name in self.raw_topics])
        for future in futures.values():
            future.result()
        time.sleep(1)  # leaders settle
        paths = [f"/bench/t{i:03d}" for i in range(streams)]
        produce_all(
            self.producer,
            source,
            [(paths[i % streams].encode(), command(paths[i % streams], f"t#{i}")) for i in range(n)],
        )
        marks = RecordCounter(target, self.partitions)
        try:
            samples: list[tuple[float, int]] = []
            self.passthrough = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--passthrough", *self.raw_topics]
            )
            wait_for_count(marks, n, timeout=600, samples=samples)
            return sustained_rate(samples, 0, n)
        finally:
            marks.close()

    def stop_passthrough(self) -> None:
        if self.passthrough is not None and self.passthrough.poll() is None:
            self.passthrough.terminate()
            try:
                self.passthrough.wait(15)
            except subprocess.TimeoutExpired:
                self.passthrough.kill()
                self.passthrough.wait()

    # 2. latency ---------------------------------------------------------------------------------

    def latency(
        self,
        source: str,
        sink: str,
        rate: float,
        seconds: float,
        streams: int = 200,
        cpu_of: dict[str, int] | None = None,
    ) -> list[float]:
        """Latencies (ms) of `rate` commands/s sent to `source` for `seconds`, seen arriving in `sink`.

        `cpu_of` (name -> pid): the CPU each of these processes spent per counted command, from the
        first one after the warm-up second to the last one's arrival, in `self.paced_cpu_us`.
        """
        cpu_of = cpu_of or {}
        consumer = Consumer(consumer_config("bench-latency", **{"fetch.wait.max.ms": 5}))
        tps = [TopicPartition(sink, p) for p in range(self.partitions)]
        for tp in tps:
            tp.offset = watermarks(consumer, tp)[1]
        consumer.assign(tps)
        warm = int(rate)  # one second of probes first, not counted: connections and fetches settle
        n = warm + int(rate * seconds)
        sent_at = [0.0] * n
        received: dict[int, float] = {}
        done = threading.Event()
        tag = uuid.uuid4().hex[:6]
        marker = f"lat{tag}#".encode()

        def consume() -> None:
            while not done.is_set():
                for message in consume_ready(consumer, 1000, 0.05):
                    now = time.perf_counter()
                    value = message.value()
                    if message.error() is not None or not value:
                        continue
                    at = value.find(marker)
                    if at < 0:
                        continue
                    end = value.index(b'"', at)
                    received[int(value[at + len(marker) : end])] = now
                if len(received) >= n:
                    return

        reader = threading.Thread(target=consume)
        reader.start()
        time.sleep(0.5)  # the consumer has fetched its (empty) partitions
        paths = [f"/bench/l{i:03d}" for i in range(streams)]
        producer = new_producer(**{"linger.ms": 1})
        started = time.perf_counter()
        cpu_before: dict[str, float | None] = {}
        for i in range(n):
            if i == warm:
                cpu_before = {name: process_cpu_s(pid) for name, pid in cpu_of.items()}
            due = started + i / rate
            delay = due - time.perf_counter()
            if delay > 0.001:
                time.sleep(delay)
            path = paths[i % streams]
            value = command(path, f"lat{tag}#{i}")
            sent_at[i] = time.perf_counter()
            producer.produce(source, key=path.encode(), value=value)
            producer.poll(0)
        producer.flush(30)
        deadline = time.monotonic() + 120
        while len(received) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        self.paced_cpu_us = {}
        for name, pid in cpu_of.items():
            before, after = cpu_before.get(name), process_cpu_s(pid)
            if before is not None and after is not None:
                self.paced_cpu_us[name] = (after - before) * 1e6 / (n - warm)
        done.set()
        reader.join()
        consumer.close()
        if len(received) < n:
            raise RuntimeError(f"only {len(received)} of {n} latency probes arrived")
        return [(received[i] - sent_at[i]) * 1000 for i in range(warm, n)]

    def paced_cost(self, seconds: float) -> None:
        """CPU per append of the worker and the broker at a moderate paced load, commit pacing off
        (`AGENTSTREAM_COMMIT_INTERVAL_MS=0`) and on (the default), alternately: what a deployment
        that is not saturated pays per append, against the backlog's figure."""
        pacing = self.settings.commit_interval_ms
        runs: dict[bool, list[tuple[float, float, list[float]]]] = {False: [], True: []}
        for paced in (False, True, False, True):  # ends with the default, as the worker runs
            self.restart_worker(commit_interval_ms=pacing if paced else 0)
            time.sleep(3)  # the broker settles after the run before (seconds of backlog at half the rate)
            mode = "on" if paced else "off"
            print(f"[bench] 2c. CPU per append at {MODERATE_RATE}/s, commit pacing {mode}", file=sys.stderr, flush=True)
            pids = {"worker": self.worker_pid(), "broker": broker_pid() or 0}
            lat = self.latency(self.topics.appends, self.topics.journal, MODERATE_RATE, seconds, cpu_of=pids)
            runs[paced].append(
                (self.paced_cpu_us.get("worker", math.nan), self.paced_cpu_us.get("broker", math.nan), lat)
            )
        cost = {paced: min(runs[paced], key=lambda run: run[0] + run[1]) for paced in runs}
        (worker_on, broker_on, lat_on), (worker_off, broker_off, lat_off) = cost[True], cost[False]
        self.add(
            f"worker + broker CPU per append @ {MODERATE_RATE}/s",
            f"{worker_on + broker_on:,.0f} us (worker {worker_on:,.0f}, broker {broker_on:,.0f})",
            f"pacing off {worker_off + broker_off:,.0f} us (worker {worker_off:,.0f}, broker {broker_off:,.0f})",
            f"{(worker_on + broker_on) / (worker_off + broker_off):.0%} of it",
        )
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            value, base = percentile(lat_on, q), percentile(lat_off, q)
            self.add(
                f"append->journaled {name} @ {MODERATE_RATE}/s, pacing on",
                f"{value:.1f} ms",
                f"pacing off {base:.1f} ms",
                f"x{value / base:.1f}",
            )
        self.notes.append(
            f"at {MODERATE_RATE}/s, worker + broker CPU per append (us), pacing off: "
            + ", ".join(f"{w + b:,.0f}" for w, b, _ in runs[False])
            + "; on: "
            + ", ".join(f"{w + b:,.0f}" for w, b, _ in runs[True])
            + f" (commit interval {pacing} ms); the broker's figure includes its idle work"
        )

    # 3. replay ----------------------------------------------------------------------------------

    def append_replay_mix(self, streams: int, per_stream: int) -> int:
        """The mix through agent-internal-appends (answers, settlements, usage and compactions are
        the workers' to write), streams interleaved; returns once every command is journaled."""
        rng = random.Random(7)
        queues = [
            [(path.encode(), value) for value in mix_commands(path, per_stream, rng)]
            for path in (f"/bench/m{i:03d}" for i in range(streams))
        ]
        records = [record for group in zip(*queues, strict=False) for record in group]
        records += [record for queue in queues for record in queue[min(map(len, queues)) :]]
        before = self.journal_marks.total()
        produce_all(self.producer, self.topics.internal_appends, records)
        wait_for_count(self.journal_marks, before + len(records), timeout=600)
        return len(records)

    def replay_rate(self, jobs: int = 1) -> tuple[float, int]:
        """`agentstream replay --jobs N` as a user runs it, in a fresh process (whose helpers are
        then forked, where this one, with its Kafka clients' threads, would spawn them): the rate
        it reports, from its own clock."""
        cli = str(Path(sys.executable).parent / "agentstream")
        result = subprocess.run(
            [cli, "replay", "--jobs", str(jobs), "--quiet", "--out", str(self.tmp / f"replay-{jobs}")],
            env=self.stack.env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
        found = REPLAYED.search(result.stdout)
        if result.returncode != 0 or found is None:
            raise RuntimeError(f"replay --jobs {jobs} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
        return float(found["rate"].replace(",", "")), int(found["events"])

    def journal_values(self) -> list[list[bytes]]:
        """Every journal record's value, per partition (read before timing the pure fold)."""
        consumer = Consumer(consumer_config("bench-journal-values"))
        topic = self.topics.journal
        try:
            partitions: list[list[bytes]] = []
            for p in range(self.partitions):
                ranges = {p: watermarks(consumer, TopicPartition(topic, p))}
                batches = read_ranges(consumer, topic, ranges, max_messages=5000, poll_s=1.0)
                partitions.append([message.value() for batch in batches for message in batch])
            return partitions
        finally:
            consumer.close()

    def raw_consume_rate(self) -> tuple[float, int]:
        consumer = Consumer(
            consumer_config("bench-raw-consume", **{"enable.partition.eof": False, "fetch.max.bytes": 64 << 20})
        )
        topic = self.topics.journal
        try:
            started = time.monotonic()
            # All partitions at once, each up to its end offset.
            ranges = {p: watermarks(consumer, TopicPartition(topic, p)) for p in range(self.partitions)}
            count = sum(len(batch) for batch in read_ranges(consumer, topic, ranges, max_messages=5000, poll_s=1.0))
            return count / (time.monotonic() - started), count
        finally:
            consumer.close()

    # 4. changelog bytes -------------------------------------------------------------------------

    def changelog_topic(self) -> str:
        return f"{self.settings.app_id}-rows-changelog"

    def append_and_settle(self, path: str, contents: list[str]) -> None:
        """Append to one stream, wait until journaled, then until the changelog stops growing."""
        before = self.journal_marks.total()
        records = [(path.encode(), command(path, c)) for c in contents]
        produce_all(self.producer, self.topics.appends, records)
        wait_for_count(self.journal_marks, before + len(records), timeout=600)
        changelog = Watermarks(self.changelog_topic(), self.partitions)
        try:
            last, stable_since = -1, time.monotonic()
            while time.monotonic() - stable_since < 1.0:
                total = changelog.total()
                if total != last:
                    last, stable_since = total, time.monotonic()
                time.sleep(0.05)
        finally:
            changelog.close()

    def changelog_bytes(self, path: str, items: int, extra: int) -> tuple[float, float]:
        """(bytes, records) of changelog per appended event while the projection holds ~`items` items."""
        batch = 5000
        for start in range(0, items, batch):
            self.append_and_settle(path, [f"grow#{i}" for i in range(start, min(items, start + batch))])
        changelog = Watermarks(self.changelog_topic(), self.partitions)
        start_offsets = changelog.per_partition()
        changelog.close()
        self.append_and_settle(path, [f"more#{i}" for i in range(extra)])
        size, records = self.read_range(self.changelog_topic(), start_offsets)
        return size / extra, records / extra

    def read_range(self, topic: str, starts: list[int]) -> tuple[int, int]:
        consumer = Consumer(consumer_config("bench-changelog"))
        try:
            size = records = 0
            for p, start in enumerate(starts):
                _, high = watermarks(consumer, TopicPartition(topic, p))
                for batch in read_ranges(consumer, topic, {p: (start, high)}, max_messages=5000, poll_s=1.0):
                    size += sum(len(message.key() or b"") + len(message.value() or b"") for message in batch)
                    records += len(batch)
            return size, records
        finally:
            consumer.close()

    # the run ------------------------------------------------------------------------------------

    def add(self, figure: str, value: str, baseline: str, ratio: str) -> None:
        self.rows.append((figure, value, baseline, ratio))
        print(f"  {figure}: {value}  (baseline {baseline}; {ratio})", file=sys.stderr, flush=True)

    def run(self) -> None:
        quick = self.quick
        n_throughput = 6_000 if quick else 40_000
        n_raw = 60_000 if quick else 200_000  # the raw loop is fast: a longer run for a stable rate
        latency_rate, latency_s = self.latency_rate, (5.0 if quick else 20.0)
        big_items, extra = (10_000, 200) if quick else (10_000, 500)
        progress = sys.stderr
        started = time.monotonic()

        print(f"[bench] topics prefix {self.settings.topic_prefix}, data {self.tmp}", file=progress, flush=True)
        self.start_worker()
        if self.traces:
            print(f"[bench] traces: {n_throughput} commands, tracing off and on, alternately", file=progress)
            self.throughput(n_throughput // 4)  # warm-up
            self.traces_cost(n_throughput)
            return

        print(f"[bench] 1. throughput: {n_throughput} commands over 200 streams", file=progress, flush=True)
        raw = self.raw_throughput(n_raw)
        # Sustained: a warm-up over the same streams first (their first events create rows and
        # cached states), then the best of two runs, as the fold below is the best of three.
        self.throughput(n_throughput // 4)
        self.worker_cpu_us.clear()
        sustained = [self.throughput(n_throughput) for _ in range(2)]
        worker_cpu = min(self.worker_cpu_us, default=float("nan"))
        piped = max(sustained)
        self.notes.append("sustained appends/s (transactions on): " + ", ".join(f"{r:,.0f}" for r in sustained))
        self.add("sustained appends/s", f"{piped:,.0f} /s", f"raw pass-through {raw:,.0f} /s", _ratio(piped, raw, 0.10))
        # The figure that holds across machines: the worker against decode + fold of the very
        # records it journaled (the target: at least 25%).
        written = self.journal_values()
        folds = [pure_fold(written, worker_gc=True) for _ in range(3)]
        fold_rate, fold_cpu = max(rate for rate, _ in folds), min(cpu for _, cpu in folds)
        del written
        self.add(
            "sustained appends/s vs pure fold",
            f"{piped:,.0f} /s",
            f"decode+fold {fold_rate:,.0f} /s (worker GC)",
            _ratio(piped, fold_rate, 0.25),
        )
        # The same comparison in CPU time, which other processes on the cores (the broker, this
        # bench's producer) do not move: what one append costs the worker against one event's fold.
        self.add(
            "worker CPU per append vs pure fold",
            f"{worker_cpu:.1f} us",
            f"decode+fold {fold_cpu:.1f} us/event",
            f"x{worker_cpu / fold_cpu:.1f}; the fold is {fold_cpu / worker_cpu:.0%} of it",
        )
        self.notes.append(
            "worker CPU per append (all its threads, from /proc): "
            + ", ".join(f"{cpu:.1f}" for cpu in self.worker_cpu_us)
            + " us in the sustained runs"
        )

        # Fencing's cost: the same build with transactions off (AGENTSTREAM_TRANSACTIONS=false), run
        # alternately with it on, best of each (other work on a shared machine only slows a run).
        print("[bench] 1b. throughput with transactions off and on, alternately", file=progress, flush=True)
        rates: dict[bool, list[float]] = {True: sustained, False: []}
        for transactions in (False, True, False, True):
            self.restart_worker(transactions=transactions)
            rates[transactions].append(self.throughput(n_throughput))
        fenced, unfenced = max(rates[True]), max(rates[False])
        self.add(
            "sustained appends/s, transactions on",
            f"{fenced:,.0f} /s",
            f"transactions off {unfenced:,.0f} /s",
            _ratio(fenced, unfenced, 0.85),
        )
        self.notes.append(
            "transactions on: "
            + ", ".join(f"{r:,.0f}" for r in rates[True])
            + " /s; off: "
            + ", ".join(f"{r:,.0f}" for r in rates[False])
            + " /s (each run in order)"
        )

        print(f"[bench] 2. latency at {latency_rate:.0f}/s for {latency_s:.0f}s", file=progress, flush=True)
        raw_lat = self.latency(self.raw_topics[0], self.raw_topics[1], latency_rate, latency_s)
        lat = self.latency(self.topics.appends, self.topics.journal, latency_rate, latency_s)
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            value, base = percentile(lat, q), percentile(raw_lat, q)
            target = " (target <= 50 ms)" if name == "p99" else ""
            ratio = f"x{value / base:.1f} of raw" + (f"; {'PASS' if value <= 50 else 'FAIL'}{target}" if target else "")
            self.add(f"append->journaled {name} @ {latency_rate:.0f}/s", f"{value:.1f} ms", f"raw {base:.1f} ms", ratio)
        self.notes.append(
            f"latency: {len(lat)} probes, mean {statistics.fmean(lat):.1f} ms, max {max(lat):.1f} ms "
            f"(raw: mean {statistics.fmean(raw_lat):.1f} ms, max {max(raw_lat):.1f} ms)"
        )
        # The fencing target: at half of what the worker sustains, p99 within 50 ms, with
        # transactions (the default) and without them, measured the same way.
        half = max(round(fenced / 2, -1), 10.0)
        half_lat: dict[bool, list[float]] = {}
        for transactions in (False, True):  # ends with transactions on, as the worker runs by default
            self.restart_worker(transactions=transactions)
            mode = "on" if transactions else "off"
            print(f"[bench] 2b. latency at {half:.0f}/s (half of sustained), transactions {mode}", file=progress)
            half_lat[transactions] = self.latency(self.topics.appends, self.topics.journal, half, latency_s)
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            value, base = percentile(half_lat[True], q), percentile(half_lat[False], q)
            verdict = f"; {'PASS' if value <= 50 else 'FAIL'} (target <= 50 ms)" if name == "p99" else ""
            self.add(
                f"append->journaled {name} @ {half:.0f}/s (half of sustained)",
                f"{value:.1f} ms",
                f"transactions off {base:.1f} ms",
                f"x{value / base:.1f}{verdict}",
            )
        self.paced_cost(latency_s)
        self.stop_passthrough()

        print(f"[bench] 4. changelog bytes per event at ~10 and ~{big_items} items", file=progress, flush=True)
        small, small_records = self.changelog_bytes("/bench/small", 10, extra)
        big, big_records = self.changelog_bytes("/bench/big", big_items, extra)
        self.add(
            f"changelog bytes/event @ {big_items:,} items",
            f"{big:,.0f} B ({big_records:.1f} records)",
            f"@ 10 items {small:,.0f} B ({small_records:.1f} records)",
            _ratio(big, small, None, within=0.20),
        )
        self.notes.append(
            f"changelog: {extra} context events appended to one stream holding 10 (-> {10 + extra}) and "
            f"{big_items:,} (-> {big_items + extra:,}) items; bytes = sum of key + value sizes of the "
            f"changelog records read back (not on-disk log size)"
        )

        streams, per_stream = (20, 400) if quick else (40, 1000)
        print(
            f"[bench] 3. replay: a mix of {streams} x ~{per_stream} events, then the whole journal",
            file=progress,
            flush=True,
        )
        mixed = self.append_replay_mix(streams, per_stream)
        self.stack.stop_worker()
        raw_rate, raw_count = self.raw_consume_rate()
        values = self.journal_values()
        pure = max(pure_fold_rate(values, worker_gc=True) for _ in range(3))
        pure_replay_gc = max(pure_fold_rate(values, worker_gc=False) for _ in range(3))
        del values
        # Best of three, alternating: other work on a shared machine only ever slows a run down.
        runs: dict[int, list[tuple[float, int]]] = {1: [], 2: []}
        for _ in range(3):
            for jobs in (1, 2):
                runs[jobs].append(self.replay_rate(jobs))
        (rate, events), (rate2, events2) = max(runs[1]), max(runs[2])
        self.add(
            "replay events/s (--jobs 1)",
            f"{rate:,.0f} /s ({events:,} events)",
            f"raw consume {raw_rate:,.0f} /s",
            f"{rate / raw_rate:.0%} of raw (the pure fold is the bound: next row)",
        )
        self.add(
            "replay --jobs 1 vs pure fold",
            f"{rate:,.0f} /s",
            f"decode+fold {pure:,.0f} /s (worker GC)",
            _ratio(rate, pure, 0.6),
        )
        self.add("replay --jobs 2 events/s", f"{rate2:,.0f} /s", f"--jobs 1 {rate:,.0f} /s", _times(rate2, rate, 1.5))
        self.notes.append(
            f"replay: journal of {events:,} events ({mixed:,} of them the mix: keyed slots, idempotency keys, "
            f"requests, answers, settlements, usage reports, compactions); pure fold = decode + fold of the same "
            f"records in this process (no Kafka, no rows); with replay's GC policy it is {pure_replay_gc:,.0f} /s "
            f"({rate / pure_replay_gc:.0%} of it for --jobs 1); replay rates are the best of three runs"
        )
        if not raw_count == events == events2:
            self.notes.append(f"replay folded {events}/{events2} events but the raw consume read {raw_count} records")
        self.notes.append(f"total bench time {time.monotonic() - started:.0f}s; {os.cpu_count()} CPUs")

    def report(self) -> None:
        headers = ("figure", "value", "baseline", "ratio")
        widths = [max(len(h), *(len(r[i]) for r in self.rows)) for i, h in enumerate(headers)]
        line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
        print(line)
        print("-" * len(line))
        for row in self.rows:
            print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
        for note in self.notes:
            print(f"note: {note}")

    def close(self) -> None:
        self.stop_passthrough()
        self.journal_marks.close()
        self.producer.flush(10)
        self.stack.close()
        admin = AdminClient({"bootstrap.servers": BOOTSTRAP, "log_level": 3})
        leftovers = [*self.raw_topics, f"{self.settings.app_id}-__assignor-__leader"]
        for future in admin.delete_topics(leftovers, operation_timeout=10).values():
            with contextlib.suppress(Exception):
                future.result()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _ratio(value: float, baseline: float, target: float | None, within: float | None = None) -> str:
    ratio = value / baseline if baseline else float("nan")
    if within is not None:
        ok = abs(ratio - 1) <= within
        return f"{ratio:.2f} ({'PASS' if ok else 'FAIL'}: target within {within:.0%})"
    assert target is not None
    return f"{ratio:.0%} ({'PASS' if ratio >= target else 'FAIL'}: target >= {target:.0%})"


def _times(value: float, baseline: float, target: float) -> str:
    ratio = value / baseline if baseline else float("nan")
    return f"{ratio:.2f}x ({'PASS' if ratio >= target else 'FAIL'}: target >= {target:.1f}x)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short run (smaller counts, shorter latency window)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of every topic (default 4)")
    parser.add_argument("--rate", type=float, default=5000.0, help="offered load of the latency run (default 5000/s)")
    parser.add_argument("--traces", action="store_true", help="only tracing's cost: appends/s off and on")
    parser.add_argument("--passthrough", nargs=2, metavar=("SOURCE", "TARGET"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.passthrough:
        passthrough_main(*args.passthrough)
        return 0
    from tests.kafka_stack import ensure_broker

    ensure_broker()
    bench = Bench(args.quick, args.partitions, args.rate, args.traces)
    try:
        bench.run()
    finally:
        bench.close()
    bench.report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
