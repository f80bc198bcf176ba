#!/usr/bin/env bash
# Downloads kafka_2.13:$KAFKA_VERSION and its runtime dependencies from Maven Central into
# .local/kafka/libs/<version>/. Idempotent: does nothing when the jars for that version are there.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if kafka_jars_present; then
  exit 0
fi

command -v mvn >/dev/null || { echo "fetch.sh: mvn (Maven) is required to download Kafka" >&2; exit 1; }
command -v java >/dev/null || { echo "fetch.sh: java (17+) is required to run Kafka" >&2; exit 1; }

echo "Fetching Apache Kafka $KAFKA_VERSION (kafka_2.13) into .local/kafka/libs/$KAFKA_VERSION ..."
rm -rf "$KAFKA_LIBS"
mkdir -p "$KAFKA_LIBS"
mkdir -p "$KAFKA_LOGS"
mvn_log="$KAFKA_LOGS/fetch-$KAFKA_VERSION.log"
# Debian's Maven 3.8 prints stray ANSI resets even with -q -B: keep its output in a log, show it on failure.
if ! mvn -B -q -Dstyle.color=never -f "$KAFKA_SCRIPTS_DIR/pom.xml" \
    -Dkafka.version="$KAFKA_VERSION" -Dkafka.libs.dir="$KAFKA_LIBS" package >"$mvn_log" 2>&1 </dev/null; then
  sed 's/\x1b\[[0-9;]*m//g' "$mvn_log" >&2
  echo "fetch.sh: Maven failed to fetch Kafka $KAFKA_VERSION (log: .local/kafka/logs/fetch-$KAFKA_VERSION.log)" >&2
  exit 1
fi
[[ -f "$KAFKA_LIBS/kafka_2.13-$KAFKA_VERSION.jar" ]] \
  || { echo "fetch.sh: kafka_2.13-$KAFKA_VERSION.jar missing after mvn" >&2; exit 1; }
touch "$KAFKA_LIBS/.complete"
echo "Kafka $KAFKA_VERSION: $(find "$KAFKA_LIBS" -name '*.jar' | wc -l) jars"
