#!/usr/bin/env bash
# Starts a local KRaft cluster of AGENTSTREAM_KAFKA_NODES (default 3) combined broker+controller
# nodes on 127.0.0.1, detached, each with start.sh under its own home <base>/node<i>:
#   node i: PLAINTEXT port AGENTSTREAM_KAFKA_PORT + 2(i-1) (default 19192, 19194, 19196), controller port+1.
# Replication 3 and min.insync.replicas 2 for every internal topic (N and N-1 for other sizes).
# The base (AGENTSTREAM_KAFKA_HOME, default .local/kafka-cluster) holds the cluster id, so a restart
# reuses the nodes' data. Prints the bootstrap servers. Never touches the single broker (.local/kafka).
set -euo pipefail
SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=cluster.sh
source "$SCRIPTS/cluster.sh"

"$SCRIPTS/fetch.sh"
mkdir -p "$CLUSTER_HOME"
if [[ ! -s "$CLUSTER_HOME/cluster.id" ]]; then
  java -cp "$(cluster_libs)/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n1 > "$CLUSTER_HOME/cluster.id"
fi

# Every node at once: a node answers metadata only once a majority of the quorum runs.
pids=()
for i in $(seq "$CLUSTER_NODES"); do
  cluster_node_env "$i" "$SCRIPTS/start.sh" > "$CLUSTER_HOME/node$i.start.out" 2>&1 &
  pids+=("$!")
done
failed=0
for i in $(seq "$CLUSTER_NODES"); do
  if ! wait "${pids[$((i - 1))]}"; then
    failed=1
    echo "start-cluster.sh: node $i did not start:" >&2
    cat "$CLUSTER_HOME/node$i.start.out" >&2
  fi
done
[[ $failed == 0 ]] || exit 1
echo "Kafka cluster of $CLUSTER_NODES nodes ready: $(cluster_bootstrap)"
