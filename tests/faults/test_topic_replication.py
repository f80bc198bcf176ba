"""`topics ensure` and the replication factor (scripts/kafka/README.md, "A cluster of three").

Every topic `ensure` creates, the journal worker's changelog and assignor topics included, gets the
setting's factor, and an existing topic with another factor is refused with one line naming it.
"""

from __future__ import annotations

import uuid

import pytest

from tests.kafka_stack import BOOTSTRAP
from topics.admin import TopicMismatchError, delete_topics, ensure_topics
from topics.names import journal_worker_topic_specs, topic_specs


def test_every_declared_topic_carries_the_replication_factor() -> None:
    specs = topic_specs("p-", 4, 3) + journal_worker_topic_specs("app", 4, 3)
    assert {spec.replication_factor for spec in specs} == {3}
    by_name = {spec.name: spec for spec in specs}
    assert by_name["app-rows-changelog"].configs == {"cleanup.policy": "compact"}
    assert by_name["app-rows-changelog"].partitions == 4
    assert by_name["app-__assignor-__leader"].partitions == 1


@pytest.mark.kafka
def test_ensure_refuses_a_topic_with_another_replication_factor() -> None:
    prefix = f"rf{uuid.uuid4().hex[:6]}-"
    specs = topic_specs(prefix, 2, 1) + journal_worker_topic_specs(f"{prefix}app", 2, 1)
    try:
        ensure_topics(BOOTSTRAP, specs)
        wanted = topic_specs(prefix, 2, 2) + journal_worker_topic_specs(f"{prefix}app", 2, 2)
        with pytest.raises(TopicMismatchError) as refused:
            ensure_topics(BOOTSTRAP, wanted)
        assert f"{prefix}agent-journal: replication factor expected 2, actual 1" in str(refused.value)
        assert f"{prefix}app-rows-changelog: replication factor expected 2, actual 1" in str(refused.value)
    finally:
        delete_topics(BOOTSTRAP, [spec.name for spec in specs])
