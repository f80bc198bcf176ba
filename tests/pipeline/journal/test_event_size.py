"""A command's size against `maxEventBytes` (docs/behaviour.md §5.1.3), exactly at the limit, without
a broker: the journal worker's decision (its partition engine over in-memory Kafka) and the setting.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from pipeline.settings import Settings, SettingsError
from tests.support.engine_harness import NAMES, PATH, EngineHarness
from topics.headers import H_REASON

BLOB = "events.iterate.com/test/blob"  # a type the agent does not consume: any object payload


def command_of_size(size: int) -> bytes:
    """An append command whose UTF-8 JSON is exactly `size` bytes."""
    empty = orjson.dumps({"streamPath": PATH, "type": BLOB, "payload": {"blob": ""}})
    value = orjson.dumps({"streamPath": PATH, "type": BLOB, "payload": {"blob": "x" * (size - len(empty))}})
    assert len(value) == size
    return value


def journal_one(value: bytes, **engine_options: int) -> EngineHarness:
    harness = EngineHarness(**engine_options)

    async def scenario() -> None:
        await harness.handle(harness.raw(value))
        await harness.settle()

    asyncio.run(scenario())
    assert harness.fatal == []
    return harness


def test_5_1_3_max_event_bytes_defaults_to_900_kib_and_is_1024_to_1000000() -> None:
    """§5.1.3: "default 900 KiB = 921 600 bytes of UTF-8 JSON; `AGENTSTREAM_MAX_EVENT_BYTES`,
    1 024 … 1 000 000"."""
    assert Settings.from_env({}).max_event_bytes == 921_600
    assert Settings.from_env({"AGENTSTREAM_MAX_EVENT_BYTES": "1024"}).max_event_bytes == 1024
    assert Settings.from_env({"AGENTSTREAM_MAX_EVENT_BYTES": "1000000"}).max_event_bytes == 1_000_000
    for bad in ("1023", "1000001"):
        with pytest.raises(SettingsError):
            Settings.from_env({"AGENTSTREAM_MAX_EVENT_BYTES": bad})


def test_5_1_3_a_command_of_exactly_921600_bytes_is_journaled() -> None:
    harness = journal_one(command_of_size(921_600))
    (event,) = harness.kafka.on(NAMES.journal)
    assert orjson.loads(event.value)["offset"] == 1
    assert harness.kafka.on(NAMES.dlq) == []


def test_5_1_3_a_command_of_921601_bytes_is_dead_lettered_as_too_large() -> None:
    """§5.1.3: dead-lettered as `too_large: the command is <n> bytes, over maxEventBytes (<max>); keep
    bulky data in a referenced event or a file`."""
    harness = journal_one(command_of_size(921_601))
    assert harness.kafka.on(NAMES.journal) == []
    (dead,) = harness.kafka.on(NAMES.dlq)
    assert dead.headers[H_REASON] == (
        b"too_large: the command is 921601 bytes, over maxEventBytes (921600); "
        b"keep bulky data in a referenced event or a file"
    )


def test_5_1_3_a_configured_limit_holds_exactly_at_its_value() -> None:
    assert len(journal_one(command_of_size(2048), max_event_bytes=2048).kafka.on(NAMES.journal)) == 1
    refused = journal_one(command_of_size(2049), max_event_bytes=2048)
    assert refused.kafka.on(NAMES.journal) == [] and len(refused.kafka.on(NAMES.dlq)) == 1
