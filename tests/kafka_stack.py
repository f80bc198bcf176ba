"""Integration-test support: the real local broker, an isolated topic set per test, a worker process.

Each `Stack` gets its own topic prefix, Faust app id and data directory, so tests never see each
other's records or rows. The journal worker runs as a real `agentstream worker journal` process that
a test can restart or SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from pipeline.client import Client, consume_ready, watermarks
from pipeline.settings import Settings
from topics.admin import ensure_topics
from topics.names import topic_specs

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
BOOTSTRAP = os.environ.get("AGENTSTREAM_BOOTSTRAP_SERVERS") or (
    f"127.0.0.1:{os.environ.get('AGENTSTREAM_KAFKA_PORT', '19092')}"  # the local broker (scripts/kafka)
)


def ensure_broker() -> None:
    """Start the local broker unless one answers (the start script is idempotent)."""
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "kafka" / "start.sh")], capture_output=True, text=True, timeout=300
    )
    if result.returncode != 0:
        raise RuntimeError(f"local Kafka broker did not start:\n{result.stdout}\n{result.stderr}")


class Stack:
    def __init__(self, data_dir: Path, partitions: int = 4, **overrides: Any) -> None:
        tag = uuid.uuid4().hex[:8]
        defaults: dict[str, Any] = {
            "bootstrap_servers": BOOTSTRAP,
            "topic_prefix": f"t{tag}-",
            "partitions": partitions,
            "data_dir": data_dir,
            "app_id": f"agentstream-test-{tag}",
            "worker_instance_id": f"agentstream-test-{tag}-0",  # static membership: a restart rejoins at once
            "caller_group": f"agentstream-caller-{tag}",
            "worker_port": 0,
            "metrics_port": 0,  # tests that scrape /metrics pass a free port
            "caller_metrics_port": 0,
            "log_level": "WARNING",
        }
        self.settings = Settings.from_env({}, **{**defaults, **overrides})
        self.specs = topic_specs(self.settings.topic_prefix, partitions, 1)
        ensure_topics(BOOTSTRAP, self.specs)
        self.worker: subprocess.Popen[bytes] | None = None
        self.caller: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir / "worker.log"
        self.caller_log_path = data_dir / "caller.log"
        self._client: Client | None = None
        self._internal_client: Client | None = None

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        for name, value in self.settings.model_dump(exclude_unset=True).items():
            env[f"AGENTSTREAM_{name.upper()}"] = json.dumps(value) if isinstance(value, dict | list) else str(value)
        return env

    def start_worker(self) -> None:
        assert self.worker is None or self.worker.poll() is not None
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.worker = subprocess.Popen(
            [str(BIN / "agentstream"), "worker", "journal"], env=self.env(), stdout=log, stderr=subprocess.STDOUT
        )

    def start_caller(self) -> None:
        """The LLM caller (`agentstream worker caller`) with this stack's settings."""
        assert self.caller is None or self.caller.poll() is not None
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        log = self.caller_log_path.open("ab")
        self.caller = subprocess.Popen(
            [str(BIN / "agentstream"), "worker", "caller"], env=self.env(), stdout=log, stderr=subprocess.STDOUT
        )

    def start_capabilities(self, **config: Any) -> subprocess.Popen[bytes]:
        """The capability host (`agentstream worker capabilities`) with this stack's settings and its own
        consumer group; `config`: HostConfig fields (AGENTSTREAM_CAPABILITIES_<NAME>)."""
        host: subprocess.Popen[bytes] | None = getattr(self, "capabilities", None)
        assert host is None or host.poll() is not None
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        env = self.env()
        env["AGENTSTREAM_CAPABILITIES_GROUP"] = f"{self.settings.app_id}-capabilities"
        env["AGENTSTREAM_CAPABILITIES_METRICS_PORT"] = "0"
        for name, value in config.items():
            env[f"AGENTSTREAM_CAPABILITIES_{name.upper()}"] = str(value)
        log = (self.settings.data_dir / "capabilities.log").open("ab")
        self.capabilities = subprocess.Popen(
            [str(BIN / "agentstream"), "worker", "capabilities"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        return self.capabilities

    def stop_capabilities(self, sig: int = signal.SIGTERM, timeout: float = 60) -> None:
        _stop(getattr(self, "capabilities", None), sig, timeout)

    def stop_worker(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        _stop(self.worker, sig, timeout)

    def stop_caller(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        _stop(self.caller, sig, timeout)

    def worker_log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.settings)
        return self._client

    @property
    def internal_client(self) -> Client:
        """A client with the workers' door (agent-internal-appends): for tests that play a worker."""
        if self._internal_client is None:
            self._internal_client = Client(self.settings, internal=True)
        return self._internal_client

    def produce_raw(self, value: bytes, key: bytes | None, *, internal: bool = False, partition: int = -1) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": BOOTSTRAP, "partitioner": "murmur2_random", "log_level": 3})
        topics = self.client.topics
        producer.produce(
            topics.internal_appends if internal else topics.appends, key=key, value=value, partition=partition
        )
        producer.flush(10)

    def read_topic(self, topic: str, timeout: float = 10.0) -> list[Any]:
        """Every record of a topic (all partitions) up to its current end."""
        consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "test-reader", "log_level": 3})
        try:
            partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            ends = {}
            assignment = []
            for p in partitions:
                low, high = watermarks(consumer, TopicPartition(topic, p))
                if high > low:
                    ends[p] = high
                    assignment.append(TopicPartition(topic, p, low))
            if not assignment:
                return []
            consumer.assign(assignment)
            records: list[Any] = []
            deadline = time.monotonic() + timeout
            done: set[int] = set()
            while len(done) < len(ends) and time.monotonic() < deadline:
                for message in consume_ready(consumer, 1000, 0.5):
                    if message.error() is not None:
                        continue
                    records.append(message)
                    if message.offset() + 1 >= ends[message.partition()]:
                        done.add(message.partition())
            return records
        finally:
            consumer.close()

    def close(self) -> None:
        for client in (self._client, self._internal_client):
            if client is not None:
                client.close()
        self.stop_caller()
        self.stop_capabilities()
        self.stop_worker()
        admin = AdminClient({"bootstrap.servers": BOOTSTRAP, "log_level": 3})
        names = [spec.name for spec in self.specs]
        faust_topics = [f"{self.settings.app_id}-rows-changelog", f"{self.settings.app_id}-__assignor-__leader"]
        futures = admin.delete_topics([*names, *faust_topics], operation_timeout=10)
        for future in futures.values():
            with contextlib.suppress(Exception):  # best effort: the changelog may not exist
                future.result()


def _stop(process: subprocess.Popen[bytes] | None, sig: int, timeout: float) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
