"""The `agentstream` command line against the real broker: the commands a person uses daily."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.kafka_stack import BIN, Stack, ensure_broker

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    ensure_broker()
    stack = Stack(tmp_path_factory.mktemp("cli") / "data", partitions=2)
    stack.start_worker()
    try:
        yield stack
    finally:
        stack.close()


def agentstream(stack: Stack, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "agentstream"), *args], env=stack.env(), capture_output=True, text=True, timeout=timeout
    )


def test_agent_create_say_tail_show(stack: Stack) -> None:
    created = agentstream(stack, "agent", "create")
    assert created.returncode == 0, created.stderr
    path = created.stdout.strip()
    assert path.startswith("/agents/")
    said = agentstream(stack, "agent", "say", path, "@ not a header\nsecond line", "--no-trigger")
    assert (said.returncode, said.stdout.strip()) == (0, "@3"), said.stderr

    tail = agentstream(stack, "agent", "tail", path, "--no-follow", "--json")
    events = [orjson.loads(line) for line in tail.stdout.splitlines()]
    assert [e["offset"] for e in events] == [1, 2, 3]
    assert events[2]["payload"]["llmRequestPolicy"] == {"behaviour": "dont-trigger-request"}

    plain = agentstream(stack, "agent", "tail", path, "--no-follow")
    lines = plain.stdout.splitlines()
    assert len(lines) == 3 and "\x1b[" not in plain.stdout  # no colours when not a terminal
    assert lines[2].endswith("user [user]: @ not a header\\nsecond line")

    shown = agentstream(stack, "agent", "show", path)
    assert "status idle" in shown.stdout
    assert '@2 key="agent/system-prompt"' in shown.stdout
    assert "@3 actor=user:cli\n@ not a header\nsecond line" in shown.stdout

    projection = orjson.loads(agentstream(stack, "agent", "show", path, "--json").stdout)
    assert [i["offset"] for i in projection["history"]] == [3]


def test_errors_are_one_clear_line_with_exit_codes(stack: Stack) -> None:
    missing = agentstream(stack, "agent", "show", "/agents/does-not-exist")
    assert missing.returncode == 4
    assert missing.stderr.strip().count("\n") == 0 and "no events in /agents/does-not-exist" in missing.stderr

    no_request = agentstream(stack, "agent", "create")
    path = no_request.stdout.strip()
    result = agentstream(stack, "agent", "request", path, "--offset", "99")
    assert result.returncode == 4 and "no llm-request-requested event at @99" in result.stderr

    bad_path = agentstream(stack, "agent", "say", "relative/path", "hi")
    assert bad_path.returncode == 2 and "Traceback" not in bad_path.stderr

    bad_setting = subprocess.run(
        [str(BIN / "agentstream"), "topics", "ensure"],
        env={**stack.env(), "AGENTSTREAM_PARTITIONS": "many"},
        capture_output=True,
        text=True,
    )
    assert bad_setting.returncode == 2 and "AGENTSTREAM_PARTITIONS" in bad_setting.stderr


def test_topics_ensure_and_replay_verify(stack: Stack, tmp_path: Path) -> None:
    ensured = agentstream(stack, "topics", "ensure")
    assert ensured.returncode == 0 and "agent-journal: ok (2 partitions)" in ensured.stdout
    mismatch = subprocess.run(
        [str(BIN / "agentstream"), "topics", "ensure"],
        env={**stack.env(), "AGENTSTREAM_PARTITIONS": "3"},
        capture_output=True,
        text=True,
    )
    assert mismatch.returncode == 3 and "partitions expected 3, actual 2" in mismatch.stderr

    path = agentstream(stack, "agent", "create").stdout.strip()
    assert agentstream(stack, "agent", "say", path, "for replay", "--no-trigger").returncode == 0
    stack.stop_worker()  # an idle, stopped worker: the live rows are complete
    try:
        replayed = agentstream(stack, "replay", "--verify", "--quiet", "--out", str(tmp_path / "replay"))
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
        assert "live store matches the journal" in replayed.stdout
    finally:
        stack.start_worker()
