#!/usr/bin/env bash
# Installs what agentstream needs into <repo>/.venv: the Python deps (pinned in pyproject.toml,
# dev extras included), the Kafka broker and s3proxy jars (Maven) and, when missing, Debian's chromium and
# chromedriver for the console's browser tests and Debian's prometheus for the chart's alert and dashboard
# tests (apt-get, as root or through sudo). Idempotent.
#   --model   also install the embedded model (llama-cpp-python compiles: minutes the first time)
#   --traces  also build Jaeger, the local trace backend (go build, once: 10-20 minutes on two cores)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

want_model=0
want_traces=0
for arg in "$@"; do
  case "$arg" in
    --model) want_model=1 ;;
    --traces) want_traces=1 ;;
    *) echo "install.sh: unknown option $arg (known: --model, --traces)" >&2; exit 2 ;;
  esac
done

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "install.sh: agentstream needs Python 3.11 ($PYTHON is $("$PYTHON" --version 2>&1))" >&2
  exit 2
fi

if [[ ! -x .venv/bin/python ]]; then
  echo "==> creating .venv"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.agentstream-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
  echo "==> installing Python dependencies"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e '.[dev]'
  touch "$stamp"
fi

echo "==> Kafka jars"
scripts/kafka/fetch.sh

# The blob store's S3 tests (tests/pipeline/test_blobs.py) run against s3proxy, an S3-compatible
# server on Java.
echo "==> s3proxy jars"
scripts/s3proxy/fetch.sh

# The web console's browser tests (tests/pipeline/gateway/console/test_console_browser.py)
# drive Debian's chromium through its chromedriver; test tools cannot download a browser of their
# own here.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  echo "==> chromium and chromedriver (Debian packages, for the console's browser tests)"
  sudo=()
  if [[ $(id -u) != 0 ]]; then
    command -v sudo >/dev/null || { echo "install.sh: run as root or install sudo to get chromium" >&2; exit 2; }
    sudo=(sudo)
  fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends chromium chromium-driver
fi

# Alert rules and dashboard queries are checked by Debian's Prometheus
# (tests/deploy/test_monitoring.py): promtool checks and unit-tests the chart's rules; the server
# evaluates every dashboard query.
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
  echo "==> prometheus and promtool (Debian package, for the chart's alert and dashboard tests)"
  sudo=()
  if [[ $(id -u) != 0 ]]; then
    command -v sudo >/dev/null || { echo "install.sh: run as root or install sudo to get prometheus" >&2; exit 2; }
    sudo=(sudo)
  fi
  "${sudo[@]}" apt-get update -qq
  # RUNLEVEL=1: invoke-rc.d then starts no service; only the binaries are wanted.
  DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 "${sudo[@]}" apt-get install -y -qq --no-install-recommends prometheus
fi

# The local trace backend (`agentstream up --traces`, tests/e2e/test_traces_jaeger_kafka.py):
# Jaeger v1.75.0, a Go tool dependency of tools/jaeger/go.mod, built once (minutes on two cores,
# at the lowest priority).
JAEGER=.local/bin/jaeger
if [[ $want_traces == 1 && ! -x $JAEGER ]]; then
  GO="$(command -v go || echo /usr/local/go/bin/go)"
  if [[ -x $GO ]]; then
    echo "==> jaeger v1.75.0 (go build into $JAEGER; skipped once it exists)"
    mkdir -p .local/bin
    (cd tools/jaeger && nice -n 19 "$GO" build -o "$ROOT/$JAEGER" github.com/jaegertracing/jaeger/cmd/jaeger)
  else
    echo "==> jaeger: no Go toolchain (go 1.26); traces still export to any OTLP endpoint" >&2
  fi
fi

if [[ $want_model == 1 ]]; then
  echo "==> embedded model"
  scripts/model/install.sh
fi
