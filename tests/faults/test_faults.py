"""behaviour §5.2 under faults, on a cluster of three brokers in network namespaces (tests/faults/run.py).

One bounded run of every scenario at a low rate (about 5 minutes): the leader of a busy partition
and the active controller SIGKILLed, a broker paused, a journal worker and the LLM caller cut off
past their session timeout, a rolling restart of the brokers, the gateway cut off from the brokers
(503, then 200 again). After each, the committed journal holds every acknowledged append once,
nothing twice, gapless offsets, rows equal to a replay, every turn settled once, and only the
invalid commands in the dead-letter topic. The long random mix is `tests/faults/run.py --soak`.
"""

from __future__ import annotations

import pytest

from tests.faults import net

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def namespaces() -> None:
    try:
        net.check_available()
    except net.NetworkUnavailable as error:
        pytest.skip(f"fault harness: {error}")


def test_5_2_every_scenario_keeps_the_journal_exact(namespaces: None) -> None:
    from tests.faults.run import run

    verdicts = run()
    failed = {v.scenario: v.problems[:5] for v in verdicts if not v.ok}
    assert len(verdicts) == 7 and not failed, f"scenarios failed (seed and history printed above): {failed}"
