"""The MCP door's pure parts, broker-free (behaviour §9): the gate's stamp for MCP items, what
send_message appends and waits for, read_events' window, and the tools as the SDK lists and calls
them in-process (a stand-in for the door behind them)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from pipeline.gateway.commands import Limits, Problem, prepare_command
from pipeline.gateway.mcp.door import DoorError, problem_text
from pipeline.gateway.mcp.tools import TokenAuthority, build_server
from pipeline.gateway.mcp.turns import (
    TurnWatch,
    as_envelope,
    event_window,
    sent_message,
    user_message,
    within_bytes,
)
from pipeline.gateway.tokens import TokenBook, hash_token
from pipeline.settings import Settings
from processors.gate import Admitted, Claims, admit
from schemas.events import (
    CONTEXT_ADDED,
    LLM_REQUEST_REQUESTED,
    LLM_REQUEST_SETTLED,
    AppendCommand,
    InvalidPayloadEvent,
    OtherEvent,
    decode_event,
)
from schemas.gateway import TokensFile
from schemas.mcp import AgentList, EventRange
from topics.names import topic_names

ALICE = Claims(tier="user", scope=("/agents/alice/**",), user_id="alice")
PLATFORM = Claims(tier="platform", scope=("/**",))
PATH = "/agents/alice/a1"
TOPICS = topic_names("")
LIMITS = Limits(max_event_bytes=900_000, max_user_file_bytes=1000)


def event(offset: int, event_type: str, payload: dict[str, Any]) -> Any:
    return decode_event(
        {
            "streamPath": PATH,
            "offset": offset,
            "type": event_type,
            "payload": payload,
            "createdAt": "2026-12-03T10:00:00.000Z",
        }
    )


def requested(offset: int) -> Any:
    return event(offset, LLM_REQUEST_REQUESTED, {"model": "m", "expiresAt": 1})


def settled(offset: int, request: int, result: dict[str, Any]) -> Any:
    return event(offset, LLM_REQUEST_SETTLED, {"requestOffset": request, "result": result})


def assistant(offset: int, request: int | None, text: str = "answer") -> Any:
    payload: dict[str, Any] = {"role": "assistant", "content": text}
    if request is not None:
        payload["llmRequestOffset"] = request
    return event(offset, CONTEXT_ADDED, payload)


# --- the gate's stamp -------------------------------------------------------------------------------


def test_a_user_tokens_item_from_the_mcp_door_is_stamped_with_origin_mcp_and_its_user_id() -> None:
    """behaviour §7.2, §9: the same user-tier rules, the door named in the stamped actor."""
    command = AppendCommand.model_validate(
        {"streamPath": PATH, "type": CONTEXT_ADDED, "payload": {"role": "user", "content": "hi"}}
    )
    for origin in ("web", "mcp"):
        decision = admit(ALICE, command, origin=origin)
        assert isinstance(decision, Admitted)
        assert decision.command.payload["actor"] == {"type": "user", "origin": origin, "userId": "alice"}
    assert admit(ALICE, command).command.payload["actor"]["origin"] == "web"  # type: ignore[union-attr]


def test_send_message_leaves_a_user_tokens_actor_to_the_gate_and_names_the_origin_for_other_tiers() -> None:
    for_alice = user_message(ALICE, PATH, "hi", interrupt=False)
    assert "actor" not in for_alice["payload"]  # the gate refuses a client-supplied one (user-actor-stamped)
    ready = prepare_command(ALICE, for_alice, "a1", TOPICS, LIMITS, origin="mcp")
    assert not isinstance(ready, Problem)
    assert AppendCommand.model_validate_json(ready.value).payload["actor"] == {
        "type": "user",
        "origin": "mcp",
        "userId": "alice",
    }
    for_platform = user_message(PLATFORM, PATH, "hi", interrupt=True)
    assert for_platform["payload"] == {
        "role": "user",
        "content": "hi",
        "actor": {"type": "user", "origin": "mcp"},
        "llmRequestPolicy": {"behaviour": "interrupt-current-request"},
    }


def test_a_refusal_reads_as_the_http_apis_words_with_the_rule() -> None:
    elsewhere = user_message(ALICE, "/agents/bob/b1", "hi", interrupt=False)
    refused = prepare_command(ALICE, elsewhere, "a2", TOPICS, LIMITS, origin="mcp")
    assert isinstance(refused, Problem)
    assert problem_text(refused).startswith("forbidden (403, rule scope): scope: /agents/bob/b1 is outside")


# --- read_events' window ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("last", "from_offset", "limit", "expected"),
    [
        (10, None, 3, [8, 9, 10]),
        (2, None, 50, [1, 2]),
        (10, 4, 3, [4, 5, 6]),
        (10, 9, 5, [9, 10]),
        (10, 11, 5, []),
        (0, None, 5, []),
    ],
)
def test_read_events_returns_at_most_limit_events_from_the_offset_or_the_newest(
    last: int, from_offset: int | None, limit: int, expected: list[int]
) -> None:
    assert list(event_window(last, from_offset, limit)) == expected


def test_events_go_out_in_their_wire_shape_an_invalid_payload_as_written() -> None:
    typed = requested(4)
    assert as_envelope(typed) == OtherEvent.model_validate(
        {
            "streamPath": PATH,
            "offset": 4,
            "type": LLM_REQUEST_REQUESTED,
            "payload": {"model": "m", "expiresAt": 1},
            "createdAt": "2026-12-03T10:00:00.000Z",
        }
    )
    invalid = event(5, CONTEXT_ADDED, {"role": "user", "content": "x", "order": 3})
    assert isinstance(invalid, InvalidPayloadEvent)
    assert as_envelope(invalid).payload == {"role": "user", "content": "x", "order": 3}


def test_one_answer_of_read_events_stays_within_its_byte_budget_but_always_moves_on() -> None:
    events = [as_envelope(event(n, "x.example/big", {"blob": "b" * 1000})) for n in range(1, 6)]
    one = len(events[0].model_dump_json(exclude_none=True))
    assert [e.offset for e in within_bytes(events, 2 * one + 10)] == [1, 2]
    assert [e.offset for e in within_bytes(events, 10)] == [1]  # the first one even when it alone is over
    assert within_bytes(events, 100 * one) == events


# --- what send_message waits for ----------------------------------------------------------------------


def test_the_first_request_after_the_message_answers_it_when_it_settles() -> None:
    watch = TurnWatch(message_offset=3)
    for seen in (requested(4), assistant(5, 4, "hello"), settled(6, 4, {"status": "succeeded", "text": "hello"})):
        assert not watch.settled
        watch.see(seen)
    answer = sent_message(PATH, 3, watch, 30)
    assert answer.answered and answer.status == "succeeded" and answer.answer == "hello"
    assert (answer.requestOffset, answer.answerOffset) == (4, 5)


def test_a_turn_that_started_before_the_message_does_not_answer_it() -> None:
    """behaviour §4.4: after-current-request waits for the open request; the next one answers."""
    watch = TurnWatch(message_offset=5)
    for seen in (requested(4), assistant(6, 4), settled(7, 4, {"status": "succeeded", "text": "old"})):
        watch.see(seen)  # offsets at or before the message are never taken; @4 settling is not the answer
    assert not watch.settled and watch.progress_note().startswith("message journaled at @5")
    watch.see(requested(8))
    assert watch.progress_note() == "turn @8 running (model m)"
    pending = sent_message(PATH, 5, watch, 30)
    assert not pending.answered and pending.requestOffset == 8
    assert "read_events with from_offset=6" in pending.note
    watch.see(settled(9, 8, {"status": "succeeded", "text": "new"}))
    assert sent_message(PATH, 5, watch, 30).answer == "new"


@pytest.mark.parametrize(
    ("result", "error"),
    [
        ({"status": "failed", "errorMessage": "HTTP 500"}, "HTTP 500"),
        ({"status": "cancelled", "reason": "interrupted-by-user-input", "partialText": "par"}, "cancelled"),
    ],
)
def test_a_failed_or_cancelled_turn_is_reported_without_an_answer(result: dict[str, Any], error: str) -> None:
    watch = TurnWatch(message_offset=3)
    watch.see(requested(4))
    watch.see(settled(5, 4, result))
    answer = sent_message(PATH, 3, watch, 30)
    assert answer.answered and answer.status == result["status"] and answer.answer is None
    assert answer.error is not None and error in answer.error


def test_without_waiting_the_answer_says_where_to_read_later() -> None:
    answer = sent_message(PATH, 7, None, 0)
    assert not answer.answered and "from_offset=8" in answer.note


# --- the tools, in-process ----------------------------------------------------------------------------


class StandInDoor:
    """Answers list_agents and read_events; every other call fails as a refused append would."""

    async def list_agents(self, claims: Claims, query: str, limit: int) -> AgentList:
        return AgentList(agents=[], more=False)

    async def read_events(self, claims: Claims, path: str, from_offset: int | None, limit: int) -> EventRange:
        raise DoorError(f"no stream at {path} in this token's scope (or it has no events yet)")


def tools_client(authority: Any) -> Client:
    server = build_server(StandInDoor(), authority, Settings.from_env({}, mcp_max_wait_s=45))  # type: ignore[arg-type]
    return Client(server)


def test_every_tool_has_a_description_and_json_schemas_and_failures_are_tool_errors() -> None:
    async def session() -> None:
        async with tools_client(lambda _: ALICE) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert set(tools) == {"list_agents", "create_agent", "send_message", "read_context", "read_events"}
            for tool in tools.values():
                assert tool.description and tool.input_schema["type"] == "object" and tool.output_schema
                for name, spec in tool.input_schema["properties"].items():
                    assert spec.get("description"), (tool.name, name)
            wait = tools["send_message"].input_schema["properties"]["wait_seconds"]
            assert (wait["minimum"], wait["maximum"], wait["default"]) == (0, 45, 30)
            listed = await client.call_tool("list_agents", {})
            assert not listed.is_error and listed.structured_content == {"agents": [], "more": False}
            hidden = await client.call_tool("read_events", {"path": "/agents/bob/b1"})
            assert hidden.is_error and "no stream at /agents/bob/b1" in hidden.content[0].text  # type: ignore[union-attr]
            bad = await client.call_tool("read_events", {"path": "/agents/a", "limit": 10_000})
            assert bad.is_error  # over the schema's bound: the model reads why

    anyio.run(session)


def test_an_unknown_revoked_or_missing_stdio_token_is_an_mcp_error() -> None:
    token = "ast_known"
    tokens = TokenBook.of(
        TokensFile.model_validate({"tokens": [{"sha256": hash_token(token), "tier": "user", "scope": ["/agents/**"]}]})
    )
    assert TokenAuthority(tokens, token)(None).tier == "user"  # type: ignore[arg-type]

    async def call_with(authority: TokenAuthority) -> str:
        async with tools_client(authority) as client:
            with pytest.raises(MCPError) as error:
                await client.call_tool("list_agents", {})
            return error.value.message

    assert anyio.run(call_with, TokenAuthority(tokens, "ast_unknown")).startswith(
        "unauthorized: AGENTSTREAM_TOKEN is unknown or revoked"
    )
    assert anyio.run(call_with, TokenAuthority(tokens, None)).startswith("unauthorized: set AGENTSTREAM_TOKEN")
