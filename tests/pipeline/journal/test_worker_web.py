"""The journal worker's Faust web server settings, without a broker: loopback by default, no table
rows served. The server itself is tested against the broker in
tests/pipeline/journal/test_worker_web_kafka.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.settings import Settings, SettingsError


def test_worker_bind_is_a_setting_with_a_loopback_default(tmp_path: Path) -> None:
    assert Settings.from_env({}).worker_bind == "127.0.0.1"
    assert Settings.from_env({"AGENTSTREAM_WORKER_BIND": "0.0.0.0"}).worker_bind == "0.0.0.0"
    from pipeline.journal.worker import build_app

    app = build_app(Settings.from_env({}, data_dir=tmp_path, worker_bind="::1"))
    assert app.conf.web_bind == "::1"
    assert not app.conf.web_tables_enabled and not app.conf.web_router_enabled
    with pytest.raises(SettingsError):
        Settings.from_env({}, worker_bind="")
