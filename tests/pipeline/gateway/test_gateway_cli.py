"""`agentstream gateway` without a broker or a socket: what it does before serving."""

from __future__ import annotations

import gc

import pytest
import uvicorn

from pipeline.gateway.cli import serve
from pipeline.settings import Settings


def test_the_gateway_serves_with_its_start_up_objects_out_of_the_collectors_view(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full collection would otherwise rescan the whole framework while requests wait."""
    frozen_when_served: list[int] = []
    monkeypatch.setattr("pipeline.logs.setup_logging", lambda _settings: None)  # leave the test run's logging
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: frozen_when_served.append(gc.get_freeze_count()))
    try:
        serve(Settings.from_env({}, topic_prefix="cli-"))
    finally:
        gc.unfreeze()
    assert len(frozen_when_served) == 1 and frozen_when_served[0] > 10_000
