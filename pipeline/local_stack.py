"""The local stack on one machine: broker, embedded model, journal worker, LLM caller.

`agentstream up` starts whatever is not running and leaves it running; `agentstream down` stops
everything by its pid file (never by name); `agentstream demo` starts what is missing and stops
exactly that afterwards. Pid files and logs live under .local/.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pipeline.settings import REPO_ROOT, Settings

SCRIPTS = REPO_ROOT / "scripts"
RUN_DIR = REPO_ROOT / ".local" / "run"
LOG_DIR = REPO_ROOT / ".local" / "logs"
BIN = Path(sys.executable).parent
WORKERS = ("journal", "caller")


class StackError(RuntimeError):
    pass


def _script(path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPTS / path)], capture_output=True, text=True)


def _alive(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except OSError:
        return None
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists() and b"agentstream" not in cmdline.read_bytes():
        return None  # the pid was reused by something else
    return pid


def start_service(name: str) -> bool:
    """Start `kafka` or `model` with its script; True if this call started it."""
    result = _script(f"{name}/start.sh")
    if result.returncode != 0:
        raise StackError(f"could not start {name}:\n{result.stdout}{result.stderr}".rstrip())
    return "already running" not in result.stdout


def stop_service(name: str) -> bool:
    """Stop `kafka` or `model` with its script; True if it was running."""
    result = _script(f"{name}/stop.sh")
    if result.returncode != 0:
        raise StackError(f"could not stop {name}: {(result.stderr or result.stdout).strip()}")
    return "not running" not in result.stdout  # both stop scripts say so when there was nothing to stop


def ensure_topics_now() -> None:
    result = subprocess.run([str(BIN / "agentstream"), "topics", "ensure"], capture_output=True, text=True)
    if result.returncode != 0:
        raise StackError(f"topics ensure failed: {result.stderr.strip()}")


def start_worker(kind: str) -> bool:
    """Start `agentstream worker <kind>` detached; True if this call started it."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    pid_file = RUN_DIR / f"worker-{kind}.pid"
    if _alive(pid_file):
        return False
    with (LOG_DIR / f"worker-{kind}.log").open("ab") as log:
        process = subprocess.Popen(
            [str(BIN / "agentstream"), "worker", kind],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    pid_file.write_text(str(process.pid))
    time.sleep(0.5)
    if process.poll() is not None:
        raise StackError(f"{kind} worker exited at once (code {process.returncode}); see .local/logs/worker-{kind}.log")
    return True


def stop_worker(kind: str, timeout: float = 30.0) -> bool:
    pid_file = RUN_DIR / f"worker-{kind}.pid"
    pid = _alive(pid_file)
    pid_file.unlink(missing_ok=True)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return True
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    return True


def up(settings: Settings, say: Any = print) -> list[str]:
    """Start what is not running; returns what this call started (for `down`-ing exactly that)."""
    started: list[str] = []
    if start_service("kafka"):
        started.append("kafka")
    say("  kafka: running on " + settings.bootstrap_servers)
    if not settings.openai_api_key:
        if start_service("model"):
            started.append("model")
        say(f"  embedded model: running at {settings.embedded_model_url}")
    ensure_topics_now()
    for kind in WORKERS:
        if start_worker(kind):
            started.append(f"worker-{kind}")
        say(f"  {kind} worker: running (log .local/logs/worker-{kind}.log)")
    return started


def down(parts: list[str] | None = None, say: Any = print) -> list[str]:
    """Stop the given parts (default: everything), workers first; returns those that were running."""
    parts = parts if parts is not None else [f"worker-{k}" for k in WORKERS] + ["model", "kafka"]
    stopped: list[str] = []
    for part in parts:
        if part.startswith("worker-") and stop_worker(part.removeprefix("worker-")):
            stopped.append(part)
            say(f"  stopped {part}")
    for service in ("model", "kafka"):
        if service in parts and stop_service(service):
            stopped.append(service)
            say(f"  stopped {service}")
    return stopped


def register(commands: Any) -> None:
    up_parser = commands.add_parser("up", help="start the local broker, embedded model and workers (detached)")
    up_parser.set_defaults(run=_run_up)
    down_parser = commands.add_parser("down", help="stop the local workers, embedded model and broker")
    down_parser.set_defaults(run=_run_down)


def _run_up(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    print("starting the local stack:")
    up(settings)
    print("up. Try: agentstream agent create; agentstream agent say PATH 'hello'; agentstream agent tail PATH")
    return 0


def _run_down(args: argparse.Namespace) -> int:
    if not down():
        print("nothing was running (no live pid files under .local/)")
    return 0
