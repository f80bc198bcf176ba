"""Integration-test support for the HTTP gateway: uvicorn on a free loopback port, a tokens file,
and a small HTTP client (the standard library's, so requests go over real sockets)."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import socket
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import uvicorn
import yaml

from pipeline.gateway.app import build_app
from pipeline.gateway.server import uvicorn_config
from pipeline.gateway.tokens import TokenBook, hash_token, new_token
from pipeline.settings import Settings


class Tokens:
    """Writes a tokens file: one token per (tier, scope, …) asked for; returns the token text."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[dict[str, Any]] = []
        self.webhooks: dict[str, dict[str, str]] = {"github": {}, "slack": {}}

    def add(self, tier: str, *scope: str, **extra: str) -> str:
        token = new_token()
        self.entries.append({"sha256": hash_token(token), "tier": tier, "scope": list(scope or ("/**",)), **extra})
        self.write()
        return token

    def secret(self, kind: str, name: str, secret: str) -> None:
        self.webhooks[kind][name] = secret
        self.write()

    def write(self) -> None:
        self.path.write_text(yaml.safe_dump({"tokens": self.entries, "webhooks": self.webhooks}))


class GatewayServer:
    """`build_app` served as `agentstream gateway` serves it (uvicorn with uvloop and the guarded
    httptools protocol) in a thread, on a socket bound to port 0."""

    def __init__(self, settings: Settings, tokens_file: Path) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.settings = settings.model_copy(update={"gateway_port": self.port, "gateway_tokens_file": tokens_file})
        app = build_app(self.settings, TokenBook(tokens_file, self.settings.gateway_tokens_file_grace_s))
        self.server = uvicorn.Server(uvicorn_config(app, self.settings.model_copy(update={"log_level": "WARNING"})))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def __enter__(self) -> GatewayServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the gateway did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.socket.close()

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.request("GET", "/readyz").status != 200:
            if time.monotonic() > deadline:
                raise AssertionError("the gateway never became ready")
            time.sleep(0.1)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Reply:
        return request(self.port, method, path, body, token=token, headers=headers, raw=raw)


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return orjson.loads(self.body)

    def __repr__(self) -> str:
        return f"Reply({self.status}, {self.body[:500]!r})"


def request(
    port: int,
    method: str,
    path: str,
    body: Any = None,
    *,
    token: str | None = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
    connection: http.client.HTTPConnection | None = None,
) -> Reply:
    conn = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    sent_headers = dict(headers or {})
    data = raw if raw is not None else (None if body is None else orjson.dumps(body))
    if data is not None:
        sent_headers.setdefault("Content-Type", "application/json")
    if token is not None:
        sent_headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, path, body=data, headers=sent_headers)
        response = conn.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        if connection is None:
            conn.close()


def github_headers(secret: str, body: bytes, event: str, delivery: str) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest(),
    }


def slack_headers(secret: str, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    ts = str(int(time.time()) if timestamp is None else timestamp)
    signature = hmac.new(secret.encode(), b"v0:" + ts.encode() + b":" + body, hashlib.sha256).hexdigest()
    return {"Content-Type": "application/json", "X-Slack-Request-Timestamp": ts, "X-Slack-Signature": "v0=" + signature}


PULL_REQUEST_OPENED: dict[str, Any] = {
    "action": "opened",
    "number": 1347,
    "pull_request": {
        "number": 1347,
        "title": "Fix the flaky retry in the uploader",
        "html_url": "https://github.com/octo-org/uploader/pull/1347",
        "state": "open",
        "user": {"login": "octocat", "type": "User"},
        "body": "The retry loop slept before the first attempt.",
        "merged": False,
    },
    "repository": {"full_name": "octo-org/uploader", "name": "uploader"},
    "sender": {"login": "octocat", "type": "User"},
    "installation": {"id": 42},
}
