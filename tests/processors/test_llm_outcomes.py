"""What the LLM caller appends for each outcome of a call, and what it scrubs: the pure decisions of
`processors/llm_outcomes.py` (docs/behaviour.md §4.3, §4.4, §4.5, §5.1.7, §5.1.8). No broker: the
caller worker itself is tested against Kafka in tests/pipeline/caller/test_llm_caller.py.
"""

from __future__ import annotations

import json

import pytest

from processors import llm_outcomes
from schemas.events import CONTEXT_ADDED, LLM_REQUEST_SETTLED, parse_consumed_input
from schemas.requests import COMPACTION_INSTRUCTION, Message
from tests.support.scripted_llm import overflow_response

API_KEY = "sk-proj-Scripted0123456789abcdefXYZ"  # shaped like a real key: it must never be journaled


# --- moved from the Kafka-backed caller tests: they never needed a broker -------------------------


def test_usage_normalizes_both_shapes() -> None:
    """§4.3: usage in the chat or the responses shape becomes the same report fields."""
    chat = {
        "prompt_tokens": 20,
        "completion_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 8},
        "completion_tokens_details": {"reasoning_tokens": 1},
    }
    responses = {
        "prompt_tokens": None,
        "input_tokens": 20,
        "output_tokens": 4,
        "input_tokens_details": {"cached_tokens": 8},
        "output_tokens_details": {"reasoning_tokens": 1},
    }
    expected = {"inputTokens": 20, "outputTokens": 4, "cachedInputTokens": 8, "reasoningOutputTokens": 1}
    assert llm_outcomes.normalize_usage(chat) == expected
    assert llm_outcomes.normalize_usage(responses) == expected
    assert llm_outcomes.normalize_usage({"prompt_tokens": 3}) is None
    assert llm_outcomes.normalize_usage({"input_tokens": True, "output_tokens": 1}) is None
    assert llm_outcomes.normalize_usage(None) is None


def test_failure_text_says_retrying_or_giving_up() -> None:
    """§4.3: the error event names the attempt and whether the agent retries."""
    first, last = llm_outcomes.failed(9, 1, 3, "boom\nbang"), llm_outcomes.failed(9, 3, 3, "boom")
    assert first[0].payload == {"requestOffset": 9, "result": {"status": "failed", "errorMessage": "boom bang"}}
    assert first[1].payload["message"] == "LLM request @9 failed (attempt 1 of 3): boom bang. Retrying."
    assert (
        last[1].payload["message"]
        == "LLM request @9 failed (attempt 3 of 3): boom. Giving up; a new message starts fresh."
    )
    assert [a.idempotencyKey for a in first] == ["agent/request/9/settled", "agent/request/9/error"]


def test_secrets_never_reach_the_journal_error_text_is_scrubbed() -> None:
    """Secrets never reach the journal: the configured key, authorization header values, bearer
    tokens, `sk-` keys (also a provider's masked echo of one) and URL credentials are scrubbed."""
    text = (
        "Incorrect API key provided: sk-proj-****************************wxyz. "
        f'request headers: {{"Authorization": "Bearer {API_KEY}", "x-api-key": "k-123456"}} '
        "via https://bob:hunter2@proxy.local/v1?key=AIzaSy12345 with my-own-secret-key-1"
    )
    assert llm_outcomes.scrub(text, ["my-own-secret-key-1", None]) == (
        "Incorrect API key provided: [redacted]. "
        'request headers: {"Authorization": "[redacted]", "x-api-key": "[redacted]"} '
        "via https://[redacted]@proxy.local/v1?key=[redacted] with [redacted]"
    )
    assert llm_outcomes.scrub(llm_outcomes.scrub(text)) == llm_outcomes.scrub(text)  # scrubbing twice changes nothing
    # Text without credentials stays as it is; a placeholder key ("local") is not hunted for.
    plain = "the local model is short of context: ask-me, risk-free, sk-learn, Bearer of news"
    assert llm_outcomes.scrub(plain, ["local"]) == plain
    # The failed settlement and its error event scrub too, whatever they are handed.
    appends = llm_outcomes.failed(4, 1, 3, f"HTTP 401 from the provider: Authorization: Bearer {API_KEY}")
    assert API_KEY not in json.dumps([a.event() for a in appends])
    assert appends[0].payload["result"]["errorMessage"] == "HTTP 401 from the provider: Authorization: [redacted]"


def test_context_overflow_is_recognised_in_each_servers_words() -> None:
    """Context that outgrows the model: llama-cpp-python's, OpenAI's and llama.cpp's HTTP 400 for a
    request over the window are overflows (with the window over the request size when they say
    it); other client errors, rate limits and server errors are not."""
    body = {"messages": [{"role": "user", "content": "x" * 4000}], "max_tokens": 64}
    ratios = {"llama-cpp-python": 500 / 1064, "openai": 500 / 1064, "llama.cpp": 500 / 1000}
    for style, ratio in ratios.items():
        refused = overflow_response(style, 500, body)
        assert refused is not None and overflow_response(style, 5000, body) is None
        inner = refused["error"]
        text = f"HTTP 400 from the provider: {inner['message']}"
        assert llm_outcomes.is_context_overflow(400, inner, text), style  # the SDK hands over `error`
        assert llm_outcomes.is_context_overflow(400, refused, text), style
        assert llm_outcomes.overflow_ratio(inner, text) == pytest.approx(ratio), style
    # A server that sets no code, in words only.
    assert llm_outcomes.is_context_overflow(
        400, None, "HTTP 400 from the provider: the request exceeds the available context size, try increasing it"
    )
    assert llm_outcomes.overflow_ratio(None, "no numbers here") is None
    not_overflows = [
        (400, {"message": "The model `x` does not exist", "code": "model_not_found"}),
        (429, {"message": "Rate limit reached for tokens per min; maximum context length", "code": "rate_limit"}),
        (500, {"message": "This model's maximum context length is 8 tokens", "code": "context_length_exceeded"}),
        (None, None),
    ]
    for status, error in not_overflows:
        text = str(error and error["message"])
        assert not llm_outcomes.is_context_overflow(status, error, text), (status, error)


def test_overflow_summary_calls_leave_out_only_the_oldest_history() -> None:
    """The summary calls after an overflow keep the system messages and the last ones, leave out
    more of the oldest history each time (the last call all it may), and say what they left out."""
    history = [
        Message(role="user" if i % 2 == 0 else "assistant", content=f"@{10 + i}\nturn {i} " + "y" * 400)
        for i in range(10)
    ]
    head = [Message(role="system", content="protocol"), Message(role="system", content="@2\nbe terse")]
    tail = [Message(role="user", content="@30\nwhat now?"), Message(role="system", content="Current date")]
    messages = [*head, *history, *tail]
    calls = llm_outcomes.summary_calls(messages, "openai-compatible", None)
    assert 1 < len(calls) <= llm_outcomes.MAX_SUMMARY_CALLS
    assert [c.dropped for c in calls] == sorted({c.dropped for c in calls})  # strictly more each time
    assert calls[-1].dropped == len(history)
    for call in calls:
        sent = call.messages
        assert sent[:2] == [{"role": "system", "content": "protocol"}, {"role": "system", "content": "@2\nbe terse"}]
        assert sent[-3:] == [
            {"role": "user", "content": "@30\nwhat now?"},
            {"role": "system", "content": "Current date"},
            {"role": "system", "content": COMPACTION_INSTRUCTION},
        ]
        assert (call.dropped_from, call.dropped_to) == (10, 10 + call.dropped - 1)
        assert sent[2] == {
            "role": "system",
            "content": f"[{call.dropped} older messages (@10 to @{call.dropped_to}) are left out here: "
            "with them the request exceeds the model's context window.]",
        }
        assert sent[3:-3] == llm_outcomes.provider_messages(history[call.dropped :])
    # The provider's numbers aim the first call: a request 10 % over keeps more than a blind half.
    aimed = llm_outcomes.summary_calls(messages, "openai", 1 / 1.1)
    assert aimed[0].dropped < calls[0].dropped
    assert aimed[0].messages[2]["role"] == "developer"  # the openai transport keeps the role


def test_overflow_outcome_is_the_summary_then_a_failed_settlement_that_retries() -> None:
    """Context that outgrows the model: the summary item replaces history through R (key derived
    from R), then R settles failed saying the context was compacted and the request is retried (an
    agent-loop trigger); at the last attempt it says it gives up. No summary: only the failure."""
    call = llm_outcomes.SummaryCall([], dropped=3, dropped_from=5, dropped_to=9)
    usage = {"inputTokens": 90, "outputTokens": 12}
    error = "HTTP 400 from the provider: too long"
    summary, settled, stream_error = llm_outcomes.overflow_compacted(12, 1, 3, error, "Plan B (@6).", usage, call)
    assert (summary.type, summary.idempotencyKey) == (CONTEXT_ADDED, "agent/compact-context@overflow-12")
    assert summary.payload == {
        "role": "developer",
        "content": "[Earlier conversation history was compacted through @12 because request @12 exceeded the "
        "model's context window; the 3 oldest messages, @5 to @9, did not fit in the summary call and are not "
        "summarized. Summary:]\n\nPlan B (@6).",
        "compaction": {"replacesHistoryThrough": 12, "usage": usage},
        "llmRequestPolicy": {"behaviour": "dont-trigger-request"},
    }
    why = (
        "the request exceeded the model's context window, so the context was compacted through @12 and the "
        "request will be retried (HTTP 400 from the provider: too long)"
    )
    assert settled.event() == {
        "type": LLM_REQUEST_SETTLED,
        "payload": {"requestOffset": 12, "result": {"status": "failed", "errorMessage": why}},
        "idempotencyKey": "agent/request/12/settled",
    }
    assert stream_error.payload["message"] == f"LLM request @12 failed (attempt 1 of 3): {why}. Retrying."
    whole = llm_outcomes.overflow_compacted(12, 3, 3, error, "Plan B.", None, llm_outcomes.SummaryCall([]))
    assert (
        whole[0]
        .payload["content"]
        .startswith(
            "[Earlier conversation history was compacted through @12 because request @12 exceeded the model's "
            "context window. Summary:]"
        )
    )
    assert "retried" not in whole[1].payload["result"]["errorMessage"]
    assert whole[2].payload["message"].endswith("Giving up; a new message starts fresh.")
    failed_too = llm_outcomes.overflow_not_compacted(12, 1, 3, error, "HTTP 500 from the provider: down")
    assert [a.idempotencyKey for a in failed_too] == ["agent/request/12/settled", "agent/request/12/error"]
    assert failed_too[0].payload["result"]["errorMessage"] == (
        "the request exceeded the model's context window and compacting the context failed (HTTP 500 from the "
        "provider: down); the request's error: HTTP 400 from the provider: too long"
    )


# --- §5.1.7 secrets never reach the journal -----------------------------------------------------------


def test_5_1_7_a_configured_key_of_8_characters_is_scrubbed_and_a_7_character_placeholder_is_not() -> None:
    """§5.1.7: the configured API key is scrubbed "when at least 8 characters"."""
    assert llm_outcomes.scrub("bad key Zq8x-k3P here", ["Zq8x-k3P"]) == "bad key [redacted] here"
    assert llm_outcomes.scrub("bad key Zq8x-k3 here", ["Zq8x-k3"]) == "bad key Zq8x-k3 here"
    assert llm_outcomes.scrub("nothing to hide", [None, ""]) == "nothing to hide"


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        ("Authorization: Bearer abc.def-123", "Authorization: [redacted]"),
        ("Proxy-Authorization: Basic dXNlcjpwYXNz", "Proxy-Authorization: [redacted]"),
        ("X-Api-Key: k-123456", "X-Api-Key: [redacted]"),
        ("api-key: 0123abcd", "api-key: [redacted]"),
        ('{"api_key": "0123abcd"}', '{"api_key": "[redacted]"}'),
        ("sent Bearer abcd1234 upstream", "sent Bearer [redacted] upstream"),
        ("sent Basic dXNlcjpwYXNz upstream", "sent Basic [redacted] upstream"),
        ("key sk-proj-AbC123xyz789 rejected", "key [redacted] rejected"),
        ("key sk-abcdef rejected", "key [redacted] rejected"),
        ("via https://bob:hunter2@proxy.local/v1", "via https://[redacted]@proxy.local/v1"),
        ("GET /v1?key=AIzaSy123 failed", "GET /v1?key=[redacted] failed"),
        ("GET /v1?a=1&key=AIzaSy123 failed", "GET /v1?a=1&key=[redacted] failed"),
        ("GET /v1?a=1&api_key=AIzaSy123", "GET /v1?a=1&api_key=[redacted]"),
    ],
)
def test_5_1_7_every_credential_shape_the_contract_names_is_redacted(text: str, scrubbed: str) -> None:
    """§5.1.7: values of Authorization, Proxy-Authorization, X-Api-Key and api-key headers,
    Bearer/Basic credentials, `sk-…` keys, `user:password@` in URLs, `key=` / `api_key=` parameters."""
    assert llm_outcomes.scrub(text) == scrubbed
    # The failed settlement and its error event carry the scrubbed text, never the credential.
    appends = llm_outcomes.failed(4, 1, 3, f"HTTP 401 from the provider: {text}")
    assert appends[0].payload["result"]["errorMessage"] == f"HTTP 401 from the provider: {scrubbed}"


# --- §5.1.8 context overflow ---------------------------------------------------------------------------


def test_5_1_8_http_413_saying_the_request_outgrew_the_window_is_a_context_overflow() -> None:
    """§5.1.8: a provider that rejects a request for exceeding the model's context window, also
    with HTTP 413 (payload too large); other statuses with the same words are not overflows."""
    text = "HTTP 413 from the provider: prompt is too long: 9000 tokens > 8192"
    assert llm_outcomes.is_context_overflow(413, None, text)
    assert llm_outcomes.is_context_overflow(413, {"code": "context_length_exceeded"}, "HTTP 413")
    assert llm_outcomes.overflow_ratio(None, text) == pytest.approx(8192 / 9000)
    for status in (401, 404, 414, 422, 429, 500, 503):
        assert not llm_outcomes.is_context_overflow(status, {"code": "context_length_exceeded"}, text), status


@pytest.mark.parametrize("field", ["code", "type"])
@pytest.mark.parametrize("name", ["context_length_exceeded", "exceed_context_size_error", "context_window_exceeded"])
def test_5_1_8_an_overflow_named_only_by_its_error_code_or_type_is_recognised(field: str, name: str) -> None:
    """llama.cpp's server names the overflow in `type`, OpenAI in `code`; the text need not say so."""
    error = {"message": "request rejected", field: name}
    text = "HTTP 400 from the provider: request rejected"
    assert llm_outcomes.is_context_overflow(400, error, text)
    assert llm_outcomes.is_context_overflow(400, {"error": error}, text)
    assert not llm_outcomes.is_context_overflow(400, {"message": "request rejected", field: "other"}, text)


def test_5_1_8_at_most_five_summary_calls_and_the_fifth_leaves_out_all_the_history_it_may() -> None:
    """§5.1.8: "leaving out the oldest history messages until the summary call fits (never the
    leading system messages or the last two messages; at most five calls)"."""
    history = [
        Message(role="user" if i % 2 == 0 else "assistant", content=f"@{10 + i}\n" + "y" * 200) for i in range(100)
    ]
    last_two = [Message(role="user", content="@200\nwhat now?"), Message(role="developer", content="Current date")]
    messages = [Message(role="system", content="protocol"), *history, *last_two]
    calls = llm_outcomes.summary_calls(messages, "openai", None)
    assert len(calls) == 5
    assert [call.dropped for call in calls] == sorted({call.dropped for call in calls})
    assert calls[-1].dropped == 100 and (calls[-1].dropped_from, calls[-1].dropped_to) == (10, 109)
    for call in calls:
        assert call.messages[0] == {"role": "system", "content": "protocol"}
        assert call.messages[-3:-1] == llm_outcomes.provider_messages(last_two)


def test_5_1_8_the_last_two_messages_are_never_left_out_even_when_they_are_history() -> None:
    """With no timestamp, the last two messages are both history items: they stay."""
    history = [Message(role="user", content=f"@{i}\n" + "z" * 500) for i in range(1, 9)]
    messages = [Message(role="system", content="protocol"), *history]
    calls = llm_outcomes.summary_calls(messages, "openai-compatible", None)
    assert calls[-1].dropped == 6 and (calls[-1].dropped_from, calls[-1].dropped_to) == (1, 6)
    assert calls[-1].messages[-3:-1] == llm_outcomes.provider_messages(history[-2:])
    assert calls[-1].messages[-1] == {"role": "system", "content": COMPACTION_INSTRUCTION}


# --- §4.3 outcomes -----------------------------------------------------------------------------------


def test_4_3_an_error_of_exactly_300_characters_is_kept_whole_and_a_longer_one_is_cut_to_300() -> None:
    """§4.3: "the error is one line, at most 300 characters"."""
    exact = llm_outcomes.failed(7, 1, 3, "e" * 300)[0].payload["result"]["errorMessage"]
    assert exact == "e" * 300
    over = llm_outcomes.failed(7, 1, 3, "e" * 301)[0].payload["result"]["errorMessage"]
    assert len(over) == 300 and over == "e" * 299 + "…"
    spread = llm_outcomes.failed(7, 1, 3, "line one\n\n  line\ttwo")[0].payload["result"]["errorMessage"]
    assert spread == "line one line two"


def test_4_3_a_success_journals_a_duration_of_at_least_0_even_when_the_clock_stepped_back() -> None:
    """§1.1: `durationMs` is a count (≥ 0); a negative measurement would make the settlement invalid."""
    assistant, settled = llm_outcomes.succeeded(5, "m", "hi", None, -3, 1000)
    assert settled.payload == {"requestOffset": 5, "durationMs": 0, "result": {"status": "succeeded", "text": "hi"}}
    for append in (assistant, settled):
        parse_consumed_input(append.event())  # a valid consumed input, as the journal will check
    assert llm_outcomes.succeeded(5, "m", "hi", None, 1234, 1000)[1].payload["durationMs"] == 1234


def test_4_3_usage_goes_into_the_settlement_and_a_report_carrying_the_models_window() -> None:
    """§4.3: assistant item, settlement, then `token-usage-reported` (key `agent/request/<R>/usage`)."""
    usage = {"inputTokens": 20, "outputTokens": 4, "cachedInputTokens": 8}
    appends = llm_outcomes.succeeded(5, "m-small", "hi", usage, 12, 4096)
    assert [a.idempotencyKey for a in appends] == [
        "agent/request/5/assistant",
        "agent/request/5/settled",
        "agent/request/5/usage",
    ]
    assert appends[0].payload == {"role": "assistant", "content": "hi", "llmRequestOffset": 5}
    assert appends[1].payload["result"] == {"status": "succeeded", "text": "hi", "usage": usage}
    assert appends[2].payload == {"llmRequestOffset": 5, "model": "m-small", "maxContextTokens": 4096, **usage}
    for append in appends:
        parse_consumed_input(append.event())


def test_4_4_an_interrupted_call_journals_the_partial_without_a_request_offset_then_the_cancellation() -> None:
    """§4.4: the partial output as an assistant item *without* `llmRequestOffset` (key
    `agent/request/<R>/partial`), then the settlement `cancelled/interrupted-by-user-input`."""
    partial, settled = llm_outcomes.cancelled(8, "half an ans")
    assert partial.event() == {
        "type": CONTEXT_ADDED,
        "payload": {
            "role": "assistant",
            "content": "[Response interrupted by the next message; partial output follows]\nhalf an ans",
        },
        "idempotencyKey": "agent/request/8/partial",
    }
    assert settled.event() == {
        "type": LLM_REQUEST_SETTLED,
        "payload": {
            "requestOffset": 8,
            "result": {"status": "cancelled", "reason": "interrupted-by-user-input", "partialText": "half an ans"},
        },
        "idempotencyKey": "agent/request/8/settled",
    }
    (nothing_yet,) = llm_outcomes.cancelled(8, "")
    assert nothing_yet.payload == {
        "requestOffset": 8,
        "result": {"status": "cancelled", "reason": "interrupted-by-user-input"},
    }


def test_4_5_a_compaction_summary_names_its_cutoff_tokens_and_threshold_and_never_triggers() -> None:
    """§4.5: content `[Earlier conversation history was compacted through @<R> (~<tokens> tokens >
    <threshold>). Summary:]\\n\\n<summary>`, key `agent/compact-context@<report offset>`."""
    (summary,) = llm_outcomes.compacted(12, 15, 3000, 2048, "Plan B.", {"inputTokens": 9, "outputTokens": 2})
    assert summary.event() == {
        "type": CONTEXT_ADDED,
        "payload": {
            "role": "developer",
            "content": "[Earlier conversation history was compacted through @12 (~3000 tokens > 2048). Summary:]"
            "\n\nPlan B.",
            "compaction": {"replacesHistoryThrough": 12, "usage": {"inputTokens": 9, "outputTokens": 2}},
            "llmRequestPolicy": {"behaviour": "dont-trigger-request"},
        },
        "idempotencyKey": "agent/compact-context@15",
    }
    call = llm_outcomes.SummaryCall([], dropped=2, dropped_from=3, dropped_to=4)
    (cut,) = llm_outcomes.compacted(12, 15, 3000, 2048, "Plan B.", None, call)
    assert cut.payload["content"].startswith(
        "[Earlier conversation history was compacted through @12 (~3000 tokens > 2048; the 2 oldest messages, "
        "@3 to @4, did not fit in the summary call and are not summarized). Summary:]"
    )
    assert "usage" not in cut.payload["compaction"]
