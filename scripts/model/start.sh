#!/usr/bin/env bash
# Start the embedded model server (llama-cpp-python's OpenAI-compatible server on the
# SmolLM2-135M-Instruct GGUF), detached. Base URL: http://127.0.0.1:$PORT/v1, model "smollm2".
# Transport kind: openai-compatible: a `developer` message gets HTTP 500 (pydantic validation
# error), and streams carry no usage even with stream_options.include_usage.
#
# Pid: .local/model/model.pid   Log: .local/model/server.log
# Waits until GET /v1/models answers. Starting again while it runs is harmless.
#
# Environment:
#   AGENTSTREAM_MODEL_PORT           (default 18080)
#   AGENTSTREAM_MODEL_N_CTX          (default 8192, the model's training context)
#   AGENTSTREAM_MODEL_THREADS        (default: llama-cpp-python's default)
#   AGENTSTREAM_MODEL_START_TIMEOUT  seconds to wait for readiness (default 120)
#   AGENTSTREAM_PYTHON               (default <repo>/.venv/bin/python)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${AGENTSTREAM_PYTHON:-$ROOT/.venv/bin/python}"
HOST="127.0.0.1"
PORT="${AGENTSTREAM_MODEL_PORT:-18080}"
N_CTX="${AGENTSTREAM_MODEL_N_CTX:-8192}"
TIMEOUT="${AGENTSTREAM_MODEL_START_TIMEOUT:-120}"
STATE="$ROOT/.local/model"
PIDFILE="$STATE/model.pid"
PORTFILE="$STATE/model.port"
LOG="$STATE/server.log"
URL="http://$HOST:$PORT/v1/models"

mkdir -p "$STATE"

alive() {
  # kill -0 also succeeds on a zombie (exited, not yet reaped): treat that as dead.
  kill -0 "$1" 2>/dev/null || return 1
  local state
  state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true)"
  [[ -n "$state" && "$state" != "Z" ]]
}

ready() {
  "$PY" - "$URL" <<'PYEOF' >/dev/null 2>&1
import json, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=2) as resp:
    json.load(resp)["data"]
PYEOF
}

listening() {
  # GET /v1/models waits for the model lock, so it stalls while a long generation runs; for a
  # server that is already up, an accepted TCP connection is enough.
  "$PY" - "$HOST" "$PORT" <<'PYEOF' >/dev/null 2>&1
import socket, sys
socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
PYEOF
}

our_pid() {
  # Prints the pid from the pid file if that process is alive and is our model server.
  [[ -f "$PIDFILE" ]] || return 1
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  alive "$pid" || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "llama_cpp.server" || return 1
  echo "$pid"
}

wait_ready() {
  local pid="$1" deadline=$((SECONDS + TIMEOUT))
  while ! ready; do
    if ! alive "$pid"; then
      echo "start.sh: the model server (pid $pid) exited during startup; see $LOG:" >&2
      tail -n 20 "$LOG" >&2 || true
      rm -f "$PIDFILE" "$PORTFILE"
      exit 1
    fi
    if ((SECONDS >= deadline)); then
      echo "start.sh: the model server (pid $pid) did not answer $URL within ${TIMEOUT}s; see $LOG" >&2
      echo "          (it is still running; stop it with scripts/model/stop.sh)" >&2
      exit 1
    fi
    sleep 0.5
  done
}

if pid="$(our_pid)"; then
  running_port="$(cat "$PORTFILE" 2>/dev/null || true)"
  if [[ -n "$running_port" && "$running_port" != "$PORT" ]]; then
    echo "start.sh: the model server is already running (pid $pid) on port $running_port, not $PORT;" >&2
    echo "          stop it first with scripts/model/stop.sh" >&2
    exit 1
  fi
  listening || wait_ready "$pid"
  echo "model server already running (pid $pid) at http://$HOST:$PORT/v1"
  exit 0
fi
rm -f "$PIDFILE" "$PORTFILE"

if ready; then
  echo "start.sh: something else already answers on $URL (not started by this script)" >&2
  exit 1
fi

if ! GGUF="$("$PY" "$ROOT/scripts/model/gguf_path.py")"; then
  echo "start.sh: model not installed; run scripts/model/install.sh" >&2
  exit 1
fi
if ! "$PY" -c "import llama_cpp.server.app" >/dev/null 2>&1; then
  echo "start.sh: llama-cpp-python[server] not installed; run scripts/model/install.sh" >&2
  exit 1
fi

# --interrupt_requests False: by default llama-cpp-python ends an in-flight *stream* early
# (a clean "[DONE]" with no finish_reason) as soon as another request queues behind it, which
# silently truncates answers when several agents call the model at once.
args=(-m llama_cpp.server --model "$GGUF" --host "$HOST" --port "$PORT" --n_ctx "$N_CTX"
  --model_alias smollm2 --interrupt_requests False)
if [[ -n "${AGENTSTREAM_MODEL_THREADS:-}" ]]; then
  args+=(--n_threads "$AGENTSTREAM_MODEL_THREADS")
fi

# setsid: own session, so the server survives the caller's terminal/job control; nohup + setsid
# both exec, so $! is the server's own pid.
nohup setsid "$PY" "${args[@]}" >"$LOG" 2>&1 </dev/null &
pid=$!
echo "$pid" >"$PIDFILE"
echo "$PORT" >"$PORTFILE"
wait_ready "$pid"
echo "model server started (pid $pid) at http://$HOST:$PORT/v1 (model smollm2); log: $LOG"
