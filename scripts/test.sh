#!/usr/bin/env bash
# The whole test suite: installs what it needs, starts the local broker if it is not running,
# runs pytest (unit, property, integration against the real broker, LLM tests against a scripted
# server and the embedded model), and stops the broker again if this script started it.
# Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

scripts/install.sh --model --traces

started_broker=0
started_model=0
cleanup() {
  if [[ $started_model == 1 ]]; then scripts/model/stop.sh || true; fi
  if [[ $started_broker == 1 ]]; then scripts/kafka/stop.sh || true; fi
}
trap cleanup EXIT

if ! scripts/kafka/status.sh >/dev/null 2>&1; then
  started_broker=1
fi
scripts/kafka/start.sh
model_pid_file=.local/model/model.pid
if ! { [[ -f $model_pid_file ]] && kill -0 "$(cat "$model_pid_file")" 2>/dev/null; }; then
  started_model=1
fi
scripts/model/start.sh

echo "==> ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "==> helm lint + template (helm from PyPI, offline)"
scripts/helm-check.sh
echo "==> pytest"
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 "$@"
