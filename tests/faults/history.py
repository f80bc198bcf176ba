"""The event history of a run: what the nemesis, the supervisor and the load did, and when."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class History:
    started: float = field(default_factory=time.time)
    events: list[tuple[float, str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, actor: str, what: str) -> float:
        at = time.time()
        with self._lock:
            self.events.append((at, actor, what))
        print(f"  [{at - self.started:7.1f}s] {actor}: {what}", flush=True)
        return at

    def since(self, at: float) -> list[str]:
        with self._lock:
            return [f"[{t - self.started:7.1f}s] {actor}: {what}" for t, actor, what in self.events if t >= at]
