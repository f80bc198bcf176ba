"""Journaling one append command (docs/behaviour.md §1): pure decisions, no Kafka.

Given a stream's state, a command and a way to read existing rows, decide: journal it (assigning
the next gapless offset and `createdAt`), recognise it as a duplicate, or reject it with a reason.
The processor shell does the I/O; the catch-up after a crash re-applies journaled events through
the same `apply_event`, so live and recovered rows are written by one code path.
"""

from __future__ import annotations

import functools
import hashlib
import time
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from processors import dedupe, grants, idempotency_keys, row_codec, rows
from processors.dedupe import RowReader
from processors.reducer import epoch_ms, fold
from processors.state import AgentState, SourceOffsets
from schemas.events import EVENT_VALIDATORS, AppendCommand, describe_validation_error, validate_other_event
from schemas.routing import AGENT_SUBSCRIBED


@dataclass(slots=True)  # not frozen: one per journaled command, and a frozen init costs a call per field
class Journaled:
    event: Any  # the typed journal event
    record: bytes  # its JSON, as written to agent-journal
    rows: list[rows.Row]


@dataclass(slots=True, frozen=True)
class Duplicate:
    offset: int
    reason: str


@dataclass(slots=True, frozen=True)
class Rejected:
    reason: str
    # The idempotency key already names another body. From a platform writer (the caller, the
    # capability host, the router) that is work repeated after a restart or a pause whose first
    # outcome is journaled: the journal keeps the first and the repeat is not bad input
    # (docs/behaviour.md §5.2, "Other writers").
    key_conflict: bool = False


Outcome = Journaled | Duplicate | Rejected


@functools.lru_cache(maxsize=8)
def format_created_at(epoch_ms: int) -> str:
    # Cached: a busy worker journals some 20 events per millisecond, all stamped alike.
    seconds, millis = divmod(epoch_ms, 1000)
    return _second(seconds) + f".{millis:03d}Z"


@functools.lru_cache(maxsize=4)
def _second(seconds: int) -> str:
    # Events of one second share their prefix; strftime per event was a visible cost.
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def payload_hash(event_type: str, payload: Any) -> str:
    canonical = orjson.dumps([event_type, payload], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()[:32]


def journal_command(
    state: AgentState,
    command: AppendCommand,
    *,
    now_ms: int,
    sources: SourceOffsets,
    read: RowReader,
    append_id_window: int = dedupe.DEFAULT_APPEND_ID_WINDOW,
    sealed_later: bool = False,
) -> Outcome:
    """`sealed_later`: leave the stream's item and metadata rows out of the outcome; the caller
    writes them once for many events (`stream_rows`), as the journal worker does per checkpoint."""
    path = command.streamPath
    append_key = None
    if command.appendId is not None:
        append_key = rows.append_id_key(path, command.appendId)
        existing = read(append_key)
        if existing is not None:
            return Duplicate(row_codec.decode_offset(existing), f"append id {command.appendId!r} was already journaled")
    key = command.idempotencyKey
    digest = None if key is None else payload_hash(command.type, command.payload)
    if key is not None:
        existing = read(rows.idempotency_key(path, key))
        if existing is not None:
            offset, _, existing_digest = row_codec.decode_idempotency(existing)
            if existing_digest == digest:
                return Duplicate(offset, f"idempotency key {key!r} already names this event")
            return Rejected(
                f"idempotency key {key!r} already names a different event at @{offset}; "
                "an idempotency key names one exact event forever: use a new key for a new body",
                key_conflict=True,
            )
    if key is not None or command.type == AGENT_SUBSCRIBED:  # neither check applies to the rest (most)
        execution = idempotency_keys.own_script_call_execution(key)
        if execution is not None and execution not in state.scripts:
            # A host that stalled past its session may wake in a run another host has already settled
            # (as crashed): its later calls must not land after the settlement.
            return Rejected(
                f"script run {execution!r} is not running in {path} (settled, or never requested): "
                "a script's calls are accepted only until its run is settled"
            )
        refusal = grants.subscription_refusal(path, state.created, state.config.grants, command)
        if refusal is not None:
            return Rejected(refusal)
    envelope: dict[str, Any] = {
        "streamPath": path,
        "offset": state.cursor + 1,
        "type": command.type,
        "payload": command.payload,
    }
    if key is not None:
        envelope["idempotencyKey"] = key
    envelope["createdAt"] = next_created_at(now_ms, state.last_event_created_at)
    try:
        event = EVENT_VALIDATORS.get(command.type, validate_other_event)(envelope)
    except ValidationError as error:
        return Rejected(describe_validation_error(error, command.type))
    record = orjson.dumps(envelope)
    if sealed_later:
        if state.changes is None:
            state.changes = {}
        fold(state, event)
        changed = dedupe.dedupe_rows(
            path,
            event.offset,
            event.type,
            key,
            digest,
            command.appendId,
            window=append_id_window,
            read=read,
            append_key=append_key,
        )
    else:
        changed = apply_event(state, event, sources, command.appendId, digest, window=append_id_window, read=read)
    return Journaled(event, record, changed)


def next_created_at(now_ms: int, last: str | None) -> str:
    """The createdAt of a stream's next event: now, but never before its last event's, whatever the
    wall clock does. Every createdAt is written by `format_created_at` (fixed width, UTC), so two
    compare as strings in time order and the last one need not be parsed on this hot path."""
    stamp = format_created_at(now_ms)
    if last is None or stamp >= last:
        return stamp
    if len(last) != len(stamp):  # not of this format: compare the instants
        return format_created_at(max(now_ms, epoch_ms(last)))
    return last


def apply_event(
    state: AgentState,
    event: Any,
    sources: SourceOffsets,
    append_id: str | None,
    digest: str | None,
    *,
    window: int,
    read: RowReader,
) -> list[rows.Row]:
    """Fold a journaled event and return every row it changes (items, dedupe rows, metadata).

    `sources` are the stream's command-topic offsets including this event's command;
    `digest` is `payload_hash` of the event's type and raw payload, required with an idempotency key;
    `window` and `read` keep the append-id window (`processors.dedupe`).
    """
    path = event.streamPath
    if state.changes is None:
        state.changes = {}
    fold(state, event)
    dedupe_rows = dedupe.dedupe_rows(
        path, event.offset, event.type, event.idempotencyKey, digest, append_id, window=window, read=read
    )
    own = stream_rows(state, sources)
    return own[:-1] + dedupe_rows + own[-1:]  # the metadata row last


def stream_rows(state: AgentState, sources: SourceOffsets) -> list[rows.Row]:
    """The stream's item rows changed since they were last written, and its metadata row (last)."""
    path = state.stream_path
    changed: list[rows.Row] = list(row_codec.change_rows(path, state.drain_changes()))
    changed.append((rows.meta_key(path), row_codec.encode_meta(state, sources)))
    return changed
