#!/usr/bin/env bash
# Downloads kafka_2.13:$KAFKA_VERSION and its runtime dependencies from Maven Central into
# .local/kafka/libs/<version>/. Idempotent: does nothing when the jars for that version are there.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# shellcheck source=../maven-fetch.sh
source "$REPO_ROOT/scripts/maven-fetch.sh"

maven_fetch fetch.sh Kafka "Apache Kafka $KAFKA_VERSION (kafka_2.13)" "$KAFKA_SCRIPTS_DIR/pom.xml" kafka \
  "$KAFKA_VERSION" "$KAFKA_LIBS" "$KAFKA_LOGS/fetch-$KAFKA_VERSION.log" \
  "kafka_2.13-$KAFKA_VERSION.jar" "kafka-clients-$KAFKA_VERSION.jar"
