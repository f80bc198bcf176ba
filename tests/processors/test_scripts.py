"""Agents run code: the pure rules (extraction, who may run, transcription, follow-ups, turn state)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.capabilities.grants import parse_ref, shown_event
from pipeline.cli import main
from processors import row_codec
from processors.idempotency_keys import script_call_key
from processors.scripts import (
    crashed,
    execution_id,
    expired,
    failed,
    fenced_blocks,
    python_blocks,
    script_follow_ups,
    succeeded,
    transcribe,
    truncation_notice,
)
from processors.state import AgentState, SourceOffsets
from schemas.capabilities import (
    SCRIPT_RUN_REQUESTED,
    SCRIPT_RUN_SETTLED,
    SCRIPT_RUN_STARTED,
    FailedSettlement,
    ScriptRunSettledPayload,
    SucceededSettlement,
)
from schemas.events import CONTEXT_ADDED, worker_only_reason
from tests.support.journal_builder import Journal

# --- extraction --------------------------------------------------------------------------------------


def test_extraction_one_python_block_is_the_script() -> None:
    text = "Let me look.\n```python\nevent = read_event('/agents/a@3')\nevent['payload']\n```\nDone."
    assert python_blocks(text) == ["event = read_event('/agents/a@3')\nevent['payload']"]


def test_extraction_py_tag_counts_and_other_tags_are_text() -> None:
    text = "```py\n1 + 1\n```\n```json\n{}\n```\n```bash\nls\n```\n```\nplain\n```"
    assert python_blocks(text) == ["1 + 1"]
    assert [block.tag for block in fenced_blocks(text)] == ["py", "json", "bash", ""]


def test_extraction_a_fence_in_the_middle_of_a_line_does_not_count() -> None:
    assert python_blocks("see ```python\nprint(1)\n``` here") == []
    assert python_blocks("inline ```python x``` is text") == []


def test_extraction_closes_with_a_fence_of_at_least_as_many_backticks() -> None:
    text = "````python\nprint('```')\n```\nstill code\n`````\nafter"
    assert python_blocks(text) == ["print('```')\n```\nstill code"]


def test_extraction_an_unclosed_block_is_text_and_never_runs() -> None:
    assert python_blocks("```python\nimport time\nwhile True:\n") == []


def test_extraction_a_closing_line_holds_only_backticks() -> None:
    # "```python" inside an open block is not its end: a closing fence has no info string.
    text = "```python\nx = 1\n```python\ny = 2\n```"
    assert python_blocks(text) == ["x = 1\n```python\ny = 2"]


def test_extraction_windows_line_endings() -> None:
    assert python_blocks("```python\r\nx = 1\r\nx\r\n```\r\n") == ["x = 1\nx"]


@pytest.mark.parametrize("opening", ["```PYTHON", "```Python", "```PY", "```Py title='step 1'", "````python"])
def test_6_2_the_tag_is_the_first_word_of_the_info_string_in_any_case(opening: str) -> None:
    """§6.2: "Only blocks tagged `python` or `py` (the first word of the info string, any case)"."""
    width = len(opening) - len(opening.lstrip("`"))
    assert python_blocks(f"Here:\n{opening}\nprint(1)\n{'`' * width}\nDone.") == ["print(1)"]


@pytest.mark.parametrize("opening", ["```python3", "```pyth", "```", "```text python", "``python"])
def test_6_2_other_first_words_and_two_backticks_are_not_scripts(opening: str) -> None:
    """§6.2: "A fenced block opens with three or more backticks"; other tags are text."""
    assert python_blocks(f"{opening}\nprint(1)\n```") == []


def test_6_2_two_backticks_neither_open_nor_close_a_fence() -> None:
    assert fenced_blocks("``\nnot a block\n``") == []
    assert python_blocks("```python\nx = '``'\n``\ny = 1\n```") == ["x = '``'\n``\ny = 1"]


# --- who may run code ----------------------------------------------------------------------------------


def born(j: Journal) -> None:
    j.created()
    j.system("policy", key="agent/system-prompt")


def follow_ups(j: Journal, offset: int) -> list[Any]:
    state = j.fold(through=offset)
    (event,) = [e for e in j.decoded(offset) if e.offset == offset]
    return script_follow_ups(state, event)


def answered(text: str, config: dict[str, Any] | None = None) -> tuple[Journal, int]:
    j = Journal()
    born(j)
    if config:
        j.configured(config)
    j.user("go")
    r = j.request()
    return j, j.assistant(text, llmRequestOffset=r)


ONE = "```python\n1 + 1\n```"


def test_who_may_run_the_live_requests_answer_requests_a_run() -> None:
    j, answer = answered(ONE, {"llmRequestExpiryMs": 60_000})
    (append,) = follow_ups(j, answer)
    assert append.type == SCRIPT_RUN_REQUESTED
    assert append.idempotencyKey == f"agent/script-run-requested@{answer}"
    assert append.payload == {
        "code": "1 + 1",
        "executionId": f"agent-output:{answer}",
        "expiresAt": j.at_ms(answer) + 60_000,
    }


def test_who_may_run_an_interrupted_partial_never_runs() -> None:
    j = Journal()
    born(j)
    j.user("go")
    r = j.request()
    partial = j.assistant("[Response interrupted]\n" + ONE)  # no llmRequestOffset
    assert follow_ups(j, partial) == []
    j.settle(r, "cancelled", reason="interrupted-by-user-input")


def test_who_may_run_an_answer_to_a_closed_request_never_runs() -> None:
    j = Journal()
    born(j)
    j.user("go")
    r = j.request()
    j.settle(r)
    late = j.assistant(ONE, llmRequestOffset=r)
    assert follow_ups(j, late) == []


def test_who_may_run_an_answer_to_an_older_request_never_runs() -> None:
    j = Journal()
    born(j)
    j.user("go")
    old = j.request()
    j.settle(old, "failed")
    j.request()
    stale = j.assistant(ONE, llmRequestOffset=old)
    assert follow_ups(j, stale) == []


def test_who_may_run_other_roles_never_run() -> None:
    j = Journal()
    born(j)
    assert follow_ups(j, j.user(ONE)) == []
    assert follow_ups(j, j.developer(ONE)) == []
    assert follow_ups(j, j.assistant(ONE)) == []


def test_who_may_run_a_raw_answer_naming_a_request_is_refused_on_the_public_topic() -> None:
    payload = {"role": "assistant", "content": ONE, "llmRequestOffset": 4}
    assert worker_only_reason(CONTEXT_ADDED, payload) is not None
    for kind in (SCRIPT_RUN_REQUESTED, SCRIPT_RUN_STARTED, SCRIPT_RUN_SETTLED):
        assert worker_only_reason(kind, {}) is not None


def test_extraction_no_python_block_nothing_runs() -> None:
    j, answer = answered('Just text.\n```json\n{"a": 1}\n```')
    assert follow_ups(j, answer) == []


def test_extraction_two_python_blocks_nothing_runs_and_the_agent_is_told() -> None:
    j, answer = answered(ONE + "\nand\n```py\n2\n```")
    (append,) = follow_ups(j, answer)
    assert append.type == CONTEXT_ADDED
    assert append.idempotencyKey == f"agent/script-feedback@{answer}"
    assert append.payload == {
        "role": "developer",
        "content": "Your response contained 2 python code blocks, so NOTHING was executed. "
        "Send one step at a time as a single ```python block.",
        "llmRequestPolicy": {"behaviour": "after-current-request"},
    }


# --- transcription -----------------------------------------------------------------------------------


def settle(settlement: dict[str, Any]) -> SucceededSettlement | FailedSettlement:
    return ScriptRunSettledPayload.model_validate({"executionId": "x", "settlement": settlement}).settlement


def test_transcription_printed_output_then_a_string_result() -> None:
    text = transcribe(settle(succeeded("done", "hello\n")), 30_000)
    assert text == "Your script printed:\n```\nhello\n```\n\nYour script returned:\n```\ndone\n```"


def test_transcription_other_results_as_indented_json() -> None:
    text = transcribe(settle(succeeded({"a": [1, 2], "b": None}, "")), 30_000)
    assert text == 'Your script returned:\n```json\n{\n  "a": [\n    1,\n    2\n  ],\n  "b": null\n}\n```'


def test_transcription_nothing_printed_nothing_returned_ends_the_turn() -> None:
    assert transcribe(settle(succeeded(None, "")), 30_000) is None


def test_transcription_failures_say_whether_the_script_ran() -> None:
    ran = transcribe(settle(failed("runtime", "run", "ValueError: boom", True, "step 1\n")), 30_000)
    assert ran == (
        "Your script printed:\n```\nstep 1\n```\n\n"
        "Your script failed during run (runtime):\n```\nValueError: boom\n```\n"
        "The script may have partially executed; inspect state before retrying."
    )
    parse = transcribe(settle(failed("syntax", "parse", "SyntaxError: invalid syntax", False)), 30_000)
    assert parse == (
        "Your script failed during parse (syntax):\n```\nSyntaxError: invalid syntax\n```\nThe script did not execute."
    )


def test_transcription_crashed_and_expired() -> None:
    assert "(crashed)" in (transcribe(settle(crashed()), 30_000) or "")
    assert settle(crashed()).executionMayHaveOccurred is True
    late = settle(expired(1_800_000_000_000))
    assert late.failureKind == "expired" and late.executionMayHaveOccurred is False
    assert "2027-01-15T08:00:00.000Z" in late.error


def test_transcription_over_the_limit_keeps_the_start_and_says_how_much_there_was() -> None:
    full = transcribe(settle(succeeded("x" * 500, "")), 10_000)
    assert full is not None
    cut = transcribe(settle(succeeded("x" * 500, "")), 100)
    assert cut == full[:100] + f"\n… truncated ({len(full)} chars total — return less: slice lists, pick fields)"


def test_transcription_a_fence_inside_the_output_gets_a_longer_fence() -> None:
    text = transcribe(settle(succeeded("```\nnot the end\n```", "")), 30_000)
    assert text == "Your script returned:\n````\n```\nnot the end\n```\n````"


def test_6_4_content_of_exactly_script_result_history_limit_characters_is_kept_whole() -> None:
    """§6.4: "Content longer than `scriptResultHistoryLimit` characters keeps that many characters
    plus" the notice; content of exactly that many is not cut."""
    full = transcribe(settle(succeeded("x" * 500, "")), 10_000)
    assert full is not None
    assert transcribe(settle(succeeded("x" * 500, "")), len(full)) == full
    assert transcribe(settle(succeeded("x" * 500, "")), len(full) - 1) == full[:-1] + truncation_notice(len(full))


def test_6_4_a_line_starting_with_three_backticks_anywhere_in_the_text_lengthens_the_fence() -> None:
    """§6.4: "A fence is made longer than three backticks when the fenced text contains a line
    starting with three", the first line or any later one."""
    later = transcribe(settle(succeeded("see:\n```\ncode\n```", "")), 30_000)
    assert later == "Your script returned:\n````\nsee:\n```\ncode\n```\n````"
    printed = transcribe(settle(succeeded(None, "a\n````b\n")), 30_000)
    assert printed == "Your script printed:\n`````\na\n````b\n`````"
    mid_line = transcribe(settle(succeeded("a ``` b", "")), 30_000)
    assert mid_line == "Your script returned:\n```\na ``` b\n```"


@pytest.mark.parametrize(
    ("value", "kept"), [(-(2**63), True), (2**64 - 1, True), (-(2**63) - 1, False), (2**64, False)]
)
def test_6_3_a_script_result_keeps_integers_from_minus_2_63_to_2_64_minus_1_exactly(value: int, kept: bool) -> None:
    """§5.1.2 for settlements: a result integer the journal can keep stays a number, others become text."""
    result = succeeded({"n": value}, "")["result"]
    assert result == ({"n": value} if kept else {"n": str(value)})


def test_results_back_into_context_a_settlement_adds_a_script_item_that_triggers() -> None:
    j, answer = answered(ONE, {"scriptResultHistoryLimit": 1000})
    execution = execution_id(answer)
    j.append(SCRIPT_RUN_REQUESTED, {"code": "1 + 1", "executionId": execution, "expiresAt": 1})
    j.append(SCRIPT_RUN_STARTED, {"executionId": execution})
    settled = j.append(SCRIPT_RUN_SETTLED, {"executionId": execution, "settlement": succeeded(2, "")})
    (append,) = follow_ups(j, settled)
    assert append.idempotencyKey == f"agent/script-result@{execution}"
    assert append.payload == {
        "role": "developer",
        "content": "Your script returned:\n```json\n2\n```",
        "actor": {"type": "script", "executionId": execution},
        "llmRequestPolicy": {"behaviour": "after-current-request"},
    }
    j.item(**append.payload)
    state = j.fold()
    assert state.pending is not None and state.pending.source == "agent-loop"


def test_results_back_into_context_only_for_agent_output_and_only_when_there_is_something() -> None:
    j, _ = answered("hi")
    other = j.append(SCRIPT_RUN_SETTLED, {"executionId": "cron:7", "settlement": succeeded(1, "")})
    assert follow_ups(j, other) == []
    empty = j.append(SCRIPT_RUN_SETTLED, {"executionId": "agent-output:9", "settlement": succeeded(None, "")})
    assert follow_ups(j, empty) == []


# --- turn state --------------------------------------------------------------------------------------


def test_turn_state_shows_a_running_script_until_it_settles_and_rows_carry_it() -> None:
    j, answer = answered(ONE)
    r = j.decoded()[-1].payload.llmRequestOffset
    j.settle(r)
    execution = execution_id(answer)
    j.append(SCRIPT_RUN_REQUESTED, {"code": "1", "executionId": execution, "expiresAt": 5})
    state = j.fold()
    assert state.status == "running-script"
    assert not state.scripts[execution].started
    j.append(SCRIPT_RUN_STARTED, {"executionId": execution})
    state = j.fold()
    assert state.status == "running-script" and state.scripts[execution].started
    restored, _ = row_codec.decode_meta(row_codec.encode_meta(state, SourceOffsets()))
    assert restored.scripts == state.scripts
    j.append(SCRIPT_RUN_SETTLED, {"executionId": execution, "settlement": succeeded(None, "")})
    assert j.fold().status == "idle"


def test_turn_state_rows_written_before_script_runs_still_read() -> None:
    meta = orjson.loads(row_codec.encode_meta(AgentState(stream_path="/a"), SourceOffsets())[2:])  # unmarked: format 1
    del meta["scripts"]
    state, _ = row_codec.decode_meta(orjson.dumps(meta))
    assert state.scripts == {}


# --- properties --------------------------------------------------------------------------------------

_pieces = st.sampled_from(
    ["```", "````", "```python", "```py", "````python", "```json", " ```python", "x ```python", "\n", "\r\n", "a", " "]
)
texts = st.lists(st.one_of(_pieces, st.text(max_size=5)), max_size=30).map("".join)


@given(texts)
@settings(max_examples=400)
def test_property_any_assistant_text_yields_at_most_one_script(text: str) -> None:
    j, answer = answered(text)
    appends = follow_ups(j, answer)
    assert len(appends) <= 1
    runs = [a for a in appends if a.type == SCRIPT_RUN_REQUESTED]
    assert len(runs) == (1 if len(python_blocks(text)) == 1 else 0)


@given(st.text(max_size=20).filter(lambda s: "\n" not in s and "\r" not in s and s.strip()), texts)
@settings(max_examples=300)
def test_property_a_mid_line_fence_never_counts(prefix: str, body: str) -> None:
    mid = f"{prefix}```python\n{body.replace('`', '')}\n```"
    blocks = fenced_blocks(mid)
    assert all(block.tag != "python" or not prefix for block in blocks[:1])
    assert python_blocks(mid) == []


@given(texts, st.integers(min_value=1, max_value=3))
@settings(max_examples=200)
def test_property_only_the_live_requests_output_qualifies(text: str, which: int) -> None:
    j = Journal()
    born(j)
    j.user("go")
    first = j.request()
    content = text.replace("`", "") + "\n```python\n1\n```"  # exactly one python block
    if which == 1:  # the live answer
        offset = j.assistant(content, llmRequestOffset=first)
        assert [a.type for a in follow_ups(j, offset)] == [SCRIPT_RUN_REQUESTED]
    elif which == 2:  # the request is closed
        j.settle(first)
        assert follow_ups(j, j.assistant(content, llmRequestOffset=first)) == []
    else:  # no request named
        assert follow_ups(j, j.assistant(content)) == []


@given(
    st.one_of(st.none(), st.text(max_size=300), st.lists(st.integers(), max_size=50)),
    st.text(max_size=300),
    st.integers(min_value=0, max_value=400),
)
@settings(max_examples=300)
def test_property_transcription_never_exceeds_the_limit_plus_its_notice(result: Any, stdout: str, limit: int) -> None:
    text = transcribe(settle(succeeded(result, stdout)), limit)
    if text is None:
        return
    full = transcribe(settle(succeeded(result, stdout)), 10**9)
    assert full is not None
    assert len(text) <= limit + len(truncation_notice(len(full)))
    assert text == full or text.startswith(full[:limit])


# --- granted functions (their pure parts) ---------------------------------------------------------


def test_granted_functions_read_event_takes_a_ref_string_or_object() -> None:
    assert parse_ref("/agents/a@12") == ("/agents/a", 12)
    assert parse_ref("/agents/user@example.com@3") == ("/agents/user@example.com", 3)  # '@' in a path
    assert parse_ref({"type": "event", "streamPath": "/agents/a", "offset": 4}) == ("/agents/a", 4)
    for bad in ("/agents/a", "/agents/a@x", "agents@1", "/agents/a@0", {"type": "file", "path": "x"}, 7):
        with pytest.raises((ValueError, TypeError)):
            parse_ref(bad)


def test_granted_functions_read_event_cuts_payloads_over_256_kib_with_a_notice() -> None:
    envelope = {"streamPath": "/a", "offset": 1, "type": "t", "payload": {"x": "y"}, "createdAt": "c", "extra": 1}
    assert shown_event(envelope) == {
        "streamPath": "/a",
        "offset": 1,
        "type": "t",
        "payload": {"x": "y"},
        "createdAt": "c",
    }
    big = shown_event({**envelope, "payload": {"blob": "z" * 300_000}})["payload"]
    assert isinstance(big, str) and big.startswith('{"blob":"zzz')
    assert big.endswith("bytes of JSON; the first 262144 are shown")


def test_granted_functions_appends_are_keyed_by_execution_and_call_counter() -> None:
    assert script_call_key("/agents/a", "agent-output:7", 1, "/agents/a") == "capability-host/agent-output:7/call-1"
    assert (
        script_call_key("/agents/a", "agent-output:7", 2, "/agents/b")
        == "capability-host/from/agents/a/agent-output:7/call-2"
    )
    long_path = "/" + "/".join(["s" * 100] * 5)
    key = script_call_key(long_path, "agent-output:7", 3, "/agents/b")
    assert len(key) <= 512 and key.endswith("/agent-output:7/call-3")


def test_turn_state_the_fold_output_names_the_running_script(tmp_path: Any, capsys: Any) -> None:
    j, answer = answered(ONE)
    execution = execution_id(answer)
    j.append(SCRIPT_RUN_REQUESTED, {"code": "1", "executionId": execution, "expiresAt": 5})
    assert main(["fold", str(j.write(tmp_path / "journal.jsonl"))]) == 0
    turn = orjson.loads(capsys.readouterr().out)["turn"]
    assert turn["status"] == "busy"  # the request is still open: its settlement comes next
    assert turn["runningScripts"] == [{"executionId": execution, "offset": j.last, "expiresAt": 5, "started": False}]


def test_settlements_always_fit_one_journal_event() -> None:
    huge = "ü" * 1_000_000  # 2 MB of UTF-8
    for settlement in (succeeded(huge, huge), succeeded([huge], ""), failed("runtime", "run", huge, True, huge)):
        payload = {"executionId": "agent-output:1", "settlement": settlement}
        assert len(orjson.dumps(payload)) < 900 * 1024
        ScriptRunSettledPayload.model_validate(payload)


# --- a script's calls end with its run (behaviour §5.2: a host that woke after its run was settled) ---


def _own_call(state: Any, key: str, content: str = "noted") -> Any:
    from processors.journal import journal_command
    from processors.state import SourceOffsets
    from schemas.events import AppendCommand

    payload = {
        "role": "developer",
        "content": content,
        "key": "k",
        "llmRequestPolicy": {"behaviour": "dont-trigger-request"},
    }
    command = AppendCommand.model_validate(
        {
            "streamPath": "/agents/a",
            "type": "events.iterate.com/agents/context-added",
            "payload": payload,
            "idempotencyKey": key,
        }
    )
    return journal_command(state, command, now_ms=1_796_000_000_000, sources=SourceOffsets(), read={}.get)


def test_5_2_a_scripts_call_into_its_own_stream_is_journaled_only_while_its_run_is_unsettled() -> None:
    from processors.journal import Journaled, Rejected
    from processors.state import AgentState, ScriptRun

    running = AgentState(stream_path="/agents/a")
    running.scripts["agent-output:7"] = ScriptRun("agent-output:7", 3, 2**40)
    key = script_call_key("/agents/a", "agent-output:7", 1, "/agents/a")
    assert isinstance(_own_call(running, key), Journaled)
    settled = AgentState(stream_path="/agents/a")  # settled (or never requested): no unsettled run
    refused = _own_call(settled, key)
    assert isinstance(refused, Rejected) and "'agent-output:7' is not running" in refused.reason
    other = AgentState(stream_path="/agents/a")
    other.scripts["agent-output:8"] = ScriptRun("agent-output:8", 5, 2**40)
    assert isinstance(_own_call(other, key), Rejected)  # another run's being open does not admit it


@pytest.mark.parametrize(
    ("key", "execution"),
    [
        ("capability-host/agent-output:7/call-1", "agent-output:7"),
        ("capability-host/agent-output:7/call-12", "agent-output:7"),
        ("capability-host/x/call-1/call-2", "x/call-1"),
        ("capability-host/from/agents/a/agent-output:7/call-2", None),  # into another stream
        ("capability-host/script-run-started@agent-output:7", None),
        ("capability-host/script-run-settled@agent-output:7", None),
        ("capability-host/agent-output:7/call-", None),
        ("capability-host/agent-output:7/call-x", None),
        ("capability-host//call-1", None),
        ("agent/script-result@agent-output:7", None),
        (None, None),
    ],
)
def test_own_script_call_execution_names_only_calls_into_the_runs_own_stream(
    key: str | None, execution: str | None
) -> None:
    from processors.idempotency_keys import own_script_call_execution

    assert own_script_call_execution(key) == execution
