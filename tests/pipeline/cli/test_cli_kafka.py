"""The `agentstream` command line against the real broker: the commands a person uses daily."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.kafka_stack import BIN, Stack, wait_until
from tests.support.cli import one_line

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(tmp_path_factory.mktemp("cli") / "data", partitions=2)
    stack.start_worker()
    try:
        yield stack
    finally:
        stack.close()


def agentstream(stack: Stack, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "agentstream"), *args], env=stack.env(), capture_output=True, text=True, timeout=timeout
    )


def test_agent_create_say_tail_show(stack: Stack) -> None:
    created = agentstream(stack, "agent", "create")
    assert created.returncode == 0, created.stderr
    path = created.stdout.strip()
    assert path.startswith("/agents/")
    said = agentstream(stack, "agent", "say", path, "@ not a header\nsecond line", "--no-trigger")
    assert (said.returncode, said.stdout.strip()) == (0, "@3"), said.stderr

    tail = agentstream(stack, "agent", "tail", path, "--no-follow", "--json")
    events = [orjson.loads(line) for line in tail.stdout.splitlines()]
    assert [e["offset"] for e in events] == [1, 2, 3]
    assert events[2]["payload"]["llmRequestPolicy"] == {"behaviour": "dont-trigger-request"}

    plain = agentstream(stack, "agent", "tail", path, "--no-follow")
    lines = plain.stdout.splitlines()
    assert len(lines) == 3 and "\x1b[" not in plain.stdout  # no colours when not a terminal
    assert lines[2].endswith("user [user]: @ not a header\\nsecond line")

    shown = agentstream(stack, "agent", "show", path)
    assert "status idle" in shown.stdout
    assert '@2 key="agent/system-prompt"' in shown.stdout
    assert "@3 actor=user:cli\n@ not a header\nsecond line" in shown.stdout

    projection = orjson.loads(agentstream(stack, "agent", "show", path, "--json").stdout)
    assert [i["offset"] for i in projection["history"]] == [3]


def test_errors_are_one_clear_line_with_exit_codes(stack: Stack) -> None:
    missing = agentstream(stack, "agent", "show", "/agents/does-not-exist")
    assert missing.returncode == 4
    assert missing.stderr.strip().count("\n") == 0 and "no events in /agents/does-not-exist" in missing.stderr

    no_request = agentstream(stack, "agent", "create")
    path = no_request.stdout.strip()
    result = agentstream(stack, "agent", "request", path, "--offset", "99")
    assert result.returncode == 4 and "no llm-request-requested event at @99" in result.stderr

    bad_path = agentstream(stack, "agent", "say", "relative/path", "hi")
    assert bad_path.returncode == 2 and "Traceback" not in bad_path.stderr

    bad_setting = subprocess.run(
        [str(BIN / "agentstream"), "topics", "ensure"],
        env={**stack.env(), "AGENTSTREAM_PARTITIONS": "many"},
        capture_output=True,
        text=True,
    )
    assert bad_setting.returncode == 2 and "AGENTSTREAM_PARTITIONS" in bad_setting.stderr


def test_topics_ensure_and_replay_verify(stack: Stack, tmp_path: Path) -> None:
    ensured = agentstream(stack, "topics", "ensure")
    assert ensured.returncode == 0 and "agent-journal: ok (2 partitions)" in ensured.stdout
    mismatch = subprocess.run(
        [str(BIN / "agentstream"), "topics", "ensure"],
        env={**stack.env(), "AGENTSTREAM_PARTITIONS": "3"},
        capture_output=True,
        text=True,
    )
    assert mismatch.returncode == 3 and "partitions expected 3, actual 2" in mismatch.stderr

    path = agentstream(stack, "agent", "create").stdout.strip()
    assert agentstream(stack, "agent", "say", path, "for replay", "--no-trigger").returncode == 0
    stack.stop_worker()  # an idle, stopped worker: the live rows are complete
    try:
        replayed = agentstream(stack, "replay", "--verify", "--quiet", "--out", str(tmp_path / "replay"))
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
        assert "live store matches the journal" in replayed.stdout
    finally:
        stack.start_worker()


# --- hardening review: replay --out, replay --verify ------------------------------------------------


def test_replay_out_refuses_a_foreign_or_live_directory(stack: Stack, tmp_path: Path) -> None:
    """Finding: `replay --out DIR` deleted whatever DIR held, the live data directory included."""
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("not replay's")
    refused = agentstream(stack, "replay", "--quiet", "--out", str(foreign))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert one_line(refused.stderr) and "not empty and was not created by agentstream replay" in refused.stderr
    assert (foreign / "keep.txt").read_text() == "not replay's"

    data_dir = stack.settings.data_dir
    live_dirs = {p.relative_to(data_dir) for p in data_dir.rglob("*") if p.is_dir()}
    for out in (data_dir, data_dir / "sub", data_dir.parent):
        result = agentstream(stack, "replay", "--quiet", "--out", str(out))
        assert result.returncode == 2, (out, result.stdout, result.stderr)
        assert one_line(result.stderr) and "the live data directory" in result.stderr
        assert "choose a directory outside it" in result.stderr
    assert not (data_dir / "sub").exists()
    # The running worker's RocksDB rotates its own files meanwhile; replay must remove no directory
    # of the live store and write nothing of its own.
    live_after = {p.relative_to(data_dir) for p in data_dir.rglob("*")}
    assert live_dirs <= live_after
    assert not [p for p in live_after if p.name == ".agentstream-replay"]
    assert not any(data_dir.glob("rows-*.db")) and not (data_dir.parent / ".agentstream-replay").exists()

    # Its own output (marked) may be replayed into again, as may a new or an empty directory.
    empty = tmp_path / "empty"
    empty.mkdir()
    for out in (tmp_path / "new", tmp_path / "new", empty):
        result = agentstream(stack, "replay", "--quiet", "--out", str(out))
        assert result.returncode == 0, result.stdout + result.stderr
        assert (out / ".agentstream-replay").is_file() and any(out.glob("rows-*.db"))


def test_replay_verify_reports_every_row_no_stream_owns(stack: Stack, tmp_path: Path) -> None:
    """Finding: `replay --verify` must compare every row of both stores, not only the streams it knows."""
    from pipeline.journal.replay_store import live_store_paths, open_rows
    from pipeline.kafka.partitioner import partition_for
    from processors import rows

    first = agentstream(stack, "agent", "create").stdout.strip()
    second = agentstream(stack, "agent", "create").stdout.strip()
    assert agentstream(stack, "agent", "say", second, "hello", "--no-trigger").returncode == 0
    partitions = stack.settings.partitions
    home, other = partition_for(first, partitions), (partition_for(second, partitions) + 1) % partitions
    stray_item = rows.item_key(first, "history", 999)  # an item no event of `first` made
    stray_meta = rows.meta_key(second)  # `second`'s metadata row in a partition that is not its own
    orphan = b"zz\x00no-stream"  # a key of no kind agentstream writes
    live = live_store_paths(stack.settings)
    stack.stop_worker()  # a stopped worker: the live rows are complete and writable
    try:
        db = open_rows(live[partition_for(second, partitions)])
        meta_value = bytes(db[stray_meta])
        db.close()
        for partition, key, value in ((home, stray_item, b'{"stray":1}'), (other, stray_meta, meta_value)):
            db = open_rows(live[partition])
            db[key] = value
            if partition == home:
                db[orphan] = b"?"
            db.close()
        result = agentstream(stack, "replay", "--verify", "--quiet", "--out", str(tmp_path / "replay"))
        assert result.returncode == 1, result.stdout + result.stderr
        reported = [line.strip() for line in result.stdout.splitlines()[2:]]
        assert sorted(reported) == sorted(
            [
                f"partition {home}: {first} item row (history lane, seq 999): live only",
                f"partition {other}: {second} metadata row: live only",
                f"partition {home}: row {orphan!r} (no stream owns it): live only",
            ]
        ), result.stdout
        assert "3 row(s) differ from the live store (2 stream(s) affected)" in result.stdout

        # With --path only that stream's rows count.
        only = agentstream(stack, "replay", "--verify", "--quiet", "--path", second, "--out", str(tmp_path / "one"))
        assert only.returncode == 1 and f"{second} metadata row: live only" in only.stdout
        assert "no stream owns it" not in only.stdout and "seq 999" not in only.stdout
    finally:
        for partition, key in ((home, stray_item), (other, stray_meta), (home, orphan)):
            db = open_rows(live[partition])
            if db.get(key) is not None:
                del db[key]
            db.close()
        stack.start_worker()


# --- hardening review: CLI rough edges ----------------------------------------------------------------


def test_missing_topics_and_replay_errors_exit_3(stack: Stack, tmp_path: Path) -> None:
    """docs/usage.md: 3 is Kafka unreachable or misconfigured (missing topics exited 2; replay's errors 1)."""
    env = {**stack.env(), "AGENTSTREAM_TOPIC_PREFIX": f"missing-{uuid.uuid4().hex[:8]}-"}
    for args in (
        ["agent", "create"],
        ["agent", "tail", "/agents/x", "--no-follow"],
        ["replay", "--quiet", "--out", str(tmp_path / "replay")],
    ):
        result = subprocess.run([str(BIN / "agentstream"), *args], env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 3, (args, result.stdout, result.stderr)
        assert one_line(result.stderr) and "run `agentstream topics ensure`" in result.stderr, args

    wrong_count = {**stack.env(), "AGENTSTREAM_PARTITIONS": "3"}
    result = subprocess.run(
        [str(BIN / "agentstream"), "agent", "show", "/agents/x"], env=wrong_count, capture_output=True, text=True
    )
    assert result.returncode == 3 and "AGENTSTREAM_PARTITIONS is 3" in result.stderr, result.stderr


def test_unknown_stream_exits_4_with_one_line(stack: Stack, tmp_path: Path) -> None:
    """Finding: `agent tail --no-follow` and `replay --path` of a stream without events exited 0 silently."""
    nobody = f"/agents/nobody-{uuid.uuid4().hex[:8]}"
    tail = agentstream(stack, "agent", "tail", nobody, "--no-follow")
    assert (tail.returncode, tail.stdout) == (4, ""), tail.stderr
    assert one_line(tail.stderr) and f"no events in {nobody}" in tail.stderr
    replayed = agentstream(stack, "replay", "--quiet", "--path", nobody, "--out", str(tmp_path / "replay"))
    assert replayed.returncode == 4, replayed.stdout + replayed.stderr
    assert one_line(replayed.stderr) and f"no events of {nobody}" in replayed.stderr


def test_malformed_path_is_one_line_saying_what_a_path_is(stack: Stack, tmp_path: Path) -> None:
    """Finding: a malformed path printed pydantic's multi-line report with a URL."""
    for args in (
        ["agent", "say", "relative/path", "hi"],
        ["agent", "tail", "/agents/with space", "--no-follow"],
        ["agent", "show", "/agents/../etc"],
        ["agent", "request", "/" + "x" * 600],
        ["replay", "--quiet", "--path", "/agents/x/", "--out", str(tmp_path / "replay")],
    ):
        result = agentstream(stack, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert one_line(result.stderr), (args, result.stderr)
        assert "http" not in result.stderr and "Traceback" not in result.stderr
        assert "invalid stream path" in result.stderr
        assert "a stream path is '/' followed by segments joined by '/', each 1-128 characters of" in result.stderr


def test_say_timeout_names_no_cause_it_does_not_know(stack: Stack) -> None:
    """Finding: `say --timeout 0.001` said the worker was not running although the append went through."""
    path = agentstream(stack, "agent", "create").stdout.strip()
    said = agentstream(stack, "agent", "say", path, "in a hurry", "--no-trigger", "--timeout", "0.001")
    assert said.returncode == 3, said.stdout + said.stderr
    assert one_line(said.stderr), said.stderr
    assert "not running" not in said.stderr
    assert f"the append to {path} was delivered to Kafka, but no outcome arrived within 0.001s" in said.stderr
    assert f"agentstream agent tail {path} --no-follow" in said.stderr

    def journaled() -> bool:
        tail = agentstream(stack, "agent", "tail", path, "--no-follow")
        return tail.stdout.rstrip().endswith("user [user]: in a hurry")

    wait_until(journaled, 60, "the timed-out append in the journal", interval=0.5)
