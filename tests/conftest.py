"""Session-wide pytest settings."""

from __future__ import annotations

import os
import sys

import pytest

_exit_status: list[int] = []
_broker_up: list[bool] = []


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures, which may start workers
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `kafka` talks to the local broker: start it, once per run, unless it answers."""
    if not _broker_up and item.get_closest_marker("kafka") is not None:
        from tests.kafka_stack import ensure_broker

        ensure_broker()
        _broker_up.append(True)


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
