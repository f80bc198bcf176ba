"""The consumer-group generation a journal worker's transactions are fenced by
(docs/architecture.md, "Fencing").

Every transaction of a journal worker commits its command positions as offsets of its Faust
consumer group (`send_offsets_to_transaction`), naming the group generation and member id under
which the worker owns its partitions. The group coordinator refuses that offset commit once the
group has moved on (another worker owns the partitions now), which aborts the transaction: a
worker that was paused or cut off writes nothing that becomes visible.

librdkafka takes the membership in its own serialized form only (what a librdkafka consumer's
`consumer_group_metadata()` returns), but the member here is Faust's aiokafka consumer. The form
is plain bytes, written here; checked against librdkafka 2.16 (confluent-kafka 2.16.1):

    b"CGMDv2:" + generation (int32, little-endian) + group id + NUL + member id + NUL
    + (b"\\0" + group instance id + NUL, or b"\\1" when there is none)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_MAGIC = b"CGMDv2:"
_NO_GENERATION = -1


@dataclass(frozen=True, slots=True)
class GroupMembership:
    """One member's place in its consumer group: what the coordinator checks an offset commit by."""

    group_id: str
    generation: int
    member_id: str
    instance_id: str | None = None

    @property
    def joined(self) -> bool:
        """Whether the member holds a generation (a member between generations has none)."""
        return self.generation > 0 and bool(self.member_id)

    def encode(self) -> bytes:
        """The membership in librdkafka's serialized consumer group metadata form."""
        for name, text in (
            ("group id", self.group_id),
            ("member id", self.member_id),
            ("instance id", self.instance_id),
        ):
            if text is not None and "\0" in text:
                raise ValueError(f"a consumer group {name} cannot hold NUL: {text!r}")
        instance = b"\1" if self.instance_id is None else b"\0" + self.instance_id.encode() + b"\0"
        return b"".join(
            (
                _MAGIC,
                struct.pack("<i", self.generation),
                self.group_id.encode(),
                b"\0",
                self.member_id.encode(),
                b"\0",
                instance,
            )
        )

    @classmethod
    def decode(cls, data: bytes) -> GroupMembership:
        """The inverse of `encode` (also reads what librdkafka's consumers write)."""
        if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + 4:
            raise ValueError(f"not serialized consumer group metadata: {data[:16]!r}")
        (generation,) = struct.unpack_from("<i", data, len(_MAGIC))
        rest = data[len(_MAGIC) + 4 :]
        group_id, member_id, tail = rest.split(b"\0", 2)
        if tail == b"\1":
            instance_id = None
        elif tail.startswith(b"\0") and tail.endswith(b"\0"):
            instance_id = tail[1:-1].decode()
        else:
            raise ValueError(f"consumer group metadata with a malformed instance id: {tail!r}")
        return cls(group_id.decode(), generation, member_id.decode(), instance_id)


def unjoined(group_id: str) -> GroupMembership:
    """A member of `group_id` that holds no generation yet (every transactional offset commit fails)."""
    return GroupMembership(group_id, _NO_GENERATION, "")


# The metadata string of a committed command position: the journal offset the transaction that
# committed it reached in the same partition, so that the partition's next owner reads the journal
# at least that far (docs/architecture.md, "Recovering").
_JOURNAL_METADATA = "journal="


def position_metadata(journal_offset: int) -> str:
    return f"{_JOURNAL_METADATA}{journal_offset}"


def journal_offset_of(metadata: str | None) -> int:
    """The journal offset a committed position's metadata names; -1 when it names none."""
    if not metadata or not metadata.startswith(_JOURNAL_METADATA):
        return -1
    try:
        return int(metadata[len(_JOURNAL_METADATA) :])
    except ValueError:
        return -1
