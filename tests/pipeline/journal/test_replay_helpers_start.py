"""How `replay --jobs N` starts its helper processes (`pipeline.journal.replay.helper_start_method`):
forked while the process runs a single thread, spawned once any other thread exists (a librdkafka
client's, a RocksDB database's, a Python thread), since a forked child would lack those threads
and hang on what they hold. No broker: each case runs in a fresh interpreter, where the thread
count is known."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads are counted in /proc")


def run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_a_single_threaded_process_forks_its_helpers() -> None:
    assert run("from pipeline.journal.replay import helper_start_method; print(helper_start_method())") == "fork"


@pytest.mark.parametrize(
    "start_a_thread",
    [
        # librdkafka starts its threads with the client, before any broker is reached.
        "from confluent_kafka import Producer; keep = Producer({'bootstrap.servers': '127.0.0.1:1'})",
        # RocksDB starts its background threads with the first database.
        "import tempfile; from rocksdict import Rdict; keep = Rdict(tempfile.mkdtemp() + '/db')",
        "import threading; stop = threading.Event(); threading.Thread(target=stop.wait, daemon=True).start()",
    ],
    ids=["librdkafka", "rocksdb", "python-thread"],
)
def test_a_process_with_another_thread_spawns_them(start_a_thread: str) -> None:
    code = f"""
        from pipeline.journal.replay import helper_start_method
        {start_a_thread}
        print(helper_start_method())
    """
    assert run(code) == "spawn"


def test_forked_helpers_take_the_end_marker_and_exit_cleanly(tmp_path: Path) -> None:
    """Helpers forked from a single-threaded process run `_replay_worker` (they open their own
    consumer there, after the fork) and end with code 0 when no partition is left for them."""
    code = f"""
        import json
        from pathlib import Path
        from pipeline.journal.replay import _Helpers
        helpers = _Helpers(2, {{"bootstrap.servers": "127.0.0.1:1"}}, "journal", Path({str(tmp_path)!r}), None)
        helpers.hand_out([])
        results = helpers.wait(lambda consumed: None)
        for process in helpers.processes:
            process.join(30)
        codes = [process.exitcode for process in helpers.processes]
        helpers.close()
        print(json.dumps({{"method": helpers.start_method, "results": results, "codes": codes}}))
    """
    outcome = json.loads(run(code))
    assert outcome == {"method": "fork", "results": [], "codes": [0, 0]}
