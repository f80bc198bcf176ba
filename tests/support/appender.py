"""An at-least-once client (behaviour §5.2): every append is sent once, then sent again, the same
command with the same append id, until the journal answers it.

The client API sends each append once and hands back a receipt; a producer that wants an outcome
for every append resends what went unanswered. The journal must hold each such append exactly once
however often it was sent (its append id makes a resend a duplicate).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer

from pipeline.client import AppendResult, AppendTimeout, Client, Receipt
from schemas.events import AppendCommand


@dataclass(slots=True)
class Pending:
    receipt: Receipt
    command: bytes  # the command as sent, append id included: a resend is byte for byte the same
    sent_at: float
    sends: int = 1


class RetryingAppender:
    """Appends through `client`; a background thread waits for each outcome and resends the same
    command every `resend_after_s` until one arrives."""

    def __init__(self, client: Client, resend_after_s: float = 8.0) -> None:
        self.client = client
        self.resend_after_s = resend_after_s
        self.results: dict[str, AppendResult] = {}  # append id -> the first outcome that arrived
        self.paths: dict[str, str] = {}  # append id -> stream path
        self.resends = 0
        self._producer = Producer(
            {
                **client.settings.kafka_client_config(),
                "enable.idempotence": True,
                "acks": "all",
                "partitioner": "murmur2_random",  # the client's: a resend lands on the same partition
                "log_level": 3,
            }
        )
        self._pending: deque[Pending] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="retrying-appender", daemon=True)
        self._thread.start()

    def append(self, path: str, raw: Mapping[str, Any]) -> str:
        """Send one append; its append id."""
        receipt = self.client.streams.get(path).append(raw)
        command = AppendCommand.model_validate({**raw, "streamPath": path, "appendId": receipt.append_id})
        pending = Pending(receipt, command.model_dump_json(exclude_none=True).encode(), time.monotonic())
        with self._lock:
            self.paths[receipt.append_id] = path
            self._pending.append(pending)
        return receipt.append_id

    def unanswered(self) -> int:
        with self._lock:
            return len(self._pending)

    def settle(self, timeout: float) -> dict[str, AppendResult]:
        """Wait until every append has an outcome (resending meanwhile); the outcomes by append id.
        Raises AssertionError naming how many are still unanswered after `timeout`."""
        self.client.flush(60)
        deadline = time.monotonic() + timeout
        while self.unanswered() and time.monotonic() < deadline and self._error is None:
            time.sleep(0.2)
        if self._error is not None:
            raise self._error
        left = self.unanswered()
        assert not left, f"{left} appends still without an outcome after {timeout:g}s ({self.resends} resends)"
        return self.results

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._producer.flush(10)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self._lock:
                    head = self._pending.popleft() if self._pending else None
                if head is None:
                    time.sleep(0.05)
                    continue
                wait = head.sent_at + self.resend_after_s - time.monotonic()
                try:
                    result = head.receipt.result(timeout=max(wait, 0.001))
                except AppendTimeout:
                    self._resend(head)
                    with self._lock:
                        self._pending.append(head)
                    continue
                self.results[head.receipt.append_id] = result
        except BaseException as error:  # reported by settle()
            self._error = error

    def _resend(self, pending: Pending) -> None:
        receipt = pending.receipt
        self._producer.produce(self.client.topics.appends, key=receipt.stream_path.encode(), value=pending.command)
        self._producer.poll(0)
        pending.sent_at = time.monotonic()
        pending.sends += 1
        self.resends += 1
