"""The group membership a journal worker's transactions name, in librdkafka's serialized form
(`pipeline.kafka.group_generation`; docs/architecture.md, "Fencing"). Broker-free: librdkafka's own
consumers write the form here (a consumer that has not joined holds generation -1 and no member id)."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer

from pipeline.kafka.group_generation import (
    GroupMembership,
    journal_offset_of,
    position_metadata,
    unjoined,
)


def librdkafka_metadata(group: str, instance_id: str | None) -> bytes:
    config = {"group.id": group, "bootstrap.servers": "127.0.0.1:9", "log_level": 0}
    if instance_id is not None:
        config["group.instance.id"] = instance_id
    consumer = Consumer(config)
    try:
        metadata: bytes = consumer.consumer_group_metadata()
        return metadata
    finally:
        consumer.close()


@pytest.mark.parametrize("instance_id", ["worker-0", None])
def test_the_form_is_librdkafkas_own(instance_id: str | None) -> None:
    written = librdkafka_metadata("agentstream-journal", instance_id)
    assert GroupMembership("agentstream-journal", -1, "", instance_id).encode() == written
    assert GroupMembership.decode(written) == GroupMembership("agentstream-journal", -1, "", instance_id)


def test_generation_member_and_instance_are_each_in_place() -> None:
    membership = GroupMembership("g", 258, "member-1", "pod-3")
    assert membership.encode() == b"CGMDv2:\x02\x01\x00\x00g\x00member-1\x00\x00pod-3\x00"
    assert GroupMembership.decode(membership.encode()) == membership
    assert GroupMembership("g", 7, "m").encode() == b"CGMDv2:\x07\x00\x00\x00g\x00m\x00\x01"


def test_a_negative_generation_is_written_as_librdkafka_writes_it() -> None:
    assert unjoined("g").encode() == b"CGMDv2:\xff\xff\xff\xffg\x00\x00\x01"


def test_only_a_member_with_a_generation_and_a_member_id_has_joined() -> None:
    assert GroupMembership("g", 1, "m").joined
    assert not GroupMembership("g", 0, "m").joined
    assert not GroupMembership("g", 3, "").joined
    assert not unjoined("g").joined


def test_a_nul_in_a_name_is_refused_rather_than_misread() -> None:
    with pytest.raises(ValueError, match="member id cannot hold NUL"):
        GroupMembership("g", 1, "m\0x").encode()


def test_malformed_metadata_is_refused() -> None:
    with pytest.raises(ValueError, match="not serialized"):
        GroupMembership.decode(b"CGMDv1:\x01\x00\x00\x00g\x00m\x00\x01")
    with pytest.raises(ValueError, match="malformed instance id"):
        GroupMembership.decode(b"CGMDv2:\x01\x00\x00\x00g\x00m\x00\x02")


def test_a_positions_metadata_names_the_journal_offset_its_transaction_reached() -> None:
    assert journal_offset_of(position_metadata(0)) == 0
    assert journal_offset_of(position_metadata(123456)) == 123456
    for other in (None, "", "journal=", "journal=x", "offset=5"):
        assert journal_offset_of(other) == -1
