"""Integration-test support: the real local broker, an isolated topic set per test, a worker process.

Each `Stack` gets its own topic prefix, Faust app id and data directory, so tests never see each
other's records or rows. The journal worker runs as a real `agentstream worker journal` process that
a test can restart or SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from pipeline.client import Client
from pipeline.kafka.read import read_ranges, watermarks
from pipeline.settings import Settings
from topics.admin import ensure_topics
from topics.names import topic_specs

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
BOOTSTRAP = os.environ.get("AGENTSTREAM_BOOTSTRAP_SERVERS") or (
    f"127.0.0.1:{os.environ.get('AGENTSTREAM_KAFKA_PORT', '19092')}"  # the local broker (scripts/kafka)
)


def consumer_config(group: str, **config: Any) -> dict[str, Any]:
    """A librdkafka consumer of the local broker reading committed records only, as every reader does."""
    settings = Settings(bootstrap_servers=BOOTSTRAP)
    return {
        **settings.kafka_consumer_config(),
        "group.id": group,
        "enable.auto.commit": False,
        "log_level": 3,
        **config,
    }


class RecordCounter:
    """How many records a topic holds, counted by reading it from its start (incrementally).

    A sum of high watermarks overcounts once records are written in transactions: their commit
    markers take offsets too (docs/architecture.md, "Fencing").
    """

    def __init__(self, topic: str, partitions: int) -> None:
        self.consumer = Consumer(consumer_config(f"test-counter-{uuid.uuid4().hex[:8]}", **{"fetch.wait.max.ms": 10}))
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        self.count = 0

    def total(self) -> int:
        """Records read so far, once what has arrived is read too."""
        while messages := self.consumer.consume(10_000, timeout=0):
            self.count += sum(message.error() is None for message in messages)
        return self.count

    def close(self) -> None:
        self.consumer.close()


def read_committed(topic: str, timeout: float = 60.0) -> list[Any]:
    """Every committed record of every partition of `topic` up to its end as of the call, in
    partition order. Raises AssertionError if a partition is not read to its end within `timeout`:
    a test never works on a silently partial topic."""
    consumer = Consumer(consumer_config(f"test-reader-{uuid.uuid4().hex[:8]}"))
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        ranges = {p: watermarks(consumer, TopicPartition(topic, p)) for p in partitions}
        records = [message for batch in read_ranges(consumer, topic, ranges, timeout=timeout) for message in batch]
        behind = [
            f"[{tp.partition}] at {tp.offset} of {ranges[tp.partition][1]}"
            for tp in consumer.position([TopicPartition(topic, p) for p, (low, high) in ranges.items() if high > low])
            if tp.offset < ranges[tp.partition][1]
        ]
        if behind:
            raise AssertionError(f"{topic}: not read to its committed end within {timeout:g}s: {', '.join(behind)}")
        return sorted(records, key=lambda message: (message.partition(), message.offset()))
    finally:
        consumer.close()


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
        log = (self.settings.data_dir / "capabilities.log").open("ab")
        self.capabilities = subprocess.Popen(
            [str(BIN / "agentstream"), "worker", "capabilities"],
            env=self.capabilities_env(**config),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return self.capabilities

    def capabilities_env(self, **config: Any) -> dict[str, str]:
        """The environment of a capability host of this stack: its hosts' one consumer group, no
        metrics port, and `config` as HostConfig fields (AGENTSTREAM_CAPABILITIES_<NAME>)."""
        env = self.env()
        env["AGENTSTREAM_CAPABILITIES_GROUP"] = f"{self.settings.app_id}-capabilities"
        env["AGENTSTREAM_CAPABILITIES_METRICS_PORT"] = "0"
        for name, value in config.items():
            env[f"AGENTSTREAM_CAPABILITIES_{name.upper()}"] = str(value)
        return env

    def start_router(self, metrics_port: int = 0) -> subprocess.Popen[bytes]:
        """The router (`agentstream worker router`) with its own app id, so its tables are this stack's."""
        router: subprocess.Popen[bytes] | None = getattr(self, "router", None)
        assert router is None or router.poll() is not None
        env = {
            **self.env(),
            "AGENTSTREAM_ROUTER_APP_ID": self.router_app_id,
            "AGENTSTREAM_ROUTER_METRICS_PORT": str(metrics_port),
        }
        log = (self.settings.data_dir / "router.log").open("ab")
        self.router = subprocess.Popen(
            [str(BIN / "agentstream"), "worker", "router"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        return self.router

    @property
    def router_app_id(self) -> str:
        return f"{self.settings.app_id}-router"

    def stop_router(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        _stop(getattr(self, "router", None), sig, timeout)

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
        """Every committed record of a topic (all partitions) up to its current end."""
        return read_committed(topic, timeout)

    def close(self) -> None:
        for client in (self._client, self._internal_client):
            if client is not None:
                client.close()
        self.stop_caller()
        self.stop_capabilities()
        self.stop_router()
        self.stop_worker()
        admin = AdminClient({"bootstrap.servers": BOOTSTRAP, "log_level": 3})
        names = [spec.name for spec in self.specs]
        faust_topics = [f"{self.settings.app_id}-rows-changelog", f"{self.settings.app_id}-__assignor-__leader"]
        if getattr(self, "router", None) is not None:
            router = self.router_app_id
            faust_topics += [f"{router}-{name}" for name in ("subscriptions-changelog", "agents-changelog")]
            faust_topics += [f"{router}-subscriptions-repartition", f"{router}-__assignor-__leader"]
        futures = admin.delete_topics([*names, *faust_topics], operation_timeout=10)
        for future in futures.values():
            with contextlib.suppress(Exception):  # best effort: the changelog may not exist
                future.result()


OWNED = {
    # The partitions a worker took, as its log says (cumulative over the log).
    "journal": re.compile(r"partition (\d+): reading commands"),
    "caller": re.compile(r"assigned (\[.*\])"),  # assigned ['<topic>[0]', '<topic>[2]']
    "capabilities": re.compile(r"assigned (\[.*\])"),
}


class Worker:
    """One more worker process of the stack's group (`agentstream worker <kind>`: journal, caller
    or capabilities), with its own data directory, log and static member id; `env`: the process's
    environment (default: the stack's)."""

    def __init__(
        self, stack: Stack, index: int, root: Path, kind: str = "journal", env: dict[str, str] | None = None
    ) -> None:
        self.kind = kind
        self.data_dir = root / (f"w{index}" if kind == "journal" else f"{kind}{index}")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / f"{'worker' if kind == 'journal' else kind}.log"
        env = dict(stack.env() if env is None else env)
        env["AGENTSTREAM_DATA_DIR"] = str(self.data_dir)
        env["AGENTSTREAM_WORKER_INSTANCE_ID"] = f"{stack.settings.app_id}-{index}"
        self.process = subprocess.Popen(
            [str(BIN / "agentstream"), "worker", kind],
            env=env,
            stdout=self.log_path.open("ab"),
            stderr=subprocess.STDOUT,
        )

    def log(self, since: int = 0) -> str:
        """The log from byte `since` on (see `log_size`)."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log:
            log.seek(since)
            return log.read().decode(errors="replace")

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def owned(self, since: int = 0) -> set[int]:
        """Every partition this worker took (journal: began reading commands for), as its log says
        from byte `since` on."""
        found = OWNED[self.kind].findall(self.log(since))
        if self.kind == "journal":
            return {int(p) for p in found}
        return {int(p) for listed in found for p in re.findall(r"\[(\d+)\]'", listed)}

    def pause(self) -> None:
        """SIGSTOP: the process, its heartbeats and librdkafka's threads stop where they are."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def stop(self, sig: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a stopped process acts on no other signal
            _stop(self.process, sig, 60)


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
