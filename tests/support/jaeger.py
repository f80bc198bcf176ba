"""A Jaeger of a test's own (docs/operations.md, "Traces"): the binary scripts/install.sh --traces builds,
with scripts/jaeger/jaeger.yaml (traces in memory) on free ports, and its query API."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
BINARY = REPO / ".local" / "bin" / "jaeger"
CONFIG = REPO / "scripts" / "jaeger" / "jaeger.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Jaeger:
    def __init__(self, root: Path) -> None:
        if not BINARY.exists():
            pytest.fail(f"{BINARY} is missing: run scripts/install.sh --traces (builds Jaeger v1.75.0)", pytrace=False)
        self.otlp_port, self.ui_port, grpc_port = _free_port(), _free_port(), _free_port()
        env = {
            **{name: value for name, value in os.environ.items() if not name.startswith("OTEL_")},
            "AGENTSTREAM_JAEGER_OTLP_PORT": str(self.otlp_port),
            "AGENTSTREAM_JAEGER_UI_PORT": str(self.ui_port),
            "AGENTSTREAM_JAEGER_GRPC_PORT": str(grpc_port),
        }
        self.log_path = root / "jaeger.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [str(BINARY), "--config", str(CONFIG)], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 60
        while self.get("/api/services") is None:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"jaeger did not start:\n{self.log_path.read_text()[-2000:]}")
            time.sleep(0.2)

    @property
    def otlp_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.otlp_port}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.ui_port}"

    def get(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(self.ui_url + path, timeout=5) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """The trace as Jaeger's query API returns it (`/api/traces/<id>`), or None (not yet)."""
        found = self.get(f"/api/traces/{trace_id}")
        if not found or not found.get("data"):
            return None
        return found["data"][0]

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(15)
