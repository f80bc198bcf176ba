#!/usr/bin/env bash
# Downloads s3proxy $S3PROXY_VERSION (org.gaul:s3proxy) and its runtime dependencies from Maven
# Central into .local/s3proxy/libs/<version>/, for the blob store's S3 tests. Idempotent: does
# nothing when the jars for that version are there. Run it with: java -cp 'libs/*' org.gaul.s3proxy.Main
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
S3PROXY_VERSION="${AGENTSTREAM_S3PROXY_VERSION:-2.6.0}"
LIBS="$ROOT/.local/s3proxy/libs/$S3PROXY_VERSION"

if [[ -f "$LIBS/s3proxy-$S3PROXY_VERSION.jar" && -f "$LIBS/.complete" ]]; then
  exit 0
fi
command -v mvn >/dev/null || { echo "s3proxy/fetch.sh: mvn (Maven) is required to download s3proxy" >&2; exit 1; }
command -v java >/dev/null || { echo "s3proxy/fetch.sh: java (17+) is required to run s3proxy" >&2; exit 1; }

echo "Fetching s3proxy $S3PROXY_VERSION into .local/s3proxy/libs/$S3PROXY_VERSION ..."
rm -rf "$LIBS"
mkdir -p "$LIBS" "$ROOT/.local/s3proxy/logs"
log="$ROOT/.local/s3proxy/logs/fetch-$S3PROXY_VERSION.log"
if ! mvn -B -q -Dstyle.color=never -f "$HERE/pom.xml" \
    -Ds3proxy.version="$S3PROXY_VERSION" -Ds3proxy.libs.dir="$LIBS" package >"$log" 2>&1 </dev/null; then
  sed 's/\x1b\[[0-9;]*m//g' "$log" >&2
  echo "s3proxy/fetch.sh: Maven failed to fetch s3proxy $S3PROXY_VERSION (log: .local/s3proxy/logs/fetch-$S3PROXY_VERSION.log)" >&2
  exit 1
fi
[[ -f "$LIBS/s3proxy-$S3PROXY_VERSION.jar" ]] \
  || { echo "s3proxy/fetch.sh: s3proxy-$S3PROXY_VERSION.jar missing after mvn" >&2; exit 1; }
touch "$LIBS/.complete"
echo "s3proxy $S3PROXY_VERSION: $(find "$LIBS" -name '*.jar' | wc -l) jars"
