"""The nemesis: one function per scenario, injecting its fault and healing it.

Each returns the wall-clock time of the heal (the broker back, the link up), from which the
checker measures the recovery. `Timings` holds the lengths: short in the bounded run, the issue's
own figures in the soak.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tests.faults.hosts import SESSION_TIMEOUT_S, WORKER_STOP_TIMEOUT_S, Proc

if TYPE_CHECKING:
    from tests.faults.run import Harness


@dataclass(frozen=True)
class Timings:
    broker_down_s: float = 15.0  # a killed broker stays down this long
    broker_pause_s: float = 30.0
    cut_s: float = SESSION_TIMEOUT_S + 8  # past the session timeout: partitions move
    replicated_timeout_s: float = 120.0


BOUNDED = Timings(broker_down_s=4.0, broker_pause_s=10.0, cut_s=SESSION_TIMEOUT_S + 4, replicated_timeout_s=90.0)


def _wait(predicate: Callable[[], bool], timeout: float, what: str, harness: Harness) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(1)
    harness.problem(f"timed out after {timeout:g}s waiting for {what}")
    return False


def _busy_partition(harness: Harness) -> int:
    """The partition of agent-journal with the most records."""
    counts = harness.journal_sizes()
    return max(counts, key=lambda p: counts[p])


def kill_leader(harness: Harness, rng: random.Random, timings: Timings) -> float:
    partition = _busy_partition(harness)
    broker = harness.cluster.leader_of(harness.topics.journal, partition)
    assert broker is not None, "the busy partition has no leader"
    harness.history.add("nemesis", f"SIGKILL broker {broker.node_id}, leader of agent-journal[{partition}]")
    broker.kill()
    time.sleep(timings.broker_down_s)
    harness.cluster.restart_broker(broker)
    heal = harness.history.add("nemesis", f"broker {broker.node_id} restarted")
    _wait(harness.cluster.fully_replicated, timings.replicated_timeout_s, "every replica in sync", harness)
    return heal


def kill_controller(harness: Harness, rng: random.Random, timings: Timings) -> float:
    broker = harness.cluster.active_controller()
    harness.history.add("nemesis", f"SIGKILL broker {broker.node_id}, the active controller")
    broker.kill()
    time.sleep(timings.broker_down_s)
    harness.cluster.restart_broker(broker)
    heal = harness.history.add("nemesis", f"broker {broker.node_id} restarted")
    _wait(harness.cluster.fully_replicated, timings.replicated_timeout_s, "every replica in sync", harness)
    return heal


def pause_broker(harness: Harness, rng: random.Random, timings: Timings) -> float:
    partition = _busy_partition(harness)
    broker = harness.cluster.leader_of(harness.topics.journal, partition) or rng.choice(harness.cluster.brokers)
    harness.history.add("nemesis", f"SIGSTOP broker {broker.node_id} for {timings.broker_pause_s:g}s")
    broker.pause()
    time.sleep(timings.broker_pause_s)
    broker.resume()
    heal = harness.history.add("nemesis", f"SIGCONT broker {broker.node_id}")
    _wait(harness.cluster.fully_replicated, timings.replicated_timeout_s, "every replica in sync", harness)
    return heal


def cut_journal_worker(harness: Harness, rng: random.Random, timings: Timings) -> float:
    worker = rng.choice(harness.cluster.journal_workers)
    harness.history.add("nemesis", f"partition journal worker {worker.name} for {timings.cut_s:g}s")
    harness.network.partition(worker.host)
    time.sleep(timings.cut_s)
    _stop_while_cut_off(harness, worker)
    harness.network.heal(worker.host)
    return harness.history.add("nemesis", f"healed {worker.name}")


def _stop_while_cut_off(harness: Harness, worker: Proc) -> None:
    """A supervisor stops a worker that cannot reach Kafka (a node drained during an outage): it must
    end within its stop timeout, not hang on the group coordinator (docs/operations.md)."""
    process = worker.process
    if process is None or process.poll() is not None:
        return
    limit = WORKER_STOP_TIMEOUT_S + 10
    began = time.monotonic()
    harness.history.add("nemesis", f"SIGTERM {worker.name} while it is cut off")
    os.kill(process.pid, signal.SIGTERM)
    try:
        code = process.wait(limit)
    except subprocess.TimeoutExpired:
        harness.problem(f"{worker.name} did not stop within {limit:g}s of SIGTERM while cut off from Kafka")
        worker.kill()
        return
    harness.history.add("nemesis", f"{worker.name} stopped in {time.monotonic() - began:.1f}s (exit {code})")


def cut_caller(harness: Harness, rng: random.Random, timings: Timings) -> float:
    caller = harness.cluster.caller
    _wait(lambda: harness.model_calls_in_flight() > 0, 30, "a model call in flight", harness)
    harness.history.add("nemesis", f"partition the LLM caller mid-call for {timings.cut_s:g}s")
    harness.network.partition(caller.host)
    time.sleep(timings.cut_s)
    harness.network.heal(caller.host)
    return harness.history.add("nemesis", "healed the LLM caller")


def rolling_restart(harness: Harness, rng: random.Random, timings: Timings) -> float:
    for broker in harness.cluster.brokers:
        harness.history.add("nemesis", f"rolling restart: SIGTERM broker {broker.node_id}")
        broker.stop()
        harness.cluster.restart_broker(broker)
        harness.history.add("nemesis", f"rolling restart: broker {broker.node_id} back")
        _wait(harness.cluster.fully_replicated, timings.replicated_timeout_s, "every replica in sync", harness)
    return harness.history.add("nemesis", "rolling restart done")


def cut_gateway(harness: Harness, rng: random.Random, timings: Timings) -> float:
    gateway = harness.cluster.gateway
    stats = harness.load.gateway
    unavailable_before = stats.unavailable
    harness.history.add("nemesis", "partition the gateway from the brokers (its public side stays up)")
    harness.network.partition(gateway.host)
    answered_503 = _wait(lambda: stats.unavailable > unavailable_before, 60, "the gateway to answer 503", harness)
    time.sleep(2)
    harness.network.heal(gateway.host)
    heal = harness.history.add("nemesis", f"healed the gateway (answered 503: {answered_503})")
    harness.load.expect_gateway_recovery(heal)
    recovered = _wait(lambda: stats.first_ok_after.get(heal, -1) > 0, 60, "the gateway to answer 200 again", harness)
    if recovered:
        harness.history.add("nemesis", f"gateway answers 200 again after {stats.first_ok_after[heal] - heal:.1f}s")
    return heal


SCENARIOS: dict[str, Callable[[Harness, random.Random, Timings], float]] = {
    "kill-leader": kill_leader,
    "kill-controller": kill_controller,
    "pause-broker": pause_broker,
    "cut-journal-worker": cut_journal_worker,
    "cut-caller": cut_caller,
    "rolling-restart": rolling_restart,
    "cut-gateway": cut_gateway,
}
