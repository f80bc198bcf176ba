"""Writes tests/data/rows_format1*.jsonl: the rows and journal of one partition, as the version of
row format 1 wrote them (docs/operations.md, "Row format"). It ran once, at the last commit of row
format 1; a later version writes another format, so it refuses to run again.

    .venv/bin/python tests/data/make_rows_format1.py

Three streams fold a realistic mix through one `PartitionEngine` (dict store, in-memory producer,
a fixed clock): a configured agent with a keyed system prompt, client appends with append ids and
idempotency keys, scheduled turns with answers, settlements and usage (one over its threshold, so
a compaction is pending), an interrupted open request, a pause, and script runs in every stage.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from processors import row_codec  # noqa: E402
from schemas.capabilities import SCRIPT_RUN_REQUESTED, SCRIPT_RUN_SETTLED, SCRIPT_RUN_STARTED  # noqa: E402
from schemas.events import (  # noqa: E402
    AGENT_CONFIGURED,
    AGENT_CREATED,
    AGENT_PAUSED,
    CONTEXT_ADDED,
    LLM_REQUEST_SETTLED,
    TOKEN_USAGE_REPORTED,
)
from tests.support.engine_harness import EngineHarness  # noqa: E402

HERE = Path(__file__).resolve().parent
CLOCK_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: every createdAt is reproducible
APPEND_ID_WINDOW = 4  # small, so that appends after the upgrade reuse format-1 window slots
ALPHA, BETA, GAMMA = "/agents/alpha", "/agents/beta", "/agents/gamma"


def user(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": CONTEXT_ADDED, "payload": {"role": "user", "content": text}, **extra}


def item(role: str, content: str, **fields: Any) -> dict[str, Any]:
    return {"type": CONTEXT_ADDED, "payload": {"role": role, "content": content, **fields}}


async def turn(h: EngineHarness, path: str, answer: str, usage: dict[str, int] | None = None) -> int:
    """Let the scheduler start a turn of `path`, then answer and settle it as the caller would."""
    h.engine.schedule(CLOCK_MS + 1_000)
    await h.settle()
    calls = [orjson.loads(r.value) for r in h.kafka.on(h.engine.topics.llm_requests)]
    (request,) = [c for c in calls if c["kind"] == "call" and c["streamPath"] == path][-1:]
    offset = request["requestOffset"]
    commands = [
        h.command(item("assistant", answer, llmRequestOffset=offset), internal=True, path=path),
        h.command(
            {
                "type": LLM_REQUEST_SETTLED,
                "payload": {
                    "requestOffset": offset,
                    "durationMs": 40,
                    "result": {"status": "succeeded", "text": answer},
                },
            },
            internal=True,
            path=path,
        ),
    ]
    if usage is not None:
        payload = {"llmRequestOffset": offset, "model": request["model"], **usage}
        commands.append(h.command({"type": TOKEN_USAGE_REPORTED, "payload": payload}, internal=True, path=path))
    await h.handle(*commands)
    await h.settle()
    return offset


async def history() -> EngineHarness:
    h = EngineHarness(clock_ms=lambda: CLOCK_MS, append_id_window=APPEND_ID_WINDOW)
    # alpha: created and configured, a keyed system prompt, two full turns, then an interrupted
    # request left open and a user message pending behind it.
    await h.handle(
        h.command({"type": AGENT_CREATED, "payload": {"by": "fixture"}}, path=ALPHA),
        h.command({"type": AGENT_CONFIGURED, "payload": {"config": {"maxAutonomousTurns": 3}}}, path=ALPHA),
        h.command(item("system", "be brief", key="agent/system-prompt"), path=ALPHA),
        h.command(user("hello", appendId="alpha-1"), path=ALPHA),
    )
    await turn(h, ALPHA, "hi there", {"maxContextTokens": 8000, "inputTokens": 120, "outputTokens": 8})
    await h.handle(
        h.command(user("what is 2+2?", appendId="alpha-2"), path=ALPHA),
        h.command(item("developer", "notes v1", key="notes"), path=ALPHA),
    )
    await turn(
        h, ALPHA, "4", {"maxContextTokens": 8000, "inputTokens": 150, "outputTokens": 2, "cachedInputTokens": 100}
    )
    await h.handle(
        h.command(item("developer", "notes v2", key="notes"), path=ALPHA),
        h.command(user("tell me a story", appendId="alpha-3"), path=ALPHA),
    )
    h.engine.schedule(CLOCK_MS + 1_000)
    await h.settle()
    interrupt = user("stop, shorter", appendId="alpha-4")
    interrupt["payload"]["llmRequestPolicy"] = {"behaviour": "interrupt-current-request"}
    await h.handle(h.command(interrupt, path=ALPHA))
    await h.settle()

    # beta: client appends with idempotency keys and append ids (more than the window holds), a
    # turn whose usage crosses the compaction threshold.
    await h.handle(
        h.command({"type": AGENT_CREATED, "payload": {}}, path=BETA),
        h.command(item("system", "summarise", key="agent/system-prompt"), path=BETA),
        *(
            h.command(user(f"beta message {n}", appendId=f"beta-{n}", idempotencyKey=f"web/beta/{n}"), path=BETA)
            for n in range(6)
        ),
    )
    await turn(h, BETA, "noted", {"maxContextTokens": 1000, "inputTokens": 950, "outputTokens": 30})

    # gamma: script runs requested, started and settled in turn, one unsettled; then paused.
    await h.handle(
        h.command({"type": AGENT_CREATED, "payload": {}}, path=GAMMA),
        h.command(user("run the scripts", appendId="gamma-1"), path=GAMMA),
    )
    for n, stage in enumerate(("settled", "started", "requested")):
        execution = f"agent-output:{n}"
        run = {"code": f"{n} + 1", "executionId": execution, "expiresAt": CLOCK_MS + 3_600_000}
        commands = [h.command({"type": SCRIPT_RUN_REQUESTED, "payload": run}, internal=True, path=GAMMA)]
        if stage != "requested":
            started = {"type": SCRIPT_RUN_STARTED, "payload": {"executionId": execution}}
            commands.append(h.command(started, internal=True, path=GAMMA))
        if stage == "settled":
            settlement = {"status": "succeeded", "result": n + 1}
            settled = {"type": SCRIPT_RUN_SETTLED, "payload": {"executionId": execution, "settlement": settlement}}
            commands.append(h.command(settled, internal=True, path=GAMMA))
        await h.handle(*commands)
    await h.handle(h.command({"type": AGENT_PAUSED, "payload": {"reason": "fixture"}}, path=GAMMA))
    await h.settle()
    return h


def main() -> int:
    if row_codec.ROW_FORMAT != 1:
        print(f"this version writes row format {row_codec.ROW_FORMAT}: the fixture is format 1's", file=sys.stderr)
        return 1
    h = asyncio.run(history())
    assert not h.fatal, h.fatal
    dead = h.kafka.on(h.engine.topics.dlq)
    assert not dead, [(r.headers, r.value) for r in dead]
    with (HERE / "rows_format1.jsonl").open("w") as out:
        for key, value in sorted(h.table.stored.items()):
            out.write(orjson.dumps({"key": key.hex(), "value": value.hex()}).decode() + "\n")
    with (HERE / "rows_format1.journal.jsonl").open("w") as out:
        for record in h.kafka.on(h.engine.topics.journal):
            headers = {name: value.hex() for name, value in sorted(record.headers.items())}
            out.write(orjson.dumps({"offset": record.offset, "value": record.value.hex(), "headers": headers}).decode())
            out.write("\n")
    positions = {"appends": h.offsets[False], "internal": h.offsets[True]}
    print(f"{len(h.table.stored)} rows, {len(h.kafka.on(h.engine.topics.journal))} journal records, next {positions}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
