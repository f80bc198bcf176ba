#!/usr/bin/env bash
# Start the local trace backend, Jaeger (built by scripts/install.sh --traces into .local/bin/jaeger), detached,
# with scripts/jaeger/jaeger.yaml: traces in memory, OTLP/HTTP on http://127.0.0.1:$OTLP_PORT, the UI
# and query API on http://127.0.0.1:$UI_PORT. `agentstream up --traces` runs it with the stack.
#
# Pid: $STATE/jaeger.pid   Log: $STATE/jaeger.log
# Waits until the query API answers. Starting again while it runs is harmless.
#
# Environment:
#   AGENTSTREAM_JAEGER_OTLP_PORT      (default 4318)
#   AGENTSTREAM_JAEGER_UI_PORT        (default 16686)
#   AGENTSTREAM_JAEGER_GRPC_PORT      query gRPC (default 16685)
#   AGENTSTREAM_JAEGER_HOME           state directory (default <repo>/.local/jaeger)
#   AGENTSTREAM_JAEGER_START_TIMEOUT  seconds to wait for readiness (default 60)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$ROOT/.local/bin/jaeger"
export AGENTSTREAM_JAEGER_OTLP_PORT="${AGENTSTREAM_JAEGER_OTLP_PORT:-4318}"
export AGENTSTREAM_JAEGER_UI_PORT="${AGENTSTREAM_JAEGER_UI_PORT:-16686}"
export AGENTSTREAM_JAEGER_GRPC_PORT="${AGENTSTREAM_JAEGER_GRPC_PORT:-16685}"
STATE="${AGENTSTREAM_JAEGER_HOME:-$ROOT/.local/jaeger}"
TIMEOUT="${AGENTSTREAM_JAEGER_START_TIMEOUT:-60}"
PIDFILE="$STATE/jaeger.pid"
LOG="$STATE/jaeger.log"
URL="http://127.0.0.1:$AGENTSTREAM_JAEGER_UI_PORT/api/services"

[[ -x "$BIN" ]] || { echo "start.sh: $BIN is missing; run scripts/install.sh --traces" >&2; exit 1; }
mkdir -p "$STATE"

alive() {
  kill -0 "$1" 2>/dev/null || return 1
  local state
  state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true)"
  [[ -n "$state" && "$state" != "Z" ]]
}

ready() { curl -fsS -o /dev/null --max-time 2 "$URL"; }

our_pid() {
  [[ -f "$PIDFILE" ]] || return 1
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$BIN" || return 1
  echo "$pid"
}

if pid="$(our_pid)"; then
  echo "jaeger already running (pid $pid): UI http://127.0.0.1:$AGENTSTREAM_JAEGER_UI_PORT, OTLP http://127.0.0.1:$AGENTSTREAM_JAEGER_OTLP_PORT"
  exit 0
fi
rm -f "$PIDFILE"
if ready; then
  echo "start.sh: something else already answers on $URL (not started by this script)" >&2
  exit 1
fi

# Without the OTEL_* variables of the shell that runs `up --traces`: Jaeger traces nothing of its own.
setsid env -u OTEL_EXPORTER_OTLP_ENDPOINT -u OTEL_TRACES_EXPORTER -u OTEL_SERVICE_NAME "$BIN" --config "$ROOT/scripts/jaeger/jaeger.yaml" </dev/null >>"$LOG" 2>&1 &
pid=$!
echo "$pid" >"$PIDFILE"
deadline=$((SECONDS + TIMEOUT))
until ready; do
  if ! alive "$pid"; then
    echo "start.sh: jaeger (pid $pid) exited during startup; see $LOG:" >&2
    tail -n 20 "$LOG" >&2 || true
    rm -f "$PIDFILE"
    exit 1
  fi
  if ((SECONDS >= deadline)); then
    echo "start.sh: jaeger (pid $pid) did not answer $URL within ${TIMEOUT}s; see $LOG" >&2
    exit 1
  fi
  sleep 0.2
done
echo "jaeger started (pid $pid): UI http://127.0.0.1:$AGENTSTREAM_JAEGER_UI_PORT, OTLP http://127.0.0.1:$AGENTSTREAM_JAEGER_OTLP_PORT"
