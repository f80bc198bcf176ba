"""The fault harness, in the manner of Jepsen: a generator, a nemesis, a checker (docs/behaviour.md §5.2).

Three brokers (replication 3, min.insync.replicas 2), two journal workers, an LLM caller and the
gateway each run on a host of their own (a network namespace on a bridge, tests/faults/net.py);
the harness sends load through the gateway, the Python client and agents' turns, injects one fault
per scenario, heals it, lets everything settle and checks the committed journal.

    tests/faults/run.py                               # every scenario once, short (about 5 minutes)
    tests/faults/run.py --scenario cut-gateway        # one scenario (repeatable)
    tests/faults/run.py --soak 30 --seed 7            # a random mix for 30 minutes, full lengths

Needs root. Everything is bounded: each wait has a timeout, the soak its minutes, and the run cleans
up its namespaces, processes and data on exit, on SIGINT/SIGTERM and at the next start (the stale
namespaces of runs whose harness is gone). A failure prints the seed and the history that led to it.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import random
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.client import Client
from tests.faults import net
from tests.faults.checker import Verdict, check, wait_for_turns
from tests.faults.history import History
from tests.faults.hosts import Cluster
from tests.faults.load import Generator, user
from tests.faults.nemesis import BOUNDED, SCENARIOS, Timings
from tests.support.scripted_llm import Reply, ScriptedLLM, last_user_text
from topics.names import topic_names

MODEL = "scripted"
AGENTS = 6
ANSWER_DELAY_S = 1.5  # each call is in flight this long: a cut lands on running calls


def respond(body: dict[str, Any]) -> Reply:
    """Deterministic in the request: a call repeated after a cut answers the same (a duplicate)."""
    return Reply(f"ok: {last_user_text(body)[:60]}", usage=(20, 5), delay=ANSWER_DELAY_S)


class Harness:
    def __init__(self, root: Path, seed: int, timings: Timings, lead_s: float, tail_s: float) -> None:
        self.root = root
        self.seed = seed
        self.timings = timings
        self.lead_s = lead_s
        self.tail_s = tail_s
        self.history = History()
        self.network = net.Network()
        self.cluster: Cluster | None = None  # type: ignore[assignment]
        self.model: ScriptedLLM | None = None
        self.client: Client | None = None
        self.load: Generator = None  # type: ignore[assignment]
        self.agents: list[str] = []
        self.problems: list[str] = []
        self.verdicts: list[Verdict] = []
        self._supervising = threading.Event()
        self._closed = False

    # --- setup -----------------------------------------------------------------------------------

    def setup(self) -> None:
        removed = net.clean_stale()
        if removed:
            self.history.add("harness", f"removed stale namespaces and links of dead runs: {removed}")
        self.network.create()
        self.model = ScriptedLLM(host=self.network.gateway_address, model=MODEL, default=respond).start()
        self.cluster = Cluster(self.network, self.root, self.model.base_url, MODEL)
        self.history.add("harness", f"starting 3 brokers on {self.cluster.bootstrap}")
        self.cluster.start_brokers()
        self.cluster.ensure_topics()
        self.cluster.start_processes()
        threading.Thread(target=self._supervise, name="supervisor", daemon=True).start()
        deadline = time.monotonic() + 120
        while not self.cluster.owns_all_partitions():
            if time.monotonic() > deadline:
                raise RuntimeError("the journal workers did not take every partition within 120 s")
            time.sleep(0.5)
        self.client = Client(self.cluster.settings)
        self.agents = [self.client.agents.create().path for _ in range(AGENTS)]
        self.client.streams.get(self.agents[0]).append(user("warm up")).wait(timeout=120)
        events = wait_for_turns(self.cluster.settings, self.agents[:1], 120)
        assert events[self.agents[0]], "the warm-up turn was never journaled"
        self.load = Generator(self.client, self.cluster.gateway_url, self.cluster.token, self.history, self.agents)
        self.history.add("harness", f"ready: {len(self.agents)} agents, gateway {self.cluster.gateway_url}")

    @property
    def topics(self) -> Any:
        return topic_names(self.cluster.settings.topic_prefix)

    def _supervise(self) -> None:
        self._supervising.set()
        while self._supervising.is_set() and not self._closed:
            for line in self.cluster.supervise():
                self.history.add("supervisor", line)
            time.sleep(1)

    # --- helpers for the nemesis ------------------------------------------------------------------

    def problem(self, text: str) -> None:
        self.problems.append(text)
        self.history.add("harness", f"PROBLEM: {text}")

    def journal_sizes(self) -> dict[int, int]:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.cluster.bootstrap, "group.id": "fault-sizes", "log_level": 0})
        try:
            topic = self.topics.journal
            return {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(self.cluster.settings.partitions)
            }
        finally:
            consumer.close()

    def model_calls_in_flight(self) -> int:
        assert self.model is not None
        return sum(record.open for record in self.model.records)

    # --- one scenario ------------------------------------------------------------------------------

    def run_scenario(self, name: str, rng: random.Random) -> Verdict:
        self.history.add("harness", f"=== scenario {name} (seed {self.seed})")
        self.problems = []
        begun = time.time()
        self.load.start()
        time.sleep(self.lead_s)
        fault = time.time()
        heal = SCENARIOS[name](self, rng, self.timings)
        time.sleep(self.tail_s)
        self.load.stop()
        self.load.send_invalid(2)
        end = time.time()
        self.history.add("harness", "load stopped; settling")
        try:
            self.load.settle(timeout=120)
        except AssertionError as error:
            self.problem(str(error))
        wait_for_turns(self.cluster.settings, self.agents, 120)
        time.sleep(2)  # a late write of a woken or healed process would show up now
        workers = [self.cluster.data_dir(w) for w in self.cluster.journal_workers]
        verdict = check(name, self.cluster.settings, self.load, self.agents, workers, self.root, (fault, heal, end))
        verdict.problems = self.problems + [repr(e) for e in self.load.errors] + verdict.problems
        self.load.errors.clear()
        verdict.figures["scenario (s)"] = round(time.time() - begun, 1)
        if name == "cut-gateway":
            first_ok = self.load.gateway.first_ok_after.get(heal, -1)
            verdict.figures["gateway 200 again after heal (s)"] = round(first_ok - heal, 2) if first_ok > 0 else None
        self.report(verdict, begun)
        self.verdicts.append(verdict)
        return verdict

    def report(self, verdict: Verdict, since: float) -> None:
        status = "ok" if verdict.ok else "FAILED"
        figures = ", ".join(f"{k} {v}" for k, v in verdict.figures.items())
        print(f"--- {verdict.scenario}: {status}; {figures}", flush=True)
        if verdict.ok:
            return
        print(f"seed {self.seed}; replay with: tests/faults/run.py --scenario {verdict.scenario} --seed {self.seed}")
        for problem in verdict.problems[:40]:
            print(f"  problem: {problem}")
        print("history of the scenario:")
        for line in self.history.since(since):
            print(f"  {line}")
        for marker in verdict.offending[:10]:
            print(f"  {self.load.sent.get(marker)}")
        self.print_process_logs(verdict)
        sys.stdout.flush()

    def print_process_logs(self, verdict: Verdict) -> None:
        """What the caller and the journal workers said about the streams a problem names, and
        about their partitions (assignments, revokes, warnings): enough to tell a lost call record
        from a lost settlement in a run that cannot be repeated."""
        paths = sorted(set(re.findall(r"/agents/[0-9a-f]{8,}", " ".join(verdict.problems))))[:6]
        telling = re.compile(r"assigned|revok|read ahead|WARNING|ERROR|CRITICAL|fenced|abandon|skipped")
        for proc in [self.cluster.caller, *self.cluster.journal_workers]:
            lines = proc.log().splitlines()
            about = [line for line in lines if any(path in line for path in paths)][-12:]
            partitions = [line for line in lines if telling.search(line)][-25:]
            print(f"log of {proc.name} ({proc.log_path}):")
            for line in dict.fromkeys(partitions + about):  # in order, once
                print(f"    {line[:400]}")

    # --- teardown ---------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._supervising.clear()
        with contextlib.suppress(Exception):
            if self.load is not None:
                self.load.close()
        with contextlib.suppress(Exception):
            if self.client is not None:
                self.client.close()
        with contextlib.suppress(Exception):
            if self.cluster is not None:
                self.cluster.stop()
        with contextlib.suppress(Exception):
            if self.model is not None:
                self.model.stop()
        self.network.destroy()


def run(
    scenarios: list[str] | None = None,
    soak_minutes: float | None = None,
    seed: int | None = None,
    root: Path | None = None,
    keep: bool = False,
) -> list[Verdict]:
    """Run the scenarios (default: each once, bounded) or a soak; returns the verdicts."""
    seed = seed if seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"fault harness: seed {seed}", flush=True)
    soak = soak_minutes is not None
    timings = Timings() if soak else BOUNDED
    work = root or Path(tempfile.mkdtemp(prefix="agentstream-fault-"))
    harness = Harness(work, seed, timings, lead_s=8 if soak else 4, tail_s=8 if soak else 4)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        harness.close()
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    atexit.register(harness.close)
    started = time.monotonic()
    try:
        harness.setup()
        if soak:
            deadline = started + soak_minutes * 60
            while time.monotonic() < deadline:
                harness.run_scenario(rng.choice(list(SCENARIOS)), rng)
        else:
            for name in scenarios or list(SCENARIOS):
                harness.run_scenario(name, rng)
    finally:
        harness.close()
        atexit.unregister(harness.close)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if not keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    took = time.monotonic() - started
    failed = [v.scenario for v in harness.verdicts if not v.ok]
    print(f"fault harness: {len(harness.verdicts)} scenarios in {took:.0f}s, failed: {failed or 'none'}; seed {seed}")
    return harness.verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests/faults/run.py", description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", action="append", choices=list(SCENARIOS), help="run this one (repeatable)")
    parser.add_argument("--soak", type=float, metavar="MINUTES", help="a random mix of scenarios for this long")
    parser.add_argument("--seed", type=int, help="the seed of the random choices (printed; pass it to replay)")
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (logs, broker data)")
    args = parser.parse_args(argv)
    try:
        net.check_available()
    except net.NetworkUnavailable as error:
        print(f"fault harness: {error}", file=sys.stderr)
        return 2
    verdicts = run(args.scenario, args.soak, args.seed, keep=args.keep)
    return 0 if verdicts and all(v.ok for v in verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
