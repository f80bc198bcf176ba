#!/usr/bin/env bash
# Downloads s3proxy $S3PROXY_VERSION (org.gaul:s3proxy) and its runtime dependencies from Maven
# Central into .local/s3proxy/libs/<version>/, for the blob store's S3 tests. Idempotent: does
# nothing when the jars for that version are there. Run it with: java -cp 'libs/*' org.gaul.s3proxy.Main
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=../maven-fetch.sh
source "$ROOT/scripts/maven-fetch.sh"
S3PROXY_VERSION="${AGENTSTREAM_S3PROXY_VERSION:-2.6.0}"

maven_fetch s3proxy/fetch.sh s3proxy "s3proxy $S3PROXY_VERSION" "$HERE/pom.xml" s3proxy \
  "$S3PROXY_VERSION" "$ROOT/.local/s3proxy/libs/$S3PROXY_VERSION" \
  "$ROOT/.local/s3proxy/logs/fetch-$S3PROXY_VERSION.log" "s3proxy-$S3PROXY_VERSION.jar"
