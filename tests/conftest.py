"""Session-wide pytest settings."""

from __future__ import annotations

import os
import sys

import pytest

_exit_status: list[int] = []


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave as soon as every result is reported. A librdkafka client that a failed test left open
    keeps background threads that may call into Python (its log callback) while the interpreter
    tears down, and crash it after the results are in: the run's status would then be a
    segfault's instead of pytest's. AGENTSTREAM_TEST_NORMAL_EXIT=1 tears down normally, to hunt
    such leaks."""
    if not _exit_status or os.environ.get("AGENTSTREAM_TEST_NORMAL_EXIT") == "1":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status[0])
