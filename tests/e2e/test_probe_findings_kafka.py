"""Findings of the security probe, each checked on the real stack: `agentstream` processes against a
real broker (the local one, or for 9b a separate broker of this test's own that it stops).

- 7: the CLI printed escape sequences from journal content raw (a model's answer could retitle or
  clear the reader's terminal, or reorder what it shows with bidi overrides).
- 9b: a worker logged about a hundred ERROR lines a second while the broker was down.
- 9c: the Prometheus metrics ports listened on every address, with no setting to change it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import signal
import subprocess
import time
import urllib.request
import uuid
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import orjson
import pytest
from confluent_kafka.admin import AdminClient

from pipeline.settings import Settings
from schemas.events import CONTEXT_ADDED, LLM_REQUEST_REQUESTED, STREAM_ERROR_OCCURRED
from tests.kafka_stack import BIN, BOOTSTRAP, REPO, Stack, wait_until
from tests.support.ports import free_port
from topics.admin import ensure_topics
from topics.names import topic_specs

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

# --- finding 7 ----------------------------------------------------------------------------------

# One of each thing a terminal obeys: OSC 0 (retitle) ended by BEL, CSI clear screen and cursor
# home, CR (overwrite the line), DEL, C1 CSI, a right-to-left override and the isolates, NUL, tab.
HOSTILE = (
    "title\x1b]0;pwned\x07 clear\x1b[2J\x1b[H cr\rover del\x7f c1\x9b31m "
    "bidi\u202egnp.exe\u2066iso\u2069 nul\x00 tab\tend\nsecond line"
)
OBEYED = {chr(c) for c in (*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A))}
VISIBLE = ("\\x1b]0;pwned\\x07", "\\x1b[2J\\x1b[H", "cr\\rover", "del\\x7f", "\\x9b31m", "\\u202egnp.exe\\u2066")


def agentstream(env: dict[str, str], *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(BIN / "agentstream"), *args], env=env, input=stdin, capture_output=True, timeout=120)


def raw_controls(output: bytes, allowed: str = "\n") -> set[str]:
    """The characters of `output` a terminal would obey, besides `allowed`."""
    return OBEYED.intersection(output.decode()) - set(allowed)


def test_finding_7_cli_escapes_control_characters(tmp_path: Path) -> None:
    stack = Stack(tmp_path / "data", partitions=2)
    try:
        stack.start_worker()
        agent = stack.client.agents.create()
        agent.append({"type": STREAM_ERROR_OCCURRED, "payload": {"message": HOSTILE}}).wait(timeout=60)
        agent.append(
            {
                "type": CONTEXT_ADDED,
                "payload": {"role": "user", "content": HOSTILE, "actor": {"type": "user", "origin": "cli"}},
            }
        ).wait(timeout=60)
        # The user item starts a turn: its request is what `agent request` prints.
        wait_until(
            lambda: any(e.type == LLM_REQUEST_REQUESTED for e in agent.stream.events()), 60, "the turn's request"
        )
        env = stack.env()

        # Human-readable output: every control character visible, none raw.
        tail = agentstream(env, "agent", "tail", agent.path, "--no-follow")
        show = agentstream(env, "agent", "show", agent.path)
        assert tail.returncode == 0 and show.returncode == 0, (tail.stderr, show.stderr)
        assert raw_controls(tail.stdout) == set(), tail.stdout
        assert raw_controls(show.stdout, allowed="\n\t") == set(), show.stdout
        lines = tail.stdout.decode().splitlines()
        error_line = next(line for line in lines if " error-occurred " in line)  # its payload as JSON: C0 as \u001b
        assert all(text in error_line for text in ("\\u001b]0;pwned\\u0007", "del\\x7f", "\\x9b31m", "\\u202e")), (
            error_line
        )
        user_line = next(line for line in lines if " user [user]: " in line)
        assert all(text in user_line for text in (*VISIBLE, "\\x00", "\\tend\\nsecond line")), user_line
        assert all(text in show.stdout.decode() for text in VISIBLE), show.stdout

        # JSON output: valid JSON holding the content exactly, and safe on a terminal too.
        tail_json = agentstream(env, "agent", "tail", agent.path, "--no-follow", "--json")
        show_json = agentstream(env, "agent", "show", agent.path, "--json")
        request = agentstream(env, "agent", "request", agent.path)
        folded = agentstream(env, "fold", stdin=tail_json.stdout)
        for result in (tail_json, show_json, request, folded):
            assert result.returncode == 0, result.stderr
            assert raw_controls(result.stdout) == set(), result.stdout
        events = [orjson.loads(line) for line in tail_json.stdout.splitlines()]
        assert [e["payload"]["message"] for e in events if e["type"] == STREAM_ERROR_OCCURRED] == [HOSTILE]
        assert HOSTILE in [e["payload"].get("content") for e in events]
        assert HOSTILE in [i["content"] for i in orjson.loads(show_json.stdout)["history"]]
        assert any(HOSTILE in m["content"] for m in orjson.loads(request.stdout)["messages"])
        assert any(HOSTILE in m["content"] for m in orjson.loads(folded.stdout)["messages"])
    finally:
        stack.close()


# --- finding 9b ---------------------------------------------------------------------------------

OUTAGE_WINDOW_S = 10.0
REPEAT_INTERVAL_S = 4  # lines of a kind at about 0, 4 and 8 s into the window: at most 3
READY = {
    "journal": "reading commands",
    "caller": "assigned [",
    "capabilities": "assigned [",
    "router": "Worker ready",
}
# `2026-01-01 10:00:00,123 ERROR aiokafka: text` (caller, capability host) and
# `[2026-01-01 10:00:00,123] [4242] [ERROR] text` (Faust: the journal worker, the router).
LOG_LINE = re.compile(r"^\[?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]? (?:\[\d+\] )?\[?(ERROR|CRITICAL)\]? (.*)$")
SUMMARY = re.compile(r" \(\d+ similar in the last \d+ s\)$")


def error_kinds(log: str) -> tuple[Counter[str], int]:
    """ERROR lines of the first OUTAGE_WINDOW_S seconds from the first one, counted by kind (the
    line's logger and text, numbers and the summary aside), and how many carry a summary count."""
    errors = []
    for line in log.splitlines():
        if found := LOG_LINE.match(line.rstrip()):
            errors.append((datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f"), found[3]))
    if not errors:
        return Counter(), 0
    end = errors[0][0] + timedelta(seconds=OUTAGE_WINDOW_S)
    window = [text for at, text in errors if at <= end]
    kinds = Counter(re.sub(r"\d+", "#", SUMMARY.sub("", text)) for text in window)
    return kinds, sum(bool(SUMMARY.search(text)) for text in window)


class SeparateBroker:
    """A broker of this test's own (scripts/kafka/start.sh with its own port and state directory),
    so that stopping it disturbs nobody else's tests."""

    def __init__(self, home: Path) -> None:
        self.port = free_port()
        self.env = {
            **os.environ,
            "AGENTSTREAM_KAFKA_HOME": str(home),
            "AGENTSTREAM_KAFKA_PORT": str(self.port),
            "AGENTSTREAM_KAFKA_CONTROLLER_PORT": str(free_port()),
        }

    def script(self, name: str) -> None:
        result = subprocess.run(
            ["bash", str(REPO / "scripts" / "kafka" / name)], env=self.env, capture_output=True, text=True, timeout=180
        )
        assert result.returncode == 0, f"{name}: {result.stdout}\n{result.stderr}"


def test_finding_9b_broker_outage_errors_are_rate_limited(tmp_path: Path) -> None:
    broker = SeparateBroker(tmp_path / "kafka")
    assert "AGENTSTREAM_KAFKA_HOME" in (REPO / "scripts" / "kafka" / "common.sh").read_text(), (
        "scripts/kafka cannot run a second broker: it would stop the shared one"
    )
    broker.script("start.sh")
    tag = uuid.uuid4().hex[:8]
    settings = Settings.from_env(
        {},
        bootstrap_servers=f"127.0.0.1:{broker.port}",
        topic_prefix=f"t{tag}-",
        partitions=2,
        data_dir=tmp_path / "data",
        app_id=f"outage-{tag}",
        router_app_id=f"outage-router-{tag}",
        caller_group=f"outage-caller-{tag}",
        worker_port=0,
        metrics_port=0,
        caller_metrics_port=0,
        router_metrics_port=0,
        log_level="INFO",
    )
    env = {
        **os.environ,
        **{f"AGENTSTREAM_{k.upper()}": str(v) for k, v in settings.model_dump(exclude_unset=True).items()},
    }
    env.update(
        AGENTSTREAM_CAPABILITIES_GROUP=f"outage-capabilities-{tag}",
        AGENTSTREAM_CAPABILITIES_METRICS_PORT="0",
        AGENTSTREAM_LOG_REPEAT_INTERVAL_S=str(REPEAT_INTERVAL_S),
    )
    workers: dict[str, subprocess.Popen[bytes]] = {}
    logs = {kind: tmp_path / f"{kind}.log" for kind in READY}
    try:
        ensure_topics(settings.bootstrap_servers, topic_specs(settings.topic_prefix, 2, 1))
        for kind, log in logs.items():
            with log.open("ab") as out:
                workers[kind] = subprocess.Popen(
                    [str(BIN / "agentstream"), "worker", kind], env=env, stdout=out, stderr=subprocess.STDOUT
                )
        for kind, log in logs.items():
            wait_until(lambda log=log, kind=kind: READY[kind] in log.read_text(errors="replace"), 90, f"the {kind}")
        ready_at = {kind: log.stat().st_size for kind, log in logs.items()}

        broker.script("stop.sh")  # the outage
        stopped = time.monotonic()

        def outage_log(kind: str) -> str:
            with logs[kind].open("rb") as log:
                log.seek(ready_at[kind])
                return log.read().decode(errors="replace")

        wait_until(lambda: all(error_kinds(outage_log(kind))[0] for kind in logs), 20, "connection errors")
        time.sleep(max(0.0, OUTAGE_WINDOW_S + 2 - (time.monotonic() - stopped)))
        for kind in logs:
            assert all(worker.poll() is None for worker in workers.values()), "a worker exited during the outage"
            log = outage_log(kind)
            assert "--- Logging error ---" not in log, log[-3000:]
            kinds, summaries = error_kinds(log)
            repeated = {text: count for text, count in kinds.items() if count > 3}
            assert not repeated, f"{kind}: {sum(kinds.values())} ERROR lines in {OUTAGE_WINDOW_S:g} s: {repeated}"
            assert summaries >= 1, f"{kind}: no line says how many it left out:\n{log[-3000:]}"
    finally:
        for worker in workers.values():
            with contextlib.suppress(ProcessLookupError):
                worker.send_signal(signal.SIGTERM)
        for worker in workers.values():
            try:
                worker.wait(5)  # without a broker a Faust worker may not finish stopping
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)
        broker.script("stop.sh")


# --- finding 9c ---------------------------------------------------------------------------------


def listening_addresses(port: int) -> set[str]:
    """The addresses TCP sockets listen on at `port` in this network namespace (Linux /proc)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            address, port_hex = local.rsplit(":", 1)
            if state != "0A" or int(port_hex, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address)  # in 32-bit words of host (little-endian) order
            packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add(str(ipaddress.ip_address(packed)))
    return found


def scrape(port: int) -> bytes:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()


def test_finding_9c_metrics_ports_listen_on_loopback_unless_configured(tmp_path: Path) -> None:
    ports = {kind: free_port() for kind in ("journal", "caller", "router", "capabilities", "gateway")}
    stack = Stack(
        tmp_path / "data",
        partitions=2,
        metrics_port=ports["journal"],
        caller_metrics_port=ports["caller"],
        router_metrics_port=ports["router"],
        gateway_port=free_port(),
        gateway_metrics_port=ports["gateway"],
    )
    router_app_id = f"{stack.settings.app_id}-router"
    env = {**stack.env(), "AGENTSTREAM_ROUTER_APP_ID": router_app_id}
    others: list[subprocess.Popen[bytes]] = []
    try:
        stack.start_worker()
        stack.start_caller()
        stack.start_capabilities(metrics_port=ports["capabilities"])
        for command in (["worker", "router"], ["gateway"]):
            with (tmp_path / f"{command[-1]}.log").open("ab") as log:
                others.append(
                    subprocess.Popen(
                        [str(BIN / "agentstream"), *command], env=env, stdout=log, stderr=subprocess.STDOUT
                    )
                )
        for kind, port in ports.items():
            wait_until(lambda port=port: listening_addresses(port), 60, f"the {kind}'s metrics port")
            assert listening_addresses(port) == {"127.0.0.1"}, (kind, listening_addresses(port))
            assert b"# HELP " in scrape(port), kind

        # The setting opens it up, e.g. in a pod (the Helm chart sets 0.0.0.0).
        stack.stop_capabilities()
        open_port = free_port()
        host = subprocess.Popen(
            [str(BIN / "agentstream"), "worker", "capabilities"],
            env={
                **stack.capabilities_env(metrics_port=open_port),
                "AGENTSTREAM_METRICS_HOST": "0.0.0.0",
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        others.append(host)
        wait_until(lambda: listening_addresses(open_port), 60, "the capability host's metrics port")
        assert listening_addresses(open_port) == {"0.0.0.0"}
        assert b"# HELP " in scrape(open_port)
    finally:
        for process in others:
            process.terminate()
        for process in others:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        stack.close()
        admin = AdminClient({"bootstrap.servers": BOOTSTRAP, "log_level": 3})
        router_topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(router_app_id)]
        if router_topics:
            for future in admin.delete_topics(router_topics, operation_timeout=10).values():
                with contextlib.suppress(Exception):
                    future.result()
