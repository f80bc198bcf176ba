"""Logging of the long-running processes: one setup, and a limit on Kafka connection-failure repeats.

While a broker is unreachable, aiokafka and librdkafka log a failure for every reconnect attempt,
metadata refresh, fetch and coordinator lookup: about a hundred ERROR lines a second per worker,
which bury everything else and fill disks. `RepeatedKafkaFailureFilter` lets the first of each kind
through, drops its repeats for `AGENTSTREAM_LOG_REPEAT_INTERVAL_S`, and then lets the next one through
with the count it dropped: "... (412 similar in the last 30 s)". A repeat is the same message from
the same logger, its numbers aside (client ids, node ids, milliseconds). Nothing else is limited.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.settings import Settings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# The loggers the Kafka clients write to: aiokafka's own, and the ones librdkafka's log callbacks are
# routed to (topics/admin.py, pipeline/kafka/producer.py, pipeline/gateway/kafka.py). Their warnings
# and errors are about the connection, the protocol or the group, and repeat per attempt.
KAFKA_CLIENT_LOGGERS = ("aiokafka", "agentstream.kafka", "agentstream.gateway.kafka")
# Connection failures as any other logger (Faust, mode, agentstream's own) may word them.
CONNECTION_FAILURE_MARKERS = (
    "Connect call failed",
    "Connection refused",
    "Connection reset",
    "KafkaConnectionError",
    "NodeNotReadyError",
    "Unable connect to node",
    "Unable to update metadata",
    "Unable to request metadata",
    "Failed to resolve",
    "Broker transport failure",
    "brokers are down",
)
_NUMBER = re.compile(r"\d+")
_MAX_KINDS = 1000  # distinct repeating messages remembered; beyond, the oldest windows are forgotten


def is_kafka_connection_failure(record: logging.LogRecord, message: str) -> bool:
    """A warning or error of a Kafka client logger, or one that reads as a failed connection."""
    if record.levelno < logging.WARNING:
        return False
    name = record.name
    if any(name == logger or name.startswith(logger + ".") for logger in KAFKA_CLIENT_LOGGERS):
        return True
    return any(marker in message for marker in CONNECTION_FAILURE_MARKERS)


@dataclass(slots=True)
class _Window:
    shown_at: float  # when a line of this kind was last let through
    dropped: int = 0  # repeats dropped since


class RepeatedKafkaFailureFilter(logging.Filter):
    """Lets through one line of each repeating Kafka connection failure per `interval_s` (per
    logger and message, numbers aside); the next line after a window carries the count dropped.
    `interval_s` 0: lets everything through."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._clock = clock
        self._windows: dict[tuple[str, str], _Window] = {}
        self._lock = threading.Lock()  # librdkafka's callbacks log from its own threads

    def filter(self, record: logging.LogRecord) -> bool:
        if self.interval_s <= 0 or record.levelno < logging.WARNING:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a broken record: the handler reports it as it would have
            return True
        if not is_kafka_connection_failure(record, message):
            return True
        kind = (record.name, _NUMBER.sub("#", message))
        now = self._clock()
        with self._lock:
            window = self._windows.get(kind)
            if window is not None and now - window.shown_at < self.interval_s:
                window.dropped += 1
                return False
            if window is None:
                self._forget_old_windows(now)
                self._windows[kind] = _Window(shown_at=now)
                return True
            dropped, since = window.dropped, now - window.shown_at
            window.shown_at, window.dropped = now, 0
        if dropped:  # args () rather than None: Faust's formatter would wrap None and then fail on it
            record.msg, record.args = f"{message} ({dropped} similar in the last {since:.0f} s)", ()
        return True

    def _forget_old_windows(self, now: float) -> None:
        if len(self._windows) < _MAX_KINDS:
            return
        expired = [kind for kind, window in self._windows.items() if now - window.shown_at >= self.interval_s]
        for kind in expired or list(self._windows)[: _MAX_KINDS // 2]:
            del self._windows[kind]


def limit_repeated_kafka_failures(interval_s: float) -> None:
    """Install a `RepeatedKafkaFailureFilter` on every handler of the root logger (once per handler):
    call it after whatever configured those handlers."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(existing, RepeatedKafkaFailureFilter) for existing in handler.filters):
            handler.addFilter(RepeatedKafkaFailureFilter(interval_s))


def setup_logging(settings: Settings) -> None:
    """The logging of a worker or the gateway: `LOG_FORMAT` at `AGENTSTREAM_LOG_LEVEL` on stderr,
    Kafka connection-failure repeats limited."""
    logging.basicConfig(level=settings.log_level, format=LOG_FORMAT)
    limit_repeated_kafka_failures(settings.log_repeat_interval_s)


def faust_worker(app: Any, settings: Settings, topics: Sequence[str]) -> Any:
    """Faust's Worker for `app` (the journal worker, the router): quiet, no spinner, Kafka
    connection-failure repeats limited. Faust replaces the root logger's handlers with its own when
    it starts, so the limit goes on those.

    First, Kafka must answer and hold `topics` with the configured partition count: otherwise the
    process exits 3 with one line saying what to fix, as the other workers do, instead of Faust's
    traceback (docs/usage.md, exit codes)."""
    from faust.worker import Worker

    from pipeline import exit_codes
    from topics.admin import KafkaSetupError, require_topics

    try:
        require_topics(
            settings.bootstrap_servers, topics, settings.partitions, client_config=settings.kafka_client_config()
        )
    except KafkaSetupError as error:
        logging.getLogger("agentstream").error("%s cannot start: %s", app.conf.id, error)
        logging.shutdown()
        raise SystemExit(exit_codes.KAFKA) from None

    class AgentstreamFaustWorker(Worker):
        def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
            super().on_setup_root_logger(logger, level)
            limit_repeated_kafka_failures(settings.log_repeat_interval_s)

        def _schedule_shutdown(self, signal: Any) -> None:
            first = not self._signal_stop_time
            super()._schedule_shutdown(signal)
            if first:
                _exit_unless_stopped_within(settings.worker_stop_timeout_s, app.conf.id)

    worker = AgentstreamFaustWorker(app, loglevel=settings.log_level, quiet=True, redirect_stdouts=False)
    # Faust's terminal spinner sets the root logger to DEBUG so it can spin on every record: every
    # debug call of aiokafka and Faust then builds a LogRecord (measured: ~14% of the worker's CPU).
    worker.spinner = None
    return worker


def _exit_unless_stopped_within(timeout_s: float, name: str) -> None:
    """Faust's stop leaves its consumer thread waiting on the group coordinator while Kafka is
    unreachable, and the process then never ends. Past `timeout_s` it ends as a crash would: what
    was committed is in Kafka and in the rows, and the next start recovers from there."""
    import os

    from pipeline import exit_codes

    def expire() -> None:
        logging.getLogger("agentstream").error(
            "%s did not stop within %gs (AGENTSTREAM_WORKER_STOP_TIMEOUT_S; is Kafka reachable?): exiting now; "
            "the next start recovers from the committed rows and the journal",
            name,
            timeout_s,
        )
        logging.shutdown()
        os._exit(exit_codes.FATAL)

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True  # a stop that ends in time ends the process, timer and all
    timer.start()
