#!/usr/bin/env bash
# Stop the embedded model server started by scripts/model/start.sh (by its pid file):
# SIGTERM, wait up to AGENTSTREAM_MODEL_STOP_TIMEOUT seconds (default 15), then SIGKILL.
# Harmless when it is not running.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PIDFILE="$ROOT/.local/model/model.pid"
PORTFILE="$ROOT/.local/model/model.port"
TIMEOUT="${AGENTSTREAM_MODEL_STOP_TIMEOUT:-15}"

alive() {
  # kill -0 also succeeds on a zombie (exited, not yet reaped): treat that as dead.
  kill -0 "$1" 2>/dev/null || return 1
  local state
  state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true)"
  [[ -n "$state" && "$state" != "Z" ]]
}

if [[ ! -f "$PIDFILE" ]]; then
  echo "model server not running (no pid file)"
  exit 0
fi
pid="$(cat "$PIDFILE" 2>/dev/null || true)"
if [[ ! "$pid" =~ ^[0-9]+$ ]] || ! alive "$pid"; then
  echo "model server not running (stale pid file)"
  rm -f "$PIDFILE" "$PORTFILE"
  exit 0
fi
if ! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "llama_cpp.server"; then
  echo "model server not running (pid $pid belongs to another process; removing stale pid file)"
  rm -f "$PIDFILE" "$PORTFILE"
  exit 0
fi

kill -TERM "$pid" 2>/dev/null || true
deadline=$((SECONDS + TIMEOUT))
while alive "$pid" && ((SECONDS < deadline)); do
  sleep 0.2
done
if alive "$pid"; then
  echo "model server (pid $pid) ignored SIGTERM for ${TIMEOUT}s; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  while alive "$pid"; do sleep 0.1; done
fi
rm -f "$PIDFILE" "$PORTFILE"
echo "model server stopped (pid $pid)"
