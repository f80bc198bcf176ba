# shellcheck shell=bash
# Shared settings of the local cluster scripts (start-cluster.sh, stop-cluster.sh). Sourced.

CLUSTER_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CLUSTER_NODES="${AGENTSTREAM_KAFKA_NODES:-3}"
CLUSTER_HOME="${AGENTSTREAM_KAFKA_HOME:-$CLUSTER_REPO/.local/kafka-cluster}"
CLUSTER_HOST="${AGENTSTREAM_KAFKA_HOST:-127.0.0.1}"
CLUSTER_PORT="${AGENTSTREAM_KAFKA_PORT:-19192}"

cluster_libs() {
  echo "$CLUSTER_REPO/.local/kafka/libs/${AGENTSTREAM_KAFKA_VERSION:-4.4.0}"
}

cluster_port() { # node index (1-based) -> its PLAINTEXT port; the controller listens on port+1
  echo $((CLUSTER_PORT + 2 * ($1 - 1)))
}

cluster_voters() {
  local i voters=()
  for i in $(seq "$CLUSTER_NODES"); do voters+=("$i@$CLUSTER_HOST:$(($(cluster_port "$i") + 1))"); done
  (IFS=,; echo "${voters[*]}")
}

cluster_bootstrap() {
  local i servers=()
  for i in $(seq "$CLUSTER_NODES"); do servers+=("$CLUSTER_HOST:$(cluster_port "$i")"); done
  (IFS=,; echo "${servers[*]}")
}

cluster_node_env() { # node index, command... -> runs the command with that node's environment
  local i="$1"; shift
  local replication=$((CLUSTER_NODES < 3 ? CLUSTER_NODES : 3))
  AGENTSTREAM_KAFKA_HOME="$CLUSTER_HOME/node$i" \
  AGENTSTREAM_KAFKA_PORT="$(cluster_port "$i")" \
  AGENTSTREAM_KAFKA_CONTROLLER_PORT="$(($(cluster_port "$i") + 1))" \
  AGENTSTREAM_KAFKA_HOST="$CLUSTER_HOST" \
  AGENTSTREAM_KAFKA_NODE_ID="$i" \
  AGENTSTREAM_KAFKA_VOTERS="$(cluster_voters)" \
  AGENTSTREAM_KAFKA_CLUSTER_ID="$(cat "$CLUSTER_HOME/cluster.id" 2>/dev/null || true)" \
  AGENTSTREAM_KAFKA_REPLICATION="$replication" \
  AGENTSTREAM_KAFKA_HEAP="${AGENTSTREAM_KAFKA_HEAP:-384m}" \
  "$@"
}
