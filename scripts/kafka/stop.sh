#!/usr/bin/env bash
# Stops the local broker recorded in .local/kafka/kafka.pid: SIGTERM, wait up to 30 s, then SIGKILL.
# Harmless when it is not running.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

STOP_TIMEOUT="${AGENTSTREAM_KAFKA_STOP_TIMEOUT:-30}"

if ! pid="$(kafka_running_pid)"; then
  rm -f "$KAFKA_PID_FILE"
  echo "Kafka not running"
  exit 0
fi

echo "Stopping Kafka (pid $pid) ..."
kill -TERM "$pid" 2>/dev/null || true
for _ in $(seq $((STOP_TIMEOUT * 10))); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
  echo "Kafka did not stop within ${STOP_TIMEOUT}s; sending SIGKILL" >&2
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
fi
rm -f "$KAFKA_PID_FILE"
echo "Kafka stopped"
