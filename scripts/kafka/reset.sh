#!/usr/bin/env bash
# Stops the local broker and deletes its data (topics, offsets, metadata). Keeps the downloaded jars.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

"$KAFKA_SCRIPTS_DIR/stop.sh"
rm -rf "$KAFKA_DATA"
echo "Kafka data deleted (.local/kafka/data)"
