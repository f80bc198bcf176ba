"""Console sign-in: a bearer token exchanged once for an opaque, server-side session.

Browsers cannot send `Authorization` on a page load or an `EventSource`, so the login form takes
the token and the gateway answers with a cookie holding only a random session id (HttpOnly,
SameSite=Strict, Path=/console). The token stays in this process's memory, never in the browser;
every request resolves it through the tokens file again, so revoking a token ends its sessions.
Each session has its own CSRF token that every form post must echo (defence in depth beside
SameSite=Strict).
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

COOKIE = "agentstream_console"
SESSION_TTL_S = 12 * 3600
SESSIONS_PER_TOKEN = 20  # the default of AGENTSTREAM_GATEWAY_CONSOLE_SESSIONS_PER_TOKEN
SWEEP_EVERY_S = 60.0


@dataclass(frozen=True, slots=True)
class Session:
    token: str
    csrf: str
    expires_at: float


class SessionBook:
    """Sessions by id, capped per token: a sign-in beyond a token's cap ends that token's oldest
    session, never another token's (one token signing in over and over cannot sign anyone else
    out). Tokens come from the tokens file, so the book holds at most tokens x cap sessions;
    expired ones are swept once a minute."""

    def __init__(self, ttl_s: float = SESSION_TTL_S, per_token: int = SESSIONS_PER_TOKEN) -> None:
        self._ttl_s = ttl_s
        self._per_token = per_token
        self._sessions: dict[str, Session] = {}
        self._by_token: dict[str, OrderedDict[str, None]] = {}  # token -> its session ids, oldest first
        self._swept_at = 0.0
        self._lock = threading.Lock()

    def open(self, token: str, now: float | None = None) -> str:
        """A new session for `token`; returns its id (the cookie's value)."""
        now = time.time() if now is None else now
        session_id = secrets.token_urlsafe(32)
        with self._lock:
            if now - self._swept_at >= SWEEP_EVERY_S:
                self._sweep(now)
            ids = self._by_token.setdefault(token, OrderedDict())
            while len(ids) >= self._per_token:
                self._drop(next(iter(ids)))  # this token's oldest sign-in goes first
            self._sessions[session_id] = Session(token, secrets.token_urlsafe(24), now + self._ttl_s)
            self._by_token[token][session_id] = None
        return session_id

    def get(self, session_id: str | None, now: float | None = None) -> Session | None:
        if not session_id:
            return None
        now = time.time() if now is None else now
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and session.expires_at <= now:
                self._drop(session_id)
                return None
            return session

    def close(self, session_id: str | None) -> None:
        if session_id:
            with self._lock:
                self._drop(session_id)

    def __len__(self) -> int:
        return len(self._sessions)

    def _drop(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        ids = self._by_token.get(session.token)
        if ids is not None:
            ids.pop(session_id, None)
            if not ids:
                del self._by_token[session.token]

    def _sweep(self, now: float) -> None:
        self._swept_at = now
        for session_id in [sid for sid, session in self._sessions.items() if session.expires_at <= now]:
            self._drop(session_id)


def csrf_ok(session: Session, sent: str | None) -> bool:
    return sent is not None and hmac.compare_digest(session.csrf.encode(), sent.encode())
