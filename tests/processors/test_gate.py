"""The append gate: every combination of tier, role, actor, field and stream kind, broker-free.

The expected decision is written out below as the tier rules read in words; the gate must agree
on every combination, stamp the actor the tier prescribes, and send worker-only commands (platform
only) to the internal topic. Then the credentials the gate's claims come from: the tokens file
(hashes only) and the GitHub and Slack webhook signatures.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import os
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.gateway.tokens import TokenBook, TokensFileError, hash_token, new_token, parse_tokens_file
from pipeline.gateway.webhooks import github_signature_ok, slack_signature_ok
from processors.gate import RULES, Admitted, Claims, Refused, admit, attached_blobs, in_scope
from schemas.events import (
    AGENT_CONFIGURED,
    AGENT_PAUSED,
    AGENT_RESUMED,
    CONTEXT_ADDED,
    LLM_REQUEST_SETTLED,
    AppendCommand,
)

MAX_FILE = 1000
AGENT_STREAM = "/agents/a1"
INTEGRATION_STREAM = "/integrations/github/42"
OTHER_STREAM = "/scratch/notes"
ROLES = ("system", "developer", "user", "assistant")
ACTORS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "user": {"type": "user", "origin": "cli"},
    "agent": {"type": "agent", "path": "/agents/other"},
    "script": {"type": "script", "executionId": "x1"},
    "integration": {"type": "integration", "name": "crm"},
    "slack": {"type": "slack", "userId": "U1"},
    "telegram": {"type": "telegram", "username": "t"},
    "email": {"type": "email", "address": "a@b.c"},
    "github": {"type": "github", "login": "octocat"},
}
FIELDS: dict[str, dict[str, Any]] = {
    "plain": {},
    "key": {"key": "slot/1"},
    "compaction": {
        "compaction": {"replacesHistoryThrough": 3},
        "llmRequestPolicy": {"behaviour": "dont-trigger-request"},
    },
    "llmRequestOffset": {"llmRequestOffset": 7},
    "small file": {"files": [{"contentType": "text/plain", "filename": "a", "path": "/f/a", "size": 10, "url": "u"}]},
    "big file": {
        "files": [{"contentType": "text/plain", "filename": "b", "path": "/f/b", "size": MAX_FILE + 1, "url": "u"}]
    },
}
STREAMS = (AGENT_STREAM, INTEGRATION_STREAM, OTHER_STREAM)
INTEGRATION_KINDS = {"integration", "slack", "telegram", "email", "github"}

CLAIMS = {
    "user": Claims("user", ("/**",), user_id="u-7"),
    "integration": Claims("integration", ("/**",)),
    "agent": Claims("agent", ("/**",), agent_path="/agents/script-runner"),
    "platform": Claims("platform", ("/**",)),
}


def item_command(path: str, role: str, actor: str, field: str) -> AppendCommand:
    payload: dict[str, Any] = {"role": role, "content": "hello", **FIELDS[field]}
    if ACTORS[actor] is not None:
        payload["actor"] = ACTORS[actor]
    return AppendCommand(streamPath=path, type=CONTEXT_ADDED, payload=payload)


def worker_only(role: str, field: str) -> bool:
    return field == "compaction" or (role == "assistant" and field == "llmRequestOffset")


def expected_allowed(tier: str, path: str, role: str, actor: str, field: str) -> bool:
    """The tier rules, read in words, for a context-added item."""
    to_agent = path.startswith("/agents/")
    if tier == "platform":
        return True
    if tier == "user":
        # Only role user to agent streams; the gateway stamps the actor; no key, compaction,
        # llmRequestOffset or oversized files.
        return (
            to_agent
            and role == "user"
            and actor == "none"
            and field not in {"key", "compaction", "llmRequestOffset", "big file"}
        )
    if tier == "integration":
        # Raw events to integration streams (anything but worker-only commands and, §6.6, system
        # items: only agents are agents); developer items with an integration-kind actor to agent
        # streams.
        if path.startswith("/integrations/"):
            return not worker_only(role, field) and role != "system"
        return (
            to_agent
            and role == "developer"
            and actor in INTEGRATION_KINDS
            and field not in {"compaction", "llmRequestOffset"}
        )
    assert tier == "agent"
    # Developer items to agent streams; the gateway stamps the agent actor.
    return to_agent and role == "developer" and actor == "none" and field not in {"compaction", "llmRequestOffset"}


COMBINATIONS = list(itertools.product(CLAIMS, STREAMS, ROLES, ACTORS, FIELDS))


@pytest.mark.parametrize(("tier", "path", "role", "actor", "field"), COMBINATIONS)
def test_every_tier_role_actor_field_combination_follows_the_tier_rules(
    tier: str, path: str, role: str, actor: str, field: str
) -> None:
    command = item_command(path, role, actor, field)
    decision = admit(CLAIMS[tier], command, max_user_file_bytes=MAX_FILE)
    allowed = expected_allowed(tier, path, role, actor, field)
    assert isinstance(decision, Admitted) == allowed, decision
    if isinstance(decision, Refused):
        assert decision.rule in RULES
        assert decision.detail
        return
    stamped = decision.command.payload.get("actor")
    if tier == "user":
        assert stamped == {"type": "user", "origin": "web", "userId": "u-7"}
    elif tier == "agent":
        assert stamped == {"type": "agent", "path": "/agents/script-runner"}
    else:
        assert stamped == ACTORS[actor]  # integration and platform actors pass through unchanged
    assert decision.internal == (tier == "platform" and worker_only(role, field))
    # Everything but the actor is exactly what was sent.
    unstamped = {k: v for k, v in decision.command.payload.items() if k != "actor"}
    assert unstamped == {k: v for k, v in command.payload.items() if k != "actor"}


def test_the_gate_never_changes_the_command_it_was_given() -> None:
    command = item_command(AGENT_STREAM, "user", "none", "plain")
    decision = admit(CLAIMS["user"], command)
    assert isinstance(decision, Admitted)
    assert "actor" not in command.payload


@pytest.mark.parametrize(
    ("tier", "event_type", "path", "allowed"),
    [
        ("user", AGENT_PAUSED, AGENT_STREAM, True),
        ("user", AGENT_RESUMED, AGENT_STREAM, True),
        ("user", AGENT_CONFIGURED, AGENT_STREAM, False),
        ("user", "events.iterate.com/custom/thing", AGENT_STREAM, False),
        ("user", AGENT_PAUSED, INTEGRATION_STREAM, False),
        ("integration", "events.iterate.com/crm/ticket-opened", INTEGRATION_STREAM, True),
        ("integration", "events.iterate.com/crm/ticket-opened", AGENT_STREAM, False),
        ("integration", AGENT_PAUSED, AGENT_STREAM, False),
        ("integration", LLM_REQUEST_SETTLED, INTEGRATION_STREAM, False),
        ("agent", AGENT_PAUSED, AGENT_STREAM, False),
        ("agent", "events.iterate.com/crm/ticket-opened", AGENT_STREAM, False),
        ("platform", AGENT_CONFIGURED, AGENT_STREAM, True),
        ("platform", "events.iterate.com/anything", OTHER_STREAM, True),
    ],
)
def test_event_types_other_than_items_follow_the_tier_rules(
    tier: str, event_type: str, path: str, allowed: bool
) -> None:
    command = AppendCommand(streamPath=path, type=event_type, payload={"reason": "r"})
    decision = admit(CLAIMS[tier], command)
    assert isinstance(decision, Admitted) == allowed, decision


def test_worker_only_types_are_platform_only_and_go_to_the_internal_topic() -> None:
    settled = {"requestOffset": 3, "result": {"status": "failed", "errorMessage": "x"}}
    command = AppendCommand(streamPath=AGENT_STREAM, type=LLM_REQUEST_SETTLED, payload=settled)
    decision = admit(CLAIMS["platform"], command)
    assert isinstance(decision, Admitted) and decision.internal
    for tier in ("user", "integration", "agent"):
        refused = admit(CLAIMS[tier], command)
        assert isinstance(refused, Refused)
    integration_stream = command.model_copy(update={"streamPath": INTEGRATION_STREAM})
    refused = admit(CLAIMS["integration"], integration_stream)
    assert isinstance(refused, Refused) and refused.rule == "worker-only"


def test_a_refusal_names_the_rule_that_refused() -> None:
    cases = {
        "user-actor-stamped": (CLAIMS["user"], item_command(AGENT_STREAM, "user", "user", "plain")),
        "user-no-key": (CLAIMS["user"], item_command(AGENT_STREAM, "user", "none", "key")),
        "user-no-compaction": (CLAIMS["user"], item_command(AGENT_STREAM, "developer", "none", "compaction")),
        "user-no-llm-request-offset": (CLAIMS["user"], item_command(AGENT_STREAM, "user", "none", "llmRequestOffset")),
        "user-file-size": (CLAIMS["user"], item_command(AGENT_STREAM, "user", "none", "big file")),
        "user-role": (CLAIMS["user"], item_command(AGENT_STREAM, "system", "none", "plain")),
        "user-agent-streams-only": (CLAIMS["user"], item_command(INTEGRATION_STREAM, "user", "none", "plain")),
        "integration-streams": (CLAIMS["integration"], item_command(OTHER_STREAM, "developer", "slack", "plain")),
        "integration-role": (CLAIMS["integration"], item_command(AGENT_STREAM, "system", "slack", "plain")),
        "integration-actor": (CLAIMS["integration"], item_command(AGENT_STREAM, "developer", "agent", "plain")),
        "agent-role": (CLAIMS["agent"], item_command(AGENT_STREAM, "user", "none", "plain")),
        "agent-actor-stamped": (CLAIMS["agent"], item_command(AGENT_STREAM, "developer", "github", "plain")),
        "agent-agent-streams-only": (CLAIMS["agent"], item_command(INTEGRATION_STREAM, "developer", "none", "plain")),
        "agent-only-types": (CLAIMS["integration"], item_command(INTEGRATION_STREAM, "system", "none", "plain")),
    }
    for rule, (claims, command) in cases.items():
        decision = admit(claims, command, max_user_file_bytes=MAX_FILE)
        assert isinstance(decision, Refused) and decision.rule == rule, (rule, decision)


@pytest.mark.parametrize("tier", sorted(CLAIMS))
def test_a_stream_outside_the_token_scope_is_refused_for_every_tier(tier: str) -> None:
    claims = Claims(tier, ("/agents/team-a/*",), agent_path="/agents/x")  # type: ignore[arg-type]
    inside = item_command("/agents/team-a/bot", "user", "none", "plain")
    outside = item_command("/agents/team-b/bot", "user", "none", "plain")
    decision = admit(claims, outside)
    assert isinstance(decision, Refused) and decision.rule == "scope"
    inside_decision = admit(claims, inside)
    assert not (isinstance(inside_decision, Refused) and inside_decision.rule == "scope")


@pytest.mark.parametrize(
    ("glob", "path", "inside"),
    [
        ("/agents/*", "/agents/a", True),
        ("/agents/*", "/agents/a/b", False),
        ("/agents/**", "/agents/a/b", True),
        ("/agents/**", "/agents", False),
        ("/agents/team-?", "/agents/team-1", True),
        ("/agents/team-?", "/agents/team-12", False),
        ("/agents/a.b", "/agents/aXb", False),  # a dot is a dot, not a regex wildcard
        ("/**", "/anything/at/all", True),
        ("/integrations/github/42", "/integrations/github/42", True),
        ("/integrations/github/42", "/integrations/github/420", False),
    ],
)
def test_scope_globs_star_within_a_segment_double_star_across(glob: str, path: str, inside: bool) -> None:
    assert in_scope(path, [glob]) is inside


# --- credentials: the tokens file and webhook signatures -------------------------------------------


def test_a_token_is_found_by_its_sha256_and_the_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    token, other = new_token(), new_token()
    path = tmp_path / "tokens.yaml"
    path.write_text(f"tokens:\n  - {{sha256: {hash_token(token)}, tier: user, scope: ['/agents/**'], userId: u1}}\n")
    book = TokenBook(path)
    assert book.claims(token) == Claims("user", ("/agents/**",), user_id="u1")
    assert book.claims(other) is None
    assert token not in path.read_text()  # only the hash is stored
    path.write_text(f'{{"tokens": [{{"sha256": "{hash_token(other)}", "tier": "platform", "scope": ["/**"]}}]}}')
    os.utime(path, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    book._checked = 0.0  # skip the once-a-second throttle
    assert book.claims(other) == Claims("platform", ("/**",))
    assert book.claims(token) is None


def test_a_bad_tokens_file_names_the_field_but_never_echoes_a_value() -> None:
    leaked = "ast_this-is-a-real-token-pasted-by-mistake"
    with pytest.raises(TokensFileError) as error:
        parse_tokens_file(f"tokens:\n  - {{sha256: {leaked}, tier: boss, scope: ['/**']}}\n")
    assert "tokens.0.sha256" in str(error.value) and "tokens.0.tier" in str(error.value)
    assert leaked not in str(error.value)
    with pytest.raises(TokensFileError, match="agentPath"):
        parse_tokens_file(f"tokens:\n  - {{sha256: {'a' * 64}, tier: agent, scope: ['/**']}}\n")


def test_github_signatures_are_hmac_sha256_of_the_raw_body() -> None:
    body = b'{"zen": "Keep it logically awesome."}'
    signature = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert github_signature_ok("s3cret", body, signature)
    assert not github_signature_ok("s3cret", body + b" ", signature)
    assert not github_signature_ok("other", body, signature)
    assert not github_signature_ok("s3cret", body, None)
    assert not github_signature_ok("s3cret", body, signature.replace("sha256=", "sha1="))


def test_slack_signatures_cover_the_timestamp_and_expire_after_five_minutes() -> None:
    body = b'{"type": "event_callback", "event_id": "Ev1"}'
    now = 1_700_000_000.0
    stamp = str(int(now))
    signature = "v0=" + hmac.new(b"s", b"v0:" + stamp.encode() + b":" + body, hashlib.sha256).hexdigest()
    assert slack_signature_ok("s", body, stamp, signature, now)
    assert slack_signature_ok("s", body, stamp, signature, now + 299)
    assert not slack_signature_ok("s", body, stamp, signature, now + 301)  # a replay
    assert not slack_signature_ok("s", body, str(int(now) + 1), signature, now)  # another timestamp
    assert not slack_signature_ok("s", body, "not-a-number", signature, now)


# --- §6.6 only agents are agents, §6.8 reserved keys -------------------------------------------------

AGENT_MAKING = {
    "events.iterate.com/agent/created": {},
    AGENT_CONFIGURED: {"config": {"maxAutonomousTurns": 3}},
    "events.iterate.com/agent/subscribed": {"source": "/integrations/github/42"},
}


@pytest.mark.parametrize("tier", ["user", "integration", "agent"])
@pytest.mark.parametrize("path", STREAMS)
@pytest.mark.parametrize("event_type", sorted(AGENT_MAKING))
def test_6_6_only_a_platform_token_makes_configures_or_subscribes_an_agent_anywhere(
    tier: str, path: str, event_type: str
) -> None:
    command = AppendCommand(streamPath=path, type=event_type, payload=AGENT_MAKING[event_type])
    assert isinstance(admit(CLAIMS[tier], command), Refused)
    assert isinstance(admit(CLAIMS["platform"], command), Admitted)


def test_6_6_an_integration_token_cannot_make_its_own_agent_under_integrations() -> None:
    """The probe's second path: `agent/created`, a system prompt and a subscription appended to
    `/integrations/evil` by an integration token; every one is refused by rule."""
    evil = "/integrations/evil"
    created = AppendCommand(streamPath=evil, type="events.iterate.com/agent/created", payload={})
    prompt = item_command(evil, "system", "none", "plain")
    subscribed = AppendCommand(
        streamPath=evil, type="events.iterate.com/agent/subscribed", payload={"source": "/agents/bob/a1"}
    )
    for command in (created, prompt, subscribed):
        decision = admit(CLAIMS["integration"], command)
        assert isinstance(decision, Refused) and decision.rule == "agent-only-types", decision
    # An ordinary raw event still goes in.
    raw = AppendCommand(streamPath=evil, type="com.example/ticket-opened", payload={"id": 1})
    assert isinstance(admit(CLAIMS["integration"], raw), Admitted)


def test_6_6_a_subscription_source_outside_the_token_scope_is_refused_even_for_platform() -> None:
    claims = Claims("platform", ("/agents/acme/**",))
    inside = AppendCommand(
        streamPath="/agents/acme/a1", type="events.iterate.com/agent/subscribed", payload={"source": "/agents/acme/b"}
    )
    outside = AppendCommand(
        streamPath="/agents/acme/a1", type="events.iterate.com/agent/subscribed", payload={"source": "/agents/bob/a1"}
    )
    assert isinstance(admit(claims, inside), Admitted)
    decision = admit(claims, outside)
    assert isinstance(decision, Refused) and decision.rule == "subscribe"
    assert decision.detail.startswith("/agents/bob/a1 is outside this token's scope")


RESERVED_EXAMPLES = (
    "agent/request/3",
    "agent/script-result@agent-output:5",
    "route//integrations/github/42@7",
    "capability-host/script-run-settled@agent-output:5",
    "github/delivery/abc",
    "slack/event/Ev1",
)


@pytest.mark.parametrize("tier", ["user", "integration", "agent"])
@pytest.mark.parametrize("key", RESERVED_EXAMPLES)
def test_6_8_reserved_idempotency_keys_are_refused_from_every_tier_but_platform(tier: str, key: str) -> None:
    role = {"user": "user", "integration": "developer", "agent": "developer"}[tier]
    actor = "github" if tier == "integration" else "none"
    command = item_command(AGENT_STREAM, role, actor, "plain").model_copy(update={"idempotencyKey": key})
    decision = admit(CLAIMS[tier], command)
    assert isinstance(decision, Refused) and decision.rule == "reserved-key", decision
    assert key in decision.detail
    # The same command with an ordinary key is admitted, and platform may use any key.
    ordinary = command.model_copy(update={"idempotencyKey": "my-client/retry-1"})
    assert isinstance(admit(CLAIMS[tier], ordinary), Admitted)
    assert isinstance(admit(CLAIMS["platform"], command), Admitted)


@pytest.mark.parametrize("key", ["agents/1", "Agent/request/3", "router/x", "github/other", "my-agent/request/3"])
def test_6_8_keys_that_only_resemble_reserved_ones_stay_free(key: str) -> None:
    command = item_command(AGENT_STREAM, "user", "none", "plain").model_copy(update={"idempotencyKey": key})
    assert isinstance(admit(CLAIMS["user"], command), Admitted)


# --- §6.6 / §3.3 an item widens nothing its writer could not reach --------------------------------

ALICE = "/agents/alice/a1"
BOB_EVENT = {"type": "event", "streamPath": "/agents/bob/b1", "offset": 3}
GITHUB_EVENT = {"type": "event", "streamPath": "/integrations/github/7", "offset": 5}
OWN_EVENT = {"type": "event", "streamPath": "/agents/alice/notes", "offset": 2}
BOB_BLOB, OWN_BLOB, LOST_BLOB = "b" * 64, "a" * 64, "c" * 64
READERS = {BOB_BLOB: ["/agents/bob/b1"], OWN_BLOB: ["/agents/bob/b1", "/agents/alice/uploads"], LOST_BLOB: []}
# One token of each tier scoped to Alice's agents, each with the item its tier may send there.
ALICE_TOKENS: dict[str, tuple[Claims, dict[str, Any]]] = {
    "user": (Claims("user", ("/agents/alice/**",), user_id="alice"), {"role": "user"}),
    "integration": (
        Claims("integration", ("/agents/alice/**",)),
        {"role": "developer", "actor": {"type": "integration", "name": "crm"}},
    ),
    "agent": (Claims("agent", ("/agents/alice/**",), agent_path="/agents/alice/helper"), {"role": "developer"}),
    "platform": (Claims("platform", ("/agents/alice/**",)), {"role": "developer"}),
}


def attachment(hex_digest: str, name: str = "f.txt") -> dict[str, Any]:
    return {
        "contentType": "text/plain",
        "filename": name,
        "path": f"blobs/sha256/{hex_digest}",
        "size": 3,
        "url": f"/v1/files/sha256/{hex_digest}",
    }


def alices_item(tier: str, readers: Any = READERS, **fields: Any) -> Admitted | Refused:
    claims, item = ALICE_TOKENS[tier]
    command = AppendCommand(streamPath=ALICE, type=CONTEXT_ADDED, payload={**item, "content": "look", **fields})
    return admit(claims, command, blob_readers=readers)


@pytest.mark.parametrize("tier", ALICE_TOKENS)
@pytest.mark.parametrize("ref", [BOB_EVENT, GITHUB_EVENT], ids=["another-agent", "an-integration"])
def test_6_6_finding_1_an_event_ref_outside_the_writers_scope_is_refused_for_every_tier(
    tier: str, ref: dict[str, Any]
) -> None:
    """§6.6: an agent may read the events its own items reference, so a ref may name only an event
    its writer could read: one outside the token's scope is refused (rule `refs`), naming it."""
    decision = alices_item(tier, refs=[ref])
    assert isinstance(decision, Refused) and decision.rule == "refs", decision
    assert f"{ref['streamPath']}@{ref['offset']}" in decision.detail
    assert isinstance(alices_item(tier, refs=[OWN_EVENT]), Admitted)


@pytest.mark.parametrize("tier", ALICE_TOKENS)
def test_6_6_every_event_ref_of_an_item_is_checked_and_other_kinds_of_ref_grant_nothing(tier: str) -> None:
    others = [
        {"type": "user", "userId": "bob"},
        {"type": "file", "path": "/agents/bob/b1/secret.txt"},
        {"type": "git-commit", "repoPath": "/agents/bob/repo", "commitOid": "abc"},
    ]
    assert isinstance(alices_item(tier, refs=others), Admitted)
    decision = alices_item(tier, refs=[*others, OWN_EVENT, BOB_EVENT])
    assert isinstance(decision, Refused) and decision.rule == "refs"
    assert "/agents/bob/b1@3" in decision.detail


def test_6_6_a_token_whose_scope_covers_the_source_may_reference_it() -> None:
    """§6.6: a writer that could read the event itself may point its agent at it."""
    wide = Claims("user", ("/agents/alice/**", "/agents/bob/*"), user_id="alice")
    command = AppendCommand(
        streamPath=ALICE, type=CONTEXT_ADDED, payload={"role": "user", "content": "see", "refs": [BOB_EVENT]}
    )
    assert isinstance(admit(wide, command), Admitted)
    one_segment = Claims("user", ("/agents/alice/**", "/agents/*"), user_id="alice")  # `*` is one segment
    assert isinstance(admit(one_segment, command), Refused)


def test_6_6_refs_in_events_other_than_items_grant_nothing_and_are_not_checked() -> None:
    """The host reads the refs of context items only; a raw event may carry any JSON."""
    claims = Claims("integration", ("/integrations/crm/**",))
    command = AppendCommand(streamPath="/integrations/crm/1", type="com.example/ticket", payload={"refs": [BOB_EVENT]})
    assert isinstance(admit(claims, command), Admitted)


@pytest.mark.parametrize("tier", ALICE_TOKENS)
def test_3_3_finding_1_a_file_the_writer_could_not_get_is_refused_for_every_tier(tier: str) -> None:
    """§3.3: an attachment's bytes go to the model, so an item may attach only a blob its token
    could GET: uploaded to a stream inside its scope (rule `files`). Uploaded elsewhere only,
    never uploaded, or not looked up by the gateway: refused."""
    for readers in (READERS, {}, None):
        decision = alices_item(tier, readers, files=[attachment(BOB_BLOB, "bob.txt")])
        assert isinstance(decision, Refused) and decision.rule == "files", (readers, decision)
        assert "'bob.txt'" in decision.detail and BOB_BLOB in decision.detail
    lost = alices_item(tier, files=[attachment(LOST_BLOB)])
    assert isinstance(lost, Refused) and lost.rule == "files"
    assert isinstance(alices_item(tier, files=[attachment(OWN_BLOB)]), Admitted)  # one upload stream in scope
    both = alices_item(tier, files=[attachment(OWN_BLOB), attachment(BOB_BLOB)])
    assert isinstance(both, Refused) and both.rule == "files"


@pytest.mark.parametrize("tier", ALICE_TOKENS)
def test_3_3_an_attachment_that_names_no_blob_is_only_a_hint_and_not_checked(tier: str) -> None:
    """Only `blobs/sha256/<hex>` paths are ever fetched (processors/files.blob_hex); any other path
    renders as a hint line, so it reaches nothing."""
    odd = {**attachment(BOB_BLOB), "path": "/f/a"}
    upper = {**attachment(BOB_BLOB), "path": "blobs/sha256/" + "B" * 64}
    assert isinstance(alices_item(tier, {}, files=[odd, upper]), Admitted)


def test_3_3_attached_blobs_names_each_blob_path_once_in_order() -> None:
    payload = {"files": [attachment(BOB_BLOB), {"path": "/f/a"}, attachment(OWN_BLOB), attachment(BOB_BLOB), 7]}
    assert attached_blobs(payload) == [BOB_BLOB, OWN_BLOB]
    assert attached_blobs({"files": "nope"}) == [] == attached_blobs(None)
