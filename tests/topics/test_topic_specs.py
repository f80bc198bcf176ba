"""The topic set as declared, without a broker (topics/names.py; docs/architecture.md, "Topics").

Creating and verifying the topics against the real broker is tests/topics/test_topics_kafka.py.
"""

from __future__ import annotations

from topics.names import topic_names, topic_specs


def test_topic_set_shares_one_partition_count_and_keeps_the_journal_forever() -> None:
    specs = {spec.name: spec for spec in topic_specs("p-", partitions=6)}
    names = topic_names("p-")
    keyed = [names.appends, names.journal, names.llm_requests]
    assert {specs[name].partitions for name in keyed} == {6}
    journal = specs[names.journal].configs
    assert journal == {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}


def test_5_1_8_llm_requests_takes_records_of_4_mib_plus_256_kib() -> None:
    """§5.1.8: "the `llm-requests` topic (`max.message.bytes` 4 456 448 = 4 MiB + 256 KiB)"."""
    specs = {spec.name: spec for spec in topic_specs("p-", partitions=1)}
    assert specs[topic_names("p-").llm_requests].configs["max.message.bytes"] == "4456448"
