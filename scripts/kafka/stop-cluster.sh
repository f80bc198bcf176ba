#!/usr/bin/env bash
# Stops every node of the local cluster (start-cluster.sh) by its pid file; with --reset also
# deletes the cluster's data (its base directory, jars excepted: they stay in .local/kafka/libs).
set -euo pipefail
SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=cluster.sh
source "$SCRIPTS/cluster.sh"
mkdir -p "$CLUSTER_HOME"

pids=()
for i in $(seq "$CLUSTER_NODES"); do
  cluster_node_env "$i" "$SCRIPTS/stop.sh" > "$CLUSTER_HOME/node$i.stop.out" 2>&1 &
  pids+=("$!")
done
for pid in "${pids[@]}"; do wait "$pid" || true; done
# One line, as stop.sh says it: callers tell "not running" from "stopped" by it.
if grep -q "Kafka stopped" "$CLUSTER_HOME"/node*.stop.out 2>/dev/null; then
  echo "Kafka cluster stopped ($CLUSTER_NODES nodes)"
else
  echo "Kafka cluster not running"
fi
if [[ "${1:-}" == "--reset" ]]; then
  rm -rf "$CLUSTER_HOME"
  echo "Kafka cluster data deleted ($CLUSTER_HOME)"
fi
