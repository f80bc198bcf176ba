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
MAX_SESSIONS = 10_000


@dataclass(frozen=True, slots=True)
class Session:
    token: str
    csrf: str
    expires_at: float


class SessionBook:
    def __init__(self, ttl_s: float = SESSION_TTL_S, capacity: int = MAX_SESSIONS) -> None:
        self._ttl_s = ttl_s
        self._capacity = capacity
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, token: str, now: float | None = None) -> str:
        """A new session for `token`; returns its id (the cookie's value)."""
        now = time.time() if now is None else now
        session_id = secrets.token_urlsafe(32)
        with self._lock:
            self._sessions[session_id] = Session(token, secrets.token_urlsafe(24), now + self._ttl_s)
            while len(self._sessions) > self._capacity:
                self._sessions.popitem(last=False)  # the oldest sign-in goes first
        return session_id

    def get(self, session_id: str | None, now: float | None = None) -> Session | None:
        if not session_id:
            return None
        now = time.time() if now is None else now
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and session.expires_at <= now:
                del self._sessions[session_id]
                return None
            return session

    def close(self, session_id: str | None) -> None:
        if session_id:
            with self._lock:
                self._sessions.pop(session_id, None)


def csrf_ok(session: Session, sent: str | None) -> bool:
    return sent is not None and hmac.compare_digest(session.csrf.encode(), sent.encode())
