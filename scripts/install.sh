#!/usr/bin/env bash
# Installs what agentstream needs into <repo>/.venv: the Python deps (pinned in pyproject.toml,
# dev extras included) and the Kafka broker jars (Maven). Idempotent; safe to re-run.
#   --model   also install the embedded model (llama-cpp-python compiles: minutes the first time)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

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

if [[ "${1:-}" == "--model" ]]; then
  echo "==> embedded model"
  scripts/model/install.sh
fi
