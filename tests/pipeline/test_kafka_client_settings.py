"""Settings every aiokafka client here shares, checked without a broker (docs/operations.md, "What
survives what"): metadata no older than 5 s, so a consumer whose cached leaders went stale during a
broker failure stops asking a follower for offsets within seconds instead of minutes."""

from __future__ import annotations

from pathlib import Path

from pipeline.settings import AIOKAFKA_METADATA_MAX_AGE_MS, Settings


def test_aiokafka_consumers_read_committed_with_metadata_at_most_5_s_old() -> None:
    config = Settings.from_env({}).aiokafka_consumer_config()
    assert config["isolation_level"] == "read_committed"
    assert config["metadata_max_age_ms"] == AIOKAFKA_METADATA_MAX_AGE_MS <= 5_000


def test_the_faust_apps_refresh_metadata_as_often(tmp_path: Path) -> None:
    from pipeline.journal.worker import build_app as journal_app
    from pipeline.router import build_app as router_app

    settings = Settings.from_env({}, data_dir=tmp_path)
    for app in (journal_app(settings), router_app(settings)):
        assert app.conf.consumer_metadata_max_age_ms == AIOKAFKA_METADATA_MAX_AGE_MS
        assert app.conf.producer_metadata_max_age_ms == AIOKAFKA_METADATA_MAX_AGE_MS
