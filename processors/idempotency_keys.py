"""Every idempotency key the system itself builds (docs/behaviour.md §1, §4, §5, §6, §7).

A key names one exact event forever, and journals are kept forever: these strings are wire
formats, pinned byte for byte by tests/processors/test_idempotency_keys.py. Never change one; a
new kind of event gets a new function.

Which offset a key holds is part of its name, because `agent/request/<N>` is two things:

- `request_key(trigger_offset)`: `agent/request/<trigger offset>` names the request *event* by the
  offset of the trigger it answers (the request's own offset is not known before it is journaled);
- every `agent/request/<N>/<suffix>` key (`assistant`, `settled`, `usage`, `error`, `partial`,
  `expired`, `expiry-error`) takes `request_offset`: the offset of that `llm-request-requested`
  event, R.

So `agent/request/7` and `agent/request/7/settled` are usually about different requests.
"""

from __future__ import annotations

import hashlib

MAX_KEY_CHARS = 512  # schemas.events.IdempotencyKey's bound
ROUTE_KEY_PREFIX = "route/"
# Every key this module mints starts with one of these. The gateway refuses them from every tier
# but platform (docs/behaviour.md §6.8): a key taken early would silence the worker that needs it.
RESERVED_KEY_PREFIXES = ("agent/", ROUTE_KEY_PREFIX, "capability-host/", "github/delivery/", "slack/event/")


def is_reserved(key: str | None) -> bool:
    return key is not None and key.startswith(RESERVED_KEY_PREFIXES)


# --- birth (§5) ------------------------------------------------------------------------------------

AGENT_CREATED_KEY = "agent/created"


def system_prompt_key(revision: int) -> str:
    """The base policy's revision `revision` (the slot key `agent/system-prompt` plus `@<revision>`)."""
    return f"agent/system-prompt@{revision}"


# --- the scheduler (§4.2, §4.3) ------------------------------------------------------------------


def request_key(trigger_offset: int) -> str:
    """`llm-request-requested`: named by the offset of the pending trigger, not of the request."""
    return f"agent/request/{trigger_offset}"


def pause_key(trigger_offset: int) -> str:
    return f"agent/pause/{trigger_offset}"


def resume_key(trigger_offset: int) -> str:
    return f"agent/resume/{trigger_offset}"


def expired_key(request_offset: int) -> str:
    return f"agent/request/{request_offset}/expired"


def expiry_error_key(request_offset: int) -> str:
    return f"agent/request/{request_offset}/expiry-error"


def expiry_of(key: str | None) -> tuple[int, bool] | None:
    """(R, whether it is the error event) when `key` is one of request R's expiry keys, else None."""
    if key is None or not key.startswith("agent/request/"):
        return None
    request, _, suffix = key[len("agent/request/") :].partition("/")
    if not request.isdigit() or suffix not in ("expired", "expiry-error"):
        return None
    return int(request), suffix == "expiry-error"


# --- the LLM caller's outcomes (§4.3, §4.4, §4.5, §5.1.8) ---------------------------------------------


def assistant_key(request_offset: int) -> str:
    return f"agent/request/{request_offset}/assistant"


def settled_key(request_offset: int) -> str:
    return f"agent/request/{request_offset}/settled"


def usage_key(request_offset: int) -> str:
    return f"agent/request/{request_offset}/usage"


def error_key(request_offset: int) -> str:
    return f"agent/request/{request_offset}/error"


def partial_key(request_offset: int) -> str:
    return f"agent/request/{request_offset}/partial"


def compaction_key(report_offset: int) -> str:
    """A summary asked for by the `token-usage-reported` event at `report_offset`."""
    return f"agent/compact-context@{report_offset}"


def overflow_compaction_key(request_offset: int) -> str:
    """A summary made because request R exceeded the model's context window."""
    return f"agent/compact-context@overflow-{request_offset}"


# --- code execution (§6) ------------------------------------------------------------------------------


def script_run_requested_key(assistant_offset: int) -> str:
    return f"agent/script-run-requested@{assistant_offset}"


def script_feedback_key(assistant_offset: int) -> str:
    return f"agent/script-feedback@{assistant_offset}"


def script_result_key(execution_id: str) -> str:
    return f"agent/script-result@{execution_id}"


def script_run_started_key(execution_id: str) -> str:
    return f"capability-host/script-run-started@{execution_id}"


def script_run_settled_key(execution_id: str) -> str:
    return f"capability-host/script-run-settled@{execution_id}"


_OWN_CALL_PREFIX = "capability-host/"
_OWN_CALL_SUFFIX = "/call-"


def own_script_call_execution(key: str | None) -> str | None:
    """The execution whose call into its own stream `key` names (`script_call_key` with the target
    the source), else None. The journal accepts such a call only while that run is unsettled."""
    if key is None or not key.startswith(_OWN_CALL_PREFIX) or key.startswith(_OWN_CALL_PREFIX + "from"):
        return None
    execution, separator, call = key[len(_OWN_CALL_PREFIX) :].rpartition(_OWN_CALL_SUFFIX)
    if not separator or not execution or not call.isdigit():
        return None
    return execution


def script_call_key(source: str, execution_id: str, call: int, target: str) -> str:
    """A script's `call`-th append through a granted function. Keys are per stream, and execution
    ids are only unique within their agent's stream, so a key in another stream names the source too."""
    if target == source:
        return f"capability-host/{execution_id}/call-{call}"
    key = f"capability-host/from{source}/{execution_id}/call-{call}"
    if len(key) > MAX_KEY_CHARS:
        digest = hashlib.sha256(source.encode()).hexdigest()[:32]
        key = f"capability-host/from-sha256:{digest}/{execution_id}/call-{call}"
    return key


# --- ingestion and routing (§7) -----------------------------------------------------------------------


def github_delivery_key(delivery: str) -> str:
    """A GitHub webhook, by its `X-GitHub-Delivery` header: a redelivery is a no-op."""
    return f"github/delivery/{delivery}"


def slack_event_key(event_id: str) -> str:
    """A Slack Events API callback, by its `event_id`."""
    return f"slack/event/{event_id}"


def route_key(source: str, offset: int) -> str:
    """The event at `offset` of `source`, routed to a subscriber (in the subscriber's stream)."""
    key = f"{ROUTE_KEY_PREFIX}{source}@{offset}"
    if len(key) <= MAX_KEY_CHARS:
        return key
    digest = hashlib.sha256(source.encode()).hexdigest()  # only paths near the 512-character limit
    return f"{ROUTE_KEY_PREFIX}sha256:{digest}@{offset}"


def is_routed(key: object) -> bool:
    """Whether an event's idempotency key says the router appended it."""
    return isinstance(key, str) and key.startswith(ROUTE_KEY_PREFIX)
