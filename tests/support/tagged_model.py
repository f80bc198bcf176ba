"""A scripted model that answers by tag: each test queues responses for a tag of its own, and the
server answers each request with the next response queued for the first tag found in it (an
`always` entry answers every request of its tag), else `ok: <last user message>`."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from tests.support.scripted_llm import Reply, Response, ScriptedLLM, last_user_text

SMALL_USAGE = (20, 5)


Entry = Response | Callable[[dict[str, Any]], Response]


def request_text(body: Any) -> str:
    if not isinstance(body, dict):
        return ""
    return "\n".join(str(m.get("content", "")) for m in body.get("messages") or [] if isinstance(m, dict))


class TaggedReplies:
    """The next queued response for the first tag found in the request (an `always` entry answers
    every request of its tag), else `ok: <last user message>`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._routes: dict[str, deque[Entry]] = {}
        self._always: dict[str, Entry] = {}

    def on(self, tag: str, *entries: Entry) -> None:
        with self._lock:
            self._routes.setdefault(tag, deque()).extend(entries)

    def always(self, tag: str, entry: Entry) -> None:
        with self._lock:
            self._always[tag] = entry

    def __call__(self, body: dict[str, Any]) -> Response:
        text = request_text(body)
        entry: Entry | None = None
        with self._lock:
            for tag, queue in self._routes.items():
                if tag in text and queue:
                    entry = queue.popleft()
                    break
            else:
                entry = next((e for tag, e in self._always.items() if tag in text), None)
        if entry is None:
            return Reply(f"ok: {last_user_text(body)}", usage=SMALL_USAGE)
        return entry(body) if callable(entry) else entry


def script(code: str, before: str = "Let me check.") -> Reply:
    return Reply(f"{before}\n```python\n{code}\n```", usage=SMALL_USAGE)


def received(llm: ScriptedLLM, tag: str) -> list[Any]:
    return [r for r in llm.records if tag in request_text(r.body)]
