#!/usr/bin/env bash
# Prints whether the local broker runs; exit 0 if running, 1 if not.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if pid="$(kafka_running_pid)"; then
  echo "Kafka $KAFKA_VERSION running (pid $pid) on $KAFKA_HOST:$KAFKA_PORT"
  exit 0
fi
echo "Kafka not running"
exit 1
