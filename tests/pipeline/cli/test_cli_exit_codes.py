"""How `agentstream` maps what a command raises to its exit code (pipeline/exit_codes.py; docs/usage.md,
"Exit codes"), without Kafka: in-process, and as a process pointed at a port where nothing listens."""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

import pytest

from pipeline import cli, exit_codes
from pipeline.cli import fold_verb
from tests.kafka_stack import BIN
from tests.support.cli import one_line
from tests.support.ports import free_port


def interrupted_inside_a_c_call(_args: argparse.Namespace) -> int:
    """What CPython 3.11 raised when Ctrl-C reached `replay` inside a C call (seen under load)."""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as interrupt:
        raise SystemError("<class 'TopicNames'> returned a result with an exception set") from interrupt


def crashed_in_c(_args: argparse.Namespace) -> int:
    raise SystemError("a real interpreter error")


def test_ctrl_c_is_130_even_when_cpython_wraps_it_in_a_system_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fold_verb, "run", interrupted_inside_a_c_call)
    assert cli.main(["fold"]) == exit_codes.INTERRUPTED


def test_a_plain_ctrl_c_is_130(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(_args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(fold_verb, "run", interrupted)
    assert cli.main(["fold"]) == exit_codes.INTERRUPTED


def test_a_system_error_not_caused_by_ctrl_c_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fold_verb, "run", crashed_in_c)
    with pytest.raises(SystemError, match="real interpreter error"):
        cli.main(["fold"])


def test_wrong_bootstrap_server_is_one_line_not_librdkafka_noise(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "AGENTSTREAM_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
        "AGENTSTREAM_TOPIC_PREFIX": "unreachable-",
        "AGENTSTREAM_DATA_DIR": str(tmp_path),
        "AGENTSTREAM_LOG_LEVEL": "WARNING",
    }
    result = subprocess.run(
        [str(BIN / "agentstream"), "agent", "create"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 3, result.stderr[-2000:]
    assert one_line(result.stderr), result.stderr[-2000:]
    assert "rdkafka" not in result.stderr and "%3|" not in result.stderr
    assert "cannot reach Kafka" in result.stderr and "AGENTSTREAM_BOOTSTRAP_SERVERS" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("worker", ["journal", "router"])
def test_a_faust_worker_without_kafka_exits_3_with_one_line_not_a_traceback(worker: str, tmp_path: Path) -> None:
    """The journal worker and the router check Kafka and their topics before Faust starts, as the
    caller and the capability host do (docs/usage.md, "Exit codes": 3)."""
    env = {
        **os.environ,
        "AGENTSTREAM_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
        "AGENTSTREAM_DATA_DIR": str(tmp_path),
        "AGENTSTREAM_METRICS_PORT": "0",
        "AGENTSTREAM_ROUTER_METRICS_PORT": "0",
    }
    result = subprocess.run(
        [str(BIN / "agentstream"), "worker", worker], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == exit_codes.KAFKA, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "rdkafka" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot start: cannot reach Kafka" in lines[0], result.stderr[-2000:]
