"""Prometheus metrics of the gateway, served on its own `/metrics`.

Labels are bounded: the route template (never the stream path), the status code, the gate rule
or refusal kind. No stream path, token or content is ever a label value.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

REQUESTS = Counter("agentstream_gateway_requests_total", "HTTP requests, by route and status.", ["route", "status"])
LATENCY = Histogram("agentstream_gateway_request_seconds", "HTTP request time, by route.", ["route"], buckets=_LATENCY)
BYTES = Counter("agentstream_gateway_request_bytes_total", "Request body bytes received, by route.", ["route"])
REFUSALS = Counter(
    "agentstream_gateway_refusals_total",
    "Refused commands or requests, by rule (append-gate rules, auth, signature, size, saturated, unavailable, "
    "timeout; uploads: file-type; console: origin, sign-in-rate, live-streams).",
    ["rule"],
)
COMMANDS = Counter("agentstream_gateway_commands_total", "Commands produced to Kafka, by topic kind.", ["topic"])
# Label children resolved once: `labels()` costs microseconds, and these are counted per command.
COMMANDS_TO_APPENDS = COMMANDS.labels("appends")
COMMANDS_TO_INTERNAL = COMMANDS.labels("internal")
