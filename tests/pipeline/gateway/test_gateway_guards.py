"""The gateway's guards as pure decisions, without a broker or a server: sign-in rate limits,
live-stream slots, the sign-in origin check, per-token session caps, the body deadline, and what
the tokens file's errors and its disappearance do. The same behaviour on the real stack:
tests/pipeline/gateway/test_gateway_hardening_kafka.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.gateway.console.guards import LiveStreamSlots, RateLimiter, foreign_sign_in, retry_after
from pipeline.gateway.console.sessions import SessionBook
from pipeline.gateway.guards import BodyDeadline, RequestBodyTimeout
from pipeline.gateway.tokens import TokenBook, TokensFileError, hash_token, new_token, parse_tokens_file

# --- sign-in rate limits ----------------------------------------------------------------------------


def test_a_rate_limiter_allows_a_burst_then_says_how_long_to_wait_and_refills() -> None:
    limiter = RateLimiter(per_minute=6)  # one every 10 s, bursts of 6
    assert [limiter.take("a", now=0) for _ in range(6)] == [0.0] * 6
    wait = limiter.take("a", now=0)
    assert wait == pytest.approx(10.0)
    assert limiter.take("a", now=5) == pytest.approx(5.0)  # a refused attempt takes nothing
    assert limiter.take("a", now=10) == 0.0
    assert limiter.take("b", now=10) == 0.0  # keys are independent


def test_a_rate_limiter_forgets_its_least_recently_used_keys_beyond_its_bound() -> None:
    limiter = RateLimiter(per_minute=1, max_keys=2)
    for key in ("a", "b", "c"):
        assert limiter.take(key, now=0) == 0.0
    assert limiter.take("c", now=0) > 0  # remembered
    assert limiter.take("a", now=0) == 0.0  # forgotten: a fresh bucket


def test_retry_after_is_whole_seconds_and_at_least_one() -> None:
    assert [retry_after(s) for s in (0.01, 1.0, 1.2, 59.9)] == ["1", "1", "2", "60"]


# --- live-update streams ----------------------------------------------------------------------------


def test_live_stream_slots_cap_each_session_and_the_total_and_come_back() -> None:
    slots = LiveStreamSlots(per_session=2, total=3)
    assert slots.take("s1") is None and slots.take("s1") is None
    refusal = slots.take("s1")
    assert refusal is not None and "this session" in refusal and "2 live updates" in refusal
    assert slots.take("s2") is None
    refusal = slots.take("s3")
    assert refusal is not None and "the gateway" in refusal and "3 live updates" in refusal
    slots.give_back("s1")
    assert slots.take("s3") is None and slots.in_use == 3
    for session in ("s1", "s2", "s3", "s3", "never-opened"):
        slots.give_back(session)
    assert slots.in_use == 0  # giving back more than was taken never goes below zero


# --- the sign-in's origin -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("origin", "referer", "host", "allowed"),
    [
        ("http://127.0.0.1:8080", None, "127.0.0.1:8080", True),
        ("https://console.example.com", None, "console.example.com", True),  # TLS ends at a proxy
        ("https://Console.Example.com", None, "console.example.com:443", True),
        ("http://[::1]:8080", None, "[::1]:8080", True),
        (None, "http://127.0.0.1:8080/console/login", "127.0.0.1:8080", True),
        (None, None, "127.0.0.1:8080", True),  # not a browser: nothing to forge
        ("https://evil.example", None, "127.0.0.1:8080", False),
        ("http://127.0.0.1:8081", None, "127.0.0.1:8080", False),
        ("http://console.example.com.evil.example", None, "console.example.com", False),
        ("null", None, "127.0.0.1:8080", False),
        ("chrome-extension://abc", None, "127.0.0.1:8080", False),
        ("http://127.0.0.1:8080", None, None, False),
        (None, "https://evil.example/login.html", "127.0.0.1:8080", False),
        ("https://evil.example", "http://127.0.0.1:8080/console/login", "127.0.0.1:8080", False),  # Origin decides
        ("http://127.0.0.1:notaport", None, "127.0.0.1:8080", False),
    ],
)
def test_sign_in_is_refused_from_another_origin(
    origin: str | None, referer: str | None, host: str | None, allowed: bool
) -> None:
    refusal = foreign_sign_in(origin, referer, host)
    assert (refusal is None) is allowed, refusal
    if refusal is not None:
        assert "origin" in refusal


# --- sessions -------------------------------------------------------------------------------------------


def test_one_token_signing_in_over_and_over_never_ends_another_tokens_session() -> None:
    book = SessionBook(ttl_s=3600, per_token=3)
    victim = book.open("victim", now=0)
    flood = [book.open("attacker", now=1) for _ in range(2000)]
    assert book.get(victim, now=2) is not None
    assert [book.get(s, now=2) is not None for s in flood[-4:]] == [False, True, True, True]
    assert len(book) == 4


def test_expired_sessions_are_swept_when_someone_signs_in() -> None:
    book = SessionBook(ttl_s=10, per_token=5)
    for n in range(50):
        book.open(f"token-{n}", now=0)
    book.open("late", now=100)
    assert len(book) == 1


# --- the body deadline -------------------------------------------------------------------------------


def test_the_body_deadline_cuts_a_trickling_body_but_never_a_finished_one() -> None:
    async def run() -> tuple[list[str], bool]:
        seen: list[str] = []

        async def trickle() -> dict[str, Any]:
            await asyncio.sleep(0.05)
            return {"type": "http.request", "body": b"x", "more_body": True}

        async def app(scope: Any, receive: Any, send: Any) -> None:
            while True:
                seen.append((await receive())["type"])

        with pytest.raises(RequestBodyTimeout):
            await BodyDeadline(app, timeout_s=0.3)({"type": "http"}, trickle, None)
        trickled = len(seen)

        messages = [{"type": "http.request", "body": b"{}", "more_body": False}]

        async def complete_then_wait() -> dict[str, Any]:
            if messages:
                return messages.pop()
            await asyncio.sleep(0.5)  # waiting for the client's disconnect, past the deadline
            return {"type": "http.disconnect"}

        async def streaming_app(scope: Any, receive: Any, send: Any) -> None:
            seen.append((await receive())["type"])
            seen.append((await receive())["type"])

        await BodyDeadline(streaming_app, timeout_s=0.1)({"type": "http"}, complete_then_wait, None)
        return seen[trickled:], 3 <= trickled <= 7

    after, trickled_until_the_deadline = asyncio.run(run())
    assert trickled_until_the_deadline
    assert after == ["http.request", "http.disconnect"]


# --- the tokens file ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('webhooks:\n  github: {"42": "s3cret-value}\n', "line 3, column 1"),  # unterminated quote
        ('webhooks:\n  github:\n    "42": *s3cret-value\n', "line 3, column 11"),  # YAML quotes the alias
        ("webhooks:\n  slack:\n    T1: !s3cret-value x\n", "line 3, column 9"),  # ... and the tag
        ("webhooks:\n  github:\n    s3cret-value: 42\n", "line 3, column 19"),  # secret and id swapped
        ("webhooks:\n  github: [s3cret-value]\n", "line 2, column 11"),
        ("tokens:\n  - {sha256: s3cret-value, tier: user, scope: ['/**']}\n", "line 2, column 14"),
        ("tokens:\n  - s3cret-value: 1\n", "line 2, column 5"),
    ],
)
def test_tokens_file_errors_name_the_line_and_column_never_the_text(text: str, where: str) -> None:
    with pytest.raises(TokensFileError) as error:
        parse_tokens_file(text, "/etc/agentstream/tokens.yaml")
    message = str(error.value)
    assert "s3cret" not in message and "\n" not in message, message
    assert message.startswith("/etc/agentstream/tokens.yaml, ") and where in message, message


def test_tokens_file_errors_still_say_what_is_wrong() -> None:
    with pytest.raises(TokensFileError, match=r"line 2, column 1: not valid YAML or JSON: found character a tab"):
        parse_tokens_file("tokens:\n\t- x\n")
    with pytest.raises(TokensFileError, match=r"expected ',' or '\]'"):
        parse_tokens_file("tokens: [1\n")
    with pytest.raises(TokensFileError, match=r"tokens\.0\.<key>: Extra inputs are not permitted"):
        parse_tokens_file(f"tokens:\n  - {{sha256: {'a' * 64}, tier: user, scope: ['/**'], scopes: 1}}\n")


def test_a_missing_tokens_file_revokes_after_the_grace_period_and_a_malformed_one_keeps_the_last_good(
    tmp_path: Path,
) -> None:
    token = new_token()
    path = tmp_path / "tokens.yaml"
    good = f"tokens:\n  - {{sha256: {hash_token(token)}, tier: user, scope: ['/**']}}\n"
    path.write_text(good)
    book = TokenBook(path, missing_grace_s=0.4)

    def check() -> bool:
        book._checked = 0.0  # skip the once-a-second throttle
        return book.claims(token) is not None

    path.unlink()
    assert check()  # missing, within the grace period
    path.write_text(good)
    assert check()
    path.unlink()
    assert check()
    time.sleep(0.5)
    assert not check()  # revoked
    path.write_text("tokens: [\n")
    assert not check()  # a malformed file brings nothing back
    path.write_text(good)
    assert check()
    path.write_text("tokens: [\n")
    assert check()  # malformed: the last good tokens stay
