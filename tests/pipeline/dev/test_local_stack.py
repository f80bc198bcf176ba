"""`agentstream up` / `down` / `demo`: which parts run, in what order, and the gateway's tokens file.

Nothing here starts or stops the shared broker or embedded model: the unit tests replace the
service scripts, and the broker-backed test starts only the agentstream processes, with their own
run directory, topic prefix, app ids and ports, and stops exactly those.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import socket
import stat
import subprocess
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.dev import demo, local_stack
from pipeline.gateway.tokens import TokenBook
from pipeline.settings import Settings
from tests.kafka_stack import REPO, wait_until

PROCESS_NAMES = ["worker-journal", "worker-caller", "worker-capabilities", "worker-router", "gateway"]


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Run and log directories, tokens file and scripts of a throwaway repository layout."""
    local = tmp_path / ".local"
    monkeypatch.setattr(local_stack, "RUN_DIR", local / "run")
    monkeypatch.setattr(local_stack, "LOG_DIR", local / "logs")
    monkeypatch.setattr(local_stack, "TOKENS_FILE", local / "gateway-tokens.yaml")
    monkeypatch.setattr(local_stack, "SCRIPTS", tmp_path / "no-scripts")  # a service call fails, never stops one
    return local


class FakeChild:
    def __init__(self) -> None:
        self.returncode = None

    def poll(self) -> None:
        return None


def test_up_runs_every_part_in_order() -> None:
    assert local_stack.parts(Settings.from_env({})) == ["kafka", "model", *PROCESS_NAMES]
    assert local_stack.parts(Settings.from_env({"OPENAI_API_KEY": "sk-test"})) == ["kafka", *PROCESS_NAMES]


def test_down_stops_processes_newest_first_then_jaeger_model_and_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(local_stack, "stop_process", lambda name, timeout: calls.append(name) or True)
    monkeypatch.setattr(local_stack, "stop_service", lambda name: calls.append(name) or name != "model")
    said: list[str] = []

    stopped = local_stack.down(say=said.append)

    assert calls == [*reversed(PROCESS_NAMES), "jaeger", "model", "kafka"]
    assert stopped == [*reversed(PROCESS_NAMES), "jaeger", "kafka"]  # the model was not running: not claimed
    assert said == [f"  stopped {name}" for name in stopped]

    calls.clear()
    assert local_stack.down(["kafka", "worker-journal", "gateway"], say=said.append) == [
        "gateway",
        "worker-journal",
        "kafka",
    ]
    assert calls == ["gateway", "worker-journal", "kafka"]


def test_tokens_file_is_minted_once_private_and_holds_only_the_hash(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "gateway-tokens.yaml"
    token = local_stack.ensure_tokens_file(path)
    assert token is not None and token.startswith("ast_")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert token not in text
    claims = TokenBook(path).claims(token)
    assert claims is not None and (claims.tier, claims.scope) == ("platform", ("/**",))

    assert local_stack.ensure_tokens_file(path) is None  # reused as it is
    assert path.read_text() == text

    path.write_text("tokens: [{tier: nobody}]\n")
    with pytest.raises(local_stack.StackError) as refused:
        local_stack.ensure_tokens_file(path)
    message = str(refused.value)
    assert "\n" not in message and str(path) in message and "remove it" in message


def _fake_up(monkeypatch: pytest.MonkeyPatch, running: set[str]) -> list[tuple[str, dict[str, str] | None]]:
    """`up` with the broker and model already running and process starts recorded, not made."""
    starts: list[tuple[str, dict[str, str] | None]] = []

    def start_process(process: local_stack.Process, env: dict[str, str] | None = None) -> FakeChild | None:
        if process.name in running:
            return None
        starts.append((process.name, env))
        return FakeChild()

    monkeypatch.setattr(local_stack, "start_service", lambda name: False)
    monkeypatch.setattr(local_stack, "ensure_topics_now", lambda: None)
    monkeypatch.setattr(local_stack, "start_process", start_process)
    monkeypatch.setattr(local_stack, "_await_gateway", lambda *args: None)
    monkeypatch.setattr(local_stack, "_listening", lambda host, port: False)
    monkeypatch.setattr(local_stack.time, "sleep", lambda seconds: None)
    return starts


def test_first_up_mints_the_gateway_token_and_later_ups_do_not_print_it(
    monkeypatch: pytest.MonkeyPatch, isolated: Path
) -> None:
    settings = Settings.from_env({})
    starts = _fake_up(monkeypatch, running=set())
    said: list[str] = []

    launch = local_stack.up(settings, say=said.append)

    assert [name for name, _ in starts] == PROCESS_NAMES
    assert launch.started == PROCESS_NAMES  # broker and model were running already: not ours
    envs = dict(starts)
    assert envs["gateway"] is not None
    assert envs["gateway"]["AGENTSTREAM_GATEWAY_TOKENS_FILE"] == str(local_stack.TOKENS_FILE)
    assert all(envs[name] is None for name in PROCESS_NAMES if name != "gateway")
    assert launch.token is not None and launch.tokens_file == local_stack.TOKENS_FILE
    assert sum(launch.token in line for line in said) == 1, said
    assert "  Kafka broker: already running on 127.0.0.1:19092" in said
    assert "  HTTP gateway: started on http://127.0.0.1:8080 (log" in "\n".join(said)
    usage = local_stack.usage(settings, launch)
    assert f"  TOKEN={launch.token}" in usage
    assert any(line.lstrip().startswith("curl ") and "$TOKEN" in line for line in usage)

    text = local_stack.TOKENS_FILE.read_text()
    starts = _fake_up(monkeypatch, running=set(PROCESS_NAMES))
    said.clear()
    again = local_stack.up(settings, say=said.append)
    assert (again.started, again.token, starts) == ([], None, [])
    assert local_stack.TOKENS_FILE.read_text() == text
    assert launch.token not in "\n".join(said + local_stack.usage(settings, again))
    assert "  HTTP gateway: already running on http://127.0.0.1:8080" in said
    later = local_stack.usage(settings, again)
    assert any(local_stack.TOKENS_FILE.name in line and "TOKEN=..." in line for line in later), later


def test_up_with_traces_starts_jaeger_and_points_every_process_at_it(
    monkeypatch: pytest.MonkeyPatch, isolated: Path
) -> None:
    """`up --traces` (docs/operations.md, "Traces"): Jaeger first, then every process with the
    standard OTLP endpoint of it (behaviour §8), the gateway also with the Jaeger UI for its console."""
    starts = _fake_up(monkeypatch, running=set())
    services: list[str] = []
    monkeypatch.setattr(local_stack, "start_service", lambda name: services.append(name) or name == "jaeger")
    said: list[str] = []

    launch = local_stack.up(Settings.from_env({}), say=said.append, traces=True)

    assert services == ["jaeger", "kafka", "model"] and launch.started == ["jaeger", *PROCESS_NAMES]
    assert "  Jaeger: started, UI http://127.0.0.1:16686" in said
    for name, env in starts:
        assert env is not None and env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4318", name
        assert env["AGENTSTREAM_JAEGER_UI_URL"] == "http://127.0.0.1:16686"
    assert dict(starts)["gateway"]["AGENTSTREAM_GATEWAY_TOKENS_FILE"] == str(local_stack.TOKENS_FILE)
    assert local_stack.traces_env({"AGENTSTREAM_JAEGER_OTLP_PORT": "5318"})["OTEL_EXPORTER_OTLP_ENDPOINT"] == (
        "http://127.0.0.1:5318"
    )


def test_up_uses_the_tokens_file_a_person_set_and_never_writes_it(
    monkeypatch: pytest.MonkeyPatch, isolated: Path, tmp_path: Path
) -> None:
    own = tmp_path / "mine.yaml"
    settings = Settings.from_env({"AGENTSTREAM_GATEWAY_TOKENS_FILE": str(own)})
    starts = _fake_up(monkeypatch, running=set())

    launch = local_stack.up(settings, say=lambda line: None)

    assert (launch.token, launch.tokens_file) == (None, own)
    assert not own.exists() and not local_stack.TOKENS_FILE.exists()
    assert dict(starts)["gateway"] is not None


def test_up_refuses_a_gateway_port_someone_else_holds(monkeypatch: pytest.MonkeyPatch, isolated: Path) -> None:
    starts = _fake_up(monkeypatch, running=set())
    monkeypatch.setattr(local_stack, "_listening", lambda host, port: True)
    launch = local_stack.Launch()
    with pytest.raises(local_stack.StackError, match=r"port 8080 is in use .* AGENTSTREAM_GATEWAY_PORT"):
        local_stack.up(Settings.from_env({}), say=lambda line: None, launch=launch)
    assert launch.started == PROCESS_NAMES[:-1] == [name for name, _ in starts]  # the caller can stop them


def test_demo_stops_what_it_started_even_when_a_start_fails(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    def failing_up(settings: Settings, say: Any, launch: local_stack.Launch) -> local_stack.Launch:
        launch.started += ["model", "worker-journal"]
        raise local_stack.StackError("the LLM caller exited at once (code 3); see .local/logs/worker-caller.log")

    stopped: list[list[str]] = []
    monkeypatch.setattr(local_stack, "up", failing_up)
    monkeypatch.setattr(local_stack, "down", lambda parts, say: stopped.append(list(parts)) or parts)

    assert demo.run(argparse.Namespace(text="hi", timeout=1.0)) == 3
    assert stopped == [["model", "worker-journal"]]
    err = capsys.readouterr().err
    assert err == "agentstream demo: the LLM caller exited at once (code 3); see .local/logs/worker-caller.log\n"


# --- against the running broker -----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def isolated_env(monkeypatch: pytest.MonkeyPatch, isolated: Path, tmp_path: Path) -> Iterator[Settings]:
    """Settings (and the children's environment) of a stack no other test or person shares."""
    from tests.kafka_stack import BOOTSTRAP, ensure_broker

    ensure_broker()
    tag = uuid.uuid4().hex[:8]
    app = f"agentstream-test-{tag}"
    env = {
        "BOOTSTRAP_SERVERS": BOOTSTRAP,
        "TOPIC_PREFIX": f"t{tag}-",
        "PARTITIONS": "2",
        "DATA_DIR": str(tmp_path / "data"),
        "APP_ID": app,
        "ROUTER_APP_ID": f"{app}-router",
        "CALLER_GROUP": f"{app}-caller",
        "CAPABILITIES_GROUP": f"{app}-capabilities",
        "WORKER_PORT": "0",
        "METRICS_PORT": "0",
        "CALLER_METRICS_PORT": "0",
        "ROUTER_METRICS_PORT": "0",
        "CAPABILITIES_METRICS_PORT": "0",
        "CAPABILITIES_CONCURRENCY": "1",
        "CAPABILITIES_WARM_WORKERS": "1",
        "GATEWAY_PORT": str(_free_port()),
        "LOG_LEVEL": "WARNING",
    }
    for name in list(os.environ):
        if name.startswith("AGENTSTREAM_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(f"AGENTSTREAM_{name}", value)
    try:
        yield Settings.from_env()
    finally:
        local_stack.down(PROCESS_NAMES, say=lambda line: None)  # processes only: never the shared services
        _delete_topics(f"t{tag}-", app)


def _delete_topics(*prefixes: str) -> None:
    from confluent_kafka.admin import AdminClient

    from tests.kafka_stack import BOOTSTRAP

    admin = AdminClient({"bootstrap.servers": BOOTSTRAP, "log_level": 3})
    names = [name for name in admin.list_topics(timeout=10).topics if name.startswith(prefixes)]
    for future in admin.delete_topics(names, operation_timeout=10).values() if names else ():
        with contextlib.suppress(Exception):
            future.result()


def _post(url: str, token: str, body: str) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url,
        data=body.encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=40) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


@pytest.mark.kafka
@pytest.mark.timeout(400)
def test_processes_start_answer_through_the_gateway_and_stop(isolated_env: Settings) -> None:
    settings = isolated_env
    local_stack.ensure_topics_now()  # as `up` does, with this test's prefix
    said: list[str] = []
    launch = local_stack.start_processes(settings, local_stack.Launch(), say=said.append)

    assert launch.started == PROCESS_NAMES, said
    pids = {name: local_stack._alive(local_stack.RUN_DIR / f"{name}.pid") for name in PROCESS_NAMES}
    assert all(pids.values()), pids
    assert launch.token is not None

    # The usage's own curl line, sent as it is printed (an agent path without agent/created: no turn).
    (curl,) = [line for line in local_stack.usage(settings, launch) if line.lstrip().startswith("curl ")]
    words = shlex.split(curl)
    body = words[words.index("-d") + 1]
    path = f"/agents/local-stack-{uuid.uuid4().hex[:8]}"
    url = words[2].replace("$AGENT", path)
    assert url == f"{local_stack.gateway_url(settings)}/v1/streams{path}/events?wait=true"

    def journaled() -> tuple[int, dict[str, Any]] | None:
        status, answer = _post(url, launch.token or "", body)
        return (status, answer) if status != 503 else None  # 503 while the workers join their groups

    status, answer = wait_until(journaled, 180, "the gateway to journal a command", interval=1.0)
    assert (status, answer) == (200, {"streamPath": path, "offset": 1, "duplicate": False}), answer

    again = local_stack.start_processes(settings, local_stack.Launch(), say=said.append)
    assert (again.started, again.token) == ([], None)

    stopped: list[str] = []
    assert local_stack.down(launch.started, say=stopped.append) == list(reversed(PROCESS_NAMES))
    assert stopped == [f"  stopped {name}" for name in reversed(PROCESS_NAMES)]
    for name, pid in pids.items():
        assert pid is not None and not local_stack._running(pid), name
        assert not (local_stack.RUN_DIR / f"{name}.pid").exists()
    assert local_stack.down(PROCESS_NAMES, say=stopped.append) == []


def test_down_with_nothing_running_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any) -> None:
    """Finding: `agentstream down` claimed to stop the broker and model when nothing ran.

    The stack's real stop scripts run from a copy of the repository layout, so the shared broker
    and any engineer's workers stay untouched.
    """
    from pipeline import cli
    from pipeline.dev import local_stack

    scripts = tmp_path / "repo" / "scripts"
    for name in ("kafka/stop.sh", "kafka/common.sh", "model/stop.sh", "jaeger/stop.sh"):
        (scripts / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "scripts" / name, scripts / name)
    monkeypatch.setattr(local_stack, "SCRIPTS", scripts)
    monkeypatch.setattr(local_stack, "RUN_DIR", tmp_path / "repo" / ".local" / "run")

    assert cli.main(["down"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == "nothing was running (no live pid files under .local/)", out

    # A worker that does run is stopped and named, and then nothing else is claimed.
    fake = subprocess.Popen(["bash", "-c", "exec -a agentstream-fake-worker sleep 60"])
    threading.Thread(target=fake.wait, daemon=True).start()  # reaped at once: a zombie would look alive
    local_stack.RUN_DIR.mkdir(parents=True)
    (local_stack.RUN_DIR / "worker-journal.pid").write_text(str(fake.pid))
    wait_until(lambda: b"agentstream" in Path(f"/proc/{fake.pid}/cmdline").read_bytes(), 10, "the fake worker")
    try:
        assert cli.main(["down"]) == 0
        assert capsys.readouterr().out.strip() == "stopped worker-journal"
    finally:
        fake.kill()
