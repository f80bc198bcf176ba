"""`agentstream replay --verify` without a broker (docs/operations.md, "Row format"; docs/architecture.md,
"Stored rows"): it compares rows as this version reads them, not byte for byte, so a live store
still holding rows of an older format equals its rebuild in this format, and what differs is said
in words.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from pipeline.journal.replay_fold import PartitionFold
from pipeline.journal.replay_store import open_rows
from pipeline.journal.replay_verify import verify
from processors import row_codec, rows
from tests.support.row_store import ALPHA, APPEND_ID_WINDOW, BETA, format_1_journal, format_1_rows


def write_store(path: Path, table: dict[bytes, bytes]) -> Path:
    db = open_rows(path)
    for key, value in table.items():
        db[key] = value
    db.close()
    return path


def rebuilt(tmp_path: Path) -> Path:
    """The fixture's journal replayed into `tmp_path/replayed/rows-0.db`, as `agentstream replay` does."""
    replay = PartitionFold(0, append_id_window=APPEND_ID_WINDOW)
    replay.fold((offset, value, list(headers.items())) for offset, value, headers in format_1_journal())
    table = {key: value for key, value in replay.take().items() if value is not None}
    write_store(tmp_path / "replayed" / "rows-0.db", table)
    return tmp_path / "replayed"


def test_verify_compares_decoded_rows_so_a_format_1_store_equals_its_format_2_rebuild(tmp_path: Path) -> None:
    live_rows = format_1_rows()
    live = write_store(tmp_path / "live.db", live_rows)
    replayed = rebuilt(tmp_path)
    replayed_db = open_rows(replayed / "rows-0.db", read_only=True)
    rebuilt_rows = {bytes(k): bytes(v) for k, v in replayed_db.items()}
    replayed_db.close()
    assert rebuilt_rows[rows.format_key(0)] == b"2" != live_rows[rows.format_key(0)]
    same_bytes = [key for key in live_rows if rebuilt_rows.get(key) == live_rows[key]]
    assert same_bytes == [], "every row is written differently: only decoding makes them equal"
    assert verify(replayed, {0: live}) == []


def test_verify_names_the_fields_and_values_that_differ_and_a_row_it_cannot_read(tmp_path: Path) -> None:
    table = format_1_rows()
    meta = orjson.loads(table[rows.meta_key(ALPHA)])
    meta["cursor"] += 1
    meta["paused"] = True
    table[rows.meta_key(ALPHA)] = orjson.dumps(meta)  # still format 1, other values
    table[rows.append_id_key(ALPHA, "alpha-3")] = b"17"
    table[rows.idempotency_key(BETA, "web/beta/0")] = b"\xff\x09{}"  # written by a newer format
    live = write_store(tmp_path / "live.db", table)
    differences = verify(rebuilt(tmp_path), {0: live})
    assert [str(d) for d in differences] == [
        "partition 0: /agents/alpha append-id row (alpha-3): values differ (live 17, replayed 16)",
        "partition 0: /agents/beta idempotency row (key web/beta/0): values differ (live row unreadable: an "
        "idempotency row is in row format 9, newer than format 2 that this agentstream reads: a newer version "
        "wrote it. Rows are never downgraded: run that version (or a newer one), or rebuild the rows from "
        "agent-journal with this version as docs/operations.md ('Row format') describes (`agentstream replay "
        "--verify` checks the rebuilt rows))",
        "partition 0: /agents/alpha metadata row: values differ (differing fields: cursor, paused)",
    ]
    assert differences[0].live == b"17" and differences[0].replayed == row_codec.encode_offset(16)
