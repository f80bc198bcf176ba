"""The system under test: three brokers and the agentstream processes, each on its own host.

Brokers are started by scripts/kafka/start.sh inside their namespace (one node of a static quorum
of three, replication 3, min.insync.replicas 2); the journal workers, the LLM caller and the
gateway are `agentstream` processes inside theirs. The scripted model runs in the harness, on the
bridge. Every process is the harness's to stop: by pid, SIGKILL, SIGSTOP/SIGCONT, or SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from pipeline.settings import Settings
from tests.faults.net import Host, Network

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
KAFKA_PORT = 9092
GATEWAY_PORT = 8080
PARTITIONS = 4
SESSION_TIMEOUT_S = 6.0
WORKER_STOP_TIMEOUT_S = 8.0  # a stop that waits on unreachable Kafka ends this soon (docs/operations.md)


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _signal(pid: int | None, sig: int) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@dataclass
class Broker:
    node_id: int
    host: Host
    home: Path
    env: dict[str, str]
    paused: bool = False

    @property
    def address(self) -> str:
        return f"{self.host.address}:{KAFKA_PORT}"

    def pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.home / "kafka.pid").read_text().strip())
            return pid if _alive(pid) else None
        return None

    def start(self) -> subprocess.Popen[bytes]:
        """Run start.sh in the broker's namespace (it returns once the node answers)."""
        out = (self.home / "start.out").open("ab")
        return subprocess.Popen(
            [*self.host.exec_prefix(), "bash", str(REPO / "scripts" / "kafka" / "start.sh")],
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        _signal(self.pid(), signal.SIGKILL)

    def pause(self) -> None:
        _signal(self.pid(), signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        _signal(self.pid(), signal.SIGCONT)
        self.paused = False

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM (a controlled shutdown: leadership moves away first), SIGKILL after `timeout`."""
        pid = self.pid()
        _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        _signal(pid, signal.SIGKILL)

    def active_controller_epoch(self) -> int:
        """The highest epoch at which this node became the active controller, per its log (-1: never)."""
        log = self.home / "logs" / "server.log"
        with contextlib.suppress(OSError):
            epochs = re.findall(r"Becoming the active controller at epoch (\d+)", log.read_text(errors="replace"))
            return max((int(e) for e in epochs), default=-1)
        return -1


@dataclass
class Proc:
    """An agentstream process on a host, restarted by the harness when it exits (as a supervisor would)."""

    name: str
    host: Host
    args: list[str]
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    restarts: int = 0
    exits: list[int] = field(default_factory=list)

    def start(self) -> None:
        self.process = subprocess.Popen(
            [*self.host.exec_prefix(), str(BIN / "agentstream"), *self.args],
            env=self.env,
            stdout=self.log_path.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: a Ctrl-C on the harness is the harness's to handle
        )

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        if self.running():
            _signal(self.pid, signal.SIGCONT)
            _signal(self.pid, signal.SIGKILL)
            assert self.process is not None
            self.process.wait(10)

    def pause(self) -> None:
        _signal(self.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        _signal(self.pid, signal.SIGCONT)
        self.paused = False

    def stop(self, timeout: float = 20) -> None:
        if not self.running():
            return
        assert self.process is not None
        _signal(self.pid, signal.SIGCONT)
        _signal(self.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Cluster:
    """Three brokers, two journal workers, one LLM caller and the gateway, on their own hosts."""

    def __init__(self, network: Network, root: Path, model_url: str, model: str) -> None:
        self.network = network
        self.root = root
        self.tag = uuid.uuid4().hex[:6]
        self.brokers: list[Broker] = []
        cluster_id = subprocess.run(
            [
                "java",
                "-cp",
                str(REPO / ".local" / "kafka" / "libs" / "4.4.0" / "*"),
                "kafka.tools.StorageTool",
                "random-uuid",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[-1]
        hosts = [network.add_host(f"b{i}") for i in (1, 2, 3)]
        voters = ",".join(f"{i}@{host.address}:{KAFKA_PORT + 1}" for i, host in enumerate(hosts, 1))
        for node_id, host in enumerate(hosts, 1):
            home = root / f"broker{node_id}"
            home.mkdir(parents=True, exist_ok=True)
            env = {
                **os.environ,
                "AGENTSTREAM_KAFKA_HOME": str(home),
                "AGENTSTREAM_KAFKA_HOST": host.address,
                "AGENTSTREAM_KAFKA_PORT": str(KAFKA_PORT),
                "AGENTSTREAM_KAFKA_NODE_ID": str(node_id),
                "AGENTSTREAM_KAFKA_VOTERS": voters,
                "AGENTSTREAM_KAFKA_CLUSTER_ID": cluster_id,
                "AGENTSTREAM_KAFKA_REPLICATION": "3",
                "AGENTSTREAM_KAFKA_HEAP": "320m",
                "AGENTSTREAM_KAFKA_START_TIMEOUT": "120",
            }
            self.brokers.append(Broker(node_id, host, home, env))
        self.bootstrap = ",".join(broker.address for broker in self.brokers)
        self.settings = Settings.from_env(
            {},
            bootstrap_servers=self.bootstrap,
            topic_prefix=f"f{self.tag}-",
            partitions=PARTITIONS,
            replication_factor=3,
            app_id=f"agentstream-fault-{self.tag}",
            caller_group=f"agentstream-fault-caller-{self.tag}",
            session_timeout_s=SESSION_TIMEOUT_S,
            worker_stop_timeout_s=WORKER_STOP_TIMEOUT_S,
            openai_base_url=model_url,
            openai_api_key="sk-fault-harness",
            llm_transport="openai-compatible",
            llm_model=model,
            worker_port=0,
            metrics_port=0,
            caller_metrics_port=0,
            data_dir=root / "unused",
            log_level="INFO",
            log_repeat_interval_s=10,
        )
        self.tokens_file = root / "gateway-tokens.yaml"
        self.token = self._write_tokens()
        self.journal_workers = [self._proc(f"j{i}", ["worker", "journal"], index=i) for i in (1, 2)]
        self.caller = self._proc("c1", ["worker", "caller"])
        self.gateway = self._proc("g1", ["gateway"], public=True)
        gateway_host = self.gateway.host.public_address
        self.gateway_url = f"http://{gateway_host}:{GATEWAY_PORT}"

    def _write_tokens(self) -> str:
        from pipeline.gateway.cli import mint_token
        from pipeline.gateway.tokens import token_entry_yaml

        token, entry = mint_token("platform", ["/**"], name="fault-harness")
        self.tokens_file.write_text(f"tokens:\n{token_entry_yaml(entry)}\n")
        self.tokens_file.chmod(0o600)
        return token

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSTREAM_")}
        for name, value in self.settings.model_dump(exclude_unset=True).items():
            env[f"AGENTSTREAM_{name.upper()}"] = json.dumps(value) if isinstance(value, dict | list) else str(value)
        return {**env, **extra}

    def _proc(self, name: str, args: list[str], index: int = 0, public: bool = False) -> Proc:
        host = self.network.add_host(name, public=public)
        data = self.root / name
        data.mkdir(parents=True, exist_ok=True)
        extra = {"AGENTSTREAM_DATA_DIR": str(data)}
        if args[:2] == ["worker", "journal"]:
            extra["AGENTSTREAM_WORKER_INSTANCE_ID"] = f"{self.settings.app_id}-{index}"
        if args == ["gateway"]:
            extra |= {
                "AGENTSTREAM_GATEWAY_HOST": "0.0.0.0",
                "AGENTSTREAM_GATEWAY_PORT": str(GATEWAY_PORT),
                "AGENTSTREAM_GATEWAY_TOKENS_FILE": str(self.tokens_file),
            }
        return Proc(name, host, args, self.env(**extra), data / f"{name}.log")

    @property
    def processes(self) -> list[Proc]:
        return [*self.journal_workers, self.caller, self.gateway]

    def data_dir(self, worker: Proc) -> Path:
        return Path(worker.env["AGENTSTREAM_DATA_DIR"])

    # --- starting ------------------------------------------------------------------------------

    def start_brokers(self, timeout: float = 180) -> None:
        starters = [broker.start() for broker in self.brokers]  # at once: a node answers with a quorum
        deadline = time.monotonic() + timeout
        for broker, starter in zip(self.brokers, starters, strict=True):
            try:
                code = starter.wait(max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                starter.kill()
                code = -1
            if code != 0:
                out = (broker.home / "start.out").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"broker {broker.node_id} did not start:\n{out}")

    def restart_broker(self, broker: Broker, timeout: float = 120) -> None:
        starter = broker.start()
        if starter.wait(timeout) != 0:
            raise RuntimeError(f"broker {broker.node_id} did not restart: {(broker.home / 'start.out').read_text()}")

    def ensure_topics(self) -> None:
        result = subprocess.run(
            [str(BIN / "agentstream"), "topics", "ensure"], env=self.env(), capture_output=True, text=True, timeout=120
        )
        if result.returncode != 0:
            raise RuntimeError(f"topics ensure failed: {result.stderr}")

    def start_processes(self) -> None:
        for process in self.processes:
            process.start()

    def supervise(self) -> list[str]:
        """Restart every process that exited (a crash, or status 70 after a fatal Kafka error)."""
        restarted = []
        for process in self.processes:
            if process.process is not None and process.process.poll() is not None:
                process.exits.append(process.process.returncode)
                process.restarts += 1
                process.start()
                restarted.append(f"{process.name} exited {process.process and process.exits[-1]}, restarted")
        return restarted

    # --- looking -------------------------------------------------------------------------------

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})

    def leader_of(self, topic: str, partition: int) -> Broker | None:
        metadata = self.admin().list_topics(topic, timeout=10)
        leader = metadata.topics[topic].partitions[partition].leader
        return next((b for b in self.brokers if b.node_id == leader), None)

    def fully_replicated(self) -> bool:
        """Every partition of every topic has all three replicas in sync."""
        try:
            metadata = self.admin().list_topics(timeout=5)
        except Exception:  # a broker still starting answers nothing
            return False
        return all(
            len(partition.isrs) == len(partition.replicas) and partition.leader >= 0
            for topic in metadata.topics.values()
            for partition in topic.partitions.values()
        )

    def active_controller(self) -> Broker:
        return max(self.brokers, key=lambda broker: broker.active_controller_epoch())

    def owns_all_partitions(self) -> bool:
        """The journal workers between them began reading every partition (their logs say so)."""
        owned = set()
        for worker in self.journal_workers:
            owned |= {int(p) for p in re.findall(r"partition (\d+): reading commands", worker.log())}
        return owned == set(range(PARTITIONS))

    # --- stopping ------------------------------------------------------------------------------

    def stop(self) -> None:
        for process in reversed(self.processes):
            with contextlib.suppress(Exception):
                process.stop(timeout=10)
        for broker in self.brokers:
            broker.resume()
            broker.kill()  # the run's data is thrown away: no controlled shutdown needed

    def remove_data(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def fresh_settings(cluster: Cluster, data_dir: Path, **overrides: Any) -> Settings:
    return cluster.settings.model_copy(update={"data_dir": data_dir, **overrides})
