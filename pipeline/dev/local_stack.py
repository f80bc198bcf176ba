"""The local stack on one machine: broker, embedded model, topics and every agentstream process.

`agentstream up` starts whatever is not running and leaves it running: the broker and the embedded
model (unless an OpenAI key is set) through their scripts, `topics ensure`, then the journal
worker, the LLM caller, the capability host, the router and the HTTP gateway, each detached with a
pid file under .local/run/ and a log under .local/logs/. `agentstream down` stops everything by its
pid file (never by name): the processes first, in the reverse order of starting, then the model and
the broker. `agentstream demo` starts what is missing and stops exactly that afterwards.

`agentstream up --traces` also starts Jaeger (scripts/jaeger/start.sh; built by scripts/install.sh --traces)
and starts every process with `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at it, the gateway also with
`AGENTSTREAM_JAEGER_UI_URL`, so that each turn's trace is in Jaeger's UI and linked from the console
(docs/behaviour.md §8). Processes already running keep their environment: `down` first.

The gateway refuses every request without a tokens file: the first `up` writes
.local/gateway-tokens.yaml (mode 0600) with one platform-tier token and prints that token once; the
file keeps only its sha256. AGENTSTREAM_GATEWAY_TOKENS_FILE, when set, is used instead and never
written.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.settings import REPO_ROOT, Settings

SCRIPTS = REPO_ROOT / "scripts"
RUN_DIR = REPO_ROOT / ".local" / "run"
LOG_DIR = REPO_ROOT / ".local" / "logs"
TOKENS_FILE = REPO_ROOT / ".local" / "gateway-tokens.yaml"
BIN = Path(sys.executable).parent
GATEWAY = "gateway"
GATEWAY_READY_TIMEOUT_S = 60.0  # imports and the first Kafka metadata take a while on a busy machine
LOCAL_TOKEN_NAME = "local-platform"

Say = Callable[[str], Any]


class StackError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class Process:
    """One agentstream process of the stack: `agentstream <args>`, detached."""

    name: str  # pid file, log file and what `down` reports
    args: tuple[str, ...]
    label: str
    stop_timeout_s: float = 30.0  # SIGTERM, then SIGKILL after this long


# In start order: the journal worker first (everything else produces commands for it), the gateway
# last (outside traffic only once everything behind it runs). `down` stops them in reverse.
PROCESSES = (
    Process("worker-journal", ("worker", "journal"), "journal worker"),
    Process("worker-caller", ("worker", "caller"), "LLM caller"),
    # Above the host's default shutdown timeout (35 s): running scripts may finish.
    Process("worker-capabilities", ("worker", "capabilities"), "capability host", 45.0),
    Process("worker-router", ("worker", "router"), "router"),
    Process(GATEWAY, (GATEWAY,), "HTTP gateway"),
)
SERVICES = ("jaeger", "model", "kafka")  # stopped in this order, after every process
# `up --brokers N` runs a cluster of N nodes (scripts/kafka/start-cluster.sh) instead of the single
# broker; this file records N so that `down` stops that cluster.
CLUSTER_FILE = RUN_DIR / "kafka-cluster.nodes"


@dataclass
class Launch:
    """What one `up` did, filled in as it goes (so a failure halfway still knows what it started)."""

    started: list[str] = field(default_factory=list)  # part names, in start order
    token: str | None = None  # a gateway token minted by this `up` (shown once, never stored)
    tokens_file: Path | None = None  # the tokens file the gateway was pointed at


def parts(settings: Settings) -> list[str]:
    """Every part `up` runs, in start order."""
    services = ["kafka"] if settings.openai_api_key else ["kafka", "model"]
    return [*services, *(process.name for process in PROCESSES)]


def _shown(path: Path) -> str:
    """A path as a person in the repository would type it."""
    with contextlib.suppress(ValueError):
        return str(path.relative_to(REPO_ROOT))
    return str(path)


# --- broker, model, topics ----------------------------------------------------------------------


def _script(path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPTS / path)], capture_output=True, text=True)


def start_service(name: str) -> bool:
    """Start `kafka`, `model` or `jaeger` with its script; True if this call started it."""
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


def start_cluster(nodes: int) -> str:
    """Start the local cluster of `nodes` brokers; its bootstrap servers."""
    env = {**os.environ, "AGENTSTREAM_KAFKA_NODES": str(nodes)}
    script = SCRIPTS / "kafka" / "start-cluster.sh"
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise StackError(f"could not start the Kafka cluster:\n{result.stdout}{result.stderr}".rstrip())
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    CLUSTER_FILE.write_text(str(nodes))
    return result.stdout.strip().rsplit(" ", 1)[-1]


def stop_cluster() -> bool:
    """Stop the cluster `up --brokers N` started; True if it was running."""
    try:
        nodes = CLUSTER_FILE.read_text().strip()
    except OSError:
        return False
    env = {**os.environ, "AGENTSTREAM_KAFKA_NODES": nodes}
    result = subprocess.run(
        ["bash", str(SCRIPTS / "kafka" / "stop-cluster.sh")], capture_output=True, text=True, env=env
    )
    if result.returncode != 0:
        raise StackError(f"could not stop the Kafka cluster: {(result.stderr or result.stdout).strip()}")
    CLUSTER_FILE.unlink(missing_ok=True)
    return "not running" not in result.stdout


def ensure_topics_now() -> None:
    result = subprocess.run([str(BIN / "agentstream"), "topics", "ensure"], capture_output=True, text=True)
    if result.returncode != 0:
        raise StackError(f"topics ensure failed: {result.stderr.strip()}")


# --- the agentstream processes --------------------------------------------------------------------


def _pid_file(name: str) -> Path:
    return RUN_DIR / f"{name}.pid"


def _log_file(name: str) -> Path:
    return LOG_DIR / f"{name}.log"


def _running(pid: int) -> bool:
    """Alive and not a zombie (a child of this process that exited is reaped here)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    if state == "Z":
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def _alive(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    if not _running(pid):
        return None
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists() and b"agentstream" not in cmdline.read_bytes():
        return None  # the pid was reused by something else
    return pid


def start_process(process: Process, env: dict[str, str] | None = None) -> subprocess.Popen[bytes] | None:
    """Start `agentstream <args>` detached, with a pid file; None if its pid file names a live one."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    pid_file = _pid_file(process.name)
    if _alive(pid_file):
        return None
    with _log_file(process.name).open("ab") as log:
        child = subprocess.Popen(
            [str(BIN / "agentstream"), *process.args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: Ctrl-C on `up` or `demo` does not reach it
        )
    pid_file.write_text(str(child.pid))
    return child


def stop_process(name: str, timeout: float = 30.0) -> bool:
    """SIGTERM the process of a pid file, SIGKILL (its group) after `timeout`; True if it was running."""
    pid_file = _pid_file(name)
    pid = _alive(pid_file)
    pid_file.unlink(missing_ok=True)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _running(pid):
            return True
        time.sleep(0.1)
    # Its group too: the capability host's sandbox processes must not outlive it.
    with contextlib.suppress(OSError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    return True


def _exited(process: Process, child: subprocess.Popen[bytes]) -> StackError:
    return StackError(
        f"the {process.label} exited at once (code {child.returncode}); see {_shown(_log_file(process.name))}"
    )


def _listening(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def _gateway_host(settings: Settings) -> str:
    """Where to reach the gateway from this machine (a wildcard bind answers on loopback)."""
    return "127.0.0.1" if settings.gateway_host in ("0.0.0.0", "") else settings.gateway_host


def gateway_url(settings: Settings) -> str:
    return f"http://{_gateway_host(settings)}:{settings.gateway_port}"


def ensure_tokens_file(path: Path) -> str | None:
    """Create the gateway tokens file with one new platform-tier token; returns that token.

    None when the file exists: it is reused as it is (checked, so a broken file is one line here
    rather than a gateway that exits).
    """
    from pipeline.gateway.cli import mint_token
    from pipeline.gateway.tokens import TokensFileError, parse_tokens_file, token_entry_yaml

    if path.exists():
        try:
            parse_tokens_file(path.read_text(), str(path))
        except (OSError, TokensFileError) as error:
            raise StackError(f"{error}; fix the file, or remove it and run `up` again to mint a new token") from None
        return None
    token, entry = mint_token("platform", ["/**"], name=LOCAL_TOKEN_NAME)
    text = (
        "# Gateway tokens of the local stack, written by `agentstream up` (or `demo`): the sha256 of each\n"
        "# bearer token, never the token. Add entries with `agentstream token create`; the gateway re-reads\n"
        "# this file when it changes.\n"
        f"tokens:\n{token_entry_yaml(entry)}\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_EXCL: never overwrite a file that appeared meanwhile; 0600: webhook secrets may be added here.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    return token


def _gateway_env(settings: Settings, launch: Launch, say: Say) -> dict[str, str]:
    """The gateway's environment: pointed at the tokens file (minting it on first use)."""
    env = dict(os.environ)
    if settings.gateway_tokens_file is not None:
        launch.tokens_file = settings.gateway_tokens_file  # the person's own file: never written
        return env
    launch.tokens_file = TOKENS_FILE
    launch.token = ensure_tokens_file(TOKENS_FILE)
    if launch.token is not None:
        # Said at once: if a later step fails, the token must not be lost with it.
        say(f"  gateway token: {launch.token}")
        say(f"    (platform tier, every stream; shown once: {_shown(TOKENS_FILE)} keeps only its sha256)")
    env["AGENTSTREAM_GATEWAY_TOKENS_FILE"] = str(TOKENS_FILE)
    return env


def _await_gateway(settings: Settings, process: Process, child: subprocess.Popen[bytes]) -> None:
    if not settings.gateway_port:
        return  # a random port: nothing to wait for
    host = _gateway_host(settings)
    deadline = time.monotonic() + GATEWAY_READY_TIMEOUT_S
    while not _listening(host, settings.gateway_port):
        if child.poll() is not None:
            raise _exited(process, child)
        if time.monotonic() > deadline:
            raise StackError(
                f"the {process.label} did not listen on {gateway_url(settings)} within "
                f"{GATEWAY_READY_TIMEOUT_S:.0f}s; see {_shown(_log_file(process.name))}"
            )
        time.sleep(0.2)


def traces_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """What `up --traces` adds to every process's environment: the local Jaeger's OTLP endpoint and
    its UI (the ports scripts/jaeger/start.sh uses), and a short batch delay for a quick UI."""
    environ = dict(os.environ) if environ is None else environ
    otlp = environ.get("AGENTSTREAM_JAEGER_OTLP_PORT", "4318")
    ui = environ.get("AGENTSTREAM_JAEGER_UI_PORT", "16686")
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp}",
        "OTEL_BSP_SCHEDULE_DELAY": environ.get("OTEL_BSP_SCHEDULE_DELAY", "1000"),
        "AGENTSTREAM_JAEGER_UI_URL": f"http://127.0.0.1:{ui}",
    }


def start_processes(
    settings: Settings, launch: Launch, say: Say = print, extra_env: dict[str, str] | None = None
) -> Launch:
    """Start every agentstream process that is not running, in order; record each in `launch`."""
    for process in PROCESSES:
        env = {**os.environ, **extra_env} if extra_env else None
        if process.name == GATEWAY:
            env = {**_gateway_env(settings, launch, say), **(extra_env or {})}
            port_taken = settings.gateway_port and _listening(_gateway_host(settings), settings.gateway_port)
            if port_taken and not _alive(_pid_file(GATEWAY)):
                raise StackError(
                    f"port {settings.gateway_port} is in use by another process: stop it, "
                    "or set AGENTSTREAM_GATEWAY_PORT to a free port"
                )
        child = start_process(process, env)
        log = _shown(_log_file(process.name))
        where = f" on {gateway_url(settings)}" if process.name == GATEWAY else ""
        if child is None:
            say(f"  {process.label}: already running{where}")
            continue
        launch.started.append(process.name)  # before any check: a failed start is still ours to stop
        if process.name == GATEWAY:
            _await_gateway(settings, process, child)
        else:
            time.sleep(0.5)
            if child.poll() is not None:
                raise _exited(process, child)
        say(f"  {process.label}: started{where} (log {log})")
    return launch


def up(
    settings: Settings, say: Say = print, launch: Launch | None = None, brokers: int = 1, traces: bool = False
) -> Launch:
    """Start what is not running; returns (and fills in `launch`) what this call started."""
    launch = launch if launch is not None else Launch()
    extra_env = None
    if traces:
        extra_env = traces_env()
        if start_service("jaeger"):
            launch.started.append("jaeger")
            say(f"  Jaeger: started, UI {extra_env['AGENTSTREAM_JAEGER_UI_URL']}")
        else:
            say(f"  Jaeger: already running, UI {extra_env['AGENTSTREAM_JAEGER_UI_URL']}")
    if brokers > 1:
        say(f"  Kafka cluster: {brokers} brokers on {start_cluster(brokers)}")
    elif start_service("kafka"):
        launch.started.append("kafka")
        say(f"  Kafka broker: started on {settings.bootstrap_servers}")
    else:
        say(f"  Kafka broker: already running on {settings.bootstrap_servers}")
    if not settings.openai_api_key:
        if start_service("model"):
            launch.started.append("model")
            say(f"  embedded model: started at {settings.embedded_model_url}")
        else:
            say(f"  embedded model: already running at {settings.embedded_model_url}")
    ensure_topics_now()
    return start_processes(settings, launch, say, extra_env)


def down(parts: list[str] | None = None, say: Say = print) -> list[str]:
    """Stop the given parts (default: everything), processes first; returns those that were running."""
    wanted = set(parts) if parts is not None else {process.name for process in PROCESSES} | set(SERVICES)
    stopped: list[str] = []
    for process in reversed(PROCESSES):
        if process.name in wanted and stop_process(process.name, process.stop_timeout_s):
            stopped.append(process.name)
            say(f"  stopped {process.name}")
    for service in SERVICES:
        if service in wanted and stop_service(service):
            stopped.append(service)
            say(f"  stopped {service}")
    if "kafka" in wanted and stop_cluster():
        stopped.append("kafka-cluster")
        say("  stopped kafka-cluster")
    return stopped


# --- the commands ---------------------------------------------------------------------------------


def register(commands: Any) -> None:
    up_parser = commands.add_parser(
        "up",
        help="start the local broker, embedded model, workers, router and HTTP gateway (detached)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up_parser.add_argument(
        "--brokers",
        type=int,
        default=1,
        metavar="N",
        help="run a local cluster of N brokers (scripts/kafka/start-cluster.sh; replication min(N, 3), "
        "min.insync.replicas one less) instead of the single broker",
    )
    up_parser.add_argument(
        "--traces",
        action="store_true",
        help="also start Jaeger (scripts/jaeger/start.sh) and export every process's traces to it "
        "(docs/behaviour.md §8); its UI is linked from the console's request timelines",
    )
    up_parser.set_defaults(run=_run_up)
    down_parser = commands.add_parser(
        "down", help="stop the local gateway, router, workers, embedded model and broker (by pid file)"
    )
    down_parser.set_defaults(run=_run_down)


def _command() -> str:
    """How to call agentstream from here: the bare name only if the shell would find this one."""
    mine = BIN / "agentstream"
    if shutil.which("agentstream") == str(mine):
        return "agentstream"
    with contextlib.suppress(ValueError):
        return str(mine.relative_to(Path.cwd()))
    return str(mine)


def usage(settings: Settings, launch: Launch) -> list[str]:
    """What to try once the stack is up: the CLI, and the gateway with its token."""
    agentstream = shlex.quote(_command())
    tokens_file = _shown(launch.tokens_file) if launch.tokens_file else "(none)"
    if launch.token is not None:
        token_line = f"  TOKEN={launch.token}"
    elif launch.tokens_file == TOKENS_FILE:
        token_line = (
            f"  TOKEN=...   # the platform token printed when {tokens_file} was written (it keeps only its "
            "sha256; `agentstream token create` mints more)"
        )
    else:
        token_line = f"  TOKEN=...   # a token of {tokens_file} (AGENTSTREAM_GATEWAY_TOKENS_FILE)"
    body = (
        '{"type": "events.iterate.com/agents/context-added", '
        '"payload": {"role": "user", "content": "hello", "actor": {"type": "user", "origin": "cli"}}}'
    )
    url = gateway_url(settings)
    return [
        "Talk to an agent:",
        f"  AGENT=$({agentstream} agent create)",
        f"  {agentstream} agent say \"$AGENT\" 'hello'",
        f'  {agentstream} agent tail "$AGENT"',
        f"Through the HTTP gateway ({url}, API docs at {url}/docs):",
        token_line,
        f'  curl -s "{url}/v1/streams$AGENT/events?wait=true" -H "Authorization: Bearer $TOKEN" '
        f"-H 'Content-Type: application/json' -d '{body}'",
        f"Logs: {_shown(LOG_DIR)}/. Stop everything: {agentstream} down",
    ]


def _run_up(args: argparse.Namespace) -> int:
    if args.brokers > 1:
        # Topics and every process started below inherit these: the cluster's address, replication 3.
        nodes = args.brokers
        port = int(os.environ.get("AGENTSTREAM_KAFKA_PORT", "19192"))
        servers = ",".join(f"127.0.0.1:{port + 2 * node}" for node in range(nodes))
        os.environ["AGENTSTREAM_BOOTSTRAP_SERVERS"] = servers
        os.environ["AGENTSTREAM_REPLICATION_FACTOR"] = str(min(nodes, 3))
        print(f"(set AGENTSTREAM_BOOTSTRAP_SERVERS={servers} for other commands)")
    settings = Settings.from_env()
    print("starting the local stack:", flush=True)
    launch = up(settings, say=lambda line: print(line, flush=True), brokers=args.brokers, traces=args.traces)
    print("up.")
    for line in usage(settings, launch):
        print(line)
    return 0


def _run_down(args: argparse.Namespace) -> int:
    if not down():
        print("nothing was running (no live pid files under .local/)")
    return 0
