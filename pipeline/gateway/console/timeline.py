"""A turn's waterfall: where the time of one request went, from the journal's own timestamps
(docs/operations.md, "Web console", "Timeline"). Pure: no I/O, no clock, no tracing backend.

The points come from what the journal already records: the `createdAt` of the trigger, of the
request, of its settlement and of the script-run events; the settlement's `durationMs` (the
caller's own measure of the provider call); and the Kafka timestamps of the two commands behind
the trigger and the settlement (when the client appended, when the caller answered), which the
console reads back by the journal record's `source-offset` header. Each clock is another
process's: a hop that comes out negative (clock skew between hosts) is drawn as zero and marked.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

TRACEPARENT = "traceparent"


@dataclass(frozen=True, slots=True)
class TurnTimes:
    """What is known about one turn, epoch milliseconds; None: not known (yet)."""

    request_offset: int
    scheduled_ms: int  # the request's createdAt
    trigger_offset: int | None = None
    appended_ms: int | None = None  # the trigger command's Kafka timestamp (its producer's clock)
    trigger_journaled_ms: int | None = None
    first_token_ms: int | None = None  # not journaled today: a streamed answer's first chunk
    answered_ms: int | None = None  # the settlement command's Kafka timestamp (the caller's clock)
    call_ms: int | None = None  # the settlement's durationMs
    settled_ms: int | None = None  # the settlement's createdAt
    status: str | None = None
    script_requested_ms: int | None = None
    script_started_ms: int | None = None
    script_settled_ms: int | None = None
    script_run_ms: int | None = None  # the script settlement's durationMs (time in the sandbox)
    script_status: str | None = None


@dataclass(frozen=True, slots=True)
class Hop:
    name: str
    start_ms: int
    end_ms: int
    process: str  # who spends this time
    skewed: bool = False  # its end came before its start (another host's clock): drawn as zero

    @property
    def duration_ms(self) -> int:
        return self.end_ms - self.start_ms


@dataclass(frozen=True, slots=True)
class Point:
    name: str
    at_ms: int
    offset: int | None  # the journal event that records it, if one does


@dataclass(frozen=True, slots=True)
class Timeline:
    hops: tuple[Hop, ...]
    points: tuple[Point, ...]

    @property
    def start_ms(self) -> int:
        return min(p.at_ms for p in self.points)

    @property
    def end_ms(self) -> int:
        return max(p.at_ms for p in self.points)


def iso_ms(created_at: str) -> int:
    """Epoch ms of a journal `createdAt` (`YYYY-MM-DDTHH:MM:SS.mmmZ`, docs/behaviour.md §1)."""
    return int(datetime.fromisoformat(created_at.replace("Z", "+00:00")).timestamp() * 1000)


def turn_timeline(t: TurnTimes) -> Timeline:
    """The hops of one turn in the order they happen: appended → journaled → scheduled → call
    started → (first token →) answered → journaled, then the script run when the answer ran code.
    A hop whose ends are not both known is left out; so is everything after an open request."""
    points: list[Point] = []
    hops: list[Hop] = []

    def point(name: str, at: int | None, offset: int | None = None) -> int | None:
        if at is not None:
            points.append(Point(name, at, offset))
        return at

    def hop(name: str, start: int | None, end: int | None, process: str) -> None:
        if start is None or end is None:
            return
        skewed = end < start
        hops.append(Hop(name, start, start if skewed else end, process, skewed))

    appended = point("appended", t.appended_ms, None)
    journaled = point("trigger journaled", t.trigger_journaled_ms, t.trigger_offset)
    scheduled = point("scheduled", t.scheduled_ms, t.request_offset)
    # The caller measures the call from its start to the answer; it appends the settlement at
    # once, so the command's timestamp ends the call. Without it the journal's createdAt bounds it.
    answered = t.answered_ms if t.answered_ms is not None else t.settled_ms
    started = None if answered is None or t.call_ms is None else answered - t.call_ms
    point("call started", started)
    first = point("first token", t.first_token_ms)
    point("answered", t.answered_ms)
    settled = point(f"settled ({t.status})" if t.status else "settled", t.settled_ms)

    hop("appended → journaled", appended, journaled, "client or gateway → journal worker")
    hop("journaled → scheduled", journaled, scheduled, "journal worker (debounce, scheduler)")
    hop("scheduled → call started", scheduled, started, "llm-requests → LLM caller (queue)")
    if first is not None:
        hop("call started → first token", started, first, "provider")
        hop("first token → answered", first, answered, "provider")
    else:
        hop("provider call", started, answered, "provider")
    if t.answered_ms is not None:
        hop("answered → journaled", t.answered_ms, settled, "LLM caller → journal worker")

    requested = point("script requested", t.script_requested_ms)
    run_started = point("script started", t.script_started_ms)
    label = f"script settled ({t.script_status})" if t.script_status else "script settled"
    run_settled = point(label, t.script_settled_ms)
    hop("journaled → script started", requested, run_started, "script-runs → capability host")
    sandbox = f" ({t.script_run_ms} ms in the sandbox)" if t.script_run_ms is not None else ""
    hop("script run" + sandbox, run_started, run_settled, "capability host → journal worker")
    points.sort(key=lambda p: p.at_ms)
    return Timeline(tuple(hops), tuple(points))


def turn_times(
    request_offset: int,
    events: dict[int, Any],
    trigger: int | None,
    settled: int | None,
    scripts: tuple[int | None, int | None, int | None] = (None, None, None),
    appended_ms: int | None = None,
    answered_ms: int | None = None,
) -> TurnTimes:
    """`TurnTimes` from a turn's journal events (by offset: the request, its trigger, its
    settlement, the script run's requested/started/settled) and the two command timestamps."""

    def at(offset: int | None) -> int | None:
        event = None if offset is None else events.get(offset)
        return None if event is None else iso_ms(event.createdAt)

    def payload(offset: int | None) -> Any:
        event = None if offset is None else events.get(offset)
        return None if event is None else event.payload

    settlement = payload(settled)
    run = payload(scripts[2])
    return TurnTimes(
        request_offset=request_offset,
        scheduled_ms=iso_ms(events[request_offset].createdAt),
        trigger_offset=trigger,
        appended_ms=appended_ms,
        trigger_journaled_ms=at(trigger),
        answered_ms=answered_ms if settlement is not None else None,
        call_ms=getattr(settlement, "durationMs", None),
        settled_ms=at(settled),
        status=None if settlement is None else settlement.result.status,
        script_requested_ms=at(scripts[0]),
        script_started_ms=at(scripts[1]),
        script_settled_ms=at(scripts[2]),
        script_run_ms=getattr(run, "durationMs", None),
        script_status=None if run is None else run.settlement.status,
    )


# --- drawing -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bar:
    y: int
    x: float
    width: float
    label: str
    duration: str
    process: str
    skewed: bool
    text_x: float  # where the duration is written: after the bar, or inside it near the right edge
    text_anchor: str


@dataclass(frozen=True, slots=True)
class Waterfall:
    width: int
    height: int
    label_width: int
    bars: tuple[Bar, ...]
    ticks: tuple[tuple[float, str], ...]  # (x, "+120 ms")
    total: str


ROW = 24
TOP = 22
LABEL = 260
MIN_BAR = 2.0


def waterfall(timeline: Timeline, width: int = 900) -> Waterfall:
    """Geometry of the timeline as an SVG the template draws: one row per hop, on a common scale
    from the first point to the last."""
    span = max(timeline.end_ms - timeline.start_ms, 1)
    plot = width - LABEL - 70  # room for a duration written after the last bar
    scale = plot / span
    bars = []
    for row, hop in enumerate(timeline.hops):
        x = LABEL + (hop.start_ms - timeline.start_ms) * scale
        w = max(hop.duration_ms * scale, MIN_BAR)
        inside = x + w + 70 > width
        bars.append(
            Bar(
                y=TOP + row * ROW,
                x=round(x, 1),
                width=round(w, 1),
                label=hop.name,
                duration=_ms(hop.duration_ms) + (" (clock skew)" if hop.skewed else ""),
                process=hop.process,
                skewed=hop.skewed,
                text_x=round(x + w - 4 if inside else x + w + 4, 1),
                text_anchor="end" if inside else "start",
            )
        )
    ticks = tuple((round(LABEL + plot * i / 4, 1), "+" + _ms(round(span * i / 4))) for i in range(5))
    return Waterfall(width, TOP + len(bars) * ROW + 8, LABEL, tuple(bars), ticks, _ms(span))


def _ms(ms: int) -> str:
    return f"{ms} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


def trace_link(jaeger_ui_url: str | None, traceparent: bytes | str | None) -> str | None:
    """The Jaeger page of the trace a W3C `traceparent` names (docs/behaviour.md §8), or None
    without a configured Jaeger UI or a well-formed traceparent."""
    if not jaeger_ui_url or not traceparent:
        return None
    text = traceparent.decode("ascii", "replace") if isinstance(traceparent, bytes) else traceparent
    parts = text.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or not _hex(parts[1]) or parts[1] == "0" * 32:
        return None
    return f"{jaeger_ui_url.rstrip('/')}/trace/{parts[1]}"


def _hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)
