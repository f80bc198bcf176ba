"""Hardening of the HTTP gateway and its web console against the findings of a security probe: one
regression test per finding, named after it, each against the real stack: an `agentstream gateway`
process (uvicorn, its own settings from AGENTSTREAM_* variables, its log in a file) in front of the
real local broker. No journal worker is needed: what these tests check is decided in the gateway.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import select
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from schemas.events import CONTEXT_ADDED
from tests.gateway_server import Reply, Tokens, request
from tests.kafka_stack import BIN, Stack, wait_until
from tests.support.ports import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


class GatewayProcess:
    """`agentstream gateway` in its own process, with the stack's settings plus `settings`
    (Settings field names: AGENTSTREAM_<NAME>), logging at INFO to a file."""

    def __init__(self, stack: Stack, tokens_file: Path, log_path: Path, **settings: object) -> None:
        self.port = free_port()
        self.log_path = log_path
        env = stack.env()
        env.update(
            AGENTSTREAM_GATEWAY_HOST="127.0.0.1",
            AGENTSTREAM_GATEWAY_PORT=str(self.port),
            AGENTSTREAM_GATEWAY_TOKENS_FILE=str(tokens_file),
            AGENTSTREAM_LOG_LEVEL="INFO",
        )
        env.update({f"AGENTSTREAM_{name.upper()}": str(value) for name, value in settings.items()})
        self.process = subprocess.Popen(
            [str(BIN / "agentstream"), "gateway"], env=env, stdout=log_path.open("ab"), stderr=subprocess.STDOUT
        )

    def __enter__(self) -> GatewayProcess:
        deadline = time.monotonic() + 60
        while True:
            assert self.process.poll() is None, f"the gateway exited:\n{self.log()}"
            try:
                if self.request("GET", "/readyz").status == 200:
                    return self
            except OSError:
                pass
            assert time.monotonic() < deadline, f"the gateway never became ready:\n{self.log()}"
            time.sleep(0.1)

    def __exit__(self, *_: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Reply:
        return request(self.port, method, path, body, **kw)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sign_in(self, token: str, **headers: str) -> Reply:
        form = urlencode({"token": token}).encode()
        return self.request("POST", "/console/login", raw=form, headers={**FORM, **headers})

    def session(self, token: str) -> str:
        """A signed-in console session: the cookie to send."""
        reply = self.sign_in(token)
        assert reply.status == 303, reply
        return reply.headers["set-cookie"].split(";", 1)[0]

    def signed_in(self, cookie: str) -> bool:
        reply = self.request("GET", "/console/agents", headers={"Cookie": cookie})
        assert reply.status in (200, 303), reply
        return reply.status == 200

    def append(self, token: str) -> int:
        """Status of one append (202 once Kafka has it; 401 for an unknown or revoked token)."""
        body = {"type": CONTEXT_ADDED, "payload": {"role": "user", "content": "hi"}}
        return self.request("POST", f"/v1/streams/agents/{uuid.uuid4().hex[:8]}/events", body, token=token).status


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(tmp_path_factory.mktemp("gateway-hardening") / "data", partitions=2)
    try:
        yield stack
    finally:
        stack.close()


def raw_connection(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """Everything the server sends within `timeout` seconds, and whether it closed the connection."""
    data = b""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([sock], [], [], left)[0]:
            break
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def trickle(sock: socket.socket, every_s: float, limit_s: float) -> tuple[bytes, bool, float]:
    """Send one byte every `every_s` seconds (a slowloris client) until the server answers or closes,
    at most `limit_s` seconds: (what it sent back, closed, seconds it took)."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        try:
            sock.sendall(b"x")
        except OSError:
            break
        if select.select([sock], [], [], every_s)[0]:
            break
    data, closed = read_until_closed(sock, 2)
    return data, closed, time.monotonic() - started


def open_live(port: int, cookie: str) -> tuple[socket.socket, bytes]:
    """A console live-update stream (server-sent events): the socket, and the response's start (a
    refusal's whole body; a stream's first event)."""
    sock = raw_connection(port)
    sock.sendall(f"GET /console/live HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nCookie: {cookie}\r\n\r\n".encode())
    data = b""

    def complete() -> bool:
        head, found, body = data.partition(b"\r\n\r\n")
        if not found:
            return False
        if head.startswith(b"HTTP/1.1 200"):
            return b"retry:" in body
        length = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
        return length is not None and len(body) >= int(length.group(1))

    while not complete():
        assert select.select([sock], [], [], 10)[0], f"no answer to the live stream: {data!r}"
        chunk = sock.recv(65536)
        assert chunk, f"the live stream closed early: {data!r}"
        data += chunk
    return sock, data


# --- finding 4: sign-in floods evict other users' sessions ---------------------------------------


def test_finding_4_sign_in_is_rate_limited_per_token_and_address_and_sessions_are_capped_per_token(
    stack: Stack, tmp_path: Path
) -> None:
    tokens = Tokens(tmp_path / "tokens.yaml")
    attacker = tokens.add("user", "/agents/**")
    victim = tokens.add("user", "/agents/**")
    limits = {
        "gateway_console_sign_in_rate_per_token": 5,
        "gateway_console_sign_in_rate_per_address": 12,
        "gateway_console_sessions_per_token": 3,
    }
    with GatewayProcess(stack, tokens.path, tmp_path / "gateway.log", **limits) as gateway:
        victim_session = gateway.session(victim)
        # The attacker's own sessions are capped: each sign-in past the cap ends its own oldest session.
        attacker_sessions = [gateway.session(attacker) for _ in range(5)]
        assert [gateway.signed_in(cookie) for cookie in attacker_sessions] == [False, False, True, True, True]
        assert gateway.signed_in(victim_session)
        # Per token: the sixth sign-in within the minute is refused, from whatever address it comes.
        refused = gateway.sign_in(attacker, **{"X-Forwarded-For": "10.0.0.2"})
        assert refused.status == 429 and int(refused.headers["retry-after"]) >= 1, refused
        assert "set-cookie" not in refused.headers and b"too many sign-ins" in refused.body
        assert gateway.signed_in(victim_session)  # nobody can sign another token out
        # Per address: guesses from one address run out too, and then even a good token waits.
        address = {"X-Forwarded-For": "10.0.0.3"}
        guesses = [gateway.sign_in(f"ast_guess-{n}", **address).status for n in range(12)]
        assert guesses == [401] * 12
        blocked = gateway.sign_in(victim, **address)
        assert blocked.status == 429 and int(blocked.headers["retry-after"]) >= 1, blocked
        assert gateway.sign_in(victim, **{"X-Forwarded-For": "10.0.0.4"}).status == 303  # another address
        assert gateway.signed_in(victim_session)


# --- finding 6: a malformed tokens file logged a webhook secret ----------------------------------


def test_finding_6_a_malformed_tokens_file_is_reported_by_line_and_column_never_by_its_text(
    stack: Stack, tmp_path: Path
) -> None:
    tokens_file = tmp_path / "tokens.yaml"
    broken = {
        # YAML syntax: an unterminated quote; an undefined alias and an unknown tag, whose names YAML quotes.
        "syntax-secret-4b1e": ('tokens: []\nwebhooks:\n  github: {"42": "syntax-secret-4b1e}\n', "line 3"),
        "alias-secret-77aa": ('tokens: []\nwebhooks:\n  github:\n    "42": *alias-secret-77aa\n', "line 4"),
        "tag-secret-0c0c": ("tokens: []\nwebhooks:\n  slack:\n    T1: !tag-secret-0c0c x\n", "line 4"),
        # Valid YAML, invalid file: the secret and the installation swapped (the secret became a key).
        "swapped-secret-9f3d": ("tokens: []\nwebhooks:\n  github:\n    swapped-secret-9f3d: 42\n", "line 4"),
    }
    for secret, (text, line) in broken.items():
        tokens_file.write_text(text)
        env = {**stack.env(), "AGENTSTREAM_GATEWAY_TOKENS_FILE": str(tokens_file), "AGENTSTREAM_GATEWAY_PORT": "0"}
        started = subprocess.run(
            [str(BIN / "agentstream"), "gateway"], env=env, capture_output=True, text=True, timeout=60
        )
        assert started.returncode == 2, (secret, started.stderr)
        message = started.stderr.strip()
        assert secret not in started.stdout + message, message
        assert str(tokens_file) in message and line in message and "column" in message, message
        assert len(message.splitlines()) == 1, message

    # The same on a reload: the running gateway logs where the problem is, never the text, and keeps
    # the tokens it had.
    tokens = Tokens(tokens_file)
    token = tokens.add("user", "/agents/**")
    tokens.secret("github", "42", "kept-secret-1d2d")
    with GatewayProcess(stack, tokens_file, tmp_path / "gateway.log") as gateway:
        assert gateway.append(token) == 202
        for secret, (text, line) in broken.items():
            before = len(kept_lines(gateway.log()))
            tokens_file.write_text(text)
            wait_until(lambda: len(kept_lines(gateway.log())) > before, 20, f"the reload error for {secret}")  # noqa: B023
            newest = kept_lines(gateway.log())[-1]
            assert re.search(rf" ERROR .*{re.escape(str(tokens_file))}, line \d+, column \d+", newest), newest
            assert line in newest, newest
            assert gateway.append(token) == 202  # the last good tokens stay
        log = gateway.log()
        for secret in [*broken, "kept-secret-1d2d"]:
            assert secret not in log, log
        assert "Traceback" not in log, log


def kept_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "kept the previous tokens" in line]


# --- finding 8: nothing timed out reading headers or bodies; SSE streams were unbounded ----------


def test_finding_8_slow_headers_and_bodies_are_cut_off_and_live_streams_are_capped(
    stack: Stack, tmp_path: Path
) -> None:
    tokens = Tokens(tmp_path / "tokens.yaml")
    token = tokens.add("user", "/agents/**")
    limits = {
        "gateway_header_timeout_s": 2,
        "gateway_body_timeout_s": 3,
        "gateway_console_live_streams_per_session": 2,
        "gateway_console_live_streams": 3,
    }
    with GatewayProcess(stack, tokens.path, tmp_path / "gateway.log", **limits) as gateway:
        # A connection that never sends a byte is closed after the header timeout.
        with raw_connection(gateway.port) as idle:
            started = time.monotonic()
            _, closed = read_until_closed(idle, 8)
            assert closed and time.monotonic() - started < 4, "an idle connection stayed open"

        # Headers one byte at a time (faster than any per-byte timeout): cut off with 408 when the
        # whole head has taken longer than the header timeout.
        with raw_connection(gateway.port) as slow:
            slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            answer, closed, took = trickle(slow, 0.5, 10)
            assert answer.startswith(b"HTTP/1.1 408") and closed and took < 4, (answer, took)

        # A head larger than the limit is refused at once, long before the timeout.
        with raw_connection(gateway.port) as huge:
            started = time.monotonic()
            with contextlib.suppress(OSError):  # the gateway may close before it has read it all
                huge.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 300_000)
            answer, closed = read_until_closed(huge, 8)
            assert closed and time.monotonic() - started < 1.5, answer
            assert answer == b"" or answer.startswith(b"HTTP/1.1 431"), answer

        # A body one byte at a time: 408 once the body has taken longer than the body timeout.
        with raw_connection(gateway.port) as slow_body:
            slow_body.sendall(
                b"POST /v1/streams/agents/slow/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Authorization: Bearer " + token.encode() + b"\r\n"
                b"Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{"
            )
            answer, closed, took = trickle(slow_body, 0.5, 12)
            assert answer.startswith(b"HTTP/1.1 408") and closed and 2.5 < took < 5, (answer, took)
            assert b'"error":"request_timeout"' in answer, answer

        # Well-behaved clients are unaffected: two requests on one kept-alive connection.
        polite = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
        try:
            for _ in range(2):
                assert request(gateway.port, "GET", "/healthz", connection=polite).status == 200
                time.sleep(2.5)  # idle past the header timeout, within the keep-alive timeout
            assert polite.sock is not None  # still the first connection
        finally:
            polite.close()

        # Live streams: at most 2 per console session and 3 in all; the next one is 429 with a reason.
        first, second, third = (gateway.session(token) for _ in range(3))
        streams = [open_live(gateway.port, first), open_live(gateway.port, first)]
        assert all(start.startswith(b"HTTP/1.1 200") for _, start in streams), streams
        extra, refusal = open_live(gateway.port, first)
        extra.close()
        assert refusal.startswith(b"HTTP/1.1 429") and b"retry-after:" in refusal.lower(), refusal
        assert b"live updates" in refusal and b"this session" in refusal, refusal
        streams.append(open_live(gateway.port, second))
        assert streams[-1][1].startswith(b"HTTP/1.1 200"), streams[-1]
        extra, refusal = open_live(gateway.port, third)
        extra.close()
        assert refusal.startswith(b"HTTP/1.1 429") and b"the gateway" in refusal, refusal
        streams.pop(0)[0].close()  # a stream ends: its slot is free again

        def third_session_streams() -> bool:
            sock, start = open_live(gateway.port, third)
            if start.startswith(b"HTTP/1.1 200"):
                streams.append((sock, start))
                return True
            sock.close()
            return False

        wait_until(third_session_streams, 10, "a free live-stream slot")
        for sock, _ in streams:
            sock.close()
        assert "Traceback" not in gateway.log(), gateway.log()


# --- finding 9a: a client that disconnects mid-body logged a traceback ---------------------------


def test_finding_9a_a_client_that_disconnects_mid_body_is_one_log_line_without_a_traceback(
    stack: Stack, tmp_path: Path
) -> None:
    tokens = Tokens(tmp_path / "tokens.yaml")
    token = tokens.add("user", "/agents/**")
    tokens.secret("github", "42", "gh-secret")
    with GatewayProcess(stack, tokens.path, tmp_path / "gateway.log") as gateway:
        for target in ["/v1/streams/agents/gone/events"] * 3 + ["/v1/webhooks/github/42"] * 2:
            with raw_connection(gateway.port) as gone:
                gone.sendall(
                    f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
                    "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n".encode()
                    + b'{"type": "half'
                )
                time.sleep(0.2)  # the gateway is reading the body when the client goes
        disconnects = re.compile(r"disconnected before|ClientDisconnect")
        wait_until(lambda: len(disconnects.findall(gateway.log())) >= 5, 20, "five disconnects in the log")
        time.sleep(0.5)
        log = gateway.log()
        assert "Traceback" not in log and "unexpected error" not in log, log
        lines = [line for line in log.splitlines() if "disconnected before" in line]
        assert len(lines) == 5, log
        assert all(" INFO " in line and "/agents/gone" not in line for line in lines), lines
        assert gateway.append(token) == 202  # and the gateway goes on


# --- finding 9b: deleting the tokens file left every token valid ---------------------------------


def test_finding_9b_a_deleted_tokens_file_revokes_every_token_after_the_grace_period(
    stack: Stack, tmp_path: Path
) -> None:
    tokens = Tokens(tmp_path / "tokens.yaml")
    token = tokens.add("user", "/agents/**")
    tokens.secret("github", "42", "gh-secret-5e5e")
    grace = 3.0
    with GatewayProcess(stack, tokens.path, tmp_path / "gateway.log", gateway_tokens_file_grace_s=grace) as gateway:
        session = gateway.session(token)
        assert gateway.append(token) == 202

        # Briefly missing (a rewrite by rename, an editor's save): nothing is revoked.
        tokens.path.unlink()
        missing_for = time.monotonic() + grace / 2
        while time.monotonic() < missing_for:
            assert gateway.append(token) == 202
            time.sleep(0.2)
        tokens.write()
        calm_until = time.monotonic() + grace + 1.5  # the grace restarts with the next disappearance
        while time.monotonic() < calm_until:
            assert gateway.append(token) == 202
            time.sleep(0.2)
        assert gateway.signed_in(session)

        # Gone for good: every token is revoked once the grace period has passed, API and console.
        tokens.path.unlink()
        deleted = time.monotonic()
        while time.monotonic() - deleted < grace - 0.5:
            assert gateway.append(token) == 202
            time.sleep(0.2)
        wait_until(lambda: gateway.append(token) == 401, grace + 5, "the tokens to be revoked")
        assert time.monotonic() - deleted < grace + 3
        assert not gateway.signed_in(session)
        assert gateway.sign_in(token).status == 401
        revoked = [line for line in gateway.log().splitlines() if "revoked" in line]
        assert len(revoked) == 1 and str(tokens.path) in revoked[0] and "ERROR" in revoked[0], revoked
        time.sleep(1.5)
        assert len([line for line in gateway.log().splitlines() if "revoked" in line]) == 1  # said once

        # The file comes back: its tokens work again.
        tokens.write()
        wait_until(lambda: gateway.append(token) == 202, 10, "the tokens to come back")

        # A malformed new file keeps the last good tokens, and says so without a secret.
        tokens.path.write_text('tokens: [\nwebhooks: {github: {"42": "new-secret-3c3c"}}\n')
        wait_until(lambda: "kept the previous tokens" in gateway.log(), 10, "the malformed file's error")
        assert gateway.append(token) == 202
        log = gateway.log()
        assert "new-secret-3c3c" not in log and "gh-secret-5e5e" not in log, log


# --- finding 9c: console sign-in accepted a foreign Origin (login CSRF) -------------------------


def test_finding_9c_console_sign_in_refuses_a_foreign_origin_or_referer(stack: Stack, tmp_path: Path) -> None:
    tokens = Tokens(tmp_path / "tokens.yaml")
    token = tokens.add("user", "/agents/**")
    with GatewayProcess(stack, tokens.path, tmp_path / "gateway.log") as gateway:
        foreign = [
            {"Origin": "https://evil.example"},
            {"Origin": f"http://127.0.0.1:{gateway.port + 1}"},  # another port is another origin
            {"Origin": "null"},  # an opaque origin (a sandboxed frame, a data: URL)
            {"Referer": "https://evil.example/login-csrf.html"},  # no Origin: the Referer decides
        ]
        for headers in foreign:
            refused = gateway.sign_in(token, **headers)
            assert refused.status == 403 and "set-cookie" not in refused.headers, (headers, refused)
            assert b"origin" in refused.body.lower(), refused
        own = [
            {"Origin": gateway.origin},
            {"Referer": gateway.origin + "/console/login"},
            {},  # no browser (curl, scripts): nothing to forge
        ]
        for headers in own:
            accepted = gateway.sign_in(token, **headers)
            assert accepted.status == 303 and "set-cookie" in accepted.headers, (headers, accepted)
