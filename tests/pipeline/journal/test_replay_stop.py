"""How replay takes SIGINT and SIGTERM (`pipeline.journal.replay._Stop`), without a broker: noted
where they land and raised only where replay checks, handlers given back afterwards, and the exit
codes `agentstream replay` maps a stop to (docs/usage.md, "Exit codes"). The broker-backed tests
(test_replay_kafka.py) stop real replays in every phase."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from pipeline import cli, exit_codes
from pipeline.cli import replay_verb
from pipeline.journal.replay import ReplayInterrupted, _Stop


def settle() -> None:
    """Long enough for the interpreter to run a pending signal's Python handler."""
    time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_is_noted_where_it_lands_and_raised_by_check(sig: int) -> None:
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with _Stop() as stop:
        stop.check()  # nothing yet
        os.kill(os.getpid(), sig)
        settle()  # no exception here: only a note
        assert stop.signum == sig
        with pytest.raises(ReplayInterrupted) as stopped:
            stop.check()
    assert stopped.value.signum == sig and str(stopped.value) == f"replay stopped by {signal.Signals(sig).name}"
    assert isinstance(stopped.value, KeyboardInterrupt)  # callers that handle Ctrl-C handle it
    assert {s: signal.getsignal(s) for s in handlers} == handlers


def test_the_first_signal_is_the_one_reported() -> None:
    with _Stop() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        settle()
        os.kill(os.getpid(), signal.SIGINT)
        settle()
    assert stop.signum == signal.SIGTERM


def test_a_sigint_the_caller_ignores_stays_ignored() -> None:
    """A command started in the background by a non-interactive shell ignores Ctrl-C."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with _Stop() as stop:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            settle()
            stop.check()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize(
    ("sig", "code"),
    [(signal.SIGINT, exit_codes.INTERRUPTED), (signal.SIGTERM, exit_codes.TERMINATED)],
    ids=["SIGINT", "SIGTERM"],
)
def test_a_stopped_replay_exits_with_the_signals_code_and_says_the_output_is_incomplete(
    sig: int, code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def stopped(*_args: object, **_kwargs: object) -> None:
        raise ReplayInterrupted(sig)

    monkeypatch.setenv("AGENTSTREAM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(replay_verb, "require_topics", lambda *args, **kwargs: None)
    monkeypatch.setattr(replay_verb, "replay", stopped)
    out = tmp_path / "out"
    assert cli.main(["replay", "--jobs", "2", "--verify", "--out", str(out)]) == code
    captured = capsys.readouterr()
    assert captured.out == ""  # no summary, no verify
    assert captured.err.strip() == (
        f"agentstream: replay stopped by {signal.Signals(sig).name}: {out} is incomplete "
        "(the next replay into it starts over)"
    )


def test_the_stop_exit_codes_are_the_shells() -> None:
    """130 and 143 are what a shell reports for a command SIGINT or SIGTERM ended: 128 + the signal."""
    assert exit_codes.INTERRUPTED == 128 + signal.SIGINT
    assert exit_codes.TERMINATED == 128 + signal.SIGTERM
