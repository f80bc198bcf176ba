"""The generator: bounded load through every door while the nemesis works.

- the Python client, at least once (tests/support/appender.py: an unanswered append is sent again,
  same append id, until the journal answers it);
- the HTTP gateway, NDJSON batches; a line with an append id is acknowledged (Kafka has it), a
  failed line or a failed request is not, and is never sent again;
- agents taking turns against the scripted model: a user message to each agent every few seconds;
- a few invalid commands, the only ones that may reach the dead-letter topic.

Every append carries a unique marker in its content, so the checker counts each one in the journal
whatever door it came through.
"""

from __future__ import annotations

import itertools
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import Producer

from pipeline.client import Client
from schemas.events import CONTEXT_ADDED
from tests.faults.history import History
from tests.support.appender import RetryingAppender

CLIENT_STREAMS = 8
GATEWAY_STREAMS = 4
INVALID_STREAM = "/faults/invalid"


def user(text: str) -> dict[str, Any]:
    return {
        "type": CONTEXT_ADDED,
        "payload": {"role": "user", "content": text, "actor": {"type": "user", "origin": "cli"}},
    }


@dataclass
class Sent:
    """One append the generator sent: which door, and whether it was acknowledged."""

    marker: str
    path: str
    door: str  # client, gateway, agent
    at: float  # wall clock, seconds
    acknowledged: bool = False
    append_id: str | None = None
    detail: str = ""


@dataclass
class GatewayStats:
    batches: int = 0
    ok: int = 0
    unavailable: int = 0  # 503 answers
    failed: int = 0  # other statuses or no answer
    last_503_at: float | None = None
    first_ok_after: dict[float, float] = field(default_factory=dict)  # heal time -> first 200 after it


class Generator:
    """Load at a fixed, low rate in threads until `stop()`; every count and wait bounded."""

    def __init__(
        self,
        client: Client,
        gateway_url: str,
        token: str,
        history: History,
        agents: list[str],
        rate: float = 20.0,
        batch_every_s: float = 1.0,
        batch_lines: int = 5,
        turn_every_s: float = 4.0,
    ) -> None:
        self.client = client
        self.appender = RetryingAppender(client, resend_after_s=6.0)
        self.gateway_url = gateway_url
        self.token = token
        self.history = history
        self.agents = agents
        self.rate = rate
        self.batch_every_s = batch_every_s
        self.batch_lines = batch_lines
        self.turn_every_s = turn_every_s
        self.sent: dict[str, Sent] = {}
        self.invalid_sent: list[str] = []
        self.gateway = GatewayStats()
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []
        self._raw = Producer(
            {
                **client.settings.kafka_client_config(),
                "partitioner": "murmur2_random",
                "enable.idempotence": True,
                "log_level": 0,
            }
        )

    def _marker(self, door: str) -> str:
        return f"{door}-{next(self._counter)}"

    def start(self) -> None:
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._guard(self._client_loop), name="load-client", daemon=True),
            threading.Thread(target=self._guard(self._gateway_loop), name="load-gateway", daemon=True),
            threading.Thread(target=self._guard(self._turns_loop), name="load-turns", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _guard(self, loop: Any) -> Any:
        def run() -> None:
            try:
                loop()
            except BaseException as error:  # reported by the checker
                self.errors.append(error)
                self.history.add("load", f"{loop.__name__} failed: {error!r}")

        return run

    # --- the doors --------------------------------------------------------------------------------

    def _client_loop(self) -> None:
        begun = time.monotonic()
        for n in itertools.count():
            if self._stop.is_set():
                return
            delay = begun + n / self.rate - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                return
            path = f"/faults/c{n % CLIENT_STREAMS}"
            self._append(path, "client")

    def _append(self, path: str, door: str) -> None:
        marker = self._marker(door)
        sent = Sent(marker, path, door, time.time())
        with self._lock:
            self.sent[marker] = sent
        sent.append_id = self.appender.append(path, user(f"{marker} m:{marker}"))

    def _turns_loop(self) -> None:
        while not self._stop.wait(self.turn_every_s):
            for path in self.agents:
                self._append(path, "agent")

    def _gateway_loop(self) -> None:
        for n in itertools.count():
            if self._stop.wait(self.batch_every_s):
                return
            lines = []
            batch: list[Sent] = []
            for i in range(self.batch_lines):
                marker = self._marker("gateway")
                path = f"/faults/g{(n + i) % GATEWAY_STREAMS}"
                sent = Sent(marker, path, "gateway", time.time())
                batch.append(sent)
                lines.append(orjson.dumps({"streamPath": path, **user(f"{marker} m:{marker}")}))
            with self._lock:
                self.sent.update((s.marker, s) for s in batch)
            self._post_batch(b"\n".join(lines), batch)

    def _post_batch(self, body: bytes, batch: list[Sent]) -> None:
        request = urllib.request.Request(
            f"{self.gateway_url}/v1/streams/-/events:batch",
            data=body,
            method="POST",
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/x-ndjson"},
        )
        self.gateway.batches += 1
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                answer = orjson.loads(response.read())
        except urllib.error.HTTPError as error:
            detail = f"HTTP {error.code}"
            if error.code == 503:
                self.gateway.unavailable += 1
                self.gateway.last_503_at = time.time()
            else:
                self.gateway.failed += 1
            for sent in batch:
                sent.detail = detail
            return
        except OSError as error:  # no answer at all: unacknowledged
            self.gateway.failed += 1
            for sent in batch:
                sent.detail = f"no answer: {error}"
            return
        self.gateway.ok += 1
        now = time.time()
        for heal in [h for h in self.gateway.first_ok_after if self.gateway.first_ok_after[h] < 0 and h <= now]:
            if answer["accepted"] == len(batch):
                self.gateway.first_ok_after[heal] = now
        for sent, result in zip(batch, answer["results"], strict=True):
            if "appendId" in result:
                sent.acknowledged = True
                sent.append_id = result["appendId"]
            else:
                sent.detail = f"line {result.get('status')}: {result.get('error')}"

    def expect_gateway_recovery(self, heal_at: float) -> None:
        self.gateway.first_ok_after[heal_at] = -1.0

    def send_invalid(self, count: int = 2) -> None:
        """Commands the journal must dead-letter: not JSON at all."""
        for _ in range(count):
            marker = self._marker("invalid")
            self._raw.produce(
                self.client.topics.appends, key=INVALID_STREAM.encode(), value=f"not json {marker}".encode()
            )
            self.invalid_sent.append(marker)
        self._raw.flush(30)

    # --- afterwards -------------------------------------------------------------------------------

    def settle(self, timeout: float) -> None:
        """Wait until every client append has an outcome; mark those acknowledged."""
        results = self.appender.settle(timeout)
        with self._lock:
            for sent in self.sent.values():
                if sent.door != "gateway" and sent.append_id in results:
                    result = results[sent.append_id]
                    sent.acknowledged = result.status in ("journaled", "duplicate")
                    sent.detail = result.status if result.status != "rejected" else f"rejected: {result.reason}"

    def close(self) -> None:
        self.stop()
        self.appender.close()
        self._raw.flush(10)
