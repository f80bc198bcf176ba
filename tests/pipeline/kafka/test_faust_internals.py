"""What the adapter reaches past Faust's and aiokafka's public API for (`pipeline.kafka.faust_internals`)
still exists in the installed versions: an upgrade that moves any of it fails here, broker-free."""

from __future__ import annotations

import asyncio
import importlib
import inspect
from importlib.metadata import version
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaConsumer

from pipeline.kafka.faust_internals import CHECKED, aiokafka_membership, group_membership, read_committed_only


def test_the_versions_checked_are_the_pinned_ones() -> None:
    assert version("faust-streaming") == "0.15.3"
    assert version("aiokafka") == "0.14.0"
    assert version("mode-streaming") == "0.7.1"


@pytest.mark.parametrize(("owner", "name"), [(owner, name) for owner, names in CHECKED.items() for name in names])
def test_each_private_name_the_adapter_uses_exists(owner: str, name: str) -> None:
    module, class_name = owner.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), class_name)
    source = "".join(_source(base) for base in cls.__mro__)
    assert hasattr(cls, name) or f"self.{name} =" in source or f"self.{name}:" in source, f"{owner}.{name} is gone"


def _source(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):  # builtins, classes made at run time
        return ""


def test_an_aiokafka_consumer_that_has_not_joined_holds_no_generation() -> None:
    async def scenario() -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:9", group_id="g")
        membership = aiokafka_membership(consumer, "g")  # no coordinator before start
        assert membership.group_id == "g" and not membership.joined
        read_committed_only(consumer)
        assert consumer._isolation_level == "read_committed"

    asyncio.run(scenario())


def test_the_membership_is_read_from_the_coordinator_of_fausts_consumer_thread() -> None:
    coordinator = SimpleNamespace(group_id="app", generation=4, member_id="m-1", _group_instance_id="pod-0")
    app = SimpleNamespace(
        conf=SimpleNamespace(id="app"),
        consumer=SimpleNamespace(_thread=SimpleNamespace(_consumer=SimpleNamespace(_coordinator=coordinator))),
    )
    membership = group_membership(app)
    assert (membership.generation, membership.member_id, membership.instance_id) == (4, "m-1", "pod-0")
    app.consumer._thread._consumer = None  # not started yet
    assert not group_membership(app).joined
