# shellcheck shell=bash
# Downloads a Java program and its runtime dependencies from Maven Central, for scripts/kafka/fetch.sh
# and scripts/s3proxy/fetch.sh. Sourced, not executed.

# maven_fetch WHO NAME TITLE POM PROPERTY VERSION LIBS LOG JAR...
#   Runs `mvn package` on POM with -D<PROPERTY>.version=VERSION and -D<PROPERTY>.libs.dir=LIBS, which
#   copies the jars into LIBS; Maven's output goes to LOG and is shown only on failure. Does nothing
#   (works offline) when every JAR and LIBS/.complete are there; the first JAR must exist after
#   Maven. WHO prefixes the error messages, NAME names the program in them, TITLE in the progress line.
maven_fetch() {
  local who=$1 name=$2 title=$3 pom=$4 property=$5 version=$6 libs=$7 log=$8
  shift 8
  local root jar present=1
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  for jar in "$@" .complete; do
    [[ -f "$libs/$jar" ]] || present=0
  done
  if ((present)); then
    return 0
  fi

  command -v mvn >/dev/null || { echo "$who: mvn (Maven) is required to download $name" >&2; return 1; }
  command -v java >/dev/null || { echo "$who: java (17+) is required to run $name" >&2; return 1; }

  echo "Fetching $title into ${libs#"$root/"} ..."
  rm -rf "$libs"
  mkdir -p "$libs" "$(dirname "$log")"
  # Debian's Maven 3.8 prints stray ANSI resets even with -q -B: keep its output in a log, show it on failure.
  if ! mvn -B -q -Dstyle.color=never -f "$pom" \
      -D"$property.version=$version" -D"$property.libs.dir=$libs" package >"$log" 2>&1 </dev/null; then
    sed 's/\x1b\[[0-9;]*m//g' "$log" >&2
    echo "$who: Maven failed to fetch $name $version (log: ${log#"$root/"})" >&2
    return 1
  fi
  [[ -f "$libs/$1" ]] || { echo "$who: $1 missing after mvn" >&2; return 1; }
  touch "$libs/.complete"
  echo "$name $version: $(find "$libs" -name '*.jar' | wc -l) jars"
}
