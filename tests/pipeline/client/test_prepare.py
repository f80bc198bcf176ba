"""The one append path every door takes (pipeline/client/prepare.py), broker-free: shape, authority,
payload, size (behaviour §5.1.3, §5.1.5, §7.2), and append ids."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from pipeline.client.prepare import Prepared, Unfit, new_append_id, prepare_append
from processors.gate import Claims

MAX = 900 * 1024
USER = {"streamPath": "/agents/a1", "type": "events.iterate.com/agents/context-added"}
SETTLED = {"streamPath": "/agents/a1", "type": "events.iterate.com/agent/llm-request-settled"}


def user_item(content: str = "hi") -> dict[str, Any]:
    return {**USER, "payload": {"role": "user", "content": content}}


def test_a_valid_command_is_serialised_with_its_append_id() -> None:
    prepared = prepare_append(user_item(), "id-1", max_event_bytes=MAX)
    assert isinstance(prepared, Prepared) and not prepared.internal
    assert orjson.loads(prepared.value) == {**user_item(), "appendId": "id-1"}


def test_a_malformed_command_is_invalid_with_the_validation_message() -> None:
    unfit = prepare_append({"streamPath": "no-slash", "type": "t", "payload": {}}, "id", max_event_bytes=MAX)
    assert isinstance(unfit, Unfit) and unfit.kind == "invalid" and "streamPath" in unfit.detail


def test_5_1_5_worker_only_types_are_forbidden_at_a_client_outside_the_workers_and_internal_for_workers() -> None:
    command = {**SETTLED, "payload": {"requestOffset": 3, "result": {"status": "succeeded", "text": "x"}}}
    refused = prepare_append(command, "id", max_event_bytes=MAX)
    assert isinstance(refused, Unfit) and refused.kind == "forbidden"
    assert refused.detail.startswith(
        "forbidden: events.iterate.com/agent/llm-request-settled is written by the workers"
    )
    workers = prepare_append(command, "id", max_event_bytes=MAX, workers=True)
    assert isinstance(workers, Prepared) and workers.internal


def test_7_2_a_token_door_goes_through_the_gate_and_gets_the_stamped_actor() -> None:
    user = Claims("user", ("/agents/**",), user_id="u-7")
    prepared = prepare_append(user_item(), "id", max_event_bytes=MAX, claims=user, origin="mcp")
    assert isinstance(prepared, Prepared)
    assert prepared.command.payload["actor"] == {"type": "user", "origin": "mcp", "userId": "u-7"}
    outside = prepare_append({**user_item(), "streamPath": "/other/a"}, "id", max_event_bytes=MAX, claims=user)
    assert isinstance(outside, Unfit) and outside.kind == "forbidden" and outside.rule == "scope"


def test_a_consumed_payload_is_checked_only_when_asked() -> None:
    bad = {**USER, "payload": {"role": "user", "content": "hi", "bogus": 1}}
    assert isinstance(prepare_append(bad, "id", max_event_bytes=MAX), Prepared)  # the journal judges it
    checked = prepare_append(bad, "id", max_event_bytes=MAX, check_payload=True)
    assert isinstance(checked, Unfit) and checked.kind == "invalid" and "bogus" in checked.detail


def test_5_1_3_a_command_of_exactly_max_event_bytes_is_produced_one_byte_more_is_too_large() -> None:
    empty = prepare_append(user_item(""), "id", max_event_bytes=MAX)
    assert isinstance(empty, Prepared)
    fill = 921_600 - len(empty.value)  # maxEventBytes, 900 KiB, as the contract states it
    at_limit = prepare_append(user_item("x" * fill), "id", max_event_bytes=921_600)
    assert isinstance(at_limit, Prepared) and len(at_limit.value) == 921_600
    over = prepare_append(user_item("x" * (fill + 1)), "id", max_event_bytes=921_600)
    assert isinstance(over, Unfit) and over.kind == "too_large"
    assert over.detail == (
        "too_large: the command is 921601 bytes, over maxEventBytes (921600); "
        "keep bulky data in a referenced event or a file"
    )


def test_append_ids_are_unique_and_of_one_shape() -> None:
    ids = [new_append_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


@pytest.mark.parametrize("tier", ["user", "integration", "agent"])
def test_6_8_a_reserved_key_is_refused_by_rule_at_every_token_door_but_platform(tier: str) -> None:
    claims = Claims(tier, ("/**",), agent_path="/agents/x", user_id="u")  # type: ignore[arg-type]
    command = {**user_item(), "idempotencyKey": "agent/request/3"}
    unfit = prepare_append(command, "id", max_event_bytes=MAX, claims=claims)
    assert isinstance(unfit, Unfit) and unfit.rule == "reserved-key"
