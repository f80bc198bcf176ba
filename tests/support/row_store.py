"""Stored rows in tests (docs/architecture.md, "Stored rows"): a state compared with ==, and the
format-1 store checked in under tests/data (tests/data/README.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from rocksdict import AccessType, Options, Rdict

from pipeline.journal.replay_store import FAUST_OFFSET_KEY
from processors.state import AgentState, Lane

DATA = Path(__file__).resolve().parents[1] / "data"

JournalRecord = tuple[int, bytes, dict[str, bytes]]  # (kafka offset, value, headers)

# As tests/data/make_rows_format1.py wrote the fixture: its clock, its append-id window, its streams.
CLOCK_MS = 1_767_225_600_000
APPEND_ID_WINDOW = 4
ALPHA, BETA, GAMMA = "/agents/alpha", "/agents/beta", "/agents/gamma"


def lane_view(lane: Lane) -> tuple[Any, ...]:
    cells = [(c.seq, c.offset, c.created_offset, c.updates_offset, c.item) for c in lane.cells]
    return lane.next_seq, lane.next_front_seq, cells, {key: cell.seq for key, cell in lane.by_key.items()}


def state_view(state: AgentState) -> dict[str, Any]:
    """Everything a state holds but the row-change bookkeeping, comparable with ==."""
    view = {name: getattr(state, name) for name in AgentState.__dataclass_fields__ if name not in ("changes",)}
    view["system"], view["history"] = lane_view(state.system), lane_view(state.history)
    return view


def format_1_rows() -> dict[bytes, bytes]:
    """One partition's rows as row format 1 wrote them (tests/data/make_rows_format1.py)."""
    lines = (orjson.loads(line) for line in (DATA / "rows_format1.jsonl").read_text().splitlines())
    return {bytes.fromhex(line["key"]): bytes.fromhex(line["value"]) for line in lines}


def format_1_journal() -> list[JournalRecord]:
    """The journal records those rows were folded from, in offset order."""
    lines = (orjson.loads(line) for line in (DATA / "rows_format1.journal.jsonl").read_text().splitlines())
    return [
        (line["offset"], bytes.fromhex(line["value"]), {k: bytes.fromhex(v) for k, v in line["headers"].items()})
        for line in lines
    ]


def stored_rows(path: Path) -> dict[bytes, bytes]:
    """Every row of one partition's RocksDB store (a stopped worker's), without Faust's offset key."""
    db = Rdict(str(path), options=Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        return {bytes(k): bytes(v) for k, v in db.items() if bytes(k) != FAUST_OFFSET_KEY}
    finally:
        db.close()
