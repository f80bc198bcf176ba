# shellcheck shell=bash
# Shared settings for the local Kafka scripts. Sourced, not executed.
# Everything lives under <repo>/.local/kafka (gitignored); paths are derived from this file's location.

KAFKA_SCRIPTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$KAFKA_SCRIPTS_DIR/../.." && pwd)"

# Newest 4.x verified against aiokafka 0.14.0, faust-streaming 0.15.3 (kafka://) and confluent-kafka 2.16.1.
KAFKA_VERSION="${AGENTSTREAM_KAFKA_VERSION:-4.4.0}"
KAFKA_PORT="${AGENTSTREAM_KAFKA_PORT:-19092}"
KAFKA_CONTROLLER_PORT="${AGENTSTREAM_KAFKA_CONTROLLER_PORT:-$((KAFKA_PORT + 1))}"
# AGENTSTREAM_KAFKA_HOST: the address this node listens on and advertises (a cluster node in its own
# network namespace listens on that namespace's address).
KAFKA_HOST="${AGENTSTREAM_KAFKA_HOST:-127.0.0.1}"

# One node of a cluster (scripts/kafka/start-cluster.sh sets these): its node id, every voter of the
# controller quorum as `id@host:port,...` (empty: a standalone node), the cluster id all nodes are
# formatted with, and the replication of the internal topics (min.insync.replicas is one less).
KAFKA_NODE_ID="${AGENTSTREAM_KAFKA_NODE_ID:-1}"
KAFKA_VOTERS="${AGENTSTREAM_KAFKA_VOTERS:-}"
KAFKA_CLUSTER_ID="${AGENTSTREAM_KAFKA_CLUSTER_ID:-}"
KAFKA_REPLICATION="${AGENTSTREAM_KAFKA_REPLICATION:-1}"
KAFKA_MIN_ISR=$(( KAFKA_REPLICATION > 1 ? KAFKA_REPLICATION - 1 : 1 ))

# AGENTSTREAM_KAFKA_HOME: another state directory (config, data, logs, pid file) for a second,
# separate broker beside the usual one (with its own AGENTSTREAM_KAFKA_PORT); the jars are shared.
KAFKA_HOME="${AGENTSTREAM_KAFKA_HOME:-$REPO_ROOT/.local/kafka}"
KAFKA_LIBS="$REPO_ROOT/.local/kafka/libs/$KAFKA_VERSION"
KAFKA_CONF="$KAFKA_HOME/config"
KAFKA_DATA="$KAFKA_HOME/data"
KAFKA_LOGS="$KAFKA_HOME/logs"
KAFKA_PID_FILE="$KAFKA_HOME/kafka.pid"

# Prints the pid if the broker recorded in the pid file is alive (and is a java process), else fails.
kafka_running_pid() {
  [[ -f "$KAFKA_PID_FILE" ]] || return 1
  local pid
  pid="$(tr -dc '0-9' < "$KAFKA_PID_FILE")"
  [[ -n "$pid" ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  # Guard against pid reuse: the process must be our broker.
  if [[ -r "/proc/$pid/cmdline" ]] && ! tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q 'kafka\.Kafka'; then
    return 1
  fi
  echo "$pid"
}

# Python used for the readiness check: the project venv if present, else python3.
kafka_python() {
  if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then
    echo "$REPO_ROOT/.venv/bin/python"
  else
    command -v python3 || true
  fi
}
