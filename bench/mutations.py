"""Mutation audit of the pure core: does the broker-free test suite catch plausible one-line bugs?

    .venv/bin/python bench/mutations.py                  # every mutation, 2 jobs, prints a table
    .venv/bin/python bench/mutations.py --jobs 1 --only J1 L7
    .venv/bin/python bench/mutations.py --check          # only check that every original line exists
    .venv/bin/python bench/mutations.py --json out.json  # also write the results, as they come
    .venv/bin/python bench/mutations.py --json out.json --resume  # run only what out.json lacks
    .venv/bin/python bench/mutations.py --source DIR     # audit another tree (e.g. `git archive` of a commit)

Each mutation below is (id, file, the exact original line, the mutated line, the bug it models).
The real tree is never edited: each job copies the repository (without .venv, .git, .local and
caches) to a temporary directory, and for each mutation rewrites one line of the copy, runs
the broker-free suite there, and puts the line back. The copy's modules are the ones imported
(`PYTHONPATH=<copy>`, no bytecode written, so a same-size edit is never hidden by a stale .pyc).

A mutation is *caught* when pytest fails (or times out) and the failing test passes without the
mutation; a test that fails without it too (flaky on a loaded machine) is left out and the run
repeated. The tests run in two stages, both with `-x -q -m "not kafka" -p no:cacheprovider`:
first the test modules that import the mutated module (found by reading their imports, modules
with Hypothesis properties last), then, only when those pass, the whole broker-free suite.
Before any mutation, the unmutated copy runs the whole broker-free suite (the baseline); a test
that fails there (someone's unfinished work) is left out of every run and listed, so a
failure is always the mutation's. A full run takes 20-60 minutes with two jobs, depending on the
machine's load and on how many mutations survive (a survivor costs a whole-suite run).

A survivor is a missing test, unless the mutation cannot change behaviour (an equivalent
mutation): replace such a mutation rather than keep it. A new mutation names the bug it models; a
test that kills it asserts the rule as docs/behaviour.md states it, with the contract's numbers.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = REPO / ".venv" / "bin" / "python"
PYTEST_ARGS = ("-x", "-q", "-m", "not kafka", "-p", "no:cacheprovider")
COPY_EXCLUDES = (".venv", ".git", ".local", ".hypothesis", ".pytest_cache", ".ruff_cache", "__pycache__")


@dataclass(frozen=True, slots=True)
class Mutation:
    id: str
    file: str  # relative to the repository
    original: str  # one line, compared without its indentation
    mutated: str  # its replacement, indented as the original
    bug: str  # the plausible bug it models
    occurrence: int = 1  # which matching line, when the original text occurs more than once


M = Mutation
MUTATIONS: tuple[Mutation, ...] = (
    # --- processors/journal.py: the idempotency decision, createdAt, the payload hash (§1) -------------------
    M(
        "J1",
        "processors/journal.py",
        "if existing_digest == digest:",
        "if existing_digest is not None:",
        "a key reused with a different body is judged a duplicate",
    ),
    M(
        "J2",
        "processors/journal.py",
        'envelope["createdAt"] = next_created_at(now_ms, state.last_event_created_at)',
        'envelope["createdAt"] = format_created_at(now_ms)',
        "createdAt goes backwards with the wall clock",
    ),
    M(
        "J3",
        "processors/journal.py",
        "canonical = orjson.dumps([event_type, payload], option=orjson.OPT_SORT_KEYS)",
        "canonical = orjson.dumps([event_type, payload])",
        "the payload hash depends on key order",
    ),
    M(
        "J4",
        "processors/journal.py",
        'return _second(seconds) + f".{millis:03d}Z"',
        'return _second(seconds) + f".{millis}Z"',
        "createdAt milliseconds not zero-padded",
    ),
    M(
        "J5",
        "processors/journal.py",
        "return hashlib.sha256(canonical).hexdigest()[:32]",
        "return hashlib.sha256(canonical).hexdigest()[:16]",
        "the stored hash is 16 hex digits, not 32",
    ),
    M(
        "J6",
        "processors/journal.py",
        'envelope["createdAt"] = next_created_at(now_ms, state.last_event_created_at)',
        'envelope["createdAt"] = next_created_at(now_ms, state.last_request_created_at)',
        "createdAt monotone against the last request instead of the last event",
    ),
    # --- processors/llm_outcomes.py: scrubbing, overflow, summary calls, outcomes (§4.3, §5.1.7, §5.1.8) -------
    M(
        "L1",
        "processors/llm_outcomes.py",
        "MIN_SECRET_CHARS = 8",
        "MIN_SECRET_CHARS = 9",
        "a configured key of exactly 8 characters is not scrubbed",
    ),
    M(
        "L2",
        "processors/llm_outcomes.py",
        "if secret and len(secret) >= MIN_SECRET_CHARS:",
        "if secret and len(secret) > MIN_SECRET_CHARS:",
        "boundary: a key at the minimum length is not scrubbed",
    ),
    M(
        "L3",
        "processors/llm_outcomes.py",
        '(re.compile(r"\\bsk-[A-Za-z0-9_*-]{6,}"), REDACTED),',
        '(re.compile(r"\\bsk-[A-Za-z0-9_*]{6,}"), REDACTED),',
        "sk-proj-… keys (a hyphen inside) are not scrubbed",
    ),
    M(
        "L4",
        "processors/llm_outcomes.py",
        'r"(?i)\\b((?:proxy-)?authorization|x-api-key|api[-_]key)([\\"\']?\\s*[:=]\\s*[\\"\']?)"',
        'r"(?i)\\b((?:proxy-)?authorization|x-api-key)([\\"\']?\\s*[:=]\\s*[\\"\']?)"',
        "the api-key header value is not scrubbed",
    ),
    M(
        "L5",
        "processors/llm_outcomes.py",
        '(re.compile(r"(?i)\\b(bearer|basic)\\s+[A-Za-z0-9._~+/=*-]{4,}"), rf"\\1 {REDACTED}"),',
        '(re.compile(r"(?i)\\b(bearer)\\s+[A-Za-z0-9._~+/=*-]{4,}"), rf"\\1 {REDACTED}"),',
        "Basic credentials outside a header are not scrubbed",
    ),
    M(
        "L6",
        "processors/llm_outcomes.py",
        '(re.compile(r"(?i)([?&](?:api[-_]?)?key=)[^&\\s\\"\']+"), rf"\\1{REDACTED}"),',
        '(re.compile(r"(?i)([?](?:api[-_]?)?key=)[^&\\s\\"\']+"), rf"\\1{REDACTED}"),',
        "a key= query parameter after & is not scrubbed",
    ),
    M(
        "L7",
        "processors/llm_outcomes.py",
        "if status not in (400, 413):",
        "if status not in (400,):",
        "HTTP 413 is not recognised as a context overflow",
    ),
    M(
        "L8",
        "processors/llm_outcomes.py",
        "MAX_SUMMARY_CALLS = 5  # the last one leaves out all the history it may",
        "MAX_SUMMARY_CALLS = 6  # the last one leaves out all the history it may",
        "more than five summary calls",
    ),
    M(
        "L9",
        "processors/llm_outcomes.py",
        "KEEP_LAST_MESSAGES = 2  # a summary call always keeps the newest item and the timestamp",
        "KEEP_LAST_MESSAGES = 1  # a summary call always keeps the newest item and the timestamp",
        "a summary call leaves out the newest item",
    ),
    M(
        "L10",
        "processors/llm_outcomes.py",
        'return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"',
        'return line if len(line) < limit else line[: limit - 1].rstrip() + "…"',
        "an error of exactly 300 characters is cut",
    ),
    M(
        "L11",
        "processors/llm_outcomes.py",
        "if attempt < max_attempts:",
        "if attempt <= max_attempts:",
        "the last attempt says Retrying",
    ),
    M(
        "L12",
        "processors/llm_outcomes.py",
        '{"requestOffset": request_offset, "durationMs": max(0, int(duration_ms)), "result": result},',
        '{"requestOffset": request_offset, "durationMs": int(duration_ms), "result": result},',
        "a negative duration (clock step) makes an invalid settlement",
    ),
    M(
        "L13",
        "processors/llm_outcomes.py",
        'retried = " and the request will be retried" if attempt < max_attempts else ""',
        'retried = " and the request will be retried" if attempt <= max_attempts else ""',
        "the overflow error promises a retry on the last attempt",
    ),
    M(
        "L14",
        "processors/llm_outcomes.py",
        'usage["cachedInputTokens"] = cached',
        'usage["reasoningOutputTokens"] = cached',
        "cached tokens reported as reasoning tokens",
    ),
    M(
        "L15",
        "processors/llm_outcomes.py",
        'if fields.get("code") in _OVERFLOW_CODES or fields.get("type") in _OVERFLOW_CODES:',
        'if fields.get("code") in _OVERFLOW_CODES:',
        "an overflow named by the error type only (llama.cpp) is not recognised",
    ),
    # --- processors/reducer.py (§2, §4) --------------------------------------------------------------
    M(
        "R1",
        "processors/reducer.py",
        "elif previous.offset <= state.published_through:",
        "elif previous.offset < state.published_through:",
        "a slot published exactly at publishedThrough is replaced in place",
    ),
    M(
        "R2",
        "processors/reducer.py",
        "if cutoff >= offset:",
        "if cutoff > offset:",
        "a compaction whose cutoff is its own offset applies",
    ),
    M(
        "R3",
        "processors/reducer.py",
        "if cell.offset > cutoff:",
        "if cell.offset >= cutoff:",
        "the item exactly at the compaction cutoff survives",
    ),
    M(
        "R4",
        "processors/reducer.py",
        "if tokens >= threshold and report.llmRequestOffset > state.compacted_through:",
        "if tokens > threshold and report.llmRequestOffset > state.compacted_through:",
        "usage exactly at the threshold does not trigger compaction",
    ),
    M(
        "R5",
        "processors/reducer.py",
        "if trigger_offset is not None and trigger_offset < state.latest_external_trigger:",
        "if trigger_offset is not None and trigger_offset <= state.latest_external_trigger:",
        "a pause for the latest external trigger itself is judged stale",
    ),
    M(
        "R6",
        "processors/reducer.py",
        "if state.consecutive_llm_failures < state.config.llmRequestRetryPolicy.maxAttempts:",
        "if state.consecutive_llm_failures <= state.config.llmRequestRetryPolicy.maxAttempts:",
        "one retry too many",
    ),
    M(
        "R7",
        "processors/reducer.py",
        "if state.compacted_through >= payload.requestOffset:",
        "if state.compacted_through > payload.requestOffset:",
        "an overflow compacted exactly through R spends an attempt",
    ),
    M(
        "R8",
        "processors/reducer.py",
        "if state.over_threshold is not None and state.over_threshold.llmRequestOffset <= cutoff:",
        "if state.over_threshold is not None and state.over_threshold.llmRequestOffset < cutoff:",
        "the report for the request at the cutoff survives its compaction",
    ),
    M(
        "R9",
        "processors/reducer.py",
        "pending.offset = offset",
        "pass",
        "the newest trigger does not win the pending offset",
    ),
    M(
        "R10",
        "processors/reducer.py",
        'if item.role in ("system", "assistant"):',
        'if item.role == "system":',
        "assistant items trigger a turn",
    ),
    M(
        "R11",
        "processors/reducer.py",
        "threshold = int(report.maxContextTokens * state.config.compactionTriggerFraction)",
        "threshold = round(report.maxContextTokens * state.config.compactionTriggerFraction)",
        "the compaction threshold is rounded, not floored",
    ),
    M(
        "R12",
        "processors/reducer.py",
        "if pending is not None and state.open is None and not state.paused:",
        "if pending is not None and state.open is None:",
        "a request reduced while paused opens",
    ),
    # --- processors/render.py (§3) ---------------------------------------------------------------------
    M(
        "N1",
        "processors/render.py",
        'if neutral == "developer" and transport == "openai-compatible":',
        'if neutral == "developer" and transport == "openai":',
        "developer mapped to system on the wrong transport",
    ),
    M(
        "N2",
        "processors/render.py",
        'return "user"',
        'return "developer"',
        "a compaction summary renders as developer",
    ),
    M(
        "N3",
        "processors/render.py",
        "parts.append(f\"refs=[{','.join(render_ref(ref) for ref in item.refs)}]\")",
        "parts.append(f\"refs=[{', '.join(render_ref(ref) for ref in item.refs)}]\")",
        "refs joined with spaces",
    ),
    M(
        "N4",
        "processors/render.py",
        'return f"user:{actor.origin}"',
        'return f"user:{_json(actor.origin)}"',
        "the user origin is quoted",
    ),
    M(
        "N5",
        "processors/render.py",
        "name = actor.login if actor.login is not None else actor.senderType",
        "name = actor.senderType if actor.senderType is not None else actor.login",
        "github actor prefers senderType over login",
    ),
    M(
        "N6",
        "processors/render.py",
        "if size <= limit:",
        "if size < limit:",
        "an item exactly at the item cap is cut",
    ),
    M(
        "N7",
        "processors/render.py",
        "while omitted < len(history) and remaining + notice_cost > room:",
        "while omitted < len(history) and remaining + notice_cost >= room:",
        "a request exactly at its budget leaves its oldest history item out",
    ),
    M(
        "N8",
        "processors/render.py",
        "if not MIN_REQUEST_BYTES <= self.request_bytes <= MAX_MESSAGES_BYTES:",
        "if not MIN_REQUEST_BYTES <= self.request_bytes < MAX_MESSAGES_BYTES:",
        "a request budget of exactly 4 MiB is refused",
    ),
    M(
        "N9",
        "processors/render.py",
        "MIN_REQUEST_BYTES = 8 * 1024  # the protocol message, the timestamp and both notices always fit",
        "MIN_REQUEST_BYTES = 8 * 1000  # the protocol message, the timestamp and both notices always fit",
        "the minimum request budget is 8 000 bytes, not 8 KiB",
    ),
    M(
        "N10",
        "processors/render.py",
        'items, them = ("item", "it") if count == 1 else ("items", "them")',
        'items, them = ("item", "it") if count == 0 else ("items", "them")',
        "the left-out notice for one item uses the plural",
    ),
    M(
        "N11",
        "processors/render.py",
        "high = max(high, cell.offset)",
        "high = cell.offset",
        "the left-out notice names the last item's offset as the highest (lane offsets need not increase)",
    ),
    M(
        "N12",
        "processors/render.py",
        'text = f"{ref.repoPath}@{ref.commitOid}"',
        'text = f"{ref.repoPath}:{ref.commitOid}"',
        "a git-commit ref with the wrong separator",
    ),
    M(
        "N13",
        "processors/render.py",
        'append({"role": provider_role("developer", transport), "content": TIMESTAMP_PREFIX + request_created_at})',
        'append({"role": "system", "content": TIMESTAMP_PREFIX + request_created_at})',
        "the timestamp message is a system message on openai",
    ),
    M(
        "N14",
        "processors/render.py",
        'if item.actor is not None and item.actor.type == "agent":',
        'if item.actor is not None and item.actor.type in ("agent", "script"):',
        "a script result gets the agent reply line",
    ),
    # --- processors/scheduler.py (§4.2, §4.3) ------------------------------------------------------------
    M(
        "S1",
        "processors/scheduler.py",
        "if now_ms >= open_request.expiresAt:",
        "if now_ms > open_request.expiresAt:",
        "a request is not expired exactly at expiresAt",
    ),
    M(
        "S2",
        "processors/scheduler.py",
        "if now_ms < due:",
        "if now_ms <= due:",
        "the request waits a millisecond past its debounce",
    ),
    M(
        "S3",
        "processors/scheduler.py",
        "return min(policy.backoffBaseMs * 2 ** (failures - 1), policy.backoffMaxMs)",
        "return min(policy.backoffBaseMs * 2**failures, policy.backoffMaxMs)",
        "backoff doubled from the first failure",
    ),
    M(
        "S4",
        "processors/scheduler.py",
        'if pending.source == "agent-loop" and state.autonomous_turn_count >= state.config.maxAutonomousTurns:',
        'if pending.source == "agent-loop" and state.autonomous_turn_count > state.config.maxAutonomousTurns:',
        "the breaker allows maxAutonomousTurns + 1 turns",
    ),
    M(
        "S5",
        "processors/scheduler.py",
        "expires_at = pending.atMs + state.config.llmRequestExpiryMs",
        "expires_at = now_ms + state.config.llmRequestExpiryMs",
        "expiresAt counted from now instead of the first trigger",
    ),
    M(
        "S6",
        "processors/scheduler.py",
        "if pending is None or not state.created or not state.has_system_prompt:",
        "if pending is None or not state.has_system_prompt:",
        "a turn before agent/created",
    ),
    M(
        "S7",
        "processors/scheduler.py",
        "if state.open is None or state.open.offset != request:",
        "if state.open is None:",
        "an expiry of a settled request journaled while a newer one is open",
    ),
    # --- processors/scripts.py (§6.2-§6.4) ---------------------------------------------------------------
    M(
        "X1",
        "processors/scripts.py",
        'tag = words[0].lower() if words else ""',
        'tag = words[0] if words else ""',
        "an upper-case PYTHON fence is not a script",
    ),
    M(
        "X2",
        "processors/scripts.py",
        "if closing is not None and len(closing[1]) >= width:",
        "if closing is not None and len(closing[1]) == width:",
        "a longer closing fence does not close",
    ),
    M(
        "X3",
        "processors/scripts.py",
        "if len(content) <= limit:",
        "if len(content) < limit:",
        "a result exactly at scriptResultHistoryLimit is truncated",
    ),
    M(
        "X4",
        "processors/scripts.py",
        'while re.search(rf"^{marker}", text, re.MULTILINE):',
        'while re.search(rf"^{marker}", text):',
        "a fence inside later lines of a result is not lengthened",
    ),
    M(
        "X5",
        "processors/scripts.py",
        "expires_at = epoch_ms(event.createdAt) + state.config.llmRequestExpiryMs",
        "expires_at = epoch_ms(event.createdAt) + state.config.scriptTimeoutMs",
        "a run request expires after the script timeout",
    ),
    M(
        "X6",
        "processors/scripts.py",
        '_OPENING = re.compile(r"(`{3,})([^`]*)")',
        '_OPENING = re.compile(r"(`{2,})([^`]*)")',
        "two backticks open a fence",
    ),
    M(
        "X7",
        "processors/scripts.py",
        "outcome = MAY_HAVE_EXECUTED if settlement.executionMayHaveOccurred else DID_NOT_EXECUTE",
        "outcome = DID_NOT_EXECUTE if settlement.executionMayHaveOccurred else MAY_HAVE_EXECUTED",
        "the partial-execution warning inverted",
    ),
    M(
        "X8",
        "processors/scripts.py",
        "return value if INT_MIN <= value <= INT_MAX else str(value)",
        "return value if INT_MIN <= value < INT_MAX else str(value)",
        "a script result of 2^64-1 becomes text",
    ),
    # --- processors/rows.py (row keys, architecture "Rows") --------------------------------------------
    M(
        "W1",
        "processors/rows.py",
        "return IDEMPOTENCY + SEP + _path_bytes(path) + SEP + key.encode()",
        "return IDEMPOTENCY + SEP + _path_bytes(path) + key.encode()",
        "idempotency rows of two streams collide (separator dropped)",
    ),
    M(
        "W2",
        "processors/rows.py",
        "return ITEM + SEP + _path_bytes(path) + SEP",
        "return ITEM + SEP + _path_bytes(path)",
        "a stream's item scan reaches another stream's items",
    ),
    M(
        "W3",
        "processors/rows.py",
        'lane: LaneName = "system" if key[-9:-8] == _LANE_TAGS["system"] else "history"',
        'lane: LaneName = "system" if key[-10:-9] == _LANE_TAGS["system"] else "history"',
        "the lane tag read from the wrong byte",
    ),
    M(
        "W4",
        "processors/rows.py",
        "return APPEND_SLOT + SEP + _path_bytes(path) + SEP + _SEQ.pack(slot)",
        "return APPEND_SLOT + SEP + _path_bytes(path) + _SEQ.pack(slot)",
        "dedupe-window slot rows of two streams collide",
    ),
    M(
        "W5",
        "processors/rows.py",
        "return APPEND_ID + SEP + _path_bytes(path) + SEP + append_id.encode()",
        "return APPEND_ID + SEP + _path_bytes(path) + append_id.encode()",
        "append-id rows of two streams collide",
    ),
    # --- processors/dedupe.py (§1 dedupe window) ----------------------------------------------------------
    M(
        "D1",
        "processors/dedupe.py",
        "slot = rows.append_slot_key(path, offset % window)",
        "slot = rows.append_slot_key(path, offset % (window + 1))",
        "the append-id window is one event too long",
    ),
    M(
        "D2",
        "processors/dedupe.py",
        "changed.append((rows.append_id_key(path, row_codec.decode_append_slot(forgotten)), None))",
        "pass",
        "append ids older than the window are never forgotten",
    ),
    # --- processors/globs.py, grants.py (§6.6, §7.2) -------------------------------------------------------
    M(
        "G1",
        "processors/globs.py",
        'parts.append("[^/]*")',
        'parts.append(".*")',
        "* matches across segments",
    ),
    M(
        "G2",
        "processors/globs.py",
        'parts.append("[^/]")',
        'parts.append(".")',
        "? matches a slash",
    ),
    M(
        "G3",
        "processors/globs.py",
        "return any(_glob(glob).fullmatch(path) for glob in globs)",
        "return any(_glob(glob).match(path) for glob in globs)",
        "a glob matches any path it is a prefix of",
    ),
    M(
        "GR1",
        "processors/grants.py",
        'send=tuple(configured.send) if configured.send is not None else (f"{project}/*",),',
        'send=tuple(configured.send) if configured.send is not None else (f"{project}/**",),',
        "the default send grant reaches nested streams",
    ),
    M(
        "GR2",
        "processors/grants.py",
        "read_referenced=configured.read is None,",
        "read_referenced=True,",
        "a configured read list still reads referenced events",
    ),
    M(
        "GR3",
        "processors/grants.py",
        "subscribe=tuple(configured.subscribe) if configured.subscribe is not None "
        'else (f"{project}/**", INTEGRATIONS),',
        'subscribe=tuple(configured.subscribe) if configured.subscribe is not None else (f"{project}/**",),',
        "the default subscribe grant misses /integrations/**",
    ),
    # --- processors/gate.py (§7.2) ------------------------------------------------------------------------
    M(
        "GA1",
        "processors/gate.py",
        "if isinstance(size, int) and size > max_file_bytes:",
        "if isinstance(size, int) and size >= max_file_bytes:",
        "a user file exactly at the limit is refused",
    ),
    M(
        "GA2",
        "processors/gate.py",
        "AGENT_ONLY_TYPES = frozenset({AGENT_CREATED, AGENT_CONFIGURED, AGENT_SUBSCRIBED})",
        "AGENT_ONLY_TYPES = frozenset({AGENT_CREATED, AGENT_CONFIGURED})",
        "non-platform tokens may subscribe",
    ),
    # --- processors/routing.py (§6.7, §7.3) ----------------------------------------------------------------
    M(
        "RT1",
        "processors/routing.py",
        'return text if len(text) <= limit else text[: limit - 1] + "…"',
        'return text if len(text) < limit else text[: limit - 1] + "…"',
        "a summary of exactly 2 000 characters is clipped",
    ),
    M(
        "RT2",
        "processors/routing.py",
        "REQUEST_BOOKKEEPING = frozenset({LLM_REQUEST_REQUESTED, LLM_REQUEST_SETTLED, TOKEN_USAGE_REPORTED})",
        "REQUEST_BOOKKEEPING = frozenset({LLM_REQUEST_REQUESTED, LLM_REQUEST_SETTLED})",
        "usage reports are routed",
    ),
    M(
        "RT3",
        "processors/routing.py",
        'if len(parts) > 2 and parts[1] == "integrations" and parts[2]:',
        'if len(parts) > 2 and parts[1] == "integration" and parts[2]:',
        "an integration is named by its whole path",
    ),
    # --- processors/idempotency_keys.py (§1, §6.8) ----------------------------------------------------------
    M(
        "K1",
        "processors/idempotency_keys.py",
        "if len(key) <= MAX_KEY_CHARS:",
        "if len(key) < MAX_KEY_CHARS:",
        "a route key of exactly 512 characters is hashed",
    ),
    M(
        "K2",
        "processors/idempotency_keys.py",
        "if len(key) > MAX_KEY_CHARS:",
        "if len(key) >= MAX_KEY_CHARS:",
        "a script call key of exactly 512 characters is hashed",
    ),
    M(
        "K3",
        "processors/idempotency_keys.py",
        'if not request.isdigit() or suffix not in ("expired", "expiry-error"):',
        'if not request.isdigit() or suffix not in ("expired",):',
        "the expiry error event is not recognised as stale",
    ),
    M(
        "K4",
        "processors/idempotency_keys.py",
        'RESERVED_KEY_PREFIXES = ("agent/", ROUTE_KEY_PREFIX, "capability-host/", "github/delivery/", "slack/event/")',
        'RESERVED_KEY_PREFIXES = ("agent/", ROUTE_KEY_PREFIX, "capability-host/", "github/delivery/")',
        "slack event keys are not reserved",
    ),
    # --- processors/row_codec.py, state.py -------------------------------------------------------------------
    M(
        "C1",
        "processors/row_codec.py",
        "if not lane.next_front_seq < seq < lane.next_seq:",
        "if not lane.next_front_seq < seq <= lane.next_seq:",
        "an item row written after its metadata row is loaded",
    ),
    M(
        "C2",
        "processors/row_codec.py",
        '"sourceOffset": sources.appends,',
        '"sourceOffset": sources.internal,',
        "the two command topics' positions swapped in the metadata row",
    ),
    # The upcast chain (docs/operations.md, "Row format").
    M(
        "C3",
        "processors/row_codec.py",
        "version += 1",
        "version += 2",
        "the upcast chain skips a step",
    ),
    M(
        "C4",
        "processors/row_codec.py",
        "while version < ROW_FORMAT:",
        "while version <= ROW_FORMAT:",
        "the upcast chain runs one step past the newest format",
    ),
    M(
        "C5",
        "processors/row_codec.py",
        "if version > ROW_FORMAT:",
        "if version >= ROW_FORMAT:",
        "a row of the newest format is refused as too new",
    ),
    M(
        "C6",
        "processors/row_codec.py",
        "body = UPCASTS[version](shape, body)",
        "body = UPCASTS[min(version + 1, ROW_FORMAT - 1)](shape, body)",
        "each step upcasts from the next format on",
    ),
    M(
        "C7",
        "processors/row_codec.py",
        "return upcast(shape, version, value if version == 1 else value[2:])",
        "return upcast(shape, version, value[2:])",
        "a format-1 row (no marker) loses its first two bytes",
    ),
    M(
        "C8",
        "processors/row_codec.py",
        "if 1 <= stored <= ROW_FORMAT:",
        "if 1 <= stored:",
        "a partition of a newer row format is opened (a downgrade)",
    ),
    M(
        "ST1",
        "processors/state.py",
        "return offset <= (self.internal if internal else self.appends)",
        "return offset < (self.internal if internal else self.appends)",
        "the last journaled command is journaled again when read twice",
    ),
    M(
        "ST2",
        "processors/state.py",
        "return SourceOffsets(self.appends, max(self.internal, offset))",
        "return SourceOffsets(self.appends, offset)",
        "the internal topic position can go backwards",
    ),
    M(
        "ST3",
        "processors/state.py",
        'return "paused"',
        'return "queued"',
        "a paused agent reports queued",
    ),
    # --- schemas/limits.py (§5.1.1-§5.1.3) -------------------------------------------------------------------
    M(
        "LI1",
        "schemas/limits.py",
        "MAX_PATH_CHARS = 512",
        "MAX_PATH_CHARS = 511",
        "a path of exactly 512 characters is refused",
    ),
    M(
        "LI2",
        "schemas/limits.py",
        "if len(path) > MAX_PATH_CHARS:",
        "if len(path) >= MAX_PATH_CHARS:",
        "boundary: a path at the length limit is refused",
    ),
    M(
        "LI3",
        "schemas/limits.py",
        '_PATH = re.compile(r"(?:/[A-Za-z0-9._~:@+\\-]{1,128})+")',
        '_PATH = re.compile(r"(?:/[A-Za-z0-9._~:@+\\-]{1,127})+")',
        "a segment of exactly 128 characters is refused",
    ),
    M(
        "LI4",
        "schemas/limits.py",
        "if depth >= MAX_JSON_DEPTH:",
        "if depth > MAX_JSON_DEPTH:",
        "a payload nested 129 levels is accepted",
    ),
    M(
        "LI5",
        "schemas/limits.py",
        "INT_MIN = -(1 << 63)",
        "INT_MIN = -(1 << 63) + 1",
        "-2^63 is refused",
    ),
    M(
        "LI6",
        "schemas/limits.py",
        "INT_MAX = (1 << 64) - 1",
        "INT_MAX = (1 << 63) - 1",
        "the unsigned half of the range is refused",
    ),
    M(
        "LI7",
        "schemas/limits.py",
        "if not INT_MIN <= node <= INT_MAX:",
        "if not INT_MIN < node <= INT_MAX:",
        "boundary: -2^63 itself is refused",
    ),
    M(
        "LI8",
        "schemas/limits.py",
        "DEFAULT_MAX_EVENT_BYTES = 900 * 1024",
        "DEFAULT_MAX_EVENT_BYTES = 900 * 1000",
        "maxEventBytes defaults to 900 000, not 921 600",
    ),
    M(
        "LI9",
        "schemas/limits.py",
        "elif kind is float and not math.isfinite(node):",
        "elif kind is float and math.isnan(node):",
        "infinities are accepted",
    ),
    M(
        "LI10",
        "schemas/limits.py",
        "MAX_JSON_DEPTH = 128  # below the JSON parsers' own recursion limits, so the error is ours and clear",
        "MAX_JSON_DEPTH = 127  # below the JSON parsers' own recursion limits, so the error is ours and clear",
        "a payload nested exactly 128 levels is refused",
    ),
    M(
        "EN1",
        "pipeline/journal/engine.py",
        "if size > self.max_event_bytes:",
        "if size >= self.max_event_bytes:",
        "a command of exactly maxEventBytes is refused",
    ),
    # --- schemas/events.py, context.py, config.py, requests.py (§1, §1.2, §4.7, §5.1.5) ----------------------
    M(
        "E1",
        "schemas/events.py",
        "IdempotencyKey = Annotated[str, Field(min_length=1, max_length=512)]",
        "IdempotencyKey = Annotated[str, Field(min_length=1, max_length=511)]",
        "an idempotency key of exactly 512 characters is refused",
    ),
    M(
        "E2",
        "schemas/events.py",
        "appendId: Annotated[str, Field(min_length=1, max_length=128)] | None = None",
        "appendId: Annotated[str, Field(min_length=1, max_length=127)] | None = None",
        "an append id of exactly 128 characters is refused",
    ),
    M(
        "E3",
        "schemas/events.py",
        "WORKER_ONLY_TYPES = frozenset({LLM_REQUEST_REQUESTED, LLM_REQUEST_SETTLED, TOKEN_USAGE_REPORTED})",
        "WORKER_ONLY_TYPES = frozenset({LLM_REQUEST_REQUESTED, LLM_REQUEST_SETTLED})",
        "anyone may append usage reports",
    ),
    M(
        "E4",
        "schemas/events.py",
        "EpochMs = Annotated[int, Field(ge=0, strict=True)]",
        "EpochMs = Annotated[int, Field(gt=0, strict=True)]",
        "expiresAt 0 is refused",
    ),
    M(
        "CX1",
        "schemas/context.py",
        '"script": ActorTrust(third_party=True, external=False, integration=False),',
        '"script": ActorTrust(third_party=False, external=False, integration=False),',
        "a script result renders with developer precedence",
    ),
    M(
        "CX2",
        "schemas/context.py",
        '"email": ActorTrust(third_party=True, external=True, integration=True),',
        '"email": ActorTrust(third_party=True, external=False, integration=True),',
        "an email item is agent-loop feedback, not external input",
    ),
    M(
        "CX3",
        "schemas/context.py",
        'if self.llmRequestPolicy is None or self.llmRequestPolicy.behaviour != "dont-trigger-request":',
        'if self.llmRequestPolicy is not None and self.llmRequestPolicy.behaviour != "dont-trigger-request":',
        "a compaction without an explicit policy is accepted",
    ),
    M(
        "CX4",
        "schemas/context.py",
        "size: Annotated[int, Field(ge=0, strict=True)]",
        "size: Annotated[int, Field(gt=0, strict=True)]",
        "an empty file attachment is refused",
    ),
    M(
        "CF1",
        "schemas/config.py",
        "llmRequestDebounceMs: NonNegativeMs = 250",
        "llmRequestDebounceMs: NonNegativeMs = 200",
        "wrong default debounce",
    ),
    M(
        "CF2",
        "schemas/config.py",
        "compactionTriggerFraction: Annotated[float, Field(gt=0, le=1)] = 0.5",
        "compactionTriggerFraction: Annotated[float, Field(gt=0, lt=1)] = 0.5",
        "a compaction fraction of exactly 1 is refused",
    ),
    M(
        "CF3",
        "schemas/config.py",
        "maxAutonomousTurns: Annotated[int, Field(ge=0, strict=True)] = 100",
        "maxAutonomousTurns: Annotated[int, Field(ge=1, strict=True)] = 100",
        "maxAutonomousTurns 0 is refused",
    ),
    M(
        "CF4",
        "schemas/config.py",
        "merged[name] = _deep_merge(merged[name], value)",
        "merged[name] = value",
        "a nested patch replaces the whole object",
    ),
    M(
        "CF5",
        "schemas/config.py",
        "backoffMaxMs: NonNegativeMs = 60_000",
        "backoffMaxMs: NonNegativeMs = 600_000",
        "wrong default backoff cap",
    ),
    M(
        "CF6",
        "schemas/config.py",
        "scriptResultHistoryLimit: Annotated[int, Field(ge=0, strict=True)] = 30_000",
        "scriptResultHistoryLimit: Annotated[int, Field(ge=0, strict=True)] = 3_000",
        "wrong default script result limit",
    ),
    M(
        "RQ1",
        "schemas/requests.py",
        "RECORD_MARGIN_BYTES = 256 * 1024",
        "RECORD_MARGIN_BYTES = 256 * 1000",
        "the llm-requests record limit is not 4 MiB + 256 KiB",
    ),
    # --- processors/files.py: sniffing, filenames, rendering files within the budget (§3.3) ------------------
    M(
        "FI1",
        "processors/files.py",
        '(b"\\x89PNG\\r\\n\\x1a\\n", "image/png"),',
        '(b"\\x89PNG\\r\\n\\x1a", "image/png"),',
        "the PNG signature is checked without its last byte: a file that only starts like a PNG is an image",
    ),
    M(
        "FI2",
        "processors/files.py",
        'if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP":',
        'if len(head) >= 12 and head[:4] == b"RIFF":',
        "any RIFF file (a WAV recording, an AVI video) is sniffed as a WebP image",
    ),
    M(
        "FI3",
        "processors/files.py",
        "_BINARY_CONTROLS = frozenset(range(0x20)) - {0x09, 0x0A, 0x0C, 0x0D, 0x1B}",
        "_BINARY_CONTROLS = frozenset(range(0x20)) - {0x0A, 0x0C, 0x0D, 0x1B}",
        "a tab counts as a binary control character: tab-separated text is application/octet-stream",
    ),
    M(
        "FI4",
        "processors/files.py",
        "TEXT_INLINE_MAX_BYTES = 64 * 1024  # a text file up to this size is inlined as a fenced block",
        "TEXT_INLINE_MAX_BYTES = 65535  # a text file up to this size is inlined as a fenced block",
        "the text-inline limit is 65 535 bytes, not 64 KiB",
    ),
    M(
        "FI5",
        "processors/files.py",
        "if size <= TEXT_INLINE_MAX_BYTES and _budget_fits(size, budget):",
        "if size < TEXT_INLINE_MAX_BYTES and _budget_fits(size, budget):",
        "a text file of exactly 64 KiB is not fetched, so it renders as a hint line",
    ),
    M(
        "FI6",
        "processors/files.py",
        'name = re.split(r"[/\\\\]", name)[-1]',
        'name = re.split(r"/", name)[-1]',
        "a Windows path's backslash-separated folders stay in the filename",
    ),
    M(
        "FI7",
        "processors/files.py",
        "FILENAME_MAX_CHARS = 128",
        "FILENAME_MAX_CHARS = 127",
        "a filename of exactly 128 characters is cut to 127",
    ),
    M(
        "FI8",
        "processors/files.py",
        'return role == "user"',
        'return role != "assistant"',
        "system and developer messages get image and PDF parts",
    ),
    M(
        "FI9",
        "processors/files.py",
        "for position in range(len(slots[index]) - 1, -1, -1):",
        "for position in range(len(slots[index])):",
        "over the budget, a message's first file falls back to its hint line before its later ones",
    ),
    M(
        "FI10",
        "processors/files.py",
        "return budget is None or (size + 2) // 3 * 4 <= budget",
        "return budget is None or size <= budget",
        "the base64 growth is left out: a blob that cannot fit the budget is fetched",
    ),
    M(
        "FI11",
        "processors/files.py",
        'missing = " (unavailable)" if unavailable else ""',
        'missing = ""',
        "a blob the store does not have renders as a plain hint line, without (unavailable)",
    ),
    # --- processors/traceparent.py: the W3C traceparent in record headers (§8) -------------------------------
    M(
        "TP1",
        "processors/traceparent.py",
        "return bool(self.flags & 1)",
        "return bool(self.flags)",
        "any trace flag, not only the sampled bit, reads as sampled",
    ),
    M(
        "TP2",
        "processors/traceparent.py",
        'return f"00-{trace_id:032x}-{span_id:016x}-{flags & 0xFF:02x}".encode()',
        'return f"00-{trace_id:032x}-{span_id:016x}-{flags & 1:02x}".encode()',
        "trace flags other than sampled are dropped when a traceparent is passed on",
    ),
    M(
        "TP3",
        "processors/traceparent.py",
        'return None if parsed is None else f"{parsed.trace_id:032x}"',
        'return None if parsed is None else f"{parsed.trace_id:x}"',
        "a trace id's leading zeros are dropped from its 32 hex digits (a broken trace link)",
    ),
    M(
        "TP4",
        "processors/traceparent.py",
        'if not all(set(p) <= _HEX for p in parts[:4]) or parts[0] == "ff" or (parts[0] == "00" and len(parts) != 4):',
        'if not all(set(p) <= _HEX for p in parts[:4]) or parts[0] == "ff" or len(parts) != 4:',
        "a later version's traceparent with more fields is ignored instead of read by its first four",
    ),
    M(
        "TP5",
        "processors/traceparent.py",
        "if not trace_id or not span_id:",
        "if not trace_id:",
        "an all-zero parent span id is accepted",
    ),
    # --- pipeline/gateway/console/timeline.py: a turn's hops (operations "Web console", "Timeline") --------
    M(
        "TL1",
        "pipeline/gateway/console/timeline.py",
        "skewed = end < start",
        "skewed = end <= start",
        "a hop of 0 ms (both ends in the same millisecond) is marked as clock skew",
    ),
    M(
        "TL2",
        "pipeline/gateway/console/timeline.py",
        "answered = t.answered_ms if t.answered_ms is not None else t.settled_ms",
        "answered = t.answered_ms",
        "without the caller's command timestamp the provider call is left out",
    ),
    M(
        "TL3",
        "pipeline/gateway/console/timeline.py",
        "answered_ms=answered_ms if settlement is not None else None,",
        "answered_ms=answered_ms,",
        "an open request gets an answer from a command timestamp with no settlement journaled",
    ),
    # --- processors/journal.py: next_created_at, the idempotency-key conflict (§1, §5.2) ----------------------
    M(
        "JC1",
        "processors/journal.py",
        "if len(last) != len(stamp):  # not of this format: compare the instants",
        "if len(last) > len(stamp):  # not of this format: compare the instants",
        "a last createdAt shorter than the journal's (no milliseconds) is copied as it is",
    ),
    M(
        "JC2",
        "processors/journal.py",
        "return format_created_at(max(now_ms, epoch_ms(last)))",
        "return format_created_at(now_ms)",
        "after a last createdAt of another width, createdAt goes backwards with the wall clock",
    ),
    M(
        "JC3",
        "processors/journal.py",
        "key_conflict=True,",
        "key_conflict=False,",
        "a platform writer's repeat under its idempotency key is dead-lettered as bad input",
    ),
    # --- pipeline/kafka/offset_progress.py: commit points with work finishing out of order -------------------
    M(
        "OP1",
        "pipeline/kafka/offset_progress.py",
        "self.next = offset + 1",
        "self.next = offset",
        "with every consumed record finished, the last one is not committed (it comes again after a restart)",
    ),
    M(
        "OP2",
        "pipeline/kafka/offset_progress.py",
        "while self.pending:",
        "if self.pending:",
        "the commit point jumps past unfinished work after one finished offset",
    ),
    M(
        "OP3",
        "pipeline/kafka/offset_progress.py",
        "if point is not None and point != partition_progress.committed:",
        "if point is not None:",
        "an unmoved commit point is committed again on every round",
    ),
)

# Which test modules to run first for a mutated file, besides those that import it.
EXTRA_TESTS: dict[str, tuple[str, ...]] = {
    "pipeline/journal/engine.py": ("tests/pipeline/journal/test_partition_engine.py",),
}


# --- the copies --------------------------------------------------------------------------------------


def make_copy(source: Path, parent: Path, index: int) -> Path:
    """A copy of the source tree that a job mutates (with a link to the .venv, for the scripts tests run)."""
    copy = parent / f"repo-{index}"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns(*COPY_EXCLUDES), symlinks=True)
    (copy / ".venv").symlink_to(REPO / ".venv")
    return copy


def environment(copy: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(copy)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_imports_from(copy: Path) -> None:
    probe = subprocess.run(
        [str(PYTHON), "-c", "import processors.journal, schemas.limits; print(processors.journal.__file__)"],
        cwd=copy,
        env=environment(copy),
        capture_output=True,
        text=True,
        check=True,
    )
    imported = Path(probe.stdout.strip())
    if copy not in imported.parents:
        raise SystemExit(f"the copy's modules are not the ones imported: {imported}")


# --- which tests to run first -------------------------------------------------------------------------


def module_name(file: str) -> str:
    return file.removesuffix(".py").replace("/", ".")


def imported_modules(source: str) -> set[str]:
    """Every module a test file imports (`from processors import x` counts as `processors.x`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def targeted_tests(tree: Path, file: str) -> list[str]:
    """The test modules of `tree` that import the mutated module, quick ones first (modules with
    Hypothesis properties last: with `-x` an example-based failure then stops the run early)."""
    wanted = module_name(file)
    found: dict[str, bool] = {}
    for path in sorted((tree / "tests").rglob("test_*.py")):
        source = path.read_text()
        if wanted in imported_modules(source) or str(path.relative_to(tree)) in EXTRA_TESTS.get(file, ()):
            found[str(path.relative_to(tree))] = "hypothesis" in source
    return sorted(found, key=lambda name: (found[name], name))


# --- one mutation ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Result:
    id: str
    file: str
    line: int
    status: str  # caught, survived, or error (the original line was not found)
    stage: str  # targeted or full: the stage that caught it (or the last one run)
    seconds: float
    bug: str
    failure: str = ""  # the first failing test


def locate(text: str, mutation: Mutation) -> int:
    """The index of the mutated line, or -1 when the original is not there as given."""
    matches = [i for i, line in enumerate(text.split("\n")) if line.strip() == mutation.original.strip()]
    return matches[mutation.occurrence - 1] if len(matches) >= mutation.occurrence else -1


def mutate(text: str, index: int, mutation: Mutation) -> str:
    lines = text.split("\n")
    line = lines[index]
    indent = line[: len(line) - len(line.lstrip())]
    lines[index] = indent + mutation.mutated.strip()
    return "\n".join(lines)


class AuditError(RuntimeError):
    """pytest could not run the tests asked for (a usage error): that says nothing about a mutation."""


def run_pytest(
    copy: Path, targets: Sequence[str], timeout_s: float, deselect: Sequence[str] = (), stop_early: bool = True
) -> tuple[bool, list[str]]:
    """(whether the tests passed, the failing tests). A collection error is a failure: a mutation
    that breaks an import is caught."""
    options = [*PYTEST_ARGS] if stop_early else [a for a in PYTEST_ARGS if a != "-x"]
    options += [f"--deselect={node}" for node in deselect]
    try:
        done = subprocess.run(
            [str(PYTHON), "-m", "pytest", *options, *targets],
            cwd=copy,
            env=environment(copy),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return False, [f"timed out after {timeout_s:.0f} s"]
    if done.returncode in (0, 5):  # passed, or nothing collected (the stage has nothing to say)
        return True, []
    if done.returncode in (3, 4):  # pytest's internal and usage errors
        raise AuditError(f"pytest {' '.join(targets)} exited {done.returncode}: {done.stderr.strip()[-400:]}")
    failed = [
        line.split(" ", 1)[1].split(" - ", 1)[0]
        for line in done.stdout.splitlines()
        if line.startswith(("FAILED ", "ERROR "))
    ]
    return False, failed or done.stdout.strip().splitlines()[-1:] or ["?"]


MAX_FLAKY_RETRIES = 3


def fails_unmutated(copy: Path, path: Path, original_text: str, mutated_text: str, node: str, timeout_s: float) -> bool:
    """Whether the test that caught a mutation fails without it too (a flaky test, say one over its
    Hypothesis deadline on a loaded machine): then its failure says nothing about the mutation."""
    if "::" not in node:  # a timeout or a collection error: the mutation's doing
        return False
    path.write_text(original_text)
    try:
        passed, _ = run_pytest(copy, [node], timeout_s)
    finally:
        path.write_text(mutated_text)
    return not passed


def audit(copy: Path, mutation: Mutation, timeout_s: float, full_suite: bool, deselect: Sequence[str]) -> Result:
    path = copy / mutation.file
    original_text = path.read_text()
    index = locate(original_text, mutation)
    started = time.monotonic()
    if index < 0:
        return Result(mutation.id, mutation.file, 0, "error", "-", 0.0, mutation.bug, "original line not found")
    stages: list[tuple[str, list[str]]] = [("targeted", targeted_tests(copy, mutation.file))]
    if full_suite:
        stages.append(("full", ["tests"]))
    mutated_text = mutate(original_text, index, mutation)
    path.write_text(mutated_text)
    flaky: list[str] = []  # tests that failed without the mutation too: left out of this mutation's runs
    try:
        stage = "-"
        for stage, targets in stages:
            if not targets:
                continue
            for _ in range(MAX_FLAKY_RETRIES + 1):
                passed, failures = run_pytest(copy, targets, timeout_s, [*deselect, *flaky])
                if passed or not fails_unmutated(copy, path, original_text, mutated_text, failures[0], timeout_s):
                    break
                flaky.append(failures[0])
            if not passed:
                seconds = time.monotonic() - started
                first = failures[0][:160]
                return Result(mutation.id, mutation.file, index + 1, "caught", stage, seconds, mutation.bug, first)
        seconds = time.monotonic() - started
        note = f"flaky without the mutation, left out: {', '.join(flaky)}" if flaky else ""
        return Result(mutation.id, mutation.file, index + 1, "survived", stage, seconds, mutation.bug, note)
    finally:
        path.write_text(original_text)


# --- the run ----------------------------------------------------------------------------------------------


def baseline(copy: Path, timeout_s: float) -> list[str]:
    """The tests that fail on the unmutated copy (someone's work in progress, say): every mutation
    run leaves them out, so that a failure is the mutation's. Stops when too much fails to judge."""
    passed, failures = run_pytest(copy, ["tests"], timeout_s, stop_early=False)
    if passed:
        return []
    if len(failures) > 10 or any("::" not in failure for failure in failures):
        raise SystemExit(f"the unmutated copy fails the broker-free suite: {failures[:10]}; fix that first")
    print(f"baseline: {len(failures)} tests fail without a mutation and are left out of every run:")
    for failure in failures:
        print(f"  {failure}")
    return failures


def print_table(results: Sequence[Result]) -> None:
    print(f"{'id':<5} {'status':<9} {'stage':<9} {'secs':>5}  {'where':<38} bug / first failure")
    for r in results:
        where = f"{r.file}:{r.line}"
        print(f"{r.id:<5} {r.status:<9} {r.stage:<9} {r.seconds:5.0f}  {where:<38} {r.bug}")
        if r.failure:
            print(f"{'':<70} {r.failure}")
    counted = [r for r in results if r.status != "error"]
    caught = sum(r.status == "caught" for r in counted)
    errors = len(results) - len(counted)
    share = 100 * caught / len(counted) if counted else 0.0
    not_applied = f"; {errors} not applied" if errors else ""
    print(f"\ncaught {caught} of {len(counted)} mutations ({share:.1f} %){not_applied}")
    survivors = [r.id for r in counted if r.status == "survived"]
    if survivors:
        print("survived: " + " ".join(survivors))


def write_results(path: Path, done: dict[str, Result]) -> None:
    order = {m.id: index for index, m in enumerate(MUTATIONS)}
    ordered = sorted(done.values(), key=lambda r: order.get(r.id, len(order)))
    path.write_text(json.dumps([asdict(r) for r in ordered], indent=2))


def selected(ids: Sequence[str] | None) -> list[Mutation]:
    if not ids:
        return list(MUTATIONS)
    known = {m.id: m for m in MUTATIONS}
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise SystemExit(f"unknown mutation ids: {unknown}")
    return [known[i] for i in ids]


def check_lines(source: Path, mutations: Sequence[Mutation]) -> int:
    ids = [m.id for m in MUTATIONS]
    duplicates = {i for i in ids if ids.count(i) > 1}
    problems = [f"{i}: id used twice" for i in sorted(duplicates)]
    for m in mutations:
        if locate((source / m.file).read_text(), m) < 0:
            problems.append(f"{m.id}: {m.file}: original line not found: {m.original}")
        if m.original.strip() == m.mutated.strip():
            problems.append(f"{m.id}: the mutated line is the original")
    for problem in problems:
        print(problem)
    print(f"{len(mutations)} mutations, {len(problems)} problems")
    return 1 if problems else 0


def copies(source: Path, parent: Path, count: int) -> Iterator[Path]:
    for index in range(count):
        yield make_copy(source, parent, index)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="copies tested in parallel (default 2)")
    parser.add_argument("--only", nargs="*", metavar="ID", help="run only these mutations")
    parser.add_argument("--source", type=Path, default=REPO, help="the tree to copy (default: this repository)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per pytest run (a timeout is caught)")
    parser.add_argument("--targeted-only", action="store_true", help="skip the whole-suite stage (faster, pessimistic)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    parser.add_argument("--deselect", action="append", default=[], metavar="NODE", help="leave this test out")
    parser.add_argument("--check", action="store_true", help="only check that every original line exists")
    parser.add_argument("--json", type=Path, help="also write the results to this file (as they come)")
    parser.add_argument("--resume", action="store_true", help="keep the results already in --json, run the rest")
    args = parser.parse_args(argv)

    source = args.source.resolve()
    mutations = selected(args.only)
    if args.check:
        return check_lines(source, mutations)
    if check_lines(source, mutations):
        print("(mutations whose line is missing are reported as not applied)")
    done: dict[str, Result] = {}
    if args.resume:
        if args.json is None or not args.json.exists():
            raise SystemExit("--resume needs the --json file of an earlier run")
        done = {r["id"]: Result(**r) for r in json.loads(args.json.read_text()) if r["id"] in {m.id for m in mutations}}
        print(f"resuming: {len(done)} results from {args.json}")
    jobs = max(1, min(args.jobs, len(mutations)))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="agentstream-mutations-") as parent:
        pool_of_copies: queue.Queue[Path] = queue.Queue()
        for copy in copies(source, Path(parent), jobs):
            pool_of_copies.put(copy)
        first = pool_of_copies.get()
        check_imports_from(first)
        deselect: list[str] = list(args.deselect)
        if not args.no_baseline:
            print("baseline: the broker-free suite on the unmutated copy ...", flush=True)
            deselect += baseline(first, args.timeout)
        pool_of_copies.put(first)

        lock = threading.Lock()

        def run_one(mutation: Mutation) -> Result:
            copy = pool_of_copies.get()
            try:
                result = audit(copy, mutation, args.timeout, not args.targeted_only, deselect)
            finally:
                pool_of_copies.put(copy)
            print(f"{result.id:<5} {result.status:<9} {result.stage:<9} {result.seconds:5.0f} s", flush=True)
            with lock:  # written as results come, so an interrupted run can be resumed
                done[result.id] = result
                if args.json is not None:
                    write_results(args.json, done)
            return result

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(run_one, [m for m in mutations if m.id not in done]))
    results = [done[m.id] for m in mutations]
    print(f"\n{len(mutations)} mutations in {time.monotonic() - started:.0f} s\n")
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
