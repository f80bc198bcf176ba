"""Integration: creating and verifying the topic set against the real local broker (topics/)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from tests.kafka_stack import BOOTSTRAP
from topics.admin import TopicMismatchError, delete_topics, ensure_topics
from topics.names import TopicSpec, topic_names, topic_specs

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]


@pytest.fixture
def prefix() -> Iterator[str]:
    prefix = f"tt{uuid.uuid4().hex[:8]}-"
    yield prefix
    delete_topics(BOOTSTRAP, [spec.name for spec in topic_specs(prefix)])


def test_ensure_topics_creates_missing_topics_with_their_configs_then_is_idempotent(prefix: str) -> None:
    specs = topic_specs(prefix, partitions=3)
    assert sorted(ensure_topics(BOOTSTRAP, specs)) == sorted(spec.name for spec in specs)
    assert ensure_topics(BOOTSTRAP, specs) == []

    admin = AdminClient({"bootstrap.servers": BOOTSTRAP, "log_level": 3})
    metadata = admin.list_topics(timeout=10).topics
    journal = topic_names(prefix).journal
    assert len(metadata[journal].partitions) == 3
    resource = ConfigResource(ConfigResource.Type.TOPIC, journal)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    assert configs["retention.ms"].value == "-1"
    assert configs["retention.bytes"].value == "-1"
    assert configs["cleanup.policy"].value == "delete"


def test_ensure_topics_names_topic_setting_expected_and_actual_on_mismatch(prefix: str) -> None:
    ensure_topics(BOOTSTRAP, topic_specs(prefix, partitions=2))
    journal = topic_names(prefix).journal

    with pytest.raises(TopicMismatchError) as wrong_partitions:
        ensure_topics(BOOTSTRAP, topic_specs(prefix, partitions=4))
    assert f"{journal}: partitions expected 4, actual 2" in str(wrong_partitions.value)

    compacted = TopicSpec(journal, 2, 1, {"cleanup.policy": "compact"})
    with pytest.raises(TopicMismatchError) as wrong_config:
        ensure_topics(BOOTSTRAP, [compacted])
    assert f"{journal}: cleanup.policy expected compact, actual delete" in str(wrong_config.value)
    assert "AGENTSTREAM_TOPIC_PREFIX" in str(wrong_config.value)  # says what to do


def test_delete_topics_ignores_topics_that_are_already_gone(prefix: str) -> None:
    delete_topics(BOOTSTRAP, [f"{prefix}never-created"])
