"""The console's door over HTTP without a broker (the gateway points at a port where nothing
listens): its pages carry a strict content security policy, and nothing is served or accepted
without a session, nor posted without the session's CSRF token. The console against a real stack:
tests/pipeline/gateway/console/test_console_browser.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import pytest

from pipeline.settings import Settings
from tests.gateway_server import GatewayServer, Tokens, request
from tests.support.ports import free_port


@dataclass
class Console:
    gateway: GatewayServer
    user: str


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Console]:
    tokens = Tokens(tmp_path / "tokens.yaml")
    user = tokens.add("user", "/agents/**", userId="u-console", name="console-test")
    unreachable = f"127.0.0.1:{free_port()}"  # closed again: nothing listens there
    settings = Settings.from_env({}, bootstrap_servers=unreachable, topic_prefix="unreachable-", data_dir=tmp_path)
    with GatewayServer(settings, tokens.path) as gateway:
        yield Console(gateway, user)


def test_console_pages_carry_a_strict_content_security_policy_and_need_a_session(env: Console) -> None:
    page = request(env.gateway.port, "GET", "/console/login")
    assert page.status == 200
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'self'" in policy and "unsafe-inline" not in policy
    assert b"<script>" not in page.body  # the only script is the static file
    assert request(env.gateway.port, "GET", "/console/agents").status == 303
    for path in ("/console/fragment/journal?path=/agents/x", "/console/live?path=/agents/x"):
        assert request(env.gateway.port, "GET", path).status == 401, path
    refused = request(env.gateway.port, "POST", "/console/agent/say", raw=b"path=/agents/x&content=hi")
    assert refused.status == 401
    wrong = request(
        env.gateway.port,
        "POST",
        "/console/login",
        raw=b"token=not-a-token",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert wrong.status == 401 and "set-cookie" not in wrong.headers
    good = request(
        env.gateway.port,
        "POST",
        "/console/login",
        raw=urlencode({"token": env.user}).encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    cookie = good.headers["set-cookie"]
    assert good.status == 303 and "HttpOnly" in cookie and "SameSite=strict" in cookie and env.user not in cookie
    session = cookie.split(";", 1)[0]
    # A post without the session's CSRF token is refused, even with the cookie.
    forged = request(
        env.gateway.port,
        "POST",
        "/console/agent/say",
        raw=b"path=/agents/x&content=hi",
        headers={"Cookie": session, "Content-Type": "application/x-www-form-urlencoded", "X-Console-Fetch": "1"},
    )
    assert forged.status == 403 and b"CSRF" in forged.body
