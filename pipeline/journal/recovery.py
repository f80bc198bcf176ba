"""Taking a partition over: what the new owner re-folds and publishes again, in one place
(docs/architecture.md, "Recovering").

In order, for partition p, once Faust has restored its rows and the group's committed positions
of p are stable (no earlier owner's transaction over p is open):

1. `read_journal_tail`: re-fold the journal past the rows' recorded position (`refold`), and
   publish again what a previous owner may have died before publishing: the `journaled` result of
   every re-folded event with an append id, the commands agent-run code calls for;
2. `wake_streams_with_work`: hand every stream with a pending trigger or an open request to the
   scheduler, and recount the turn gauges;
3. (the worker reads the commands that waited at recovery)
4. `open_work`: the call record of every open request (rendered exactly as first sent), a cancel
   when it was interrupted, every compaction not yet applied;
5. `republish_script_runs`: the `script-runs` record of every unsettled run, its code read back
   from the journal.

Every record published again is one the live path produced or would have produced, byte for byte,
so a repeat is a duplicate by its idempotency key. `refold` is also what replay's fold must equal.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import orjson

from pipeline.journal import records
from pipeline.journal.streams import StreamEntry
from pipeline.kafka.journal_reader import JournalReader
from pipeline.kafka.read import read_ranges_async
from processors import row_codec, rows
from processors.journal import apply_event, payload_hash
from processors.state import ScriptRun
from schemas.capabilities import SCRIPT_RUN_REQUESTED
from schemas.config import AgentConfig
from schemas.events import EnvelopeError, InvalidPayloadEvent, decode_event
from schemas.outcomes import AppendOutcome
from topics.headers import H_APPEND_ID, H_SOURCE_OFFSET, H_SOURCE_TOPIC, INTERNAL

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer

    from pipeline.journal.engine import PartitionEngine

log = logging.getLogger("agentstream.journal")

Record = tuple[str, bytes, bytes]  # (topic, key, value)


class Recovery:
    """The recovery of one partition's engine (steps in the module docstring)."""

    def __init__(self, engine: PartitionEngine) -> None:
        self.engine = engine

    async def read_journal_tail(
        self, consumer: AIOKafkaConsumer, journal_topic: str, *, at_least: int = -1, timeout_s: float = 60.0
    ) -> int:
        """Step 1: read the journal partition (committed records only) from the rows' recorded
        position to its last stable offset, re-fold it and commit what it stages. Returns the
        number of events re-folded.

        `at_least`: a journal offset the previous owner's last committed transaction reached (the
        group's committed positions name it). Its commit marker may still be on its way to the
        journal partition when the positions are already stable, so the read waits until the last
        stable offset is past it."""
        from aiokafka.structs import TopicPartition

        engine = self.engine
        started = time.monotonic()
        position = engine.checkpoints.journal_position
        refolded = 0
        tp = TopicPartition(journal_topic, engine.partition)
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]  # read_committed: the last stable offset
        while end <= at_least:
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(
                    f"journal partition {engine.partition}: the last stable offset stayed at {end}, "
                    f"before offset {at_least} of the last owner's committed transaction, for {timeout_s:.0f}s"
                )
            await asyncio.sleep(0.02)
            end = (await consumer.end_offsets([tp]))[tp]
        async for batch in read_ranges_async(consumer, {tp: (position + 1, end)}):
            outcomes: list[Record] = []
            refolded += self.refold([(r.offset, r.value, dict(r.headers or ())) for r in batch], outcomes)
            for topic, key, value in outcomes:
                engine.checkpoints.publish(topic, key, value)
            await engine.checkpoints.flush()
        await engine.checkpoints.flush()  # the format row a new store got on open, even with nothing to re-fold
        log.info(
            "partition %d: re-folded %d journal events past position %d in %.2fs",
            engine.partition,
            refolded,
            position,
            time.monotonic() - started,
        )
        return refolded

    def refold(
        self,
        tail: Iterable[tuple[int, bytes, dict[str, bytes]]],
        outcomes: list[tuple[str, bytes, bytes]] | None = None,
    ) -> int:
        """Re-fold journal records (kafka offset, value, headers) past the recorded position.

        Events a stream's rows already hold are skipped; the rest are folded and stored exactly as
        the live path would have stored them. With `outcomes`, what the previous owner may have
        died before publishing is added to it: the result record of every re-folded event that a
        client may wait for, and the commands agent-run code calls for (a run request, the
        too-many-blocks feedback, a script result). Replay passes none.
        """
        refolded = 0
        position = None
        for kafka_offset, value, headers in tail:
            position = kafka_offset
            try:
                event = decode_event(value)
            except EnvelopeError as error:
                log.error(
                    "journal partition %d offset %d is not an event: %s", self.engine.partition, kafka_offset, error
                )
                continue
            entry = self.engine.streams.get(event.streamPath)
            if event.offset <= entry.state.cursor:
                continue
            internal = headers.get(H_SOURCE_TOPIC) == INTERNAL
            sources = entry.sources.advanced(internal, int(headers.get(H_SOURCE_OFFSET, b"-1")))
            append_id = headers[H_APPEND_ID].decode() if H_APPEND_ID in headers else None
            digest = None
            if event.idempotencyKey is not None:
                digest = payload_hash(event.type, orjson.loads(value)["payload"])
            if isinstance(event, InvalidPayloadEvent):
                log.error(
                    "journal @%d of %s has an invalid payload (skipped): %s",
                    event.offset,
                    event.streamPath,
                    event.reason,
                )
            changed = apply_event(
                entry.state,
                event,
                sources,
                append_id,
                digest,
                window=self.engine.append_id_window,
                read=self.engine.streams.read,
            )
            entry.sources = sources
            for key, row_value in changed:
                self.engine.checkpoints.open.put(key, row_value)
            if outcomes is not None:
                if append_id is not None:
                    outcome = AppendOutcome.encode_trusted(append_id, event.streamPath, "journaled", event.offset)
                    outcomes.append((self.engine.topics.results, event.streamPath.encode(), outcome))
                # Folded in journal order, the state is exactly the one the live path decided with,
                # so these are the commands it produced (or never got to): repeats are duplicates.
                outcomes.extend(self.engine.follow_ups.script_commands(entry.state, event))
            refolded += 1
        if position is not None:
            self.engine.checkpoints.journal_position = max(self.engine.checkpoints.journal_position, position)
            self.engine.checkpoints.open.put(
                rows.position_key(self.engine.partition),
                row_codec.encode_offset(self.engine.checkpoints.journal_position),
            )
        return refolded

    def wake_streams_with_work(self) -> None:
        """After recovery (a restart or a rebalance): wake every stream with a pending trigger or an
        open request, and count the gauges from the rows."""
        self.engine.open_requests = self.engine.paused_agents = 0
        for _, value in self.engine.streams.scan(rows.META + rows.SEP):
            meta = row_codec.decode_meta_row(value)
            self.engine.open_requests += meta.open is not None
            self.engine.paused_agents += meta.paused
            if meta.pending is not None or meta.open is not None:
                self.engine.wake(meta.path, 0)

    def open_work(self) -> list[tuple[str, bytes, bytes]]:
        """What open requests still need published, once the partition has read the commands that
        were waiting when it was recovered (the worker calls it then).

        The worker may have died after journaling a request, an interrupt or a usage report but
        before its follow-up reached `llm-requests`. So every open request's call record goes out
        again (rendered exactly as first sent), with a cancel if it was interrupted, and every
        compaction not yet applied. Waiting for the commands first matters: a settlement the caller
        appended while no worker ran is among them, and a call record republished before it is
        journaled would have the caller answer R twice. Repeats that remain are harmless: the caller
        skips what it has handled, and its outcomes carry idempotency keys derived from R."""
        found: list[tuple[str, bytes, bytes]] = []
        for _, value in self.engine.streams.scan(rows.META + rows.SEP):
            meta = row_codec.decode_meta_row(value)
            if meta.open is not None or meta.over_threshold is not None:
                found.extend(self._open_work(self.engine.streams.get(meta.path)))  # the current state decides
        return found

    def _open_work(self, entry: StreamEntry) -> list[tuple[str, bytes, bytes]]:
        state = entry.state
        path = state.stream_path
        assert path is not None
        key = path.encode()
        found: list[tuple[str, bytes, bytes]] = []
        request = state.open
        if request is not None:
            messages = self.engine.follow_ups.request_messages(entry, request.offset, request.model)
            if messages is None:
                log.warning(
                    "%s: the call record of @%d cannot be rendered again (history compacted since, or state "
                    "from an older version); the request expires at %d",
                    path,
                    request.offset,
                    request.expiresAt,
                )
            else:
                found.append(
                    (
                        self.engine.topics.llm_requests,
                        key,
                        records.call_record(state, messages, self.engine.follow_ups.transport),
                    )
                )
            if request.interruptedBy is not None:
                found.append((self.engine.topics.llm_requests, key, records.cancel_record(path, request.offset)))
        if state.over_threshold is not None:
            compact = self.engine.follow_ups.compaction_record(entry, state.over_threshold.offset)
            if compact is not None:
                found.append((self.engine.topics.llm_requests, key, compact))
        return found

    def unsettled_script_runs(self) -> list[tuple[str, ScriptRun, AgentConfig]]:
        """Every execution requested and not settled in this partition, with its agent's
        configuration: (stream path, run, config). The worker publishes their `script-runs` records
        again after recovery (their code is read back from the journal)."""
        runs: list[tuple[str, ScriptRun, AgentConfig]] = []
        for _, value in self.engine.streams.scan(rows.META + rows.SEP):
            meta = row_codec.decode_meta_row(value)
            if meta.scripts:
                state = self.engine.streams.get(meta.path).state
                runs.extend((meta.path, run, state.config) for run in state.scripts.values())
        return runs

    async def republish_script_runs(self, events: JournalReader) -> int:
        """Step 5: publish the `script-runs` record of every unsettled run again. The previous owner
        may have died between journaling a run request and publishing its record, and the
        capability host learns of a run from that record only; a host that has the run already finds
        its start journaled and never runs it twice. Returns how many went out."""
        engine = self.engine
        published = 0
        for path, run, config in self.unsettled_script_runs():
            event = await asyncio.to_thread(events.event, path, run.offset)
            if not engine.active:
                break  # revoked: the next owner does it
            try:
                if event is None or event.get("type") != SCRIPT_RUN_REQUESTED:
                    raise ValueError(f"the journal has no {SCRIPT_RUN_REQUESTED} at {path}@{run.offset}")
                payload = event["payload"]
                value = records.script_run_record(
                    path,
                    run.offset,
                    event["createdAt"],
                    payload["code"],
                    run.executionId,
                    run.expiresAt,
                    config,
                )
            except (ValueError, KeyError, TypeError) as error:
                log.error("%s: run %s cannot be published again: %s", path, run.executionId, error)
                continue
            engine.checkpoints.publish(engine.topics.script_runs, path.encode(), value)
            published += 1
        return published
