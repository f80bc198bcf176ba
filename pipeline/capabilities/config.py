"""Settings of the capability host: environment variables `AGENTSTREAM_CAPABILITIES_<NAME>`.

The Kafka connection, topic prefix and partition count are the shared `pipeline.settings.Settings`.
"""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.settings import SettingsError

ENV_PREFIX = "AGENTSTREAM_CAPABILITIES_"


class HostConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    group: Annotated[str, Field(min_length=1, description="Consumer group of the capability hosts.")] = (
        "agentstream-capabilities"
    )
    metrics_port: Annotated[
        int, Field(ge=0, le=65535, description="Prometheus /metrics port of the capability host (0: none).")
    ] = 9467
    concurrency: Annotated[
        int, Field(ge=1, le=1024, description="Scripts run at once (sandbox worker processes), one per agent.")
    ] = 16
    warm_workers: Annotated[int, Field(ge=1, description="Sandbox worker processes kept started when idle.")] = 2
    max_memory_mb: Annotated[int, Field(ge=8, description="Heap limit of one script run, MiB.")] = 64
    max_output_bytes: Annotated[
        int, Field(ge=1024, description="Printed output one script run may produce before it fails (limit).")
    ] = 1024 * 1024
    max_host_calls: Annotated[
        int, Field(ge=1, description="Calls of granted functions (and imports, sleeps) one script run may make.")
    ] = 1000
    shutdown_timeout_s: Annotated[
        float,
        Field(
            ge=0,
            description="On SIGTERM or a revoked partition: how long running scripts may finish (longer ones "
            "are abandoned and settle as crashed on the next host).",
        ),
    ] = 35.0

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: object) -> HostConfig:
        environ = dict(os.environ if environ is None else environ)
        values: dict[str, object] = {}
        for name in cls.model_fields:
            raw = environ.get(ENV_PREFIX + name.upper())
            if raw:
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
