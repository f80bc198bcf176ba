"""The checker: behaviour §5.2 on the committed journal, read after each scenario.

- per stream the offsets are 1..n, each once (no gap, no offset twice);
- every acknowledged append (an outcome from the journal to the client, an append id from the
  gateway) is journaled exactly once, every other one at most once (counted by its marker);
- `replay --verify` finds the live rows equal to the journal's;
- every request settles once, no answer twice, no agent left busy (tests/support/turns.py);
- the dead-letter topic holds exactly the invalid commands sent, each once.

It also measures the recovery: the first append journaled after the heal, and the longest stretch
of the scenario in which nothing was journaled.
"""

from __future__ import annotations

import itertools
import re
import shutil
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from pipeline.journal.replay import replay
from pipeline.journal.replay_store import FAUST_OFFSET_KEY, live_store_paths, open_rows
from pipeline.journal.replay_verify import verify
from pipeline.kafka.read import read_ranges, watermarks
from pipeline.settings import Settings
from schemas.events import CONTEXT_ADDED, decode_event
from tests.faults.load import INVALID_STREAM, Generator
from tests.support.turns import audit_turns, unanswered

MARKER = re.compile(r"m:((?:client|gateway|agent)-\d+)")


def read_committed(settings: Settings, topic: str, timeout: float = 120) -> list[Any]:
    """Every committed record of `topic` up to its end as of the call; raises if not read to the end."""
    consumer = Consumer(
        {
            **settings.kafka_consumer_config(),
            "group.id": f"fault-checker-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        ranges = {p: watermarks(consumer, TopicPartition(topic, p)) for p in partitions}
        records = [m for batch in read_ranges(consumer, topic, ranges, timeout=timeout) for m in batch]
        positions = consumer.position([TopicPartition(topic, p) for p, (low, high) in ranges.items() if high > low])
        behind = [tp.partition for tp in positions if tp.offset < ranges[tp.partition][1]]
        if behind:
            raise AssertionError(f"{topic}: partitions {behind} not read to their committed end in {timeout:g}s")
        return records
    finally:
        consumer.close()


@dataclass
class Verdict:
    scenario: str
    problems: list[str] = field(default_factory=list)
    offending: list[str] = field(default_factory=list)  # markers to show with the history
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def _journal(settings: Settings) -> tuple[dict[str, list[Any]], list[Any]]:
    events: dict[str, list[Any]] = defaultdict(list)
    records = read_committed(settings, settings.topic_prefix + "agent-journal")
    for message in sorted(records, key=lambda m: (m.partition(), m.offset())):
        event = decode_event(message.value())
        events[event.streamPath].append(event)
    return events, records


def wait_for_turns(settings: Settings, agents: list[str], timeout: float) -> dict[str, list[Any]]:
    deadline = time.monotonic() + timeout
    events, _ = _journal(settings)
    while unanswered(events, agents) and time.monotonic() < deadline:
        time.sleep(1)
        events, _ = _journal(settings)
    return events


def check(
    scenario: str,
    settings: Settings,
    load: Generator,
    agents: list[str],
    worker_dirs: list[Path],
    scratch: Path,
    window: tuple[float, float, float],
) -> Verdict:
    """The verdict on the committed journal; `window`: (fault start, heal, end) wall-clock seconds."""
    verdict = Verdict(scenario)
    events, records = _journal(settings)

    # Offsets 1..n per stream, each once.
    for path, stream in events.items():
        offsets = [e.offset for e in stream]
        twice = sorted(o for o, n in Counter(offsets).items() if n > 1)
        if twice:
            verdict.problems.append(f"{path}: offsets journaled twice {twice[:5]}")
        elif offsets != list(range(1, len(offsets) + 1)):
            gaps = sorted(set(range(1, max(offsets) + 1)) - set(offsets))[:5]
            verdict.problems.append(f"{path}: offsets not 1..{len(offsets)} (missing {gaps})")

    # Every append by its marker: acknowledged exactly once, the rest at most once.
    journaled: Counter[str] = Counter()
    journaled_at: dict[str, float] = {}
    for stream in events.values():
        for event in stream:
            if event.type == CONTEXT_ADDED and event.payload.role == "user":
                match = MARKER.search(str(event.payload.content))
                if match:
                    journaled[match.group(1)] += 1
                    journaled_at[match.group(1)] = datetime.fromisoformat(
                        event.createdAt.replace("Z", "+00:00")
                    ).timestamp()
    sent = dict(load.sent)
    for marker, count in journaled.items():
        if marker not in sent:
            verdict.problems.append(f"{marker}: journaled but never sent")
            verdict.offending.append(marker)
        elif count > 1:
            verdict.problems.append(f"{marker} ({sent[marker].door}): journaled {count} times")
            verdict.offending.append(marker)
    lost = [s for s in sent.values() if s.acknowledged and journaled[s.marker] == 0]
    for s in lost[:10]:
        verdict.problems.append(
            f"{s.marker} ({s.door}, {s.path}, append id {s.append_id}): acknowledged, not journaled"
        )
        verdict.offending.append(s.marker)
    if len(lost) > 10:
        verdict.problems.append(f"... {len(lost) - 10} more acknowledged appends not journaled")

    # Turns: every request settles once, no agent left busy.
    audit = audit_turns(events, agents)
    for kind in ("settled_twice", "answered_twice", "unsettled"):
        found = getattr(audit, kind)
        if found:
            verdict.problems.append(f"turns: {kind.replace('_', ' ')}: {found[:5]}")
    busy = unanswered(events, agents)
    if busy:
        verdict.problems.append(f"turns: agents still busy or unanswered: {busy[:5]}")

    # The dead-letter topic: exactly the invalid commands, each once.
    dead = read_committed(settings, settings.topic_prefix + "agent-dlq")
    dead_markers = Counter()
    for message in dead:
        value = message.value() or b""
        if message.key() == INVALID_STREAM.encode() and value.startswith(b"not json "):
            dead_markers[value.removeprefix(b"not json ").decode()] += 1
        else:
            reason = dict(message.headers() or ()).get("reason", b"").decode()[:200]
            verdict.problems.append(f"dead-lettered though valid: {message.key()!r}: {reason}")
    for marker in load.invalid_sent:
        if dead_markers[marker] != 1:
            verdict.problems.append(f"invalid command {marker} dead-lettered {dead_markers[marker]} times, not once")

    # replay --verify: the live rows of each partition's current owner equal a fold of the journal.
    differences = replay_verify(settings, worker_dirs, scratch)
    verdict.problems += [f"replay --verify: {d}" for d in differences[:10]]

    # Recovery: the first append journaled after the heal; the longest silence of the scenario.
    fault, heal, end = window
    times = sorted(t for t in journaled_at.values() if fault - 5 <= t <= end)
    after = [t for t in times if t >= heal]
    verdict.figures = {
        "journal records": len(records),
        "appends sent": len(sent),
        "acknowledged": sum(s.acknowledged for s in sent.values()),
        "unacknowledged journaled": sum(1 for s in sent.values() if not s.acknowledged and journaled[s.marker]),
        "requests": audit.requests,
        "recovered after heal (s)": round(after[0] - heal, 2) if after else None,
        "longest silence (s)": round(max((b - a for a, b in itertools.pairwise(times)), default=0), 2),
    }
    return verdict


def replay_verify(settings: Settings, worker_dirs: list[Path], scratch: Path) -> list[str]:
    """Replay the journal and compare each partition with the live store of its current owner: of
    the workers' stores, the one furthest along Faust's changelog (a store a worker lost keeps
    stale rows)."""
    owners: dict[int, Path] = {}
    best: dict[int, int] = {}
    for data_dir in worker_dirs:
        for partition, path in live_store_paths(settings.model_copy(update={"data_dir": data_dir})).items():
            if not path.exists():
                continue
            db = open_rows(path, read_only=True)
            try:
                raw = db.get(FAUST_OFFSET_KEY)
            finally:
                db.close()
            offset = int(bytes(raw)) if raw is not None else -1
            if offset > best.get(partition, -2):
                best[partition], owners[partition] = offset, path
    out = scratch / f"replay-{uuid.uuid4().hex[:6]}"
    settings = settings.model_copy(update={"data_dir": scratch / "no-live-store"})
    try:
        replay(settings, out, progress=False)
        return [str(d) for d in verify(out, owners)]
    finally:
        shutil.rmtree(out, ignore_errors=True)
