"""Every idempotency key the system builds, byte for byte (docs/behaviour.md §1: a key names one
exact event forever, and journals are kept forever). A failure here means journaled keys would no
longer match: never "fix" the expected strings."""

from __future__ import annotations

import hashlib
import inspect

from pipeline import base_policy
from pipeline.gateway.webhooks import github_command, slack_command
from processors import idempotency_keys as keys
from processors.routing import routable
from processors.scheduler import decide
from schemas.events import AppendCommand
from tests.support.journal_builder import Journal


def test_every_key_shape_is_pinned() -> None:
    assert keys.AGENT_CREATED_KEY == "agent/created"
    assert keys.system_prompt_key(2) == "agent/system-prompt@2"
    assert keys.request_key(trigger_offset=7) == "agent/request/7"
    assert keys.pause_key(trigger_offset=7) == "agent/pause/7"
    assert keys.resume_key(trigger_offset=7) == "agent/resume/7"
    assert keys.expired_key(request_offset=9) == "agent/request/9/expired"
    assert keys.expiry_error_key(request_offset=9) == "agent/request/9/expiry-error"
    assert keys.assistant_key(request_offset=9) == "agent/request/9/assistant"
    assert keys.settled_key(request_offset=9) == "agent/request/9/settled"
    assert keys.usage_key(request_offset=9) == "agent/request/9/usage"
    assert keys.error_key(request_offset=9) == "agent/request/9/error"
    assert keys.partial_key(request_offset=9) == "agent/request/9/partial"
    assert keys.compaction_key(report_offset=12) == "agent/compact-context@12"
    assert keys.overflow_compaction_key(request_offset=9) == "agent/compact-context@overflow-9"
    assert keys.script_run_requested_key(assistant_offset=5) == "agent/script-run-requested@5"
    assert keys.script_feedback_key(assistant_offset=5) == "agent/script-feedback@5"
    assert keys.script_result_key("agent-output:5") == "agent/script-result@agent-output:5"
    assert keys.script_run_started_key("agent-output:5") == "capability-host/script-run-started@agent-output:5"
    assert keys.script_run_settled_key("agent-output:5") == "capability-host/script-run-settled@agent-output:5"
    assert keys.github_delivery_key("72d3162e-cc78") == "github/delivery/72d3162e-cc78"
    assert keys.slack_event_key("Ev08MFMKH6") == "slack/event/Ev08MFMKH6"
    assert keys.route_key("/integrations/github/main", 240) == "route//integrations/github/main@240"


def test_keys_that_would_outgrow_512_characters_name_a_digest_of_the_source_path() -> None:
    source = "/" + "/".join(["s" * 100] * 5)  # 505 characters
    digest = hashlib.sha256(source.encode()).hexdigest()
    assert keys.route_key(source, 3) == f"route/sha256:{digest}@3"
    own = keys.script_call_key("/agents/a", "agent-output:7", 1, "/agents/a")
    assert own == "capability-host/agent-output:7/call-1"
    other = keys.script_call_key("/agents/a", "agent-output:7", 2, "/agents/b")
    assert other == "capability-host/from/agents/a/agent-output:7/call-2"
    far = keys.script_call_key(source, "agent-output:7", 3, "/agents/b")
    assert far == f"capability-host/from-sha256:{digest[:32]}/agent-output:7/call-3"
    assert max(len(keys.route_key(source, 2**63)), len(far)) <= keys.MAX_KEY_CHARS


def test_the_request_key_names_the_trigger_while_its_outcomes_name_the_request() -> None:
    """§4.2/§4.3: `agent/request/<N>` holds the trigger's offset; `agent/request/<R>/…` the request's."""
    j = Journal()
    j.created()
    j.system("policy", key="agent/system-prompt")
    hi = j.user("hi")
    (requested,) = decide(j.fold(), j.at_ms(hi) + 250, "m").appends
    assert requested.idempotencyKey == f"agent/request/{hi}"
    r = j.request(expires_at=j.at_ms(hi) + 1000)
    assert r != hi
    expired, error = decide(j.fold(), j.at_ms(hi) + 1000, "m").appends
    assert (expired.idempotencyKey, error.idempotencyKey) == (
        f"agent/request/{r}/expired",
        f"agent/request/{r}/expiry-error",
    )


def test_producers_outside_the_core_use_the_same_keys() -> None:
    assert base_policy.IDEMPOTENCY_KEY == "agent/system-prompt@2" == keys.system_prompt_key(base_policy.REVISION)
    github = github_command("main", "push", "d-1", b"{}", "application/json")
    assert github["idempotencyKey"] == "github/delivery/d-1"
    slack = slack_command("acme", {"event_id": "Ev1"})
    assert slack["idempotencyKey"] == "slack/event/Ev1"
    for command in (github, slack):
        AppendCommand.model_validate(command)
    assert not routable({"type": "x/y", "idempotencyKey": keys.route_key("/integrations/x", 1)})
    assert routable({"type": "x/webhook", "idempotencyKey": "github/delivery/d-1"}) and routable({"type": "x/y"})


def test_an_expiry_key_is_read_back_as_its_request_and_kind() -> None:
    """The engine recognises the scheduler's expiry commands by these keys (§4.3)."""
    assert keys.expiry_of(keys.expired_key(12)) == (12, False)
    assert keys.expiry_of(keys.expiry_error_key(12)) == (12, True)
    for other in (
        None,
        keys.settled_key(12),
        keys.request_key(12),
        "agent/request/x/expired",
        "agent/request/12/expired/more",
        "agents/request/12/expired",
    ):
        assert keys.expiry_of(other) is None, other


def test_6_8_every_key_the_system_mints_is_reserved() -> None:
    """Each key-building function of the module, called with sample arguments, yields a key the
    gateway refuses from non-platform tiers: a new kind of key cannot slip out of the reserved set."""
    samples = {"trigger_offset": 7, "request_offset": 9, "report_offset": 12, "assistant_offset": 5, "revision": 2}
    samples |= {"execution_id": "agent-output:5", "delivery": "d1", "event_id": "Ev1", "offset": 3, "call": 1}
    samples |= {"source": "/agents/a", "target": "/agents/b"}
    minted = [keys.AGENT_CREATED_KEY]
    for name, function in inspect.getmembers(keys, inspect.isfunction):
        if function.__module__ != keys.__name__ or not name.endswith("_key"):
            continue
        minted.append(function(**{p: samples[p] for p in inspect.signature(function).parameters}))
    assert len(minted) >= 20
    assert all(keys.is_reserved(key) for key in minted), [key for key in minted if not keys.is_reserved(key)]
    assert keys.script_call_key("/agents/a", "agent-output:5", 1, "/agents/a").startswith("capability-host/")
    assert not keys.is_reserved("agents/1") and not keys.is_reserved(None)


def test_a_route_key_of_exactly_512_characters_is_kept_and_one_of_513_names_a_digest() -> None:
    """§1: an idempotency key is 1-512 characters. `route/<source>@<offset>` is kept as it is up to
    512 characters; only a longer one names a digest of the source path."""
    source = "/" + "s" * 500  # route/ (6) + 501 + @ + 4 digits = 512
    assert keys.route_key(source, 1000) == f"route/{source}@1000"
    assert len(keys.route_key(source, 1000)) == 512
    digest = hashlib.sha256(source.encode()).hexdigest()
    assert keys.route_key(source, 10000) == f"route/sha256:{digest}@10000"  # 513 characters as it is


def test_a_script_call_key_of_exactly_512_characters_is_kept_and_one_of_513_names_a_digest() -> None:
    source = "/" + "s" * 466  # capability-host/from (20) + 467 + /agent-output:7 (15) + /call-1234 (10) = 512
    execution = "agent-output:7"
    exact = keys.script_call_key(source, execution, 1234, "/agents/b")
    assert exact == f"capability-host/from{source}/{execution}/call-1234" and len(exact) == 512
    over = keys.script_call_key(source, execution, 12345, "/agents/b")
    digest = hashlib.sha256(source.encode()).hexdigest()[:32]
    assert over == f"capability-host/from-sha256:{digest}/{execution}/call-12345"
