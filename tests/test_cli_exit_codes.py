"""How `agentstream` maps what a command raises to its exit code (pipeline/exit_codes.py; docs/usage.md,
"Exit codes"), without Kafka."""

from __future__ import annotations

import argparse

import pytest

from pipeline import cli, exit_codes
from pipeline.cli import fold_command


def interrupted_inside_a_c_call(_args: argparse.Namespace) -> int:
    """What CPython 3.11 raised when Ctrl-C reached `replay` inside a C call (seen under load)."""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as interrupt:
        raise SystemError("<class 'TopicNames'> returned a result with an exception set") from interrupt


def crashed_in_c(_args: argparse.Namespace) -> int:
    raise SystemError("a real interpreter error")


def test_ctrl_c_is_130_even_when_cpython_wraps_it_in_a_system_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fold_command, "run", interrupted_inside_a_c_call)
    assert cli.main(["fold"]) == exit_codes.INTERRUPTED


def test_a_plain_ctrl_c_is_130(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(_args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(fold_command, "run", interrupted)
    assert cli.main(["fold"]) == exit_codes.INTERRUPTED


def test_a_system_error_not_caused_by_ctrl_c_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fold_command, "run", crashed_in_c)
    with pytest.raises(SystemError, match="real interpreter error"):
        cli.main(["fold"])
