"""Settings: environment variables `AGENTSTREAM_<NAME>` with documented defaults.

Every field's description is the documentation. The configuration table of docs/reference.md
repeats each field with its default and description; tests/docs/test_reference_docs.py fails when
a row is missing or differs (`.venv/bin/python -m tests.docs.test_reference_docs` prints the
current rows).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import ssl
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from processors.dedupe import DEFAULT_APPEND_ID_WINDOW
from processors.files import TRANSPORT_INPUTS, FileInput
from processors.gate import DEFAULT_MAX_USER_FILE_BYTES
from processors.render import (
    DEFAULT_ITEM_BYTES,
    DEFAULT_REQUEST_BYTES,
    MIN_ITEM_BYTES,
    MIN_REQUEST_BYTES,
    RenderBudget,
)
from schemas.limits import DEFAULT_MAX_EVENT_BYTES
from schemas.requests import MAX_MESSAGES_BYTES, Transport

# aiokafka (0.14) retries a failed ListOffsets (resetting a position after a rebalance) against
# the leader its metadata names, without refreshing that metadata: with a view taken while a
# broker was down it asked a follower for minutes and the partition's calls waited
# (docs/operations.md, "What survives what"). Metadata no older than this bounds the loop.
AIOKAFKA_METADATA_MAX_AGE_MS = 5_000


ENV_PREFIX = "AGENTSTREAM_"
WINDOW_FLOOR_BYTES = 4096
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
    session_timeout_s: Annotated[
        float,
        Field(ge=6, description="Consumer session timeout: how soon a dead worker's partitions move (broker min 6 s)."),
    ] = 10.0
    worker_stop_timeout_s: Annotated[
        float,
        Field(
            gt=0,
            description="Journal worker and router: how long a stop (SIGTERM, SIGINT) may take before the process "
            "exits anyway, as after a crash (a stop can wait on Kafka forever while it is unreachable); keep it "
            "below the pod's termination grace period.",
        ),
    ] = 25.0
    transactions: Annotated[
        bool,
        Field(
            description="Journal worker: write in Kafka transactions (one per commit, over every partition the "
            "worker owns, fenced by the consumer group's generation), so a worker that lost its partitions (paused, "
            'cut off) writes nothing more (docs/architecture.md, "Fencing"). '
            "Turn off only to measure their cost or on a broker without transactions.",
        ),
    ] = True
    worker_instance_id: Annotated[
        str | None,
        Field(
            description="Static group membership id (e.g. the StatefulSet pod name): a restart keeps its partitions."
        ),
    ] = None
    worker_port: Annotated[int, Field(ge=0, description="Faust web port of the journal worker (0: none).")] = 6066
    worker_bind: Annotated[
        str,
        Field(
            min_length=1,
            description="Address the journal worker's Faust web server listens on (0.0.0.0 to reach it from "
            "other hosts, e.g. in a pod; it serves status only, never table rows).",
        ),
    ] = "127.0.0.1"
    metrics_host: Annotated[
        str,
        Field(
            min_length=1,
            description="Address every process's Prometheus /metrics port listens on (the journal worker, the "
            "LLM caller, the router, the capability host, the gateway's extra metrics port); 0.0.0.0 so that "
            "Prometheus can scrape it from another host, e.g. a pod's IP.",
        ),
    ] = "127.0.0.1"
    metrics_port: Annotated[
        int, Field(ge=0, description="Prometheus /metrics port of the journal worker (0: none).")
    ] = 9464
    caller_metrics_port: Annotated[
        int, Field(ge=0, description="Prometheus /metrics port of the LLM caller (0: none).")
    ] = 9465
    rocksdb_write_buffer_mb: Annotated[int, Field(ge=1, description="RocksDB write buffer per partition.")] = 8
    rocksdb_block_cache_mb: Annotated[int, Field(ge=1, description="RocksDB block cache per partition.")] = 16
    max_event_bytes: Annotated[
        int,
        Field(
            ge=1024,
            le=1_000_000,
            description="Largest append command accepted, in bytes of UTF-8 JSON (clients refuse bigger ones; "
            "the journal worker dead-letters them as too_large). At most ~1 MB: the journal record must fit Kafka's "
            "default message size.",
        ),
    ] = DEFAULT_MAX_EVENT_BYTES
    append_id_window: Annotated[
        int,
        Field(
            ge=1,
            description="Append ids remembered per stream, in events: a command sent again within the stream's "
            "last N events is a duplicate (docs/behaviour.md §1).",
        ),
    ] = DEFAULT_APPEND_ID_WINDOW
    commit_interval_ms: Annotated[
        int,
        Field(
            ge=0,
            le=1000,
            description="Journal worker: once the worker receives commands faster than two per this many "
            "milliseconds (over all its partitions), its commits (one Kafka transaction each) start at most this "
            "often, so that more commands share each transaction. Slower, or when a commit holds work another "
            "process waits on (an internal command, an LLM request, a script run), it commits as soon as the last "
            'one is done. 0: always as soon as the last one is done (docs/architecture.md, "Commit pacing").',
        ),
    ] = 30
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
    log_repeat_interval_s: Annotated[
        float,
        Field(
            ge=0,
            description="While Kafka is unreachable, workers and the gateway log each kind of connection failure "
            "at most once per this many seconds, the next line saying how many were left out (0: every line).",
        ),
    ] = 30.0
    # --- the LLM caller -------------------------------------------------------------------------
    openai_api_key: Annotated[
        str | None,
        Field(description="API key for the LLM endpoint; OPENAI_API_KEY is read too. Unset: the embedded model."),
    ] = None
    openai_base_url: Annotated[
        str | None,
        Field(description="OpenAI-compatible base URL. Unset: api.openai.com with a key, else the embedded model."),
    ] = None
    embedded_model_url: Annotated[
        str, Field(description="Base URL of the embedded model server (scripts/model/start.sh).")
    ] = "http://127.0.0.1:18080/v1"
    llm_model: Annotated[
        str | None,
        Field(description="Default model when an agent configures none (gpt-4o-mini with a key, else smollm2)."),
    ] = None
    llm_transport: Annotated[
        Transport | None,
        Field(description="openai keeps the developer role; openai-compatible maps it to system. Unset: by endpoint."),
    ] = None
    llm_stream: Annotated[
        bool | None,
        Field(
            description="Stream completions (an interrupt keeps the partial output). Unset: stream, except on "
            "the embedded model, whose server reports no token usage on streams (compaction needs it)."
        ),
    ] = None
    llm_max_in_flight: Annotated[int, Field(ge=1, description="Concurrent LLM calls per caller worker.")] = 64
    llm_timeout_s: Annotated[float, Field(gt=0, description="Timeout of one LLM call, seconds.")] = 120.0
    llm_max_tokens: Annotated[int, Field(ge=1, description="max_tokens sent with every completion.")] = 512
    llm_context_tokens: Annotated[
        dict[str, int],
        Field(description='Context window per model, JSON, e.g. {"smollm2": 8192}; others use the default.'),
    ] = {"smollm2": 8192}
    llm_default_context_tokens: Annotated[int, Field(ge=1, description="Context window of unlisted models.")] = 128_000
    caller_group: Annotated[str, Field(description="Consumer group of the LLM caller workers.")] = "agentstream-caller"
    # --- request size (the journal worker renders within it; the llm-requests topic fits the maximum)
    llm_request_max_bytes: Annotated[
        int,
        Field(
            ge=MIN_REQUEST_BYTES,
            le=MAX_MESSAGES_BYTES,
            description="Size budget of one rendered LLM request's messages (UTF-8 JSON bytes, at most the "
            "default): over it the oldest history items are left out behind a notice.",
        ),
    ] = DEFAULT_REQUEST_BYTES
    llm_request_item_max_bytes: Annotated[
        int,
        Field(
            ge=MIN_ITEM_BYTES,
            description="Size cap of one item in a rendered LLM request (UTF-8 JSON bytes; a value over "
            "llm_request_max_bytes counts as that): a larger item is cut with a notice naming its offset.",
        ),
    ] = DEFAULT_ITEM_BYTES
    llm_file_inputs: Annotated[
        dict[str, list[FileInput]],
        Field(
            description='File inputs each model takes, JSON, e.g. {"gpt-4o": ["image", "pdf", "text"]} (image: '
            "image_url parts; pdf: file parts; text: small text files inlined); a file a model does not take is "
            "a hint line. Unlisted models: image, pdf and text on the openai transport, text on openai-compatible.",
        ),
    ] = {"smollm2": ["text"]}
    # --- files the model sees (docs/behaviour.md §3.3) --------------------------------------------
    blob_dir: Annotated[
        Path | None,
        Field(description="Directory of the blob store (uploaded file bytes by sha256). Unset: <data_dir>/blobs."),
    ] = None
    blob_s3_bucket: Annotated[
        str | None,
        Field(description="S3 bucket of the blob store; set it to keep blobs in any S3-compatible object store."),
    ] = None
    blob_s3_prefix: Annotated[str, Field(description="Key prefix of the blob store's objects in the bucket.")] = ""
    blob_s3_endpoint: Annotated[
        str | None,
        Field(description="Endpoint URL of an S3-compatible store (path-style; http:// allowed). Unset: AWS S3."),
    ] = None
    blob_s3_region: Annotated[str | None, Field(description="Region of the blob store's bucket.")] = None
    blob_s3_access_key_id: Annotated[
        str | None, Field(description="Access key id for the bucket. Unset: AWS_ACCESS_KEY_ID and the usual chain.")
    ] = None
    blob_s3_secret_access_key: Annotated[
        str | None, Field(description="Secret access key for the bucket. Unset: AWS_SECRET_ACCESS_KEY and the chain.")
    ] = None
    # --- the HTTP gateway and the router ------------------------------------------------------
    gateway_host: Annotated[str, Field(description="Address the HTTP gateway listens on (0.0.0.0 in a container).")] = (
        "127.0.0.1"
    )
    gateway_port: Annotated[int, Field(ge=0, le=65535, description="Port of the HTTP gateway.")] = 8080
    gateway_metrics_port: Annotated[
        int,
        Field(ge=0, description="Extra Prometheus /metrics port of the gateway (0: none; its own port has /metrics)."),
    ] = 0
    gateway_tokens_file: Annotated[
        Path | None,
        Field(
            description="Gateway tokens file (YAML or JSON): sha256 of each bearer token with its tier and scope, "
            "and the webhook secrets. Re-read when it changes. Unset: every request is 401 (`agentstream up` "
            "writes .local/gateway-tokens.yaml and points its gateway at it)."
        ),
    ] = None
    gateway_max_body_bytes: Annotated[
        int, Field(ge=1024, description="Largest request body of the gateway (one event, a webhook), bytes.")
    ] = 1024 * 1024
    gateway_max_batch_bytes: Annotated[
        int, Field(ge=1024, description="Largest NDJSON batch body of the gateway (at most 10 000 lines), bytes.")
    ] = 16 * 1024 * 1024
    gateway_max_user_file_bytes: Annotated[
        int, Field(ge=0, description="Largest file a user-tier token may attach to an item, bytes.")
    ] = DEFAULT_MAX_USER_FILE_BYTES
    gateway_max_file_bytes: Annotated[
        int,
        Field(
            ge=0,
            description="Largest file an integration, agent or platform token may upload, bytes (a user-tier "
            "token: gateway_max_user_file_bytes).",
        ),
    ] = 100 * 1024 * 1024
    gateway_wait_timeout_s: Annotated[
        float, Field(gt=0, description="With ?wait=true: how long the gateway waits for the journal's outcome.")
    ] = 30.0
    gateway_delivery_timeout_s: Annotated[
        float, Field(gt=0, description="How long the gateway's producer retries a command before answering 503.")
    ] = 10.0
    gateway_max_queued: Annotated[
        int, Field(ge=1, description="Commands the gateway's producer may hold unacknowledged; beyond: 429.")
    ] = 100_000
    gateway_header_timeout_s: Annotated[
        float,
        Field(
            gt=0,
            description="How long a client may take to send a request's line and headers, counted from the "
            "connection (or the request's first byte on a kept-alive one); slower: 408 and the connection closed.",
        ),
    ] = 10.0
    gateway_body_timeout_s: Annotated[
        float,
        Field(
            gt=0,
            description="How long a client may take to send a request's body, counted from the end of its "
            "headers; slower: 408 and the connection closed (raise it for large batches over slow links).",
        ),
    ] = 30.0
    gateway_keep_alive_timeout_s: Annotated[
        int, Field(ge=1, description="How long an idle kept-alive connection to the gateway stays open, seconds.")
    ] = 5
    gateway_max_header_bytes: Annotated[
        int,
        Field(
            ge=8192,
            description="Largest request line plus headers the gateway reads, bytes; larger: 431 and the "
            "connection closed.",
        ),
    ] = 64 * 1024
    gateway_tokens_file_grace_s: Annotated[
        float,
        Field(
            ge=0,
            description="How long the tokens file may be missing or unreadable before every token is revoked "
            "(a rewrite that replaces the file briefly is not a revocation).",
        ),
    ] = 5.0
    gateway_console_sign_in_rate_per_token: Annotated[
        int,
        Field(
            ge=1,
            description="Console sign-ins one token may make per minute (bursts up to the same number); "
            "beyond: 429 with Retry-After.",
        ),
    ] = 10
    gateway_console_sign_in_rate_per_address: Annotated[
        int,
        Field(
            ge=1,
            description="Console sign-in attempts, good or bad, one client address may make per minute (bursts "
            "up to the same number); beyond: 429 with Retry-After.",
        ),
    ] = 30
    gateway_console_sessions_per_token: Annotated[
        int,
        Field(
            ge=1,
            description="Console sessions one token may hold; a sign-in beyond it ends that token's oldest "
            "session (never another token's).",
        ),
    ] = 20
    gateway_console_live_streams_per_session: Annotated[
        int,
        Field(ge=1, description="Live-update streams (server-sent events) one console session may hold open."),
    ] = 6
    gateway_console_live_streams: Annotated[
        int, Field(ge=1, description="Live-update streams the console serves at once, all sessions together.")
    ] = 1000
    jaeger_ui_url: Annotated[
        str | None,
        Field(
            description="Base URL of a Jaeger UI (e.g. http://127.0.0.1:16686): the console's request timeline "
            "links to the turn's trace there. Unset: no link.",
        ),
    ] = None
    mcp_max_wait_s: Annotated[
        float,
        Field(
            ge=0,
            description="Longest an MCP send_message may wait for the agent's answer (its wait_seconds); a "
            "gateway shutting down waits at most this long for the answers in flight.",
        ),
    ] = 60.0
    token: Annotated[
        str | None,
        Field(
            description="Bearer token `agentstream mcp` acts with, checked against the gateway tokens file "
            "(AGENTSTREAM_GATEWAY_TOKENS_FILE) as the gateway checks it: the same tier and scope.",
        ),
    ] = None
    router_app_id: Annotated[
        str, Field(description="Faust application id of the router (consumer group, subscriptions table topics).")
    ] = "agentstream-router"
    router_metrics_port: Annotated[
        int, Field(ge=0, description="Prometheus /metrics port of the router (0: none).")
    ] = 9466

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: object) -> Settings:
        environ = dict(os.environ if environ is None else environ)
        values: dict[str, object] = {}
        for name, field in cls.model_fields.items():
            raw = environ.get(ENV_PREFIX + name.upper())
            if raw is not None and raw != "":
                values[name] = _json_or_text(raw) if isinstance(field.default, dict) else raw
        if "openai_api_key" not in values and environ.get("OPENAI_API_KEY"):
            values["openai_api_key"] = environ["OPENAI_API_KEY"]
        values.update(overrides)
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            problems = "; ".join(
                f"{ENV_PREFIX}{'.'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
                for e in error.errors(include_url=False)
            )
            raise SettingsError(f"invalid settings: {problems}") from None

    @property
    def llm_base_url(self) -> str | None:
        """None means the SDK default (api.openai.com)."""
        if self.openai_base_url:
            return self.openai_base_url
        return None if self.openai_api_key else self.embedded_model_url

    @property
    def default_model(self) -> str:
        return self.llm_model or ("gpt-4o-mini" if self.openai_api_key else "smollm2")

    @property
    def transport(self) -> Transport:
        if self.llm_transport is not None:
            return self.llm_transport
        return "openai" if self.openai_api_key and not self.openai_base_url else "openai-compatible"

    @property
    def streaming(self) -> bool:
        if self.llm_stream is not None:
            return self.llm_stream
        return self.llm_base_url != self.embedded_model_url

    @property
    def render_budget(self) -> RenderBudget:
        request = self.llm_request_max_bytes
        return RenderBudget(request, min(self.llm_request_item_max_bytes, request))

    def render_budget_for(self, model: str) -> RenderBudget:
        """The budget of one request to `model`: a history item larger than its context window (at
        ~4 bytes a token) is cut with a notice, so one huge item cannot keep every request over the
        window. The system lane keeps the general cap; no real window is below 4 KiB."""
        budget = self.render_budget
        window_bytes = max(WINDOW_FLOOR_BYTES, self.context_tokens(model) * 4)
        return RenderBudget(budget.request_bytes, budget.item_bytes, min(budget.item_bytes, window_bytes))

    @property
    def blob_directory(self) -> Path:
        return self.blob_dir if self.blob_dir is not None else self.data_dir / "blobs"

    def file_inputs_for(self, model: str, transport: Transport) -> frozenset[FileInput]:
        """What files `model` takes (docs/behaviour.md §3.3): its `llm_file_inputs`, else its transport's."""
        declared = self.llm_file_inputs.get(model)
        return frozenset(declared) if declared is not None else TRANSPORT_INPUTS[transport]

    def max_file_bytes(self, tier: str) -> int:
        """The upload limit of a token's tier (user: gateway_max_user_file_bytes)."""
        return self.gateway_max_user_file_bytes if tier == "user" else self.gateway_max_file_bytes

    def context_tokens(self, model: str) -> int:
        return self.llm_context_tokens.get(model, self.llm_default_context_tokens)

    def journal_transactional_id(self) -> str:
        """The transactional id of this journal worker's producer: the same for every run of this
        worker, so a restarted worker fences its last run at once (an open transaction of the last
        run would otherwise hold read_committed readers back until the broker aborts it).

        A worker is its static membership id when it has one, else its host and data directory (two
        live workers never share a data directory: RocksDB locks it). Fencing between workers is the
        consumer group generation's (docs/architecture.md, "Fencing")."""
        if self.worker_instance_id:
            return f"{self.app_id}-journal-{self.worker_instance_id}"
        where = f"{socket.gethostname()}:{self.data_dir.resolve()}"
        return f"{self.app_id}-journal-{hashlib.sha256(where.encode()).hexdigest()[:16]}"

    def aiokafka_config(self) -> dict[str, Any]:
        """aiokafka connection settings (security only; bootstrap servers are passed separately)."""
        options: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.sasl_mechanism:
            options.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password,
            )
        if self.security_protocol.endswith("SSL"):
            options["ssl_context"] = ssl.create_default_context(cafile=self.ssl_cafile)
        return options

    def aiokafka_consumer_config(self) -> dict[str, Any]:
        """aiokafka consumer settings: `aiokafka_config()` reading committed records only, with
        metadata refreshed every `AIOKAFKA_METADATA_MAX_AGE_MS`.

        The journal worker writes in Kafka transactions (docs/architecture.md, "Fencing"); aiokafka
        reads `read_uncommitted` by default, which would hand out the records of aborted ones.
        """
        return {
            **self.aiokafka_config(),
            "isolation_level": "read_committed",
            "metadata_max_age_ms": AIOKAFKA_METADATA_MAX_AGE_MS,
        }

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

    def kafka_consumer_config(self) -> dict[str, str]:
        """librdkafka consumer settings: `kafka_client_config()` reading committed records only.

        librdkafka's default already, stated because the journal worker writes in Kafka transactions
        (docs/architecture.md, "Fencing"). Producers take `kafka_client_config()`.
        """
        return {**self.kafka_client_config(), "isolation.level": "read_committed"}


def _json_or_text(raw: str) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return raw  # validation then says what is wrong with it
