#!/usr/bin/env bash
# Stop the Jaeger that scripts/jaeger/start.sh started (by its pid file; its traces were in memory).
#   AGENTSTREAM_JAEGER_HOME           state directory (default <repo>/.local/jaeger)
#   AGENTSTREAM_JAEGER_STOP_TIMEOUT   seconds before SIGKILL (default 15)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE="${AGENTSTREAM_JAEGER_HOME:-$ROOT/.local/jaeger}"
PIDFILE="$STATE/jaeger.pid"
TIMEOUT="${AGENTSTREAM_JAEGER_STOP_TIMEOUT:-15}"

pid="$(cat "$PIDFILE" 2>/dev/null || true)"
if [[ ! "$pid" =~ ^[0-9]+$ ]] || ! kill -0 "$pid" 2>/dev/null \
  || ! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "/.local/bin/jaeger"; then
  rm -f "$PIDFILE"
  echo "jaeger not running"
  exit 0
fi
kill -TERM "$pid"
deadline=$((SECONDS + TIMEOUT))
while kill -0 "$pid" 2>/dev/null; do
  if ((SECONDS >= deadline)); then
    kill -KILL "$pid" 2>/dev/null || true
    break
  fi
  sleep 0.2
done
rm -f "$PIDFILE"
echo "jaeger stopped"
