"""`agentstream fold` (the real installed command) on journal dumps: docs/behaviour.md §1, §2, §3, §4 state.

Each test name starts with the contract rule it checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.journal_builder import DONT_TRIGGER, Journal

AGENTSTREAM = Path(sys.executable).parent / "agentstream"
PROMPT = "agent/system-prompt"


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(AGENTSTREAM), "fold", *args], input=stdin, capture_output=True, timeout=60)


def fold_file(tmp_path: Path, j: Journal, *args: str) -> dict[str, Any]:
    result = run(str(j.write(tmp_path / "journal.jsonl")), *args)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def test_2_3_cli_output_has_projection_turn_and_messages(tmp_path: Path) -> None:
    j = Journal()
    j.created()
    s = j.system("be kind", key=PROMPT)
    u = j.user("hi", actor={"type": "user", "origin": "web"})
    out = fold_file(tmp_path, j)
    assert set(out) == {"projection", "turn", "messages"}
    assert out["projection"] == {
        "system": [{"offset": s, "role": "system", "content": "be kind", "key": PROMPT}],
        "history": [{"offset": u, "role": "user", "content": "hi", "actor": {"type": "user", "origin": "web"}}],
        "publishedThrough": 0,
    }
    assert set(out["turn"]) == {
        "status",
        "pendingTrigger",
        "openRequest",
        "autonomousTurnCount",
        "consecutiveLlmFailures",
        "tokenUsage",
    }
    assert out["turn"]["pendingTrigger"] == {"offset": u, "atMs": j.at_ms(u), "source": "external"}
    assert out["turn"]["openRequest"] is None
    assert [m["role"] for m in out["messages"]] == ["system", "system", "user"]
    assert out["messages"][2] == {"role": "user", "content": f"@{u} actor=user:web\nhi"}


def test_2_cli_items_use_wire_names_and_omit_absent_fields(tmp_path: Path) -> None:
    attachment = {"contentType": "text/plain", "filename": "a.txt", "path": "/f/a.txt", "size": 1, "url": "u"}
    j = Journal()
    p = j.developer("v1", key="k", refs=[{"type": "file", "path": "/x"}])
    r = j.request()
    n = j.developer("v2", key="k", files=[attachment], actor={"type": "slack", "botName": "b"})
    a = j.assistant("ans", llmRequestOffset=r)
    history = fold_file(tmp_path, j)["projection"]["history"]
    assert history == [
        {"offset": p, "role": "developer", "content": "v1", "key": "k", "refs": [{"type": "file", "path": "/x"}]},
        {
            "offset": n,
            "role": "developer",
            "content": "v2",
            "key": "k",
            "updatesOffset": p,
            "actor": {"type": "slack", "botName": "b"},
            "files": [attachment],
        },
        {"offset": a, "role": "assistant", "content": "ans", "llmRequestOffset": r},
    ]


def test_2_cli_items_carry_their_llm_request_policy(tmp_path: Path) -> None:
    """§2: an Item is the context payload plus offset/updatesOffset, so a present
    `llmRequestPolicy` (required on a compaction summary) belongs in the projection output."""
    j = Journal()
    j.user("quiet", policy=DONT_TRIGGER)
    s = j.compaction(through=1)
    history = fold_file(tmp_path, j)["projection"]["history"]
    assert history[0] == {
        "offset": s,
        "role": "developer",
        "content": "summary",
        "compaction": {"replacesHistoryThrough": 1},
        "llmRequestPolicy": {"behaviour": DONT_TRIGGER},
    }


def test_3_cli_through_folds_only_events_up_to_n(tmp_path: Path) -> None:
    j = Journal()
    j.user("a")
    r = j.request()
    j.user("b")
    j.request()
    out = fold_file(tmp_path, j, "--through", str(r))
    assert [i["content"] for i in out["projection"]["history"]] == ["a"]
    assert out["projection"]["publishedThrough"] == r
    assert out["turn"]["openRequest"]["offset"] == r
    # The last folded event is the request: its timestamp closes the messages.
    assert out["messages"][-1] == {"role": "developer", "content": f"Current date and time (UTC): {j.created_at(r)}"}


def test_3_cli_timestamp_message_only_when_the_last_folded_event_is_a_request(tmp_path: Path) -> None:
    j = Journal()
    j.user("a")
    r = j.request()
    j.user("b")
    out = fold_file(tmp_path, j)
    assert not any(m["content"].startswith("Current date and time") for m in out["messages"])
    out = fold_file(tmp_path, j, "--through", str(r))
    assert out["messages"][-1]["content"].startswith("Current date and time (UTC): ")


def test_3_2_cli_transport_openai_compatible_maps_developer_to_system(tmp_path: Path) -> None:
    j = Journal()
    j.developer("note")
    j.request()
    native = fold_file(tmp_path, j)["messages"]
    compatible = fold_file(tmp_path, j, "--transport", "openai-compatible")["messages"]
    assert [m["role"] for m in native] == ["system", "developer", "developer"]
    assert [m["role"] for m in compatible] == ["system", "system", "system"]
    assert [m["content"] for m in native] == [m["content"] for m in compatible]


def test_3_2_cli_rejects_an_unknown_transport(tmp_path: Path) -> None:
    j = Journal()
    j.user("a")
    result = run(str(j.write(tmp_path / "j.jsonl")), "--transport", "anthropic")
    assert result.returncode == 2


def test_4_2_cli_status_idle(tmp_path: Path) -> None:
    j = Journal()
    j.created()
    j.system("p", key=PROMPT)
    assert fold_file(tmp_path, j)["turn"]["status"] == "idle"


def test_4_2_cli_status_queued_when_only_waiting_for_the_system_prompt(tmp_path: Path) -> None:
    """§4.2 distributed birth: a trigger waiting only for the system prompt is queued, never busy."""
    j = Journal()
    j.created()
    u = j.user("early")
    turn = fold_file(tmp_path, j)["turn"]
    assert turn["status"] == "queued" and turn["pendingTrigger"]["offset"] == u


def test_4_2_cli_status_queued_with_prompt_and_trigger(tmp_path: Path) -> None:
    j = Journal()
    j.created()
    j.system("p", key=PROMPT)
    j.user("hi")
    assert fold_file(tmp_path, j)["turn"]["status"] == "queued"


def test_4_2_cli_status_busy_with_open_request(tmp_path: Path) -> None:
    j = Journal()
    j.system("p", key=PROMPT)
    u = j.user("hi")
    r = j.request(model="gpt-x", expires_at=42)
    turn = fold_file(tmp_path, j)["turn"]
    assert turn["status"] == "busy"
    assert turn["openRequest"] == {"offset": r, "model": "gpt-x", "expiresAt": 42, "triggerOffset": u}
    assert turn["pendingTrigger"] is None


def test_4_3_cli_status_paused(tmp_path: Path) -> None:
    j = Journal()
    j.system("p", key=PROMPT)
    d = j.developer("loop")
    j.paused(trigger_offset=d, reason="autonomous turn limit reached (100 consecutive turns without external input)")
    turn = fold_file(tmp_path, j)["turn"]
    assert turn["status"] == "paused" and turn["pendingTrigger"] is None


def test_4_3_cli_turn_counts_and_token_usage(tmp_path: Path) -> None:
    j = Journal()
    j.developer("loop")
    r = j.request()
    j.usage(r, 7, 3, cachedInputTokens=2, reasoningOutputTokens=1)
    j.settle(r, "failed")
    turn = fold_file(tmp_path, j)["turn"]
    assert turn["autonomousTurnCount"] == 1 and turn["consecutiveLlmFailures"] == 1
    assert turn["tokenUsage"] == {
        "inputTokens": 7,
        "outputTokens": 3,
        "cachedInputTokens": 2,
        "reasoningOutputTokens": 1,
    }
    assert turn["pendingTrigger"]["source"] == "agent-loop"


def test_1_cli_non_envelope_line_exits_2_naming_the_line(tmp_path: Path) -> None:
    j = Journal()
    j.user("a")
    j.user("b")
    lines = j.lines()
    path = tmp_path / "bad.jsonl"
    path.write_bytes(lines[0] + b"\n" + lines[1] + b"\n" + b'{"not": "an event"}\n')
    result = run(str(path))
    assert result.returncode == 2
    assert result.stdout == b""
    stderr = result.stderr.decode()
    assert "line 3" in stderr and "not a journal event envelope" in stderr


def test_1_cli_invalid_json_line_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"{oops\n")
    result = run(str(path))
    assert result.returncode == 2 and b"line 1" in result.stderr


def test_1_2_cli_invalid_payload_warns_on_stderr_and_is_skipped(tmp_path: Path) -> None:
    j = Journal()
    j.user("kept")
    bad = j.user("dropped", order=5)
    j.user("also kept")
    result = run(str(j.write(tmp_path / "j.jsonl")))
    assert result.returncode == 0
    stderr = result.stderr.decode()
    assert f"line {bad} (@{bad}) skipped" in stderr
    assert "payload.order" in stderr and "unknown field" in stderr
    out = json.loads(result.stdout)
    assert [i["content"] for i in out["projection"]["history"]] == ["kept", "also kept"]


def test_2_cli_out_of_order_offsets_exit_2(tmp_path: Path) -> None:
    j = Journal()
    j.user("a")
    j.user("b")
    lines = j.lines()
    path = tmp_path / "swapped.jsonl"
    path.write_bytes(lines[1] + b"\n" + lines[0] + b"\n")
    result = run(str(path))
    assert result.returncode == 2 and b"line 2" in result.stderr


def test_cli_missing_file_exits_2(tmp_path: Path) -> None:
    result = run(str(tmp_path / "missing.jsonl"))
    assert result.returncode == 2 and result.stderr


def test_1_cli_reads_stdin_and_skips_blank_lines(tmp_path: Path) -> None:
    j = Journal()
    j.user("a")
    j.user("b")
    result = run(stdin=b"\n" + j.lines()[0] + b"\n\n" + j.lines()[1] + b"\n")
    assert result.returncode == 0, result.stderr
    assert [i["content"] for i in json.loads(result.stdout)["projection"]["history"]] == ["a", "b"]


def test_3_cli_reproduces_the_contract_header_example(tmp_path: Path) -> None:
    j = Journal()
    j.pad_to(17)
    j.developer("task", key="github/review-task")
    j.request()
    j.pad_to(81)
    j.developer(
        "review please",
        key="github/review-task",
        actor={"type": "github", "login": "octocat"},
        refs=[{"type": "event", "streamPath": "/integrations/github/install-789", "offset": 240}],
    )
    out = fold_file(tmp_path, j)
    assert out["messages"][-1] == {
        "role": "user",
        "content": '@81 key="github/review-task" updates=@17 actor=github:"octocat" '
        'refs=["/integrations/github/install-789@240"]\nreview please',
    }


@pytest.mark.parametrize("transport", ["openai", "openai-compatible"])
def test_3_cli_replaying_a_request_gives_byte_identical_output(tmp_path: Path, transport: str) -> None:
    """§3: a request folds only events ≤ R, so later events never change its messages."""
    j = Journal()
    j.system("p", key=PROMPT)
    j.user("a")
    r = j.request()
    short = tmp_path / "short.jsonl"
    short.write_bytes(b"".join(line + b"\n" for line in j.lines()))
    j.assistant("x", llmRequestOffset=r)
    j.settle(r, text="x")
    j.user("more", key="k")
    j.compaction(through=r)
    full = j.write(tmp_path / "full.jsonl")
    first = run(str(short), "--transport", transport)
    second = run(str(full), "--through", str(r), "--transport", transport)
    assert first.returncode == second.returncode == 0
    assert first.stdout == second.stdout
