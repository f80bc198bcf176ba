"""Settings: environment variables `AGENTSTREAM_<NAME>` with documented defaults.

Every field's description is the documentation (the README's configuration table is generated
from it by `agentstream settings`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ENV_PREFIX = "AGENTSTREAM_"
REPO_ROOT = Path(__file__).resolve().parent.parent


class SettingsError(ValueError):
    pass


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    bootstrap_servers: Annotated[str, Field(description="Kafka bootstrap servers (host:port, comma-separated).")] = (
        "127.0.0.1:19092"
    )
    topic_prefix: Annotated[str, Field(description="Prefix for every topic name (one cluster, many installs).")] = ""
    partitions: Annotated[
        int,
        Field(ge=1, description="Partitions of agent-appends, agent-journal and llm-requests (must be equal)."),
    ] = 8
    replication_factor: Annotated[int, Field(ge=1, description="Replication factor for created topics.")] = 1
    data_dir: Annotated[Path, Field(description="Directory of the journal processor's RocksDB rows.")] = (
        REPO_ROOT / ".local" / "data"
    )
    app_id: Annotated[str, Field(description="Faust application id (consumer group and changelog topic names).")] = (
        "agentstream-journal"
    )
    worker_port: Annotated[int, Field(ge=0, description="Faust web port of the journal worker (0: none).")] = 6066
    rocksdb_write_buffer_mb: Annotated[int, Field(ge=1, description="RocksDB write buffer per partition.")] = 8
    rocksdb_block_cache_mb: Annotated[int, Field(ge=1, description="RocksDB block cache per partition.")] = 16
    flush_interval_ms: Annotated[
        int, Field(ge=1, description="Longest time journaled events wait before their rows are stored.")
    ] = 20
    max_cached_streams: Annotated[
        int, Field(ge=1, description="Stream states kept in memory per worker; others reload from rows.")
    ] = 10_000
    security_protocol: Annotated[
        str, Field(description="Kafka security.protocol (PLAINTEXT, SSL, SASL_SSL, SASL_PLAINTEXT).")
    ] = "PLAINTEXT"
    sasl_mechanism: Annotated[str | None, Field(description="Kafka SASL mechanism (PLAIN, SCRAM-SHA-512).")] = None
    sasl_username: Annotated[str | None, Field(description="Kafka SASL username.")] = None
    sasl_password: Annotated[str | None, Field(description="Kafka SASL password.")] = None
    ssl_cafile: Annotated[str | None, Field(description="CA bundle for Kafka TLS.")] = None
    log_level: Annotated[str, Field(description="Log level of workers (DEBUG, INFO, WARNING).")] = "INFO"

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: object) -> Settings:
        environ = dict(os.environ if environ is None else environ)
        values: dict[str, object] = {}
        for name in cls.model_fields:
            raw = environ.get(ENV_PREFIX + name.upper())
            if raw is not None and raw != "":
                values[name] = raw
        values.update(overrides)
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            problems = "; ".join(
                f"{ENV_PREFIX}{'.'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
                for e in error.errors(include_url=False)
            )
            raise SettingsError(f"invalid settings: {problems}") from None

    def kafka_client_config(self) -> dict[str, str]:
        """librdkafka (confluent-kafka) connection settings."""
        config = {"bootstrap.servers": self.bootstrap_servers, "security.protocol": self.security_protocol}
        if self.sasl_mechanism:
            config["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            config["sasl.username"] = self.sasl_username
        if self.sasl_password:
            config["sasl.password"] = self.sasl_password
        if self.ssl_cafile:
            config["ssl.ca.location"] = self.ssl_cafile
        return config
