"""The MCP door (behaviour §9) on the real stack: the official SDK's own client against both
transports, streamable HTTP at the gateway's `/mcp` and stdio against `agentstream mcp` as a
subprocess.

A journal worker and an LLM caller run as real processes on the local broker; a scripted
OpenAI-compatible server plays the model, answering by tag (tests/support/tagged_model.py); the
gateway serves the tokens file every door checks. Each test uses stream paths of its own.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from schemas.events import AGENT_CREATED, CONTEXT_ADDED, LLM_REQUEST_REQUESTED, LLM_REQUEST_SETTLED
from tests.gateway_server import GatewayServer, Tokens
from tests.kafka_stack import BIN, Stack
from tests.support.scripted_llm import Reply
from tests.support.scripted_stack import MODEL, birth, served_stack
from tests.support.tagged_model import SMALL_USAGE, TaggedReplies

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

REPLIES = TaggedReplies()
TOOLS = {"list_agents", "create_agent", "send_message", "read_context", "read_events"}

Connect = Callable[[str], AbstractAsyncContextManager[Client]]


class Env:
    def __init__(self, stack: Stack, gateway: GatewayServer, tokens: Tokens, issued: dict[str, str], root: Path):
        self.stack = stack
        self.gateway = gateway
        self.tokens = tokens
        self.issued = issued
        self.root = root

    @contextlib.asynccontextmanager
    async def http(self, token: str, mode: str = "auto") -> AsyncIterator[Client]:
        """The SDK's client over streamable HTTP to the gateway's /mcp, with `token` as its bearer."""
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {self.issued.get(token, token)}"})
        url = f"http://127.0.0.1:{self.gateway.port}/mcp"
        async with http, Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            yield client

    @contextlib.asynccontextmanager
    async def stdio(self, token: str, errlog_name: str = "mcp-stdio.log") -> AsyncIterator[Client]:
        """The SDK's client over stdio to an `agentstream mcp` subprocess acting with `token`."""
        env = {
            **self.stack.env(),
            "AGENTSTREAM_GATEWAY_TOKENS_FILE": str(self.tokens.path),
            "AGENTSTREAM_TOKEN": self.issued.get(token, token),
        }
        params = StdioServerParameters(command=str(BIN / "agentstream"), args=["mcp"], env=env)
        with (self.root / errlog_name).open("a") as errlog:
            async with Client(stdio_client(params, errlog=errlog)) as client:
                yield client

    def connect(self, transport: str) -> Connect:
        if transport == "stdio":
            return self.stdio
        return lambda token: self.http(token, mode=transport.removeprefix("http-"))

    def appended(self, path: str) -> list[Any]:
        """Every command produced for `path` to agent-appends."""
        return [m for m in self.stack.read_topic(self.stack.client.topics.appends) if m.key() == path.encode()]

    def events(self, path: str) -> list[Any]:
        return self.stack.client.streams.get(path).events()

    def birth(self, path: str) -> None:
        """An agent at `path`, made with the two events `agents.create()` appends."""
        birth(self.stack, path)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("mcp")
    tokens = Tokens(root / "tokens.yaml")
    issued = {
        "platform": tokens.add("platform", "/**"),
        "alice": tokens.add("user", "/agents/alice/**", userId="alice"),
    }
    with served_stack(root, tokens, REPLIES) as served:
        yield Env(served.stack, served.gateway, tokens, issued, root)


def tag() -> str:
    return uuid.uuid4().hex[:10]


def result(call: Any) -> dict[str, Any]:
    assert not call.is_error, call.content
    return call.structured_content


def error_text(call: Any) -> str:
    assert call.is_error, call.structured_content
    return " ".join(getattr(block, "text", "") for block in call.content)


async def listed(client: Client, query: str, want: int, timeout: float = 20) -> list[dict[str, Any]]:
    """list_agents' agents matching `query`, once there are `want` (the mirror follows the journal)."""
    with anyio.fail_after(timeout):
        while True:
            agents = result(await client.call_tool("list_agents", {"query": query}))["agents"]
            if len(agents) >= want:
                return agents
            await anyio.sleep(0.2)


# --- the whole conversation, on both transports ------------------------------------------------------


@pytest.mark.parametrize("transport", ["http-auto", "http-legacy", "stdio"])
def test_the_sdk_client_lists_creates_sends_gets_the_answer_and_reads_context_and_events(
    env: Env, transport: str
) -> None:
    """behaviour §9: the five tools, each with a JSON schema and a description, in one session."""
    name = tag()
    path = f"/agents/mcp-{name}"
    REPLIES.on(name, Reply(f"hello from {name}", usage=SMALL_USAGE))

    async def conversation() -> None:
        with anyio.fail_after(120):
            async with env.connect(transport)("platform") as client:
                tools = {tool.name: tool for tool in (await client.list_tools()).tools}
                assert set(tools) == TOOLS
                for tool in tools.values():
                    assert tool.description and len(tool.description) > 80, tool.name
                    assert tool.input_schema["type"] == "object" and tool.output_schema, tool.name
                assert tools["send_message"].input_schema["required"] == ["path", "text"]
                assert tools["send_message"].input_schema["properties"]["wait_seconds"]["maximum"] == 60

                created = result(await client.call_tool("create_agent", {"path": path}))
                assert created == {"path": path, "createdOffset": 1, "systemPromptOffset": 2, "alreadyExisted": False}
                again = result(await client.call_tool("create_agent", {"path": path}))
                assert again["alreadyExisted"] is True and again["createdOffset"] == 1
                (agent,) = await listed(client, name, 1)
                assert agent["path"] == path and agent["status"] == "idle" and agent["events"] == 2

                progress: list[tuple[float, float | None, str | None]] = []

                async def on_progress(done: float, total: float | None, message: str | None) -> None:
                    progress.append((done, total, message))

                arguments = {"path": path, "text": f"hi {name}", "wait_seconds": 30}
                sent = result(await client.call_tool("send_message", arguments, progress_callback=on_progress))
                assert sent["offset"] == 3 and sent["answered"] is True and sent["status"] == "succeeded", sent
                assert sent["answer"] == f"hello from {name}"
                assert progress and all(total == 30 for _, total, _ in progress), progress

                context = result(await client.call_tool("read_context", {"path": path}))
                assert context["model"] == MODEL and context["status"] == "idle"
                messages = context["messages"]
                assert messages[0]["role"] == "system"  # the context protocol
                assert {"role": "user", "content": f"@3 actor=user:mcp\nhi {name}", "files": None} in messages
                answer = messages[-1]
                assert answer["role"] == "assistant" and answer["content"].endswith(f"hello from {name}")
                assert answer["content"].startswith(f"@{sent['answerOffset']}")

                window = result(await client.call_tool("read_events", {"path": path, "from_offset": 1}))
                events = window["events"]
                assert [e["offset"] for e in events] == list(range(1, window["lastOffset"] + 1))
                types = [e["type"] for e in events]
                assert types[:3] == [AGENT_CREATED, CONTEXT_ADDED, CONTEXT_ADDED]
                assert LLM_REQUEST_REQUESTED in types and LLM_REQUEST_SETTLED in types
                assert events[2]["payload"]["actor"] == {"type": "user", "origin": "mcp"}  # a platform token's
                assert window["nextOffset"] is None
                newest = result(await client.call_tool("read_events", {"path": path, "limit": 2}))
                assert [e["offset"] for e in newest["events"]] == [window["lastOffset"] - 1, window["lastOffset"]]
                first = result(await client.call_tool("read_events", {"path": path, "from_offset": 1, "limit": 2}))
                assert [e["offset"] for e in first["events"]] == [1, 2] and first["nextOffset"] == 3

    anyio.run(conversation)


# --- authority ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["http-auto", "stdio"])
def test_a_user_token_reaches_only_agents_in_its_scope_and_sends_only_user_items(env: Env, transport: str) -> None:
    """behaviour §9 and §7.2: a refused append is a tool error naming the gate's rule, nothing produced;
    a stream outside the scope reads as one that does not exist; the gate stamps a user token's item
    with the actor {user, mcp, userId}."""
    name = tag()
    mine, theirs, new = f"/agents/alice/{name}", f"/agents/bob-{name}/a1", f"/agents/alice/new-{name}"
    connect = env.connect(transport)

    for path in (mine, theirs):
        env.birth(path)

    async def probe() -> None:
        with anyio.fail_after(120):
            async with connect("alice") as alice:
                (agent,) = await listed(alice, name, 1)
                assert agent["path"] == mine
                refused = error_text(await alice.call_tool("send_message", {"path": theirs, "text": "hi bob"}))
                assert "rule scope" in refused and "Nothing was appended" in refused, refused
                for tool in ("read_context", "read_events"):
                    hidden = error_text(await alice.call_tool(tool, {"path": theirs}))
                    assert f"no stream at {theirs}" in hidden, hidden
                made = error_text(await alice.call_tool("create_agent", {"path": new}))
                assert "forbidden (403, rule reserved-key)" in made, made  # agent/created's key is the system's
                sent = result(await alice.call_tool("send_message", {"path": mine, "text": "hi", "wait_seconds": 0}))
                assert sent["answered"] is False and sent["offset"] == 3

    anyio.run(probe)
    assert len(env.appended(theirs)) == 2  # its two birth events; alice's message was never produced
    assert env.appended(new) == []
    item = env.events(mine)[2].payload
    assert item.role == "user" and item.actor.model_dump() == {"type": "user", "origin": "mcp", "userId": "alice"}


def test_a_bad_token_is_401_over_http_and_an_mcp_error_over_stdio(env: Env) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"Accept": "application/json, text/event-stream"}
    for token in ("ast_not-a-token", None):
        reply = env.gateway.request("POST", "/mcp", body, token=token, headers=headers)
        assert reply.status == 401 and reply.json()["error"] == "unauthorized", reply
        assert reply.headers["www-authenticate"] == "Bearer"
    reply = env.gateway.request("GET", "/mcp", token=env.issued["platform"], headers=headers)
    assert reply.status == 405 and "POST" in reply.headers["allow"], reply  # no standalone event stream

    async def refused_over_http() -> None:
        with anyio.fail_after(30):
            async with env.http("ast_not-a-token") as client:
                await client.list_tools()

    with pytest.raises(BaseException) as raised:  # the SDK raises its MCPError inside task groups
        anyio.run(refused_over_http)
    assert raised.group_contains(MCPError) if isinstance(raised.value, BaseExceptionGroup) else raised.type is MCPError

    async def refused_over_stdio() -> str:
        with anyio.fail_after(60):
            async with env.stdio("ast_not-a-token", "bad-token.log") as client:
                assert {tool.name for tool in (await client.list_tools()).tools} == TOOLS
                with pytest.raises(MCPError) as error:
                    await client.call_tool("list_agents", {})
                return error.value.message

    message = anyio.run(refused_over_stdio)
    assert message.startswith("unauthorized: AGENTSTREAM_TOKEN is unknown or revoked"), message
    assert "Traceback" not in (env.root / "bad-token.log").read_text()


def test_an_http_session_belongs_to_the_token_that_opened_it(env: Env) -> None:
    """behaviour §9.1: another token presenting a session's id finds no such session."""
    headers = {"Accept": "application/json, text/event-stream"}
    client = {"name": "raw", "version": "1"}
    initialize = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": client}
    opened = env.gateway.request(
        "POST",
        "/mcp",
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize},
        token=env.issued["platform"],
        headers=headers,
    )
    assert opened.status == 200, opened
    in_session = {**headers, "Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    ready = env.gateway.request("POST", "/mcp", initialized, token=env.issued["platform"], headers=in_session)
    assert ready.status == 202, ready
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    stranger = env.gateway.request("POST", "/mcp", listing, token=env.issued["alice"], headers=in_session)
    assert stranger.status == 404, stranger
    owner = env.gateway.request("POST", "/mcp", listing, token=env.issued["platform"], headers=in_session)
    assert owner.status == 200 and b'"send_message"' in owner.body, owner
    assert env.gateway.request("DELETE", "/mcp", token=env.issued["platform"], headers=in_session).status == 200


# --- a long wait blocks nobody --------------------------------------------------------------------------


def test_a_60_second_send_message_does_not_block_other_sessions(env: Env) -> None:
    """behaviour §9: send_message waits without holding the door; another session's calls answer
    promptly meanwhile, and the waiting call reports the turn's progress."""
    slow, quick = tag(), tag()
    slow_path, quick_path = f"/agents/slow-{slow}", f"/agents/quick-{quick}"
    REPLIES.on(slow, Reply("late", usage=SMALL_USAGE, delay=120))  # longer than the call waits
    REPLIES.on(quick, Reply(f"quick {quick}", usage=SMALL_USAGE))
    progress: list[str | None] = []
    outcome: dict[str, Any] = {}

    async def race() -> None:
        with anyio.fail_after(120):
            async with env.http("platform") as waiting, env.http("platform") as other:
                for path in (slow_path, quick_path):
                    result(await other.call_tool("create_agent", {"path": path}))
                turn_running = anyio.Event()

                async def on_progress(_: float, __: float | None, message: str | None) -> None:
                    progress.append(message)
                    if message and "running" in message:
                        turn_running.set()

                async def wait_for_slow() -> None:
                    arguments = {"path": slow_path, "text": f"take your time {slow}", "wait_seconds": 60}
                    outcome["slow"] = await waiting.call_tool("send_message", arguments, progress_callback=on_progress)

                async with anyio.create_task_group() as group:
                    group.start_soon(wait_for_slow)
                    with anyio.fail_after(30):
                        await turn_running.wait()
                    timings = {}
                    for tool, arguments in [
                        ("list_agents", {"query": slow}),
                        ("read_events", {"path": slow_path}),
                        ("read_context", {"path": slow_path}),
                        ("send_message", {"path": quick_path, "text": f"quick {quick}?", "wait_seconds": 30}),
                    ]:
                        started = time.monotonic()
                        answer = result(await other.call_tool(tool, arguments))
                        timings[tool] = time.monotonic() - started
                        if tool == "send_message":
                            assert answer["answer"] == f"quick {quick}", answer
                    assert all(seconds < 5 for seconds in timings.values()), timings
                    assert "slow" not in outcome  # still waiting for its answer
                    await anyio.sleep(2.5)
                    group.cancel_scope.cancel()
                # The slow turn is still open: interrupting it answers the new message instead.
                arguments = {"path": slow_path, "text": "never mind", "interrupt": True, "wait_seconds": 30}
                instead = result(await other.call_tool("send_message", arguments))
                assert instead["status"] == "succeeded" and instead["answer"].endswith("never mind"), instead

    anyio.run(race)
    running = [message for message in progress if message and "running" in message]
    assert len(running) >= 2, progress  # a notification at least every 2 s while the turn runs
