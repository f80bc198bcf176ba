"""The console's limits, as small decisions without I/O: how often one may sign in, how many live
streams one may hold, and whether a sign-in form was sent from the console itself.

All of them are used from the gateway's event loop only (no locks).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}


class RateLimiter:
    """A token bucket per key: `per_minute` a minute, in bursts of up to `per_minute`.

    Remembers at most `max_keys` keys (the least recently used one is forgotten first: its bucket
    has mostly refilled by then), so a flood of distinct keys cannot grow it without bound.
    """

    def __init__(self, per_minute: int, max_keys: int = 100_000) -> None:
        self._rate_per_s = per_minute / 60.0
        self._burst = float(per_minute)
        self._max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, as of)

    def take(self, key: str, now: float | None = None) -> float:
        """0 if `key` may go ahead (one token taken); else the seconds until it may (nothing taken)."""
        now = time.monotonic() if now is None else now
        tokens, as_of = self._buckets.pop(key, (self._burst, now))
        tokens = min(self._burst, tokens + (now - as_of) * self._rate_per_s)
        wait = 0.0
        if tokens >= 1:
            tokens -= 1
        else:
            wait = (1 - tokens) / self._rate_per_s
        self._buckets[key] = (tokens, now)
        while len(self._buckets) > self._max_keys:
            self._buckets.popitem(last=False)
        return wait


def retry_after(wait_s: float) -> str:
    """A Retry-After value: whole seconds, at least 1."""
    return str(max(1, math.ceil(wait_s)))


class LiveStreamSlots:
    """Open live-update streams, per console session and in all, each within its cap."""

    def __init__(self, per_session: int, total: int) -> None:
        self.per_session = per_session
        self.total = total
        self._open: dict[str, int] = {}
        self._in_use = 0

    def take(self, session_id: str) -> str | None:
        """None if the session may open one more stream (it is counted); else why not."""
        if self._open.get(session_id, 0) >= self.per_session:
            return (
                f"this session already has {self.per_session} live updates open (the limit per session, "
                "AGENTSTREAM_GATEWAY_CONSOLE_LIVE_STREAMS_PER_SESSION): close a console tab or retry later"
            )
        if self._in_use >= self.total:
            return (
                f"the gateway already serves {self.total} live updates (its limit, "
                "AGENTSTREAM_GATEWAY_CONSOLE_LIVE_STREAMS): retry later"
            )
        self._open[session_id] = self._open.get(session_id, 0) + 1
        self._in_use += 1
        return None

    def give_back(self, session_id: str) -> None:
        count = self._open.get(session_id, 0)
        if count == 0:
            return
        self._in_use -= 1
        if count == 1:
            del self._open[session_id]
        else:
            self._open[session_id] = count - 1

    @property
    def in_use(self) -> int:
        return self._in_use


def _authority(url: str) -> tuple[str, int] | None:
    """(host, port) of an absolute http(s) URL or origin, the scheme's port if none is written."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.hostname, port or DEFAULT_PORTS[parts.scheme]


def foreign_sign_in(origin: str | None, referer: str | None, host: str | None) -> str | None:
    """None if a sign-in form may have come from the console itself; else why it did not.

    A browser sends `Origin` with every form post (the console's own pages send `Referer` only to
    the console, as a fallback for browsers that leave `Origin` out). A request with neither is not
    a browser's (curl, a script): nobody's session can be forged with it. The scheme is not compared:
    behind a proxy that terminates TLS the gateway sees http while the browser says https; the host
    and port are (a port left out is the page's scheme's default).
    """
    claimed, what = (origin, "Origin") if origin is not None else (referer, "Referer")
    if claimed is None:
        return None
    refusal = "sign-in refused: the form was not sent from this console's own origin"
    if claimed.strip() == "null":
        return f"{refusal} (Origin: null, an opaque origin)"
    authority = _authority(claimed.strip())
    if authority is None or not host:
        return f"{refusal} ({what} is not an http(s) origin, or the request names no Host)"
    scheme = urlsplit(claimed.strip()).scheme
    own = _authority(f"{scheme}://{host.strip()}")
    if own is None or own != authority:
        return f"{refusal} ({what} names another site)"
    return None
