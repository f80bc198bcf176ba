"""GitHub and Slack webhooks: signature checks and the integration events they become. Pure.

- GitHub signs the raw body: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, body)>`; the
  delivery id (`X-GitHub-Delivery`) is stable across redeliveries, so it is the idempotency key.
- Slack signs `v0:<X-Slack-Request-Timestamp>:<body>` with the workspace's signing secret
  (`X-Slack-Signature: v0=<hex>`), and a timestamp older than five minutes is a replay. The
  `event_id` is stable across Slack's retries.

Signatures are compared with `hmac.compare_digest` (constant time).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any
from urllib.parse import parse_qs

import orjson

from processors.idempotency_keys import github_delivery_key, slack_event_key
from schemas.gateway import GITHUB_WEBHOOK_RECEIVED, SLACK_WEBHOOK_RECEIVED

SLACK_MAX_SKEW_S = 5 * 60


class WebhookError(ValueError):
    """The request is not a usable webhook delivery (400)."""


def github_signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def github_signature_ok(secret: str, body: bytes, header: str | None) -> bool:
    if not header:
        return False
    return hmac.compare_digest(github_signature(secret, body).encode(), header.strip().encode())


def slack_signature(secret: str, timestamp: str, body: bytes) -> str:
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def slack_signature_ok(secret: str, body: bytes, timestamp: str | None, header: str | None, now_s: float) -> bool:
    if not timestamp or not header:
        return False
    try:
        sent_at = int(timestamp)
    except ValueError:
        return False
    if abs(now_s - sent_at) > SLACK_MAX_SKEW_S:
        return False  # a replay of an old (even genuine) request
    return hmac.compare_digest(slack_signature(secret, timestamp, body).encode(), header.strip().encode())


def github_command(
    install: str, event: str | None, delivery: str | None, body: bytes, content_type: str | None
) -> dict[str, Any]:
    """The append command (without appendId) for one GitHub delivery."""
    if not event:
        raise WebhookError("missing X-GitHub-Event header")
    if not delivery:
        raise WebhookError("missing X-GitHub-Delivery header")
    payload = _json_object(_github_json(body, content_type), "GitHub payload")
    return {
        "streamPath": f"/integrations/github/{install}",
        "type": GITHUB_WEBHOOK_RECEIVED,
        "payload": {"event": event, "delivery": delivery, "payload": payload},
        "idempotencyKey": github_delivery_key(delivery),
    }


def _github_json(body: bytes, content_type: str | None) -> bytes:
    # A GitHub webhook can be configured to send `application/x-www-form-urlencoded`: payload=<json>.
    if content_type and content_type.split(";")[0].strip() == "application/x-www-form-urlencoded":
        values = parse_qs(body.decode(errors="replace")).get("payload")
        if not values:
            raise WebhookError("form-encoded GitHub delivery without a 'payload' field")
        return values[0].encode()
    return body


def slack_body(body: bytes) -> dict[str, Any]:
    return _json_object(body, "Slack payload")


def slack_command(workspace: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The append command (without appendId) for one Slack Events API delivery."""
    event_id = payload.get("event_id")
    if not isinstance(event_id, str) or not event_id:
        raise WebhookError("Slack payload has no event_id (only Events API callbacks are accepted)")
    return {
        "streamPath": f"/integrations/slack/{workspace}",
        "type": SLACK_WEBHOOK_RECEIVED,
        "payload": {"payload": payload},
        "idempotencyKey": slack_event_key(event_id),
    }


def _json_object(body: bytes, what: str) -> dict[str, Any]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise WebhookError(f"{what} is not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise WebhookError(f"{what} must be a JSON object, not {type(value).__name__}")
    return value
