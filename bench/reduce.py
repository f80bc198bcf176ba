"""Fold throughput and render time of the pure core (issue: context core).

    .venv/bin/python bench/reduce.py [--events N] [--sizes 100,10000,100000]

Each size first folds a warm-up journal until the projection holds that many items (not timed),
then times decode (JSON bytes -> validated event) + fold over a realistic mix that keeps the
projection near that size: keyed and unkeyed context in both lanes, a request every ~10 events
with its settlement and usage report, and a compaction every ~2000 events whose cutoff drops about
as many items as arrived since the previous one. Single process, single core.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections import deque
from typing import Any

import orjson

from pipeline.journal import heap
from processors.reducer import fold
from processors.render import render_messages
from processors.state import AgentState
from schemas.events import (
    CONTEXT_ADDED,
    LLM_REQUEST_REQUESTED,
    LLM_REQUEST_SETTLED,
    TOKEN_USAGE_REPORTED,
    decode_event,
)

PATH = "/agents/bench"
ACTORS: list[dict[str, Any] | None] = [
    None,
    {"type": "user", "origin": "web"},
    {"type": "integration", "name": "github"},
    {"type": "slack", "userId": "U123"},
    {"type": "agent", "path": "/agents/peer"},
]


class JournalWriter:
    """Generates a realistic journal for one stream as JSON bytes lines."""

    def __init__(self, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.offset = 0
        self.history_offsets: deque[int] = deque()  # appended history items, oldest first
        self.added_since_compaction = 0
        self.open_request: int | None = None

    def _event(self, event_type: str, payload: dict[str, Any]) -> bytes:
        self.offset += 1
        ms = self.offset % 1000
        return orjson.dumps(
            {
                "streamPath": PATH,
                "offset": self.offset,
                "type": event_type,
                "payload": payload,
                "createdAt": f"2026-12-02T10:{(self.offset // 60000) % 60:02d}:"
                f"{(self.offset // 1000) % 60:02d}.{ms:03d}Z",
            }
        )

    def context(self) -> bytes:
        rng = self.rng
        roll = rng.random()
        payload: dict[str, Any]
        if roll < 0.03:
            payload = {"role": "system", "content": "Policy line " * 4, "key": f"policy/{rng.randrange(5)}"}
        else:
            role = "user" if roll < 0.5 else "developer"
            payload = {"role": role, "content": "x" * rng.randrange(40, 400)}
            actor = ACTORS[1] if role == "user" else rng.choice(ACTORS)
            if actor is not None:
                payload["actor"] = actor
            if rng.random() < 0.2:
                payload["key"] = f"slot/{rng.randrange(200)}"
            if rng.random() < 0.3:
                payload["refs"] = [
                    {"type": "event", "streamPath": "/integrations/github/main", "offset": rng.randrange(1, 10**6)}
                ]
            if rng.random() < 0.5:
                payload["llmRequestPolicy"] = {"behaviour": "dont-trigger-request"}
            self.history_offsets.append(self.offset + 1)
            self.added_since_compaction += 1
        return self._event(CONTEXT_ADDED, payload)

    def request_cycle(self) -> list[bytes]:
        lines = [self._event(LLM_REQUEST_REQUESTED, {"model": "bench-model", "expiresAt": 1})]
        request = self.offset
        lines.append(
            self._event(CONTEXT_ADDED, {"role": "assistant", "content": "answer " * 20, "llmRequestOffset": request})
        )
        self.history_offsets.append(self.offset)
        self.added_since_compaction += 1
        lines.append(
            self._event(
                LLM_REQUEST_SETTLED,
                {"requestOffset": request, "durationMs": 900, "result": {"status": "succeeded", "text": "answer"}},
            )
        )
        lines.append(
            self._event(
                TOKEN_USAGE_REPORTED,
                {
                    "llmRequestOffset": request,
                    "model": "bench-model",
                    "maxContextTokens": 128_000,
                    "inputTokens": 1200,
                    "outputTokens": 80,
                    "cachedInputTokens": 1000,
                },
            )
        )
        return lines

    def compaction(self) -> bytes:
        drop = min(self.added_since_compaction, len(self.history_offsets) - 1)
        cutoff = 0
        for _ in range(max(drop, 1)):
            cutoff = self.history_offsets.popleft()
        self.added_since_compaction = 0
        return self._event(
            CONTEXT_ADDED,
            {
                "role": "developer",
                "content": "Summary of earlier conversation. " * 10,
                "compaction": {"replacesHistoryThrough": cutoff},
                "llmRequestPolicy": {"behaviour": "dont-trigger-request"},
            },
        )

    def mix(self, count: int, with_compaction: bool = True) -> list[bytes]:
        lines: list[bytes] = []
        since_compaction = 0
        while len(lines) < count:
            lines.append(self.context())
            since_compaction += 1
            if self.rng.random() < 0.1:
                lines.extend(self.request_cycle())
                since_compaction += 4
            if with_compaction and since_compaction >= 2000:
                lines.append(self.compaction())
                since_compaction = 0
        return lines


def projection_size(state: AgentState) -> int:
    return len(state.system) + len(state.history)


def build(size: int) -> tuple[AgentState, JournalWriter]:
    writer = JournalWriter()
    state = AgentState()
    while projection_size(state) < size:
        for line in writer.mix(min(1000, max(size - projection_size(state), 1)), with_compaction=False):
            fold(state, decode_event(line))
    writer.added_since_compaction = 0
    return state, writer


def time_fold(size: int, events: int, worker_gc: bool) -> tuple[float, float]:
    """(events/s, mean projection size) over the timed run."""
    state, writer = build(size)
    lines = writer.mix(events)
    gc.collect()
    if worker_gc:
        heap.settle()
    sizes = 0
    start = time.perf_counter()
    for number, line in enumerate(lines, start=1):
        fold(state, decode_event(line))
        if number % heap.SETTLE_EVERY == 0:
            sizes += projection_size(state)
            if worker_gc:
                heap.settle()
    elapsed = time.perf_counter() - start
    gc.unfreeze()
    return len(lines) / elapsed, sizes / max(len(lines) // heap.SETTLE_EVERY, 1)


def time_render(size: int, repeats: int = 5) -> tuple[float, float]:
    state, _ = build(size)
    items = projection_size(state)
    cold = warm = float("inf")
    for _ in range(repeats):
        for lane in (state.system, state.history):
            for cell in lane.cells:
                cell.rendered = None
        start = time.perf_counter()
        render_messages(state, "openai", "2026-12-02T10:00:00.000Z")
        cold = min(cold, time.perf_counter() - start)
        start = time.perf_counter()
        render_messages(state, "openai", "2026-12-02T10:00:00.000Z")
        warm = min(warm, time.perf_counter() - start)
    return items / cold, items / warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000, help="timed events per size")
    parser.add_argument("--sizes", default="100,10000,100000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    print(f"fold: decode JSON bytes + validate + fold, {args.events} events per size, one core")
    print("  worker GC = the journal worker's policy (pipeline/journal/heap.py: settle every 1000 events)")
    print(f"{'target items':>13} {'mean items':>11} {'GC policy':>10} {'events/s':>11} {'us/event':>9} {'ratio':>7}")
    for worker_gc in (False, True):
        baseline_us = None
        for size in sizes:
            rate, mean_items = time_fold(size, args.events, worker_gc)
            us = 1e6 / rate
            baseline_us = baseline_us or us
            policy = "worker" if worker_gc else "default"
            print(f"{size:>13} {mean_items:>11,.0f} {policy:>10} {rate:>11,.0f} {us:>9.2f} {us / baseline_us:>6.2f}x")
    print("target: >= 100,000 events/s; per-event cost at the largest size <= 1.2x the smallest")
    print()
    print(f"{'render items':>18} {'cold items/s':>14} {'cached items/s':>16}")
    for size in (1_000, 10_000):
        cold, warm = time_render(size)
        print(f"{size:>18} {cold:>14,.0f} {warm:>16,.0f}")
    print("target: rendering >= 300,000 items/s (cold: every header built anew)")


if __name__ == "__main__":
    main()
